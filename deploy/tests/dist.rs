//! make dist's archives (`make test-packages` builds them, then runs this):
//! each holds its binary, the licence and a README at the workspace's
//! version; SHA256SUMS matches; no binary needs a glibc above the baseline
//! docs/install.md states; each binary answers `--version`, and the module
//! answers RL.TAKE from a redis-server.

mod support;

use std::path::{Path, PathBuf};

use support::{repo_file, repo_path, run, version};
use testkit::PlainServer;

/// The newest glibc symbol version a binary may need: Debian 12's glibc is
/// 2.36, and what the binaries built there use is at most this.
const GLIBC_BASELINE: (u32, u32) = (2, 34);

/// (archive kind, binary) of every archive.
const KINDS: [(&str, &str); 4] = [
    ("redis-rl-module", "libredis_rl.so"),
    ("rl-relay", "rl-relay"),
    ("rl-balancer", "rl-balancer"),
    ("rlctl", "rlctl"),
];

fn dist() -> PathBuf {
    let dir = repo_path("dist");
    assert!(
        dir.join("SHA256SUMS").is_file(),
        "{}: no SHA256SUMS: run make test-packages (it runs make dist)",
        dir.display()
    );
    dir
}

/// `kind`'s archive extracted into `into`: the folder it holds.
fn extract(kind: &str, into: &Path) -> PathBuf {
    let name = format!("{kind}-{}-{}-linux-gnu", version(), std::env::consts::ARCH);
    let archive = dist().join(format!("{name}.tar.gz"));
    let (ok, said) = run("tar", &["-xzf", archive.to_str().unwrap(), "-C", into.to_str().unwrap()]);
    assert!(ok, "{}: {said}", archive.display());
    into.join(name)
}

/// The highest GLIBC_x.y a binary's dynamic symbols name.
fn newest_glibc(binary: &Path) -> (u32, u32) {
    let (ok, said) = run("objdump", &["-T", binary.to_str().unwrap()]);
    assert!(ok, "objdump -T {}: {said}", binary.display());
    let versions: Vec<(u32, u32)> = said
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>());
            Some((parts.next()?.ok()?, parts.next()?.ok()?))
        })
        .collect();
    assert!(!versions.is_empty(), "{}: no GLIBC_ symbol at all", binary.display());
    versions.into_iter().max().unwrap()
}

#[test]
#[ignore = "make test-packages: needs make dist"]
fn every_archive_holds_its_binary_the_licence_and_a_readme() {
    let tmp = tempfile::tempdir().unwrap();
    let licence = repo_file("LICENSE");
    for (kind, binary) in KINDS {
        let folder = extract(kind, tmp.path());
        let mut names: Vec<String> =
            std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        let mut want = vec![binary.to_string(), "LICENSE".into(), "README.md".into()];
        if kind == "redis-rl-module" {
            want.push("redis.conf.example".into());
        }
        want.sort();
        assert_eq!(names, want, "{kind}");
        assert_eq!(std::fs::read_to_string(folder.join("LICENSE")).unwrap(), licence, "{kind}");
        let readme = std::fs::read_to_string(folder.join("README.md")).unwrap();
        assert!(readme.contains(&version()) && !readme.contains("@VERSION@"), "{kind}: {readme}");
        let baseline = format!("glibc {}.{}", GLIBC_BASELINE.0, GLIBC_BASELINE.1);
        assert!(readme.contains(&baseline), "{kind}'s README says {baseline}");
    }
    // SHA256SUMS covers every archive, and each matches.
    let sums = std::fs::read_to_string(dist().join("SHA256SUMS")).unwrap();
    for (kind, _) in KINDS {
        assert!(sums.contains(&format!("  {kind}-{}-", version())), "{kind} not in SHA256SUMS:\n{sums}");
    }
    let out = std::process::Command::new("sha256sum").args(["-c", "SHA256SUMS"]).current_dir(dist()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
#[ignore = "make test-packages: needs make dist"]
fn no_binary_needs_a_glibc_above_the_baseline() {
    let stated = format!("glibc {}.{}", GLIBC_BASELINE.0, GLIBC_BASELINE.1);
    assert!(repo_file("docs/install.md").contains(&stated), "docs/install.md states {stated}");
    let tmp = tempfile::tempdir().unwrap();
    for (kind, binary) in KINDS {
        let path = extract(kind, tmp.path()).join(binary);
        let newest = newest_glibc(&path);
        assert!(newest <= GLIBC_BASELINE, "{binary} needs GLIBC_{}.{}, above the stated {stated}", newest.0, newest.1);
    }
}

#[test]
#[ignore = "make test-packages: needs make dist"]
fn the_binaries_answer_version_and_the_module_rl_take() {
    let tmp = tempfile::tempdir().unwrap();
    for (kind, binary) in &KINDS[1..] {
        let path = extract(kind, tmp.path()).join(binary);
        let (ok, said) = run(path.to_str().unwrap(), &["--version"]);
        assert!(ok, "{binary} --version: {said}");
        assert_eq!(said.trim(), format!("{binary} {}", version()));
    }
    let module = extract("redis-rl-module", tmp.path()).join("libredis_rl.so");
    let server = PlainServer::start_with(&["--loadmodule".as_ref(), module.as_os_str()]);
    let reply = testkit::call(&mut server.con(), "RL.TAKE", "1 k 10 1 1000");
    assert_eq!(&reply[..2], [1, 9], "{reply:?}");
}
