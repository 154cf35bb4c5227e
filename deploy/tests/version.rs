//! One version for everything released together: the workspace's (every
//! published crate's, MODULE LIST's `ver`: tests/operations.rs), the
//! versions on path dependencies, the image tags of deploy/kubernetes/, what
//! docs/install.md names, and CHANGELOG.md's latest release. And
//! `make release VERSION=x.y.z` (deploy/packaging/release.sh) moves them all.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::repo_path;

/// Every Cargo.toml of the workspace under `root`.
fn manifests(root: &Path) -> Vec<PathBuf> {
    let mut found = vec![root.join("Cargo.toml")];
    for dir in [root.to_path_buf(), root.join("tools")] {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let manifest = entry.path().join("Cargo.toml");
            if manifest.is_file() {
                found.push(manifest);
            }
        }
    }
    found
}

fn workspace_version(root: &Path) -> String {
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let line = cargo.lines().find(|l| l.starts_with("version = ")).expect("the workspace's version");
    line.trim_start_matches("version = ").trim_matches('"').to_string()
}

/// The text after each `marker` in `text`, up to the first character that
/// cannot be part of a version.
fn versions_after<'a>(text: &'a str, marker: &str) -> Vec<&'a str> {
    text.match_indices(marker)
        .map(|(i, _)| {
            let rest = &text[i + marker.len()..];
            let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
            rest[..end].trim_end_matches('.')
        })
        .collect()
}

/// Where the tree under `root` names another version than its workspace's.
fn disagreements(root: &Path) -> Vec<String> {
    let version = workspace_version(root);
    let mut wrong = Vec::new();
    let mut check = |place: String, found: &str| {
        if found != version {
            wrong.push(format!("{place}: {found}, not {version}"));
        }
    };
    for manifest in manifests(root) {
        let text = std::fs::read_to_string(&manifest).unwrap();
        let name = manifest.strip_prefix(root).unwrap().display().to_string();
        for line in text.lines().filter(|l| l.contains("path = ")) {
            for found in versions_after(line, "version = \"") {
                check(format!("{name}, a path dependency"), found);
            }
        }
        // A published package takes the workspace's version.
        if !text.contains("publish = false") && text.contains("[package]") && !text.contains("version.workspace = true")
        {
            check(format!("{name}: a published package without version.workspace = true"), "");
        }
    }
    for entry in std::fs::read_dir(root.join("deploy/kubernetes")).unwrap().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap();
        for image in ["redis-rl:", "rl-relay:"] {
            for found in versions_after(&text, &format!("image: {image}")) {
                check(format!("deploy/kubernetes: {image}"), found);
            }
        }
    }
    let install = std::fs::read_to_string(root.join("docs/install.md")).unwrap();
    for marker in ["redis-rl:", "redis-rl-valkey:", "rl-relay:", "-module-", "rl-relay-", "rl-balancer-", "rlctl-"] {
        for found in versions_after(&install, marker).into_iter().filter(|v| !v.is_empty()) {
            check(format!("docs/install.md: {marker}"), found);
        }
    }
    for found in versions_after(&install, "module_") {
        check("docs/install.md: the Debian package".into(), found);
    }
    for found in versions_after(&install, "rl-gateway = \"") {
        check("docs/install.md: the crate".into(), found);
    }
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap();
    let released =
        changelog.lines().filter_map(|l| l.strip_prefix("## ")).find(|l| l.starts_with(|c: char| c.is_ascii_digit()));
    match released {
        Some(heading) => check("CHANGELOG.md's latest release".into(), heading.split_whitespace().next().unwrap()),
        None => check("CHANGELOG.md: no release heading".into(), ""),
    }
    wrong
}

#[test]
fn one_version_everywhere() {
    let root = repo_path("");
    assert_eq!(disagreements(&root), Vec::<String>::new());
}

/// The files release.sh changes, copied into `to` where they are in the repository.
fn copy_release_files(to: &Path) {
    let root = repo_path("");
    for manifest in manifests(&root) {
        let target = to.join(manifest.strip_prefix(&root).unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&manifest, target).unwrap();
    }
    for dir in ["deploy/kubernetes", "docs"] {
        std::fs::create_dir_all(to.join(dir)).unwrap();
    }
    for entry in std::fs::read_dir(root.join("deploy/kubernetes")).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join("deploy/kubernetes").join(entry.file_name())).unwrap();
    }
    for file in ["docs/install.md", "CHANGELOG.md"] {
        std::fs::copy(root.join(file), to.join(file)).unwrap();
    }
}

fn release(root: &Path, version: &str) -> (i32, String) {
    let out = Command::new("bash")
        .arg(repo_path("deploy/packaging/release.sh"))
        .arg(version)
        .env("RELEASE_ROOT", root)
        .env("RELEASE_NO_LOCK", "1")
        .output()
        .expect("run release.sh");
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn make_release_moves_every_place_to_the_new_version() {
    let dir = tempfile::tempdir().unwrap();
    copy_release_files(dir.path());
    let before = workspace_version(dir.path());
    let unreleased = std::fs::read_to_string(dir.path().join("CHANGELOG.md")).unwrap();

    let (code, said) = release(dir.path(), "9.8.7");
    assert_eq!(code, 0, "{said}");
    assert_eq!(workspace_version(dir.path()), "9.8.7");
    assert_eq!(disagreements(dir.path()), Vec::<String>::new());
    // What was unreleased is 9.8.7's now, under a new empty Unreleased.
    let changelog = std::fs::read_to_string(dir.path().join("CHANGELOG.md")).unwrap();
    let headings: Vec<&str> = changelog.lines().filter(|l| l.starts_with("## ")).take(3).collect();
    assert_eq!(headings[0], "## Unreleased");
    assert!(headings[1].starts_with("## 9.8.7 — "), "{headings:?}");
    assert!(headings[2].starts_with(&format!("## {before} ")), "{headings:?}");
    assert_eq!(changelog.len(), unreleased.len() + "\n\n## 9.8.7 — YYYY-MM-DD".len(), "only the heading added");

    // Refused, nothing changed: not x.y.z, or the version it is already.
    for bad in ["1.2", "v1.2.3", "", "9.8.7"] {
        let (code, said) = release(dir.path(), bad);
        assert_eq!(code, 2, "{bad}: {said}");
        assert!(said.contains("release:"), "{said}");
    }
    assert_eq!(workspace_version(dir.path()), "9.8.7");
}
