//! What admission reads from a sale request itself: the quantity (query string, and a body a
//! backend might read it from) and the `Idempotency-Key`.

use super::target::lenient_name;
use super::BadRequest;
use http::HeaderMap;
use std::num::NonZeroU32;

/// Header a buyer's client sets to make retries of one purchase return the same reservation.
pub use crate::header_names::IDEMPOTENCY_KEY as IDEMPOTENCY_HEADER;

/// Longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

/// The `Idempotency-Key`, if sent: once, 1 to 128 visible ASCII characters.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, BadRequest> {
    let mut values = headers.get_all(IDEMPOTENCY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(BadRequest::IdempotencyKeyInvalid);
    }
    let key = value.as_bytes();
    let valid = !key.is_empty()
        && key.len() <= MAX_IDEMPOTENCY_KEY_LEN
        && key.iter().all(u8::is_ascii_graphic);
    if !valid {
        return Err(BadRequest::IdempotencyKeyInvalid);
    }
    Ok(std::str::from_utf8(key).ok())
}

/// A quantity a sale request's body names under the quantity parameter's name (or a lenient
/// spelling of it), for a backend that reads it there: form fields
/// (`application/x-www-form-urlencoded`) and top-level keys of a JSON object. `Err` when one is
/// not a plain number or two disagree; `None` when the body names none (or is of another type,
/// which flashgate does not read).
pub fn body_quantity(
    content_type: Option<&str>,
    body: &[u8],
    name: &str,
) -> Result<Option<u32>, BadRequest> {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase());
    let lenient = name.to_ascii_lowercase();
    let mut found: Vec<String> = Vec::new();
    match media.as_deref() {
        Some("application/x-www-form-urlencoded") => {
            for pair in String::from_utf8_lossy(body).split('&') {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                if lenient_name(key) == lenient {
                    found.push(value.to_owned());
                }
            }
        }
        Some(m) if m == "application/json" || m.ends_with("+json") => {
            let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(body) else {
                return Ok(None);
            };
            for (key, value) in map {
                if lenient_name(&key) == lenient {
                    found.push(match value {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    });
                }
            }
        }
        _ => return Ok(None),
    }
    let mut qty = None;
    for value in found {
        let n: u32 = value
            .trim()
            .parse()
            .map_err(|_| BadRequest::QuantityAmbiguous)?;
        if qty.is_some_and(|q| q != n) {
            return Err(BadRequest::QuantityAmbiguous);
        }
        qty = Some(n);
    }
    Ok(qty)
}

/// Most digits a quantity may have (keeps parsing trivially overflow-free).
const MAX_QUANTITY_DIGITS: usize = 9;

/// The requested quantity from the query string: absent means 1; otherwise plain decimal
/// digits, given once, between 1 and `max`. A parameter a lenient backend would read as the
/// quantity under another spelling (`QTY`, `%71ty`, `qty[]`) is refused, never ignored.
pub fn quantity(query: Option<&str>, name: &str, max: NonZeroU32) -> Result<u32, BadRequest> {
    let mut found = None;
    let lenient = name.to_ascii_lowercase();
    for pair in query.unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == name {
            if found.is_some() {
                return Err(BadRequest::QuantityRepeated);
            }
            found = Some(value);
        } else if lenient_name(key) == lenient {
            return Err(BadRequest::QuantityAmbiguous);
        }
    }
    let Some(value) = found else {
        return Ok(1);
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BadRequest::QuantityNotInteger);
    }
    let digits = value.trim_start_matches('0');
    if digits.len() > MAX_QUANTITY_DIGITS {
        return Err(BadRequest::QuantityTooLarge);
    }
    let qty: u32 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| BadRequest::QuantityNotInteger)?
    };
    if qty == 0 {
        Err(BadRequest::QuantityTooSmall)
    } else if qty > max.get() {
        Err(BadRequest::QuantityTooLarge)
    } else {
        Ok(qty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn quantity_rules() {
        let max = NonZeroU32::new(3).unwrap();
        let q = |s: Option<&str>| quantity(s, "qty", max);
        assert_eq!(q(None), Ok(1));
        assert_eq!(q(Some("a=1")), Ok(1));
        assert_eq!(q(Some("qty=2")), Ok(2));
        assert_eq!(q(Some("x=9&qty=03")), Ok(3));
        assert_eq!(q(Some("qty=4")), Err(BadRequest::QuantityTooLarge));
        assert_eq!(q(Some("qty=0")), Err(BadRequest::QuantityTooSmall));
        assert_eq!(q(Some("qty=000")), Err(BadRequest::QuantityTooSmall));
        for bad in [
            "qty=", "qty", "qty=-1", "qty=+1", "qty=1.0", "qty=%201", "qty=one", "qty=1 ",
        ] {
            assert_eq!(q(Some(bad)), Err(BadRequest::QuantityNotInteger), "{bad}");
        }
        assert_eq!(
            q(Some("qty=99999999999999999999")),
            Err(BadRequest::QuantityTooLarge)
        );
        assert_eq!(q(Some("qty=1&qty=1")), Err(BadRequest::QuantityRepeated));
        for lookalike in ["QTY=5", "qty=1&%71ty=5", "qty[]=5", "Qty%5B%5D=2"] {
            assert_eq!(
                q(Some(lookalike)),
                Err(BadRequest::QuantityAmbiguous),
                "{lookalike}"
            );
        }
    }

    #[test]
    fn a_body_quantity_is_read_as_a_backend_would() {
        let form = Some("application/x-www-form-urlencoded; charset=utf-8");
        assert_eq!(body_quantity(form, b"item=7&qty=2", "qty"), Ok(Some(2)));
        assert_eq!(body_quantity(form, b"QTY=2&qty=2", "qty"), Ok(Some(2)));
        assert_eq!(
            body_quantity(form, b"qty=2&qty%5B%5D=5", "qty"),
            Err(BadRequest::QuantityAmbiguous)
        );
        assert_eq!(body_quantity(form, b"note=hi", "qty"), Ok(None));
        let json = Some("application/json");
        assert_eq!(body_quantity(json, br#"{"qty": 3}"#, "qty"), Ok(Some(3)));
        assert_eq!(body_quantity(json, br#"{"Qty": "3"}"#, "qty"), Ok(Some(3)));
        assert_eq!(
            body_quantity(json, br#"{"qty": 1.5}"#, "qty"),
            Err(BadRequest::QuantityAmbiguous)
        );
        assert_eq!(body_quantity(json, b"not json", "qty"), Ok(None));
        assert_eq!(body_quantity(Some("text/plain"), b"qty=9", "qty"), Ok(None));
        assert_eq!(body_quantity(None, b"qty=9", "qty"), Ok(None));
    }

    #[test]
    fn idempotency_key_rules() {
        let with = |values: &[&[u8]]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(IDEMPOTENCY_HEADER, HeaderValue::from_bytes(v).unwrap());
            }
            h
        };
        assert_eq!(idempotency_key(&with(&[])), Ok(None));
        assert_eq!(idempotency_key(&with(&[b"k-1"])), Ok(Some("k-1")));
        for bad in [&b""[..], b"a b", &[b'k'; 129], &[0xff]] {
            assert_eq!(
                idempotency_key(&with(&[bad])),
                Err(BadRequest::IdempotencyKeyInvalid)
            );
        }
        assert_eq!(
            idempotency_key(&with(&[b"a", b"b"])),
            Err(BadRequest::IdempotencyKeyInvalid)
        );
    }
}
