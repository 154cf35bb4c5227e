//! Live rules that never stop applying without a sign: a rule set's
//! lineage survives a store that lost its rules, one source of truth per
//! gateway, a store that went back is reported (and ages the status), and
//! a broken bootstrap file does not keep a gateway from the store's set.

#[path = "../../client/tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::config;
use rl_gateway::live::{LiveRules, RedisSource, Request, RuleSetSpec, RulesStore, DEFAULT_KEY};
use rl_gateway::{Backend, Limiter};
use testkit::Server;

fn limiter(s: &Server) -> Limiter {
    Limiter::new(config(s.url(), Backend::Module)).unwrap()
}

/// One default rule named after `tag`, so a verdict tells which set decided.
fn set(tag: &str, version: Option<u64>) -> RuleSetSpec {
    let version = version.map(|v| format!("version = {v}\n")).unwrap_or_default();
    RuleSetSpec::from_toml(&format!(
        "{version}[[rules]]\nid = \"{tag}\"\nreason = \"r\"\nlimits = [{{ name = \"s\", rate = 1000, per = \"1s\" }}]\n"
    ))
    .unwrap()
}

fn fast(url: String) -> RedisSource {
    RedisSource { poll_every: Duration::from_millis(200), ..RedisSource::new(url) }
}

async fn eventually(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn rule_of(rules: &LiveRules) -> String {
    rules.check(&Request::new().subject("u")).await.unwrap().rule.id().to_owned()
}

fn rlctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rlctl")).args(args).env_remove("RL_REDIS_URL").output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_takes_the_new_lineage_of_a_store_that_lost_its_rules() {
    // No persistence: a restart empties the store.
    let mut s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    assert_eq!(store.publish(&set("old", Some(6))).await.unwrap(), 6);
    let first = store.read().await.unwrap().lineage;
    let rules = LiveRules::new(limiter(&s), &set("boot", None)).unwrap();
    let _watcher = rules.watch_redis(fast(s.url())).unwrap();
    eventually(Duration::from_secs(10), "version 6", || rules.snapshot().version() == 6).await;
    assert_eq!(rules.status().lineage, first, "the gateway reports the lineage it runs");

    s.shutdown("NOSAVE");
    s.restart();
    // Emptied: the gateway keeps its set, says so, and its age grows.
    eventually(Duration::from_secs(10), "the lost store is reported", || {
        let st = rules.status();
        st.last_error.as_deref().is_some_and(|e| e.contains("holds no rules")) && st.age > Duration::from_secs(1)
    })
    .await;
    assert_eq!(rule_of(&rules).await, "old");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    std::fs::write(&file, toml::to_string(&set("new", None)).unwrap()).unwrap();
    let (code, out, err) = rlctl(&["publish", file.to_str().unwrap(), "--redis", &s.url()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("as version 1 of lineage "), "{out}");
    assert!(out.contains("the store held no rules"), "{out}");
    // A new store handle: the old one's connection died with the server.
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    let second = store.read().await.unwrap().lineage;
    assert!(second.is_some() && second != first, "a new lineage: {first:?} then {second:?}");
    // Version 1 of the new lineage replaces version 6 of the old.
    eventually(Duration::from_secs(10), "the new lineage's version 1", || rules.snapshot().version() == 1).await;
    assert_eq!(rule_of(&rules).await, "new");
    let st = rules.status();
    assert_eq!(st.lineage, second);
    eventually(Duration::from_secs(5), "confirmed", || {
        let st = rules.status();
        st.last_error.is_none() && st.age < Duration::from_millis(600)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_of_truth_per_gateway() {
    let s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    store.publish(&set("a", None)).await.unwrap();
    let rules = LiveRules::new(limiter(&s), &set("boot", None)).unwrap();
    let redis = rules.watch_redis(fast(s.url())).unwrap();
    eventually(Duration::from_secs(10), "version 1", || rules.snapshot().version() == 1).await;
    // A file watched beside Redis once reloaded as a local "next version",
    // dropping Redis's overrides, and hid Redis's next version of the same
    // number: it is refused.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    std::fs::write(&file, toml::to_string(&set("file", None)).unwrap()).unwrap();
    let e = rules.watch_file(&file, Duration::from_millis(50)).unwrap_err().to_string();
    assert!(e.contains("already follow Redis: one source of truth per gateway"), "{e}");
    assert!(rules.watch_redis(fast(s.url())).is_err(), "nor two watchers of Redis");
    assert_eq!(store.publish(&set("b", None)).await.unwrap(), 2);
    eventually(Duration::from_secs(10), "version 2", || rules.snapshot().version() == 2).await;
    assert_eq!(rule_of(&rules).await, "b");
    // Once the Redis watcher is dropped, the file may be followed.
    drop(redis);
    let _file = rules.watch_file(&file, Duration::from_millis(50)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_went_back_is_followed_even_to_the_same_version() {
    let s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    assert_eq!(store.publish(&set("five", Some(5))).await.unwrap(), 5);
    let rules = LiveRules::new(limiter(&s), &set("boot", None)).unwrap();
    let _watcher = rules.watch_redis(fast(s.url())).unwrap();
    eventually(Duration::from_secs(10), "version 5", || rules.snapshot().version() == 5).await;
    let first = rules.status().publication;
    assert!(first.is_some() && first == store.read().await.unwrap().publication, "{:?}", rules.status());
    // A failover to a replica that missed version 5, then another change
    // published there as version 5: the same version, another set (what
    // the replica's script writes, done here by hand).
    let other = set("other", None).to_json();
    let _: () = redis::cmd("HSET")
        .arg(DEFAULT_KEY)
        .arg("version")
        .arg(5)
        .arg("id")
        .arg("0123456789abcdef")
        .arg("rules")
        .arg(&other)
        .query(&mut s.con())
        .unwrap();
    let _: () = redis::cmd("PUBLISH").arg(DEFAULT_KEY).arg("5 0123456789abcdef").query(&mut s.con()).unwrap();
    // Ignored as "not newer" before: the gateway kept "five" for good.
    eventually(Duration::from_secs(10), "the store's version 5 is taken", || {
        rules.status().publication.as_deref() == Some("0123456789abcdef")
    })
    .await;
    assert_eq!(rule_of(&rules).await, "other");
    // Gone back to version 2 (a restore of an old dump): followed too.
    let _: () = redis::cmd("HSET").arg(DEFAULT_KEY).arg("version").arg(2).query(&mut s.con()).unwrap();
    eventually(Duration::from_secs(10), "version 2", || rules.snapshot().version() == 2).await;
    // The next publication moves on from the store's version.
    assert_eq!(store.publish(&set("three", None)).await.unwrap(), 3);
    eventually(Duration::from_secs(10), "version 3 taken", || rules.snapshot().version() == 3).await;
    assert_eq!(rule_of(&rules).await, "three");
    eventually(Duration::from_secs(5), "confirmed", || {
        let st = rules.status();
        st.last_error.is_none() && st.age < Duration::from_millis(600)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_publication_ages_the_status_until_a_good_one() {
    let s = Server::start(&[]);
    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    store.publish(&set("one", None)).await.unwrap();
    // A Lua gateway refuses a set it cannot count exactly (an exact window
    // above the script's 10,000) that was not declared for it.
    let lua = Limiter::new(config(s.url(), Backend::Lua)).unwrap();
    let rules = LiveRules::new(lua, &set("boot", None)).unwrap();
    let _watcher = rules.watch_redis(fast(s.url())).unwrap();
    eventually(Duration::from_secs(10), "version 1", || rules.snapshot().version() == 1).await;
    let window = RuleSetSpec::from_toml(
        "[[rules]]\nid = \"w\"\nreason = \"r\"\nlimits = [{ name = \"m\", kind = \"exact\", limit = 20000, per = \"1m\" }]\n",
    )
    .unwrap();
    assert_eq!(store.publish(&window).await.unwrap(), 2);
    eventually(Duration::from_secs(10), "refused, and the age grows past a few polls", || {
        let st = rules.status();
        st.rejected == 1
            && st.age > Duration::from_millis(1500)
            && st.last_error.as_deref().is_some_and(|e| e.contains("version 2"))
    })
    .await;
    assert_eq!(rules.snapshot().version(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_with_a_broken_rules_file_starts_from_the_store() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "[[rules]]\nid = \"x\"\nlimits = [{ name = \"s\", rate = 0, per = \"1s\" }]\n").unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, toml::to_string(&set("file", None)).unwrap()).unwrap();

    // Nothing in the store and a broken file: nothing to start from.
    let e = LiveRules::start(limiter(&s), &broken, fast(s.url())).await.err().unwrap().to_string();
    assert!(e.contains("no rules to start from") && e.contains("broken.toml"), "{e}");
    // Nothing in the store: the file's set.
    let (rules, watcher) = LiveRules::start(limiter(&s), &good, fast(s.url())).await.unwrap();
    assert_eq!(rule_of(&rules).await, "file");
    drop(watcher);

    let store = RulesStore::new(&s.url(), DEFAULT_KEY, Duration::from_secs(2)).unwrap();
    assert_eq!(store.publish(&set("stored", None)).await.unwrap(), 1);
    let (rules, _watcher) = LiveRules::start(limiter(&s), &broken, fast(s.url())).await.unwrap();
    assert_eq!(rules.snapshot().version(), 1);
    assert_eq!(rule_of(&rules).await, "stored");
    let st = rules.status();
    assert_eq!(st.lineage, store.read().await.unwrap().lineage);
    assert_eq!(st.rejected, 1, "the broken file is counted: {st:?}");
    // And it follows the store from there.
    assert_eq!(store.publish(&set("next", None)).await.unwrap(), 2);
    eventually(Duration::from_secs(10), "version 2", || rules.snapshot().version() == 2).await;

    // The store unreachable: the file's set, the failure in the status.
    let e = LiveRules::start(limiter(&s), &broken, fast("redis://127.0.0.1:1/".to_owned())).await.err().unwrap();
    assert!(e.to_string().contains("no rules to start from"), "{e}");
    let (rules, _w) = LiveRules::start(limiter(&s), &good, fast("redis://127.0.0.1:1/".to_owned())).await.unwrap();
    assert_eq!(rule_of(&rules).await, "file");
    assert!(rules.status().last_error.is_some_and(|e| e.contains("cannot refresh")));
}
