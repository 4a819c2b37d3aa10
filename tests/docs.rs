//! The documentation holds: every relative link in the README, docs/ and the other top-level
//! pages resolves (its file exists, its `#anchor` is a heading there); every `flashgate` command
//! line shown names a subcommand and flags the binary has, and those that run offline are run;
//! the configuration reference lists exactly the keys of `flashgate schema`; the README stays a
//! map (at most 250 lines); and docs/gateway.schema.json is what the binary prints.

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::*;

/// The Markdown pages: the top level's and docs/'s.
fn pages() -> Vec<PathBuf> {
    let mut pages = Vec::new();
    for dir in [repo_path("."), repo_path("docs")] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    assert!(pages.len() >= 8, "{pages:?}");
    pages
}

/// A page's lines outside fenced code blocks (blank inside them, so line numbers hold), and the
/// lines inside them, with the fence's info string.
fn split_code(text: &str) -> (Vec<String>, Vec<(String, String)>) {
    let (mut prose, mut code) = (Vec::new(), Vec::new());
    let mut fence: Option<(String, String)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker: String = trimmed.chars().take_while(|c| *c == '`').collect();
        match &fence {
            Some((open, _)) if marker.len() >= open.len() && marker.len() >= 3 => {
                fence = None;
                prose.push(String::new());
            }
            Some((_, info)) => {
                code.push((info.clone(), line.to_owned()));
                prose.push(String::new());
            }
            None if marker.len() >= 3 => {
                fence = Some((marker.clone(), trimmed[marker.len()..].trim().to_owned()));
                prose.push(String::new());
            }
            None => prose.push(line.to_owned()),
        }
    }
    (prose, code)
}

/// GitHub's anchor of a heading: inline markup dropped, lower case, every character but a
/// letter, digit, space, '-' or '_' removed, spaces made '-'.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](target) -> text
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        text.push_str(rest[..open].trim_end_matches('!'));
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.replace('`', "")
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(path: &Path) -> BTreeSet<String> {
    let (prose, _) = split_code(&std::fs::read_to_string(path).unwrap());
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for line in prose {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#').trim());
        let n = seen.entry(base.clone()).or_default();
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The link targets on a line of prose (inline code removed): `](target)` and `[x]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let mut plain = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            plain.push_str(part);
        }
    }
    let mut out = Vec::new();
    let mut rest = plain.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find([')', ' ']).unwrap_or(after.len());
        out.push(after[..end].to_owned());
        rest = &after[end..];
    }
    let t = plain.trim_start();
    if t.starts_with('[') {
        if let Some((_, target)) = t.split_once("]: ") {
            out.push(target.trim().to_owned());
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let (prose, _) = split_code(&std::fs::read_to_string(&page).unwrap());
        for (no, line) in prose.iter().enumerate() {
            for target in link_targets(line) {
                let scheme = target.split_once(':').is_some_and(|(s, _)| {
                    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '+')
                });
                if scheme || target.is_empty() {
                    continue;
                }
                checked += 1;
                let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let dest = if file.is_empty() {
                    page.clone()
                } else {
                    page.parent().unwrap().join(file)
                };
                let at = format!("{}:{}: {target}", page.display(), no + 1);
                if !dest.exists() {
                    broken.push(format!("{at}: no such file"));
                } else if !anchor.is_empty() && !anchors(&dest).contains(anchor) {
                    broken.push(format!("{at}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    assert!(checked >= 100, "only {checked} links");
}

#[test]
fn the_readme_is_a_map_and_docs_has_a_page_per_reader() {
    let readme = std::fs::read_to_string(repo_path("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines");
    for page in [
        "getting-started.md",
        "buyers-and-frontends.md",
        "backends.md",
        "operating.md",
        "configuration.md",
        "architecture.md",
        "sneaker-drop.md",
    ] {
        assert!(repo_path("docs").join(page).exists(), "docs/{page}");
        assert!(
            readme.contains(&format!("docs/{page}")),
            "the README's map lacks docs/{page}"
        );
    }
    // The two set-up commands CI and a new machine run.
    assert!(readme.contains("scripts/run-gateway") && readme.contains("scripts/test"));
}

/// Every `flashgate …` command line the docs show (in code blocks, and in inline code), as
/// (page, line).
fn command_lines() -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        let (prose, code) = split_code(&text);
        for (info, line) in code {
            let line = line.trim().trim_start_matches("$ ");
            if line.starts_with("flashgate ") && info != "text" {
                out.push((name.clone(), line.to_owned(), true));
            }
        }
        for line in prose {
            for (i, part) in line.split('`').enumerate() {
                if i % 2 == 1 && part.starts_with("flashgate ") {
                    out.push((name.clone(), part.to_owned(), false));
                }
            }
        }
    }
    out
}

fn flashgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flashgate"))
}

/// Every command shown names a subcommand the binary has and only flags that subcommand takes;
/// those in code blocks that need neither Redis nor a running gateway (`check` without
/// `--live`, `schema`) are run as written, from a directory holding a copy of gateway.yaml.
#[test]
fn every_command_shown_exists_and_the_offline_ones_run() {
    let lines = command_lines();
    assert!(lines.len() >= 10, "{lines:?}");
    let mut helps: HashMap<String, String> = HashMap::new();
    let mut ran = 0;
    for (page, line, in_block) in &lines {
        let at = format!("{page}: {line}");
        let words: Vec<&str> = line.split_whitespace().collect();
        // A command's own subcommand (`flashgate access load`) is read with it.
        let nested = matches!(words[1], "access") && words.len() > 2;
        let sub = if nested {
            words[1..3].join(" ")
        } else {
            words[1].to_owned()
        };
        let sub = sub.as_str();
        let help = helps.entry(sub.to_owned()).or_insert_with(|| {
            let mut args: Vec<&str> = sub.split(' ').collect();
            args.push("--help");
            let out = run_bounded(
                "flashgate help",
                flashgate().args(args),
                Duration::from_secs(30),
            );
            assert!(out.status.success(), "{at}: no subcommand {sub}");
            String::from_utf8(out.stdout).unwrap()
        });
        for flag in words.iter().filter(|w| w.starts_with("--")) {
            let flag = flag.trim_matches(|c: char| c == '[' || c == ']' || c == '`');
            let flag = flag.split('=').next().unwrap();
            assert!(help.contains(flag), "{at}: {sub} takes no {flag}");
        }
        // A full command line (one with flags) carries every flag the subcommand requires (its
        // usage line's flags outside brackets); a bare `flashgate reconcile` names the command.
        if words.iter().any(|w| w.starts_with("--")) {
            let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
            let mut depth = 0;
            let outside: String = usage
                .chars()
                .filter(|c| {
                    depth += match c {
                        '[' => 1,
                        ']' => -1,
                        _ => 0,
                    };
                    depth == 0 && *c != ']'
                })
                .collect();
            for required in outside.split_whitespace().filter(|w| w.starts_with("--")) {
                assert!(words.contains(&required), "{at}: {sub} requires {required}");
            }
        }
        let offline = matches!(sub, "check" | "schema") && !line.contains("--live");
        let placeholder = line.contains("FILE") || line.contains('<') || line.contains("ID");
        if *in_block && offline && !placeholder {
            let dir = tempfile::tempdir().unwrap();
            std::fs::copy(repo_path("gateway.yaml"), dir.path().join("gateway.yaml")).unwrap();
            let bin = PathBuf::from(env!("CARGO_BIN_EXE_flashgate"));
            let path = format!(
                "{}:{}",
                bin.parent().unwrap().display(),
                std::env::var("PATH").unwrap_or_default()
            );
            let out = run_bounded(
                "a command from the docs",
                Command::new("sh")
                    .args(["-c", line])
                    .current_dir(dir.path())
                    .env("PATH", path),
                Duration::from_secs(30),
            );
            assert!(
                out.status.success(),
                "{at}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if let Some((_, file)) = line.split_once('>') {
                let written = std::fs::read_to_string(dir.path().join(file.trim())).unwrap();
                let _: serde_json::Value = serde_json::from_str(&written).unwrap();
            }
            ran += 1;
        }
    }
    assert!(ran >= 2, "ran {ran} of {lines:?}");
}

/// Every key path of a schema (`a.b`, list items as `a[].b`).
fn key_paths(schema: &serde_json::Value) -> BTreeSet<String> {
    fn walk(
        node: &serde_json::Value,
        root: &serde_json::Value,
        at: &str,
        out: &mut BTreeSet<String>,
    ) {
        if let Some(r) = node.get("$ref").and_then(|r| r.as_str()) {
            let name = r.trim_start_matches("#/$defs/");
            return walk(&root["$defs"][name], root, at, out);
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            for alt in node
                .get(key)
                .and_then(|a| a.as_array())
                .into_iter()
                .flatten()
            {
                walk(alt, root, at, out);
            }
        }
        if let Some(items) = node.get("items") {
            walk(items, root, &format!("{at}[]"), out);
        }
        for (key, prop) in node
            .get("properties")
            .and_then(|p| p.as_object())
            .into_iter()
            .flatten()
        {
            let path = if at.is_empty() {
                key.clone()
            } else {
                format!("{at}.{key}")
            };
            out.insert(path.clone());
            walk(prop, root, &path, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(schema, schema, "", &mut out);
    out
}

/// The configuration reference (docs/configuration.md) lists exactly the schema's keys, one
/// table row each (`| \`key\` | …`, as the schema's descriptions: from the same doc comments,
/// the rows say more where an SRE needs it): a key added to the types without a row, or a row naming a
/// key the gateway no longer reads, fails here.
#[test]
fn the_configuration_reference_lists_exactly_the_schemas_keys() {
    let schema: serde_json::Value = serde_json::from_str(&printed_schema_text()).unwrap();
    let keys = key_paths(&schema);
    let doc = std::fs::read_to_string(repo_path("docs/configuration.md")).unwrap();
    let rows: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        // A list's row may name it by its items (`activities[]`).
        .map(|(k, _)| k.trim_end_matches("[]").to_owned())
        .collect();
    let undocumented: Vec<_> = keys.difference(&rows).collect();
    let unknown: Vec<_> = rows.difference(&keys).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "keys without a row: {undocumented:#?}\nrows without a key: {unknown:#?}"
    );
    assert!(keys.len() >= 100, "{} keys", keys.len());
}

/// docs/gateway.schema.json (what gateway.yaml's first line points an editor at) is what the
/// binary prints. `FLASHGATE_UPDATE_SCHEMA=1` writes it.
#[test]
fn the_committed_schema_is_the_binarys() {
    let printed = printed_schema_text();
    let path = repo_path("docs/gateway.schema.json");
    if std::env::var_os("FLASHGATE_UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &printed).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == printed,
        "docs/gateway.schema.json differs from `flashgate schema`: run the tests with \
         FLASHGATE_UPDATE_SCHEMA=1"
    );
    let gateway = std::fs::read_to_string(repo_path("gateway.yaml")).unwrap();
    assert!(
        gateway.starts_with("# yaml-language-server: $schema=docs/gateway.schema.json\n"),
        "gateway.yaml names its schema on its first line"
    );
}

/// docs/operating.md counts the dashboard's panels and names every alert rule, as shipped.
#[test]
fn the_operating_guide_counts_the_panels_and_names_every_alert() {
    let guide = std::fs::read_to_string(repo_path("docs/operating.md")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("grafana/flashgate-dashboard.json")).unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().unwrap().len();
    let said = format!("`grafana/flashgate-dashboard.json`: {panels} panels");
    assert!(guide.contains(&said), "operating.md should say {said:?}");
    let rules = std::fs::read_to_string(repo_path("prometheus/flashgate-alerts.yml")).unwrap();
    let names: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(names.len() >= 15, "{names:?}");
    let said = format!("`prometheus/flashgate-alerts.yml`, {} rules", names.len());
    assert!(guide.contains(&said), "operating.md should say {said:?}");
    for name in names {
        assert!(
            guide.contains(&format!("`{name}`")),
            "{name} is not in operating.md"
        );
    }
}

/// docs/sneaker-drop.md's worked configuration is valid as written (secrets set).
#[test]
fn the_sneaker_drops_configuration_is_valid() {
    let page = std::fs::read_to_string(repo_path("docs/sneaker-drop.md")).unwrap();
    let yaml = page
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a yaml block");
    let secrets = |_: &str| Some("s".repeat(32));
    let settings = flashgate::config::Settings::from_yaml(yaml, &repo_path("docs"), &secrets)
        .unwrap_or_else(|e| panic!("docs/sneaker-drop.md: {e}"));
    let drop = settings.activities.get("runner-drop").expect("the drop");
    assert_eq!(drop.variants.len(), 3);
    assert!(drop.queue.is_some());
}
