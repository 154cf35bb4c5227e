//! Hostile files on the RLS front: a config file is bounded before it is
//! expanded (aliases, nesting, its size, the folder's size and files) and
//! refused with the file and the bound named: at start the relay does not
//! start; at reload the config in force is kept and the refusal counted.
//! Every relay here runs with its memory limited (`ulimit -d`), so that one
//! that would expand a bomb fails its test instead of eating the machine.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::rls::*;
use common::{Relay, Start};
use rl_relay::rls::config::RlsConfig;
use testkit::Server;

/// The relay's memory in these tests: far above what it needs,
/// far below what an expanded bomb takes.
const MEMORY_MIB: u64 = 1024;

/// `levels` levels of ten aliases under a descriptor's `metadata`, as in
/// the issue: 10^(levels + 1) scalars once expanded.
fn alias_bomb(levels: usize) -> String {
    let mut text = String::from(
        "domain: bomb\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n    metadata:\n      \
         a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n",
    );
    for level in 1..=levels {
        let items = vec![format!("*a{}", level - 1); 10].join(", ");
        text.push_str(&format!("      a{level}: &a{level} [{items}]\n"));
    }
    text
}

/// Block lists nested `depth` deep on one line (`- - - v`), under metadata.
fn too_deep(depth: usize) -> String {
    format!("domain: deep\ndescriptors:\n  - key: k\n    metadata:\n      x:\n        {}v\n", "- ".repeat(depth))
}

/// A valid file of more than `bytes` bytes (a long comment).
fn oversized(bytes: usize) -> String {
    format!("domain: big\n# {}\n", "x".repeat(bytes))
}

/// The hostile files: name, text, what the refusal says.
fn hostile() -> Vec<(&'static str, String, Vec<String>)> {
    let big = oversized(5 << 20);
    let size = format!("is {} bytes, above the bound of 4194304", big.len());
    let s = |t: &str| t.to_string();
    vec![
        ("bomb.yaml", alias_bomb(9), vec![s("bomb.yaml:"), s("more than 1000000 nodes with aliases expanded")]),
        ("deep.yaml", too_deep(100_000), vec![s("deep.yaml:"), s("nested deeper than 64 levels")]),
        ("big.yaml", big, vec![s("big.yaml:"), size]),
    ]
}

fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `text` to `dir/name` whole: written beside it under a dot name
/// (which the relay skips), then renamed.
fn drop_in(dir: &Path, name: &str, text: &str) {
    let hidden = dir.join(format!(".{name}.tmp"));
    std::fs::write(&hidden, text).unwrap();
    std::fs::rename(&hidden, dir.join(name)).unwrap();
}

#[test]
fn a_hostile_config_file_at_start_refuses_to_start_quickly() {
    for (name, text, expected) in hostile() {
        let dir = tempfile::tempdir().unwrap();
        drop_in(dir.path(), name, &text);
        let config = dir.path().display().to_string();
        let args = ["--redis", "redis://127.0.0.1:1/", "--rls-listen", "127.0.0.1:0", "--rls-config", &config];
        let started = Instant::now();
        let mut relay = Relay::spawn(Start { no_wait: true, max_memory_mib: Some(MEMORY_MIB), ..Start::args(&args) });
        // A clean refusal: exit 2 with the message, not a signal.
        let code = relay.exit_code();
        let log = relay.log();
        assert_eq!(code, Some(2), "{name}: {log}");
        assert!(started.elapsed() < Duration::from_secs(10), "{name}: {:?}", started.elapsed());
        for part in expected {
            assert!(log.contains(part.as_str()), "{name}: '{part}' in {log}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_config_file_at_reload_is_refused_counted_and_the_config_in_force_kept() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    drop_in(
        dir.path(),
        "api.yaml",
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 7 }\n",
    );
    let relay = RlsRelay::start_limited(&[server.url()], false, dir.path(), &[], Some(MEMORY_MIB));
    let mut client = relay.client().await;
    let r = ask(&mut client, request("api", &[&[("k", "1")]])).await;
    assert_eq!(limit_of(&r.statuses[0]), Some((7, 3, String::new())));
    let loaded = relay.metric("ratelimit_service_config_load_success");
    for (n, (name, text, expected)) in hostile().into_iter().enumerate() {
        drop_in(dir.path(), name, &text);
        let refused = (n + 1) as f64;
        wait_for(|| relay.metric("ratelimit_service_config_load_error") >= refused, name);
        // Logged with the file and the bound (the line follows the count).
        let refusal = |log: &str| {
            log.lines()
                .any(|l| l.contains("the one in force kept") && expected.iter().all(|part| l.contains(part.as_str())))
        };
        wait_for(|| refusal(&relay.relay.log()), "the refusal's log line");
        let r = ask(&mut client, request("api", &[&[("k", "1")]])).await;
        assert_eq!(limit_of(&r.statuses[0]), Some((7, 3, String::new())), "{name}: the config in force kept");
        assert_eq!(relay.get("/healthcheck").0, 200);
        assert_eq!(relay.metric("ratelimit_service_config_load_error"), refused, "{name}: counted once");
        // Taken away, the folder loads again.
        std::fs::remove_file(dir.path().join(name)).unwrap();
        wait_for(|| relay.metric("ratelimit_service_config_load_success") > loaded + n as f64, "the reload");
    }
    assert_eq!(relay.metric("ratelimit_service_config_load_error"), 3.0);
}

#[test]
fn a_config_folder_is_bounded_in_files_and_in_total_size() {
    let file = |i: usize| {
        format!("domain: d{i}\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: hour, requests_per_unit: 1 }}\n")
    };
    // 1,000 files load; one more is refused, naming the folder and the bound.
    let dir = tempfile::tempdir().unwrap();
    for i in 0..1000 {
        std::fs::write(dir.path().join(format!("f{i:04}.yaml")), file(i)).unwrap();
    }
    assert_eq!(RlsConfig::load(dir.path(), false).unwrap().files.len(), 1000);
    std::fs::write(dir.path().join("f1000.yaml"), file(1000)).unwrap();
    let e = RlsConfig::load(dir.path(), false).unwrap_err().to_string();
    assert!(e.contains(&dir.path().display().to_string()) && e.contains("more than 1000"), "{e}");
    // Five files of 3.5 MiB: each within its bound, together above 16 MiB.
    let dir = tempfile::tempdir().unwrap();
    for i in 0..5 {
        let mut text = file(i);
        text.push_str(&format!("# {}\n", "x".repeat(7 << 19)));
        std::fs::write(dir.path().join(format!("f{i}.yaml")), text).unwrap();
    }
    let e = RlsConfig::load(dir.path(), false).unwrap_err().to_string();
    assert!(e.contains("f4.yaml") && e.contains("16777216"), "{e}");
    // A folder that holds itself (a link loop) is walked to a bound, not forever.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), file(0)).unwrap();
    std::os::unix::fs::symlink(".", dir.path().join("x")).unwrap();
    std::os::unix::fs::symlink(".", dir.path().join("y")).unwrap();
    let e = RlsConfig::load(dir.path(), false).unwrap_err().to_string();
    assert!(e.contains("more than 1000"), "{e}");
}

#[test]
fn aliases_within_the_bounds_load() {
    // A rate_limit shared by anchor and alias, as configs do.
    let config = RlsConfig::from_texts(
        [(
            "shared.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &std { unit: hour, requests_per_unit: 5 }\n  - key: b\n    \
             rate_limit: *std\n",
        )],
        false,
    )
    .unwrap();
    assert_eq!(config.domains["d"].children.len(), 2);
    // A bomb of four levels (100,000 scalars) loads; five (a million) do not.
    assert!(RlsConfig::from_texts([("b.yaml", alias_bomb(4).as_str())], false).is_ok());
    let e = RlsConfig::from_texts([("b.yaml", alias_bomb(5).as_str())], false).unwrap_err().to_string();
    assert!(e.starts_with("b.yaml:") && e.contains("more than 1000000 nodes"), "{e}");
    // The bounds hold for the files together: four such bombs (about 247,000
    // nodes each, with their anchors' copies) load, the fifth is refused.
    let bombs: Vec<(String, String)> = (0..5)
        .map(|i| (format!("b{i}.yaml"), alias_bomb(4).replace("domain: bomb", &format!("domain: b{i}"))))
        .collect();
    let texts = |n: usize| bombs[..n].iter().map(|(name, text)| (name.as_str(), text.as_str())).collect::<Vec<_>>();
    assert_eq!(RlsConfig::from_texts(texts(4), false).unwrap().files.len(), 4);
    let e = RlsConfig::from_texts(texts(5), false).unwrap_err().to_string();
    assert!(e.starts_with("b4.yaml:") && e.contains("more than 1000000 nodes"), "{e}");
    // A big scalar copied by aliases is bounded by its bytes.
    let text = format!(
        "domain: d\ndescriptors:\n  - key: k\n    metadata:\n      a: &a {}\n      b: [{}]\n",
        "x".repeat(1 << 20),
        vec!["*a"; 20].join(", ")
    );
    let e = RlsConfig::from_texts([("text.yaml", text.as_str())], false).unwrap_err().to_string();
    assert!(e.contains("more than 16777216 bytes"), "{e}");
    // Many aliases of one scalar.
    let text = format!(
        "domain: d\ndescriptors:\n  - key: k\n    metadata:\n      a: &a x\n      b: [{}]\n",
        vec!["*a"; 100_001].join(",")
    );
    let e = RlsConfig::from_texts([("many.yaml", text.as_str())], false).unwrap_err().to_string();
    assert!(e.contains("more than 100000 aliases"), "{e}");
}

#[test]
fn a_huge_token_file_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("api.yaml");
    std::fs::write(&config, "domain: api\n").unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t".repeat(100_000)).unwrap();
    let (config, token) = (config.display().to_string(), token.display().to_string());
    let args = [
        "--redis",
        "redis://127.0.0.1:1/",
        "--rls-listen",
        "127.0.0.1:0",
        "--rls-config",
        &config,
        "--rls-token-file",
        &token,
    ];
    let mut relay = Relay::spawn(Start { no_wait: true, max_memory_mib: Some(MEMORY_MIB), ..Start::args(&args) });
    let code = relay.exit_code();
    let log = relay.log();
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("--rls-token-file") && log.contains("100000 bytes") && log.contains("65536"), "{log}");
}
