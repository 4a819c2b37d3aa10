//! Property-based fuzzing (proptest) of everything that reads untrusted input: request
//! classification and extraction, and configuration parsing. No input may panic; whatever is
//! accepted must satisfy the rules. Case counts keep each target to seconds in CI; raise them
//! with PROPTEST_CASES for a longer hunt.

use flashgate::client_policy::identity::Identifier;
use flashgate::config::{IdentitySettings, IdentitySource, Settings};
use flashgate::edge::route::{match_target, SaleRoute};
use flashgate::edge::target::Target;
use flashgate::purchase::request::{idempotency_key, quantity};
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use proptest::prelude::*;
use std::num::NonZeroU32;
use std::path::Path;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn secrets(name: &str) -> Option<String> {
    name.starts_with("FLASHGATE_").then(|| "secret".to_owned())
}

const CONTRACT: &str = include_str!("fixtures/contract.example.yaml");

proptest! {
    #![proptest_config(config(20000))]

    #[test]
    fn quantity_never_panics_and_accepts_only_valid_numbers(query in ".{0,40}", max in 1u32..50) {
        let max = NonZeroU32::new(max).unwrap();
        if let Ok(q) = quantity(Some(&query), "qty", max) {
            prop_assert!(q >= 1 && q <= max.get());
            let given: Vec<&str> = query.split('&').filter(|p| p.split('=').next() == Some("qty")).collect();
            prop_assert!(given.len() <= 1);
            if let Some(pair) = given.first() {
                let digits = pair.split_once('=').map(|(_, v)| v).unwrap_or("");
                prop_assert!(!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()));
            } else {
                prop_assert_eq!(q, 1);
            }
        }
    }

    #[test]
    fn quantity_from_structured_queries(qty in any::<u64>(), junk in "x[a-z]{0,4}=[0-9a-z]{0,5}") {
        let max = NonZeroU32::new(10).unwrap();
        let q = quantity(Some(&format!("{junk}&qty={qty}")), "qty", max);
        match qty {
            1..=10 => prop_assert_eq!(q, Ok(qty as u32)),
            _ => prop_assert!(q.is_err()),
        }
    }

    #[test]
    fn route_matching_never_panics(path in "(/[a-zA-Z0-9%{}._;\\\\-]{0,8}){0,6}/?", method in "[A-Za-z]{1,7}") {
        let route = SaleRoute::parse("POST", "/api/seckill/{activity}/buy", "qty").unwrap();
        let Ok(method) = Method::from_bytes(method.as_bytes()) else { return Ok(()) };
        let target = Target::of(&method, path.as_bytes());
        if let Some(activity) = match_target(&route, &target) {
            prop_assert!(method.as_str().eq_ignore_ascii_case("POST"));
            prop_assert!(!activity.is_empty());
            // The canonical form it is forwarded as reads the same again.
            let again = Target::of(&Method::POST, route.path_for(activity, None).as_bytes());
            prop_assert_eq!(match_target(&route, &again), Some(activity));
        }
    }

    #[test]
    fn any_request_target_normalises_without_panicking(raw in prop::collection::vec(any::<u8>(), 0..300)) {
        let target = Target::of(&Method::POST, &raw);
        if let Ok(segments) = &target.segments {
            prop_assert!(segments.iter().all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\', ';'])));
            // What another route is forwarded as reads exactly as the gateway read it (so the
            // backend routes what the gateway routed), and is a fixed point.
            let forwarded = target.forwarded_path().unwrap();
            let again = Target::of(&Method::POST, forwarded.as_bytes());
            prop_assert_eq!(again.segments.as_ref(), Ok(segments));
            prop_assert_eq!(again.forwarded_path().unwrap(), forwarded);
        }
    }

    #[test]
    fn identity_header_extraction_never_panics(values in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 0..3)) {
        let id = Identifier::new(&IdentitySettings {
            source: IdentitySource::Header(HeaderName::from_static("x-user-id")),
            trusted_proxies: vec![],
            strip_headers: vec![],
            header_from_any_peer: false,
            phase_headers: vec![],
        });
        let mut headers = HeaderMap::new();
        for v in &values {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                headers.append("x-user-id", v);
            }
        }
        if let Ok(user) = id.identify(&headers, None).map(|b| b.user) {
            prop_assert!(!user.is_empty() && user.len() <= 128);
            prop_assert!(user.bytes().all(|b| b.is_ascii_graphic() || b == b' '));
            prop_assert_eq!(headers.get_all("x-user-id").iter().count(), 1);
        }
        let _ = id.client_ip(&headers, Some("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn idempotency_keys_are_short_visible_ascii(value in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            headers.insert("idempotency-key", v);
        }
        if let Ok(Some(key)) = idempotency_key(&headers) {
            prop_assert!(!key.is_empty() && key.len() <= 128);
            prop_assert!(key.bytes().all(|b| b.is_ascii_graphic()));
        }
    }
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn arbitrary_yaml_never_panics(text in ".{0,400}") {
        let _ = Settings::from_yaml(&text, Path::new("."), &secrets);
    }

    #[test]
    fn mutated_contract_config_never_panics(edits in prop::collection::vec((any::<prop::sample::Index>(), ".{0,6}"), 1..4)) {
        let mut text = CONTRACT.to_owned();
        for (at, insert) in edits {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            let end = (i + insert.len()).min(text.len());
            let end = (end..=text.len()).find(|&e| text.is_char_boundary(e)).unwrap();
            text.replace_range(i..end, &insert);
        }
        let _ = Settings::from_yaml(&text, Path::new("tests/fixtures"), &secrets);
    }
}
