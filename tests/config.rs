//! Configuration: the contract example works unchanged, every bad configuration (one table of
//! patches onto the example, `support/bad_yaml.rs`) is refused with a message naming the key,
//! and `flashgate check` says so on the command line.

#[path = "support/bad_yaml.rs"]
mod bad_yaml;
#[path = "support/mod.rs"]
mod support;

use flashgate::Settings;
use std::path::Path;
use support::*;

fn secrets(name: &str) -> Option<String> {
    match name {
        "FLASHGATE_SIGNING_SECRET" => Some(SIGNING_SECRET.to_owned()),
        "FLASHGATE_ADMIN_TOKEN" => Some(ADMIN_TOKEN.to_owned()),
        "FLASHGATE_EMPTY_SECRET" => Some(String::new()),
        _ => None,
    }
}

fn load(path: &Path) -> Result<Settings, flashgate::ConfigError> {
    let text = std::fs::read_to_string(path).unwrap();
    Settings::from_yaml(&text, path.parent().unwrap(), &secrets)
}

/// The contract's example with one bad case's patch applied, as YAML.
fn patched(name: &str) -> String {
    let case = bad_yaml::BAD
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no bad case {name}"));
    let text = std::fs::read_to_string(repo_path("tests/fixtures/contract.example.yaml")).unwrap();
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    for (path, value) in case.patch {
        let (parent, last) = path.rsplit_once('.').unwrap_or(("", path));
        let mut at = &mut doc;
        for key in parent.split('.').filter(|k| !k.is_empty()) {
            at = match key.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[key],
            };
        }
        match (value, at) {
            (None, serde_yaml::Value::Mapping(m)) => {
                m.remove(last);
            }
            (Some(v), serde_yaml::Value::Sequence(items)) => {
                items[last.parse::<usize>().unwrap()] = serde_yaml::from_str(v).unwrap();
            }
            (Some(v), at) => at[last] = serde_yaml::from_str(v).unwrap(),
            (None, _) => panic!("{name}: {path} is not in a mapping"),
        }
    }
    serde_yaml::to_string(&doc).unwrap()
}

fn load_bad(name: &str) -> Result<Settings, flashgate::ConfigError> {
    Settings::from_yaml(&patched(name), &repo_path("tests/fixtures"), &secrets)
}

#[test]
fn the_contract_example_and_the_repo_default_are_valid() {
    for file in [
        "tests/fixtures/contract.example.yaml",
        "gateway.yaml",
        "tests/fixtures/eddsa.yaml",
        "tests/fixtures/security.yaml",
        "tests/fixtures/cluster.yaml",
    ] {
        let settings = load(&repo_path(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let act = settings.activities.get("1001").expect("activity 1001");
        assert_eq!(
            (act.stock, act.version, act.per_user_limit.get()),
            (100, 1, 1)
        );
        assert_eq!(settings.redis.timeout.as_millis(), 50);
        assert_eq!(settings.signing.ttl.as_secs(), 900);
    }
}

#[test]
fn the_shipped_contract_file_is_the_one_tested() {
    // ../shared/contract is the source of truth where it exists (it does not in every checkout).
    let shared = repo_path("../shared/contract/gateway.example.yaml");
    if let Ok(original) = std::fs::read_to_string(shared) {
        let copy =
            std::fs::read_to_string(repo_path("tests/fixtures/contract.example.yaml")).unwrap();
        assert_eq!(
            original, copy,
            "tests/fixtures/contract.example.yaml drifted from the contract"
        );
    }
}

#[test]
fn every_bad_configuration_is_refused_with_its_message() {
    for case in bad_yaml::BAD {
        match load_bad(case.name) {
            Ok(_) => panic!("{} was accepted", case.name),
            Err(e) => assert!(
                e.to_string().contains(case.expect),
                "{}: message {:?} does not contain {:?}",
                case.name,
                e.to_string(),
                case.expect
            ),
        }
    }
    assert!(
        bad_yaml::BAD.len() >= 97,
        "only {} cases",
        bad_yaml::BAD.len()
    );
    // YAML that does not parse names the line.
    let err = Settings::from_yaml("server: [\n  listen: x\n", Path::new("."), &secrets)
        .unwrap_err()
        .to_string();
    assert!(err.contains("line"), "{err}");
}

#[test]
fn the_default_grace_period_is_the_one_the_readme_states() {
    // gateway.yaml's longest trip is 8.05 s: rounded up, plus a second (docs/operating.md, "Shutdown").
    let settings = load(&repo_path("gateway.yaml")).unwrap();
    assert_eq!(settings.server.grace_period.as_secs(), 10);
    assert_eq!(settings.server.longest_sale_trip.as_millis(), 8050);
}

#[test]
fn eddsa_keys_are_published_for_rotation() {
    let settings = load(&repo_path("tests/fixtures/eddsa-rotation.yaml")).unwrap();
    let kids: Vec<&str> = settings
        .signing
        .published_keys
        .iter()
        .map(|k| k.kid.as_str())
        .collect();
    assert_eq!(
        kids,
        ["k1", "k0"],
        "the active key first, then the previous one"
    );
    let hs = load(&repo_path("tests/fixtures/contract.example.yaml")).unwrap();
    assert!(
        hs.signing.published_keys.is_empty(),
        "HS256 secrets are never published"
    );
}

#[test]
fn parser_errors_carry_the_line() {
    let err = load_bad("unknown-key").unwrap_err().to_string();
    assert!(
        err.contains("activities[id=1001]") && err.contains("line"),
        "{err}"
    );
}

#[test]
fn optional_sections_have_defaults() {
    let text = std::fs::read_to_string(repo_path("tests/fixtures/contract.example.yaml")).unwrap();
    let minimal: String =
        text.split("\nrate_limits:").next().unwrap().to_owned() + "\nactivities: []\n";
    let settings = Settings::from_yaml(&minimal, Path::new("."), &secrets).unwrap();
    assert!(settings.rate_limits.per_user.is_none());
    assert!(settings.rate_limits.evict_interval.as_millis() > 0);
    assert_eq!(settings.sold_out_cache.ttl.as_millis(), 1000);
    assert!(settings.sale_routes.is_empty());
}

#[test]
fn check_command_exit_codes_and_messages() {
    let env = [
        ("FLASHGATE_SIGNING_SECRET", "s"),
        ("FLASHGATE_ADMIN_TOKEN", "t"),
    ];
    let good = repo_path("tests/fixtures/contract.example.yaml");
    let (code, out, _) = run_cli(&["check", "--config", good.to_str().unwrap()], &env);
    assert_eq!(code, 0);
    assert!(out.contains("valid"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("zero-burst.yaml");
    std::fs::write(&bad, patched("zero-burst")).unwrap();
    let (code, _, err) = run_cli(&["check", "--config", bad.to_str().unwrap()], &env);
    assert_ne!(code, 0);
    assert!(
        err.contains("rate_limits.per_user.burst: must be at least 1"),
        "{err}"
    );

    // Without the secrets (a CI job checking the YAML): valid, each unset variable named in a
    // warning; the gateway itself still refuses to start without them.
    let (code, out, err) = run_cli(&["check", "--config", good.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("valid"), "{out}");
    for name in ["FLASHGATE_ADMIN_TOKEN", "FLASHGATE_SIGNING_SECRET"] {
        assert!(
            err.contains(&format!("warning: {name} is not set here")),
            "{err}"
        );
    }
    let (code, _, err) = run_cli(&["check", "--config", good.to_str().unwrap()], &env);
    assert_eq!(code, 0);
    assert!(!err.contains("warning"), "{err}");

    let (code, _, err) = run_cli(&["check", "--config", "/no/such/file.yaml"], &env);
    assert_ne!(code, 0);
    assert!(err.contains("cannot read"), "{err}");

    // A header identity anyone can set: refused, unless the operator opts out, loudly.
    let open = dir.path().join("open.yaml");
    std::fs::write(&open, patched("header-identity-anyone-can-set")).unwrap();
    let (code, _, err) = run_cli(&["check", "--config", open.to_str().unwrap()], &env);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("anyone can send any user id"), "{err}");
    let opted_out = format!(
        "{}\n",
        patched("header-identity-anyone-can-set")
            .replace("identity:\n", "identity:\n  header_from_any_peer: true\n")
    );
    std::fs::write(&open, opted_out).unwrap();
    let (code, out, err) = run_cli(&["check", "--config", open.to_str().unwrap()], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("valid"), "{out}");
    assert!(
        err.contains("warning: x-user-id is believed from any peer"),
        "{err}"
    );
}

#[test]
fn a_pages_dir_replaces_the_templates_it_holds_and_titles_are_kept() {
    let text = std::fs::read_to_string(repo_path("tests/fixtures/contract.example.yaml")).unwrap();
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    doc["pages"] = serde_yaml::from_str("{dir: pages, shop_name: Example Shop}").unwrap();
    doc["activities"][0]["title"] = "Phone X".into();
    doc["activities"][0]["success_url"] = "/orders/{jti}".into();
    let yaml = serde_yaml::to_string(&doc).unwrap();
    let settings = Settings::from_yaml(&yaml, &repo_path("tests/fixtures"), &secrets).unwrap();
    let pages = &settings.pages;
    assert_eq!(pages.shop_name, "Example Shop");
    assert_eq!(pages.shop_url, "/");
    assert!(pages.templates["refusal.html"].contains("{{ shop_name }}"));
    assert!(!pages.templates.contains_key("waiting.html"), "built in");
    let act = pages.activity("1001");
    assert_eq!(act.title.as_deref(), Some("Phone X"));
    assert_eq!(act.success_url.as_deref(), Some("/orders/{jti}"));
    assert_eq!(pages.activity("other").title, None);
}

/// `flashgate schema` as the binary prints it, and a validator of draft 2020-12 for it.
fn printed_schema() -> (serde_json::Value, jsonschema::Validator) {
    let schema: serde_json::Value = serde_json::from_str(&printed_schema_text()).unwrap();
    assert_eq!(
        schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
        "draft 2020-12"
    );
    let validator = jsonschema::draft202012::new(&schema).expect("a valid schema");
    (schema, validator)
}

fn yaml_as_json(text: &str) -> serde_json::Value {
    serde_yaml::from_str(text).unwrap()
}

/// Every YAML file in the repository the gateway accepts as its configuration validates against
/// the schema (gateway.yaml, the contract's example, every valid fixture), and every key of the
/// schema has its type and description.
#[test]
fn every_configuration_the_gateway_accepts_validates_against_the_schema() {
    let (schema, validator) = printed_schema();
    let mut accepted = Vec::new();
    let mut dirs = vec![repo_path(".")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && !name.starts_with("target") {
                    dirs.push(path);
                }
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                let text = std::fs::read_to_string(&path).unwrap();
                if Settings::from_yaml(&text, path.parent().unwrap(), &secrets).is_ok() {
                    let errors: Vec<String> = validator
                        .iter_errors(&yaml_as_json(&text))
                        .map(|e| format!("{} at {}", e, e.instance_path))
                        .collect();
                    assert!(errors.is_empty(), "{}: {errors:#?}", path.display());
                    accepted.push(name);
                }
            }
        }
    }
    for shipped in [
        "gateway.yaml",
        "contract.example.yaml",
        "eddsa.yaml",
        "cluster.yaml",
    ] {
        assert!(accepted.iter().any(|a| a == shipped), "{accepted:?}");
    }
    // Every key described, with a type (or a reference to one).
    let defs = schema["$defs"].as_object().unwrap();
    for (name, def) in defs
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .chain([("FileConfig", &schema)])
    {
        for (key, prop) in def["properties"].as_object().into_iter().flatten() {
            assert!(
                prop.get("description").is_some(),
                "{name}.{key} has no description"
            );
        }
    }
}

/// Every bad configuration whose refusal is a shape error (a key the gateway does not know, a
/// value of the wrong type, a required key missing, a value outside an enumeration) is refused
/// by the schema too: an editor shows it before `flashgate check` runs.
#[test]
fn the_schema_refuses_every_shape_error() {
    let (_, validator) = printed_schema();
    let shape = [
        "unknown field",
        "invalid type",
        "missing field",
        "unknown variant",
    ];
    let mut refused = 0;
    for case in bad_yaml::BAD {
        let message = load_bad(case.name).unwrap_err().to_string();
        if shape.iter().any(|s| message.contains(s)) {
            assert!(
                !validator.is_valid(&yaml_as_json(&patched(case.name))),
                "{}: the gateway refuses it ({message}), the schema accepts it",
                case.name
            );
            refused += 1;
        }
    }
    assert!(refused >= 15, "only {refused} shape errors");
    // A typo anywhere, as an SRE makes one at 9:58.
    let text = std::fs::read_to_string(repo_path("gateway.yaml")).unwrap();
    for (from, to) in [
        ("per_user_limit:", "per_user_limt:"),
        ("timeout_ms:", "timeout_msec:"),
        ("listen:", "lisen:"),
    ] {
        let typo = text.replacen(from, to, 1);
        assert_ne!(typo, text, "{from}");
        assert!(!validator.is_valid(&yaml_as_json(&typo)), "{to} accepted");
    }
}
