//! What a purchase reads from a sale request itself: the quantity (query string, and a body a
//! backend might read it from) and the `Idempotency-Key`.

use crate::decision::BadRequest;
use crate::edge::target::lenient_name;
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
/// (`application/x-www-form-urlencoded`, split on `&` and `;`), and the top-level keys of a JSON
/// object whatever the `Content-Type` says (many backends parse any body that looks like JSON:
/// byte-order marks, whitespace and control characters before it are skipped, as lenient readers
/// do, and duplicate keys all count). `Err` when one is not a plain number or two disagree, when
/// the request names its body's type more than once or in a list (parsers keep different ones),
/// for a `multipart/*` body (its parsers disagree on boundaries, quoting and folding too much to
/// read one the way every backend would: a purchase needs no upload), or when a body that is (or
/// says it is, or looks like) JSON is not strict JSON (`NaN`, `Infinity` and trailing commas,
/// which lenient parsers accept, included); `None` when the body names none.
pub fn body_quantity(
    headers: &HeaderMap,
    body: &[u8],
    name: &str,
) -> Result<Option<u32>, BadRequest> {
    let mut types = headers.get_all(http::header::CONTENT_TYPE).iter();
    let content_type = match (types.next(), types.next()) {
        (None, _) => None,
        (Some(t), None) => Some(t.to_str().map_err(|_| BadRequest::MalformedBody)?),
        (Some(_), Some(_)) => return Err(BadRequest::MalformedBody),
    };
    if content_type.is_some_and(|t| t.contains(',')) {
        return Err(BadRequest::MalformedBody);
    }
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase());
    let lenient = name.to_ascii_lowercase();
    let found = match media.as_deref() {
        Some("application/x-www-form-urlencoded") => form_values(body, &lenient),
        Some(m) if m.starts_with("multipart/") => return Err(BadRequest::MalformedBody),
        m => {
            let json_type = m.is_some_and(|m| m == "application/json" || m.ends_with("+json"));
            let text = json_start(body);
            let looks_like_json = matches!(text.first(), Some(b'{' | b'['));
            if json_type || looks_like_json {
                json_values(text, &lenient)?
            } else {
                Vec::new()
            }
        }
    };
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

/// A body with what lenient JSON readers skip before the document cut off: byte-order marks,
/// Unicode whitespace and control characters.
fn json_start(body: &[u8]) -> &[u8] {
    let mut rest = body;
    loop {
        let Some(c) = std::str::from_utf8(&rest[..rest.len().min(4)])
            .ok()
            .or_else(|| std::str::from_utf8(&rest[..rest.len().min(3)]).ok())
            .or_else(|| std::str::from_utf8(&rest[..rest.len().min(2)]).ok())
            .or_else(|| std::str::from_utf8(&rest[..rest.len().min(1)]).ok())
            .and_then(|s| s.chars().next())
        else {
            return rest;
        };
        if c == '\u{feff}' || c.is_whitespace() || c.is_control() {
            rest = &rest[c.len_utf8()..];
        } else {
            return rest;
        }
    }
}

/// Values of form fields whose name reads as `lenient` (`&` and `;` both separate fields).
fn form_values(body: &[u8], lenient: &str) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split(['&', ';'])
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (lenient_name(key) == lenient).then(|| {
                String::from_utf8_lossy(&crate::edge::target::percent_decode(
                    value.replace('+', " ").as_bytes(),
                ))
                .into_owned()
            })
        })
        .collect()
}

/// Values of a JSON object's top-level keys that read as `lenient`, duplicates included; `Err`
/// when the body is not strict JSON.
fn json_values(body: &[u8], lenient: &str) -> Result<Vec<String>, BadRequest> {
    /// A JSON document's top level, keeping every key of an object (duplicates too).
    struct TopLevel(Vec<(String, serde_json::Value)>);
    impl<'de> serde::Deserialize<'de> for TopLevel {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = TopLevel;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON document")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<TopLevel, A::Error> {
                    let mut entries = Vec::new();
                    while let Some(entry) = map.next_entry()? {
                        entries.push(entry);
                    }
                    Ok(TopLevel(entries))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(
                    self,
                    mut seq: A,
                ) -> Result<TopLevel, A::Error> {
                    while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                    Ok(TopLevel(Vec::new()))
                }
                fn visit_str<E>(self, _: &str) -> Result<TopLevel, E> {
                    Ok(TopLevel(Vec::new()))
                }
                fn visit_f64<E>(self, _: f64) -> Result<TopLevel, E> {
                    Ok(TopLevel(Vec::new()))
                }
                fn visit_i64<E>(self, _: i64) -> Result<TopLevel, E> {
                    Ok(TopLevel(Vec::new()))
                }
                fn visit_u64<E>(self, _: u64) -> Result<TopLevel, E> {
                    Ok(TopLevel(Vec::new()))
                }
                fn visit_bool<E>(self, _: bool) -> Result<TopLevel, E> {
                    Ok(TopLevel(Vec::new()))
                }
                fn visit_unit<E>(self) -> Result<TopLevel, E> {
                    Ok(TopLevel(Vec::new()))
                }
            }
            d.deserialize_any(Visit)
        }
    }
    let TopLevel(entries) = serde_json::from_slice(body).map_err(|_| BadRequest::MalformedBody)?;
    Ok(entries
        .into_iter()
        .filter(|(key, _)| lenient_name(key) == lenient)
        .map(|(_, value)| match value {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        })
        .collect())
}

/// Why a query parameter cannot be read as given once.
enum Spelling {
    /// Given twice.
    Repeated,
    /// Beside another spelling of its name a lenient backend would read as it.
    Other,
}

/// The value of the query parameter `name`, if given: once, and with no other spelling of the
/// name beside it (`QTY`, `%71ty`, `qty[]`). `;` separates parameters too for some parsers
/// (CGI, older Python and Perl).
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Result<Option<&'q str>, Spelling> {
    let mut found = None;
    let lenient = name.to_ascii_lowercase();
    for pair in query.unwrap_or("").split(['&', ';']) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == name {
            if found.is_some() {
                return Err(Spelling::Repeated);
            }
            found = Some(value);
        } else if lenient_name(key) == lenient {
            return Err(Spelling::Other);
        }
    }
    Ok(found)
}

/// Most digits a quantity may have (keeps parsing trivially overflow-free).
const MAX_QUANTITY_DIGITS: usize = 9;

/// The requested quantity from the query string: absent means 1; otherwise plain decimal
/// digits, given once, between 1 and `max`. A parameter a lenient backend would read as the
/// quantity under another spelling (`QTY`, `%71ty`, `qty[]`) is refused, never ignored.
pub fn quantity(query: Option<&str>, name: &str, max: NonZeroU32) -> Result<u32, BadRequest> {
    let found = query_param(query, name).map_err(|s| match s {
        Spelling::Repeated => BadRequest::QuantityRepeated,
        Spelling::Other => BadRequest::QuantityAmbiguous,
    })?;
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

/// The variant the query string names under `name`: `None` if absent; otherwise given once, as
/// plain id characters (letters, digits, `-`, `_`). Given twice, under another spelling of the
/// name a lenient backend would read (`VARIANT`, `%76ariant`, `variant[]`), or in a spelling of
/// its own (percent-encoded, empty): refused, never guessed.
pub fn variant<'q>(query: Option<&'q str>, name: &str) -> Result<Option<&'q str>, BadRequest> {
    let found = query_param(query, name).map_err(|_| BadRequest::VariantAmbiguous)?;
    match found {
        None => Ok(None),
        Some(v) if plain_variant(v) => Ok(Some(v)),
        Some(_) => Err(BadRequest::VariantAmbiguous),
    }
}

/// Whether `v` could be a configured variant id as sent (`crate::config::variant_id`).
pub fn plain_variant(v: &str) -> bool {
    crate::config::variant_id(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn variant_rules() {
        let v = |q: &'static str| variant(Some(q), "variant");
        assert_eq!(variant(None, "variant"), Ok(None));
        assert_eq!(v("qty=1"), Ok(None));
        assert_eq!(v("variant=42&qty=1"), Ok(Some("42")));
        assert_eq!(v("variant=EU_42-b"), Ok(Some("EU_42-b")));
        assert_eq!(v("variant=40.5"), Ok(Some("40.5")), "a half size");
        for bad in [
            "variant=42&variant=42",
            "variant=42&VARIANT=43",
            "variant=42&%76ariant=43",
            "variant=42&variant[]=43",
            "variant=4%32",
            "variant=",
            "variant",
            "variant=42 ",
            "variant=..",
            "variant=.5",
            "variant=40..5",
        ] {
            assert_eq!(v(bad), Err(BadRequest::VariantAmbiguous), "{bad}");
        }
    }

    #[test]
    fn quantity_rules() {
        let max = NonZeroU32::new(3).unwrap();
        let q = |s: Option<&str>| quantity(s, "qty", max);
        assert_eq!(q(None), Ok(1));
        assert_eq!(q(Some("a=1")), Ok(1));
        assert_eq!(q(Some("qty=2")), Ok(2));
        assert_eq!(q(Some("x=9&qty=03")), Ok(3));
        assert_eq!(q(Some("x=1;qty=2")), Ok(2), "`;` separates too");
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
        for lookalike in [
            "QTY=5",
            "qty=1&%71ty=5",
            "qty[]=5",
            "Qty%5B%5D=2",
            "qty[0]=5",
            "qty%5B0%5D=5",
            "qty%00=5",
            "qty=1;QTY=5",
        ] {
            assert_eq!(
                q(Some(lookalike)),
                Err(BadRequest::QuantityAmbiguous),
                "{lookalike}"
            );
        }
    }

    #[test]
    fn a_body_quantity_is_read_as_a_backend_would() {
        let typed = |types: &[&str], body: &[u8]| {
            let mut h = HeaderMap::new();
            for t in types {
                h.append(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_str(t).unwrap(),
                );
            }
            body_quantity(&h, body, "qty")
        };
        let form = |b: &[u8]| typed(&["application/x-www-form-urlencoded; charset=utf-8"], b);
        let json = |b: &[u8]| typed(&["application/json"], b);
        let plain = |b: &[u8]| typed(&["text/plain"], b);
        assert_eq!(form(b"item=7&qty=2"), Ok(Some(2)));
        assert_eq!(form(b"QTY=2&qty=2"), Ok(Some(2)));
        assert_eq!(
            form(b"qty=2&qty%5B%5D=5"),
            Err(BadRequest::QuantityAmbiguous)
        );
        assert_eq!(form(b"note=hi"), Ok(None));
        assert_eq!(json(br#"{"qty": 3}"#), Ok(Some(3)));
        assert_eq!(json(br#"{"Qty": "3"}"#), Ok(Some(3)));
        assert_eq!(json(br#"{"qty": 1.5}"#), Err(BadRequest::QuantityAmbiguous));
        assert_eq!(json(b"not json"), Err(BadRequest::MalformedBody));
        assert_eq!(plain(b"qty=9"), Ok(None));
        assert_eq!(typed(&[], b"qty=9"), Ok(None));
        // Whatever the type says, a body that looks like JSON is read as JSON, after what
        // lenient readers skip (byte-order marks, Unicode whitespace, control characters).
        assert_eq!(plain(br#"{"qty":5}"#), Ok(Some(5)));
        assert_eq!(typed(&[], br#" {"qty":5}"#), Ok(Some(5)));
        for lead in [
            &b"\xEF\xBB\xBF"[..],
            b"\xEF\xBB\xBF\xEF\xBB\xBF",
            b"\x0b",
            b"\x1c",
            b"\xC2\xA0",
        ] {
            let body = [lead, &br#"{"qty": 5}"#[..]].concat();
            assert_eq!(plain(&body), Ok(Some(5)), "{lead:?}");
        }
        assert_eq!(json(br#"{"qty": NaN}"#), Err(BadRequest::MalformedBody));
        assert_eq!(
            plain(br#"{"qty": Infinity}"#),
            Err(BadRequest::MalformedBody)
        );
        assert_eq!(
            json(br#"{"qty": 1, "qty": 5}"#),
            Err(BadRequest::QuantityAmbiguous),
            "duplicate keys"
        );
        assert_eq!(json(br#"[{"qty": 5}]"#), Ok(None));
        assert_eq!(form(b"x=1;qty=5"), Ok(Some(5)));
        assert_eq!(form(b"qty%5B0%5D=5"), Ok(Some(5)));
        // Multipart parsers disagree too much to read one as every backend would: refused.
        let part = b"--XyZ\r\nContent-Disposition: form-data; name=\"qty\"\r\n\r\n5\r\n--XyZ--\r\n";
        assert_eq!(
            typed(&["multipart/form-data; boundary=XyZ"], part),
            Err(BadRequest::MalformedBody)
        );
        // The body's type named twice, or as a list: parsers keep different ones.
        assert_eq!(
            typed(
                &["text/plain", "application/x-www-form-urlencoded"],
                b"qty=5"
            ),
            Err(BadRequest::MalformedBody)
        );
        assert_eq!(
            typed(&["text/plain, application/x-www-form-urlencoded"], b"qty=5"),
            Err(BadRequest::MalformedBody)
        );
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
