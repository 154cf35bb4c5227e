//! The docs as a map that holds: every relative link of README.md,
//! docs/*.md, the crates' READMEs and the crates' guides reaches a file, and an `#anchor` into our own Markdown reaches a
//! heading (GitHub's slugs); every command the module registers has its
//! reference heading in docs/commands.md.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Markdown files directly in `dir`.
fn markdown_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<PathBuf> =
        entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "md")).collect();
    found.sort();
    found
}

/// The guides a crate keeps beside its code as rustdoc modules
/// (`src/guide.md`, `src/http/guide.md`).
fn guides(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for path in entries.map(|e| e.unwrap().path()) {
        if path.is_dir() {
            guides(&path, out);
        } else if path.file_name().is_some_and(|n| n == "guide.md") {
            out.push(path);
        }
    }
}

/// README.md, every page of docs/, and every crate's README and guides.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    pages.extend(markdown_in(&repo().join("docs")));
    let mut crates: Vec<PathBuf> = std::fs::read_dir(repo())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| d.join("Cargo.toml").exists() && d.join("README.md").exists())
        .collect();
    crates.sort();
    for dir in crates {
        pages.push(dir.join("README.md"));
        guides(&dir.join("src"), &mut pages);
    }
    pages
}

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A heading's text: `## Memory: what to set` gives `Memory: what to set`.
fn heading(line: &str) -> Option<&str> {
    let hashes = line.len() - line.trim_start_matches('#').len();
    let rest = &line[hashes..];
    ((1..=6).contains(&hashes) && rest.starts_with(' ')).then(|| rest.trim().trim_end_matches('#').trim())
}

/// GitHub's anchor for a heading: lower case, punctuation dropped but `-`
/// and `_`, each space a `-`.
fn slug(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .flat_map(char::to_lowercase)
        .collect()
}

/// Every anchor of a Markdown file; a repeated heading's gets `-1`, `-2`...
fn anchors(text: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    for (_, line) in prose(text) {
        if let Some(h) = heading(line) {
            let base = slug(h);
            let mut anchor = base.clone();
            let mut n = 0;
            while out.contains(&anchor) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
            out.insert(anchor);
        }
    }
    out
}

/// The `(target)` of every inline link `[text](target)` of `line`, code spans left out.
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
    out
}

/// What is wrong with the relative links of `page`, a line each.
fn broken_links(page: &Path) -> Vec<String> {
    let text = read(page);
    let dir = page.parent().unwrap();
    let mut broken = Vec::new();
    for (n, line) in prose(&text) {
        for target in link_targets(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() { page.to_path_buf() } else { dir.join(path) };
            let at = format!("{}:{n}: ({target})", page.strip_prefix(repo()).unwrap().display());
            if !file.exists() {
                broken.push(format!("{at}: no file {}", file.display()));
            } else if !anchor.is_empty()
                && file.extension().is_some_and(|x| x == "md")
                && !anchors(&read(&file)).contains(anchor)
            {
                let on = if path.is_empty() { "this page" } else { path };
                broken.push(format!("{at}: no heading with the anchor #{anchor} in {on}"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_of_the_readme_and_docs_resolves() {
    let pages = pages();
    assert!(pages.len() >= 10, "README.md and docs/: {pages:?}");
    for page in ["docs/commands.md", "gateway/README.md", "gateway/src/guide.md", "gateway/src/http/guide.md"] {
        assert!(pages.contains(&repo().join(page)), "{page} is not among the pages checked: {pages:?}");
    }
    let broken: Vec<String> = pages.iter().flat_map(|p| broken_links(p)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The names of `COMMANDS`, the table src/commands/mod.rs registers
/// (`name: c"rl.take"`), in upper case.
fn registered_commands() -> Vec<String> {
    let source = read(&repo().join("src/commands/mod.rs"));
    let start = source.find("const COMMANDS: &[Command] = &[").expect("the command table in src/commands/mod.rs");
    let table = &source[start..];
    let table = &table[..table.find("\n];").expect("the end of the command table")];
    let names: Vec<String> = table
        .lines()
        .filter_map(|l| l.trim().strip_prefix("name: c\""))
        .map(|l| l[..l.find('"').unwrap()].to_uppercase())
        .collect();
    assert!(names.len() >= 14, "the command table: {names:?}");
    names
}

#[test]
fn every_registered_command_has_its_reference_in_docs_commands() {
    let text = read(&repo().join("docs/commands.md"));
    let headings: Vec<&str> = prose(&text).into_iter().filter_map(|(_, l)| heading(l)).collect();
    let missing: Vec<String> = registered_commands()
        .into_iter()
        .filter(|name| {
            !headings.iter().any(|h| h.split(|c: char| !(c.is_alphanumeric() || c == '.')).any(|w| w == name))
        })
        .collect();
    assert!(missing.is_empty(), "commands the module registers with no heading in docs/commands.md: {missing:?}");
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("CL.THROTTLE (redis-cell compatible)"), "clthrottle-redis-cell-compatible");
    assert_eq!(slug("Memory: what to set, what to alarm on"), "memory-what-to-set-what-to-alarm-on");
    assert_eq!(slug("The relay's fronts"), "the-relays-fronts");
    assert_eq!(slug("`rl_client` and RL.TAKE"), "rl_client-and-rltake");
    let twice = anchors("# A\n## A\n```\n# not a heading\n```\n## A\n");
    assert_eq!(twice, HashSet::from(["a".to_owned(), "a-1".to_owned(), "a-2".to_owned()]));
}
