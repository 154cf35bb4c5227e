//! Live rules on a Redis that speaks only TLS (managed Redis): rlctl
//! publishes and reads with `--tls-ca-file`, a gateway's watcher follows the
//! published version over `rediss://` (`RedisSource::tls`), and a wrong CA is
//! refused with a message that names it.

mod support;

use std::time::{Duration, Instant};

use rl_gateway::{Config, Limiter, LiveRules, RedisSource, RuleSetSpec, Tls};
use support::rlctl;
use testkit::Server;

const RULES: &str =
    "[[rules]]\nid = \"default\"\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 10, per = \"1s\" }]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlctl_and_a_gateway_watch_rules_over_tls() {
    let server = Server::start_tls(testkit::Tls::Server, &[]);
    let files = server.tls().expect("a TLS server's files");
    let (url, ca) = (server.url(), files.ca.to_str().unwrap().to_owned());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    std::fs::write(&file, RULES).unwrap();
    let file = file.to_str().unwrap().to_owned();

    let run = rlctl(&["publish", &file, "--redis", &url, "--tls-ca-file", &ca]).await;
    assert_eq!(run.code, 0, "{}", run.err);
    let active = rlctl(&["active", "--redis", &url, "--tls-ca-file", &ca]).await;
    assert!(active.out.starts_with("version 1 "), "{} {}", active.out, active.err);

    // The gateway: its limiter and its watcher on the same TLS server.
    let tls = Tls { ca_file: Some(files.ca.clone()), ..Tls::default() };
    let limiter = Limiter::new(Config { tls: tls.clone(), ..Config::standalone(url.clone()) }).unwrap();
    let gateway = LiveRules::new(limiter, &RuleSetSpec::from_toml(RULES).unwrap()).unwrap();
    let _watcher = gateway.watch_redis(RedisSource { tls, ..RedisSource::new(url.clone()) }).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while gateway.snapshot().version() != 1 {
        assert!(Instant::now() < deadline, "version 1 did not arrive over TLS: {:?}", gateway.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = rlctl(
        &["override", "add", "--subject", "k", "--limit", "s=1/1s", "--expires", "1h", "--reason", "r"]
            .into_iter()
            .chain(["--redis", &url, "--tls-ca-file", &ca])
            .collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.err);
    while gateway.snapshot().version() != 2 {
        assert!(Instant::now() < deadline, "version 2 did not arrive over TLS: {:?}", gateway.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A CA that signed nothing of the server's: refused, and named.
    let other = testkit::tls::unrelated_ca(dir.path(), "other");
    let run = rlctl(&["active", "--redis", &url, "--tls-ca-file", other.to_str().unwrap()]).await;
    assert_ne!(run.code, 0, "{}", run.out);
    assert!(run.err.contains("not trusted by the CA file"), "{}", run.err);
    // Without the CA (and the server's not in the system roots): refused too.
    let run = rlctl(&["active", "--redis", &url]).await;
    assert_ne!(run.code, 0, "{}", run.out);
}
