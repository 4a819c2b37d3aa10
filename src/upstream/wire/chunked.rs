//! Finding the end of a chunked body (RFC 9112, section 7.1) in the bytes as they come, so it
//! can be relayed as it was sent and its connection kept.

/// Where the scan stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum At {
    /// In a chunk's size (hex digits so far in `Scan::size`).
    #[default]
    Size,
    /// Past the size: an extension, up to the line's end.
    Extension,
    /// In a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data, up to its line end.
    DataEnd,
    /// In the trailer section (after the last chunk): `true` when the line so far is empty.
    Trailer(bool),
}

#[derive(Debug, Default)]
pub struct Scan {
    at: At,
    size: u64,
    digits: u32,
}

impl Scan {
    /// Feeds the next bytes: how many belong to the body, and whether the body ends there.
    /// `Err` when it is not a chunked body.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(usize, bool), ()> {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match self.at {
                At::Data(left) => {
                    let now = (bytes.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                    i += now;
                    let left = left - now as u64;
                    self.at = if left == 0 {
                        At::DataEnd
                    } else {
                        At::Data(left)
                    };
                    continue;
                }
                At::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        self.digits += 1;
                        let digit = (b as char).to_digit(16).ok_or(())? as u64;
                        if self.digits > 15 {
                            return Err(());
                        }
                        self.size = self.size * 16 + digit;
                    }
                    b';' | b' ' | b'\t' | b'\r' if self.digits > 0 => self.at = At::Extension,
                    b'\n' if self.digits > 0 => self.end_size_line(),
                    _ => return Err(()),
                },
                At::Extension => {
                    if b == b'\n' {
                        self.end_size_line();
                    }
                }
                At::DataEnd => match b {
                    b'\r' => {}
                    b'\n' => self.at = At::Size,
                    _ => return Err(()),
                },
                At::Trailer(empty) => match b {
                    b'\r' => {}
                    b'\n' if empty => return Ok((i + 1, true)),
                    b'\n' => self.at = At::Trailer(true),
                    _ => self.at = At::Trailer(false),
                },
            }
            i += 1;
        }
        Ok((bytes.len(), false))
    }

    fn end_size_line(&mut self) {
        self.at = if self.size == 0 {
            At::Trailer(true)
        } else {
            At::Data(self.size)
        };
        self.size = 0;
        self.digits = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end_of(body: &[u8], split: usize) -> Option<usize> {
        let mut scan = Scan::default();
        let (a, done) = scan.feed(&body[..split]).ok()?;
        if done {
            return Some(a);
        }
        let (b, done) = scan.feed(&body[split..]).ok()?;
        done.then_some(a + b)
    }

    #[test]
    fn the_end_is_found_wherever_the_bytes_split() {
        let body =
            b"5\r\nhello\r\n1A;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        for split in 0..=body.len() {
            assert_eq!(end_of(body, split), Some(end), "split at {split}");
        }
        assert_eq!(end_of(b"0\r\n\r\n", 2), Some(5));
        assert_eq!(end_of(b"0\n\n", 1), Some(3));
    }

    #[test]
    fn what_is_not_chunked_is_refused() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"5\r\nhelloX\r\n",
            b"ffffffffffffffffff\r\n",
        ] {
            assert!(Scan::default().feed(bad).is_err(), "{bad:?}");
        }
    }
}
