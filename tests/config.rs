//! Configuration: the contract example works unchanged, every bad-YAML fixture is refused with a
//! message naming the key, and `flashgate check` says so on the command line.

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
fn every_bad_fixture_is_refused_with_its_message() {
    let dir = repo_path("tests/fixtures/bad");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} lacks an '# expect: ' first line", path.display()));
        match load(&path) {
            Ok(_) => panic!("{} was accepted", path.display()),
            Err(e) => assert!(
                e.to_string().contains(expect),
                "{}: message {:?} does not contain {:?}",
                path.display(),
                e.to_string(),
                expect
            ),
        }
        count += 1;
    }
    assert!(count >= 55, "only {count} fixtures");
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
    let err = load(&repo_path("tests/fixtures/bad/unknown-key.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("activities[0]") && err.contains("line"),
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

    let bad = repo_path("tests/fixtures/bad/zero-burst.yaml");
    let (code, _, err) = run_cli(&["check", "--config", bad.to_str().unwrap()], &env);
    assert_ne!(code, 0);
    assert!(
        err.contains("rate_limits.per_user.burst: must be at least 1"),
        "{err}"
    );

    // Secrets are read from the environment: without them the example is refused, by name.
    let (code, _, err) = run_cli(&["check", "--config", good.to_str().unwrap()], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("FLASHGATE_ADMIN_TOKEN is not set"), "{err}");

    let (code, _, err) = run_cli(&["check", "--config", "/no/such/file.yaml"], &env);
    assert_ne!(code, 0);
    assert!(err.contains("cannot read"), "{err}");
}
