//! The deployment files, checked by the tools that read them: `deploy/flashgate.service` by
//! `systemd-analyze verify` (no warning) and `systemd-analyze security` (its sandbox), the
//! `Dockerfile` by hadolint and by its shape (multi-stage, a user that is not root, and every
//! binary it copies one that Cargo builds). scripts/ensure-deps installs both tools; a test
//! whose tool is missing fails in CI and says so loudly elsewhere.

#[path = "support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::*;

/// A tool, from PATH or the venv scripts/ensure-deps puts hadolint in; `None` (said loudly, and
/// a failure in CI) when it is not installed.
fn tool(name: &str) -> Option<PathBuf> {
    let tools = std::env::var_os("FLASHGATE_TOOLS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/flashgate-tools"))
        });
    let in_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let found = in_path
        .into_iter()
        .chain(tools.map(|t| t.join("bin")))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{name} is not installed: scripts/ensure-deps installs it"
        );
        eprintln!("SKIPPED: {name} is not installed here (scripts/ensure-deps installs it)");
    }
    found
}

fn run(what: &str, cmd: &mut Command) -> (bool, String, String) {
    let out = run_bounded(what, cmd, Duration::from_secs(120));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The unit, with its binary where this build put it (verify checks the binary exists).
fn unit_here() -> (tempfile::TempDir, PathBuf) {
    let text = std::fs::read_to_string(repo_path("deploy/flashgate.service")).unwrap();
    assert!(
        text.contains("ExecStart=/usr/local/bin/flashgate serve --config "),
        "the unit runs the installed binary"
    );
    let here = text.replace("/usr/local/bin/flashgate", env!("CARGO_BIN_EXE_flashgate"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flashgate.service");
    std::fs::write(&path, here).unwrap();
    (dir, path)
}

#[test]
fn the_systemd_unit_verifies_without_a_warning() {
    let Some(analyze) = tool("systemd-analyze") else {
        return;
    };
    let (_dir, unit) = unit_here();
    let (ok, out, err) = run(
        "systemd-analyze verify",
        Command::new(&analyze).arg("verify").arg(&unit),
    );
    assert!(ok && err.trim().is_empty(), "verify: {out}{err}");
}

#[test]
fn the_systemd_unit_is_sandboxed() {
    let text = std::fs::read_to_string(repo_path("deploy/flashgate.service")).unwrap();
    for line in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "DynamicUser=yes",
        "CapabilityBoundingSet=",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter=@system-service",
        "MemoryDenyWriteExecute=yes",
    ] {
        assert!(
            text.lines().any(|l| l.trim() == line),
            "the unit lacks {line}"
        );
    }
    let Some(analyze) = tool("systemd-analyze") else {
        return;
    };
    let (_dir, unit) = unit_here();
    let (_, out, err) = run(
        "systemd-analyze security",
        Command::new(&analyze)
            .args(["security", "--offline=true", "--no-pager"])
            .arg(&unit),
    );
    // "→ Overall exposure level for flashgate.service: 1.2 OK"; 10 is unsandboxed.
    let exposure: f64 = out
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for flashgate.service: "))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level: {out}{err}"));
    assert!(exposure <= 2.0, "exposure {exposure}: {out}");
}

/// The binaries Cargo builds: the package's (src/main.rs) and each of src/bin/.
fn cargo_bins() -> Vec<String> {
    let mut bins = vec!["flashgate".to_owned()];
    for entry in std::fs::read_dir(repo_path("src/bin")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            bins.push(path.file_stem().unwrap().to_string_lossy().into_owned());
        }
    }
    bins
}

#[test]
fn the_dockerfile_is_multi_stage_non_root_and_copies_real_binaries() {
    let text = std::fs::read_to_string(repo_path("Dockerfile")).unwrap();
    // Instructions, continuation lines joined, comments dropped.
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let instructions: Vec<(&str, &str)> = joined
        .lines()
        .filter_map(|l| l.trim().split_once(char::is_whitespace))
        .collect();
    let froms: Vec<&str> = instructions
        .iter()
        .filter(|(i, _)| i.eq_ignore_ascii_case("FROM"))
        .map(|(_, a)| a.trim())
        .collect();
    assert!(froms.len() >= 2, "not multi-stage: {froms:?}");
    let stage = froms[0]
        .rsplit_once(" AS ")
        .map(|(_, name)| name.trim())
        .expect("the build stage is named");
    assert!(froms[0].starts_with("rust:"), "{froms:?}");
    assert!(
        froms.last().unwrap().starts_with("debian:") && froms.last().unwrap().contains("-slim")
    );
    // The last stage runs as a user that is not root.
    let last_from = instructions
        .iter()
        .rposition(|(i, _)| i.eq_ignore_ascii_case("FROM"))
        .unwrap();
    let user = instructions[last_from..]
        .iter()
        .rev()
        .find(|(i, _)| i.eq_ignore_ascii_case("USER"))
        .map(|(_, u)| u.trim())
        .expect("the runtime stage sets USER");
    let name = user.split(':').next().unwrap();
    assert!(name != "root" && name != "0", "runs as {user}");
    // Every binary copied from the build is one Cargo builds, and the build names it.
    let bins = cargo_bins();
    let build = instructions
        .iter()
        .find(|(i, a)| i.eq_ignore_ascii_case("RUN") && a.contains("cargo build"))
        .map(|(_, a)| *a)
        .expect("the build stage runs cargo build");
    assert!(
        build.contains("--release") && build.contains("--locked"),
        "{build}"
    );
    let copied: Vec<&str> = instructions
        .iter()
        .filter(|(i, a)| {
            i.eq_ignore_ascii_case("COPY") && a.starts_with(&format!("--from={stage}"))
        })
        .filter_map(|(_, a)| a.split_whitespace().nth(1))
        .collect();
    assert!(!copied.is_empty());
    for source in &copied {
        let bin = source
            .strip_prefix("/src/target/release/")
            .unwrap_or_else(|| panic!("{source} is not a release binary"));
        assert!(
            bins.iter().any(|b| b == bin),
            "{bin} is no Cargo binary ({bins:?})"
        );
        assert!(
            build.contains(&format!("--bin {bin}")),
            "{bin} is not built: {build}"
        );
    }
    let entry = instructions
        .iter()
        .find(|(i, _)| i.eq_ignore_ascii_case("ENTRYPOINT"))
        .map(|(_, a)| *a)
        .expect("an entrypoint");
    assert!(entry.contains("/usr/local/bin/flashgate"), "{entry}");
}

#[test]
fn hadolint_passes_the_dockerfile() {
    let Some(hadolint) = tool("hadolint") else {
        return;
    };
    let (ok, out, err) = run(
        "hadolint",
        Command::new(&hadolint)
            .arg("--no-color")
            .arg(repo_path("Dockerfile")),
    );
    assert!(ok, "hadolint: {out}{err}");
}
