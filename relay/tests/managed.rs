//! The relay on a managed Redis (testkit::managed: TLS only, no module,
//! `default` off, `CONFIG`, `KEYS`, `MODULE`... renamed away), as the
//! `rl-relay-lua` user of docs/security.md's "Managed Redis" section, with
//! `--redis-backend lua` and the server's CA: a gateway leases through its
//! RESP front, Envoy's ShouldRateLimit on a token bucket, a window and a
//! quota through its Envoy front, each counted exactly; `ACL LOG` stays
//! empty (the documented rights suffice). And the same relay reading
//! envoyproxy/ratelimit's environment as a start with no argument does
//! (`REDIS_TLS`, `REDIS_TLS_CACERT`, `REDIS_AUTH`, `RL_REDIS_BACKEND=lua`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::away_from_midnight;
use common::rls::*;
use rl_gateway::{Config, Limiter, LimiterConfig, Policy, Rule, Source};
use testkit::managed::{documented_user, Managed};

const PASSWORD: &str = "relay-pw";

/// A bucket, a fixed window and a quota, each a day long: nothing refills
/// or ends within a run.
const CONFIG: &str = "\
domain: d
descriptors:
  - key: bucket
    rate_limit: { unit: day, requests_per_unit: 5, algorithm: token_bucket }
  - key: window
    rate_limit: { unit: day, requests_per_unit: 4 }
  - key: quota
    quota_mode: true
    rate_limit: { unit: day, requests_per_unit: 3 }
";

/// The keys matching `pattern`, by SCAN (KEYS is withheld).
fn scan(server: &Managed, pattern: &str) -> Vec<String> {
    let (_, keys): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(10_000)
        .query(&mut server.operator())
        .unwrap();
    keys
}

/// Asks `n` times for one hit of `key`/`value`: the answers' codes and
/// the remaining counts of the descriptor.
async fn hits(client: &mut RateLimitServiceClient, key: &str, value: &str, n: usize) -> Vec<(i32, u32)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let answer = ask(client, request("d", &[&[(key, value)]])).await;
        out.push((answer.overall_code, answer.statuses[0].limit_remaining));
    }
    out
}

type RateLimitServiceClient =
    envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
        tonic::transport::Channel,
    >;

/// Waits (20 s at most) until the health service serves: the relay has
/// connected over TLS and loaded the scripts (a debug build's handshake on
/// a busy machine is slow).
async fn serving(relay: &RlsRelay) {
    wait_health(relay, tonic_health::pb::health_check_response::ServingStatus::Serving).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_fronts_serve_on_a_managed_redis_as_the_documented_user() {
    away_from_midnight();
    let server = Managed::start(&[&documented_user("rl-relay-lua", PASSWORD)]);
    let ca = server.tls().ca.display().to_string();
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(
        &[server.url_as("rl-relay-lua", PASSWORD)],
        false,
        &config,
        // Batches of the whole hour's limit, held as long: the relay leases
        // from Redis (by the scripts) and serves the gateway from them.
        &["--redis-backend", "lua", "--tls-ca-file", &ca, "--lease-window-ms", "3600000", "--lease-ttl-ms", "3600000"],
    );
    serving(&relay).await;
    let info = relay.relay.info();
    assert!(info.contains("redis_backend:lua"), "{info}");

    // The RESP front: a gateway leases through it (module commands, which
    // the relay carries out with the scripts), every check decided there.
    let limiter = Limiter::new(LimiterConfig {
        lease_window: Duration::from_millis(1),
        ..LimiterConfig::new(Config {
            relay: Some(relay.relay.url()),
            // Used only while the relay does not answer: never here.
            tls: rl_gateway::Tls { ca_file: Some(server.tls().ca.clone()), ..Default::default() },
            timeout: Duration::from_secs(2),
            ..Config::standalone(server.url_as("rl-relay-lua", PASSWORD))
        })
    })
    .unwrap();
    let policy = Arc::new(Policy::builder("rl:gw").rule(Rule::per_hour("h", 10)).build().unwrap());
    let mut allowed = 0;
    for _ in 0..15 {
        let d = limiter.check(&policy, "acme").await.unwrap();
        assert_ne!(d.source, Source::Fallback, "{d:?}: {}", relay.relay.log());
        allowed += usize::from(d.allowed);
    }
    assert_eq!(allowed, 10, "10 an hour (no token refills within the test), through the relay: {}", relay.relay.log());
    // The 10 grants and the first refusal (the gateway's deny cache
    // answers the rest), from tokens the relay leased.
    assert!(relay.relay.info_field("requests") >= 11, "the checks went through the relay: {}", relay.relay.info());
    assert!(relay.relay.info_field("upstream_leases") >= 1, "leased by the scripts: {}", relay.relay.info());
    assert!(relay.relay.info_field("from_memory") >= 1, "{}", relay.relay.info());
    let keys = scan(&server, "rl:gw*acme*");
    assert_eq!(keys.len(), 1, "the gateway's bucket, in Redis: {keys:?}");

    // The Envoy front: each limit counted exactly.
    let mut client = relay.client().await;
    let codes = |answers: &[(i32, u32)]| answers.iter().map(|a| a.0).collect::<Vec<_>>();
    let bucket = hits(&mut client, "bucket", "acme", 7).await;
    assert_eq!(codes(&bucket), [OK, OK, OK, OK, OK, OVER_LIMIT, OVER_LIMIT], "{bucket:?}");
    let window = hits(&mut client, "window", "acme", 6).await;
    assert_eq!(window, [(OK, 3), (OK, 2), (OK, 1), (OK, 0), (OVER_LIMIT, 0), (OVER_LIMIT, 0)]);
    let quota = hits(&mut client, "quota", "acme", 5).await;
    assert_eq!(quota, [(OK, 2), (OK, 1), (OK, 0), (OVER_LIMIT, 0), (OVER_LIMIT, 0)]);
    // Another subject starts full.
    assert_eq!(hits(&mut client, "window", "other", 1).await, [(OK, 3)]);
    let keys = scan(&server, "rl:rls:*");
    assert!(keys.len() >= 4, "the front's counters, under rl:rls: {keys:?}");
    assert_eq!(relay.metric("rl_relay_redis_backend{backend=\"lua\"}"), 1.0);

    assert_eq!(server.acl_log(), Vec::<String>::new(), "every call allowed to the documented user");
    assert!(!relay.relay.log().contains("NOPERM"), "{}", relay.relay.log());
}

/// Started as envoyproxy/ratelimit is: upstream's variables say where Redis
/// is and how to reach it over TLS; `RL_REDIS_BACKEND=lua` picks the scripts.
/// (`--envoyproxy-env` reads them as a start with no argument does; its
/// flags give the calls the test's timeouts, not the 15 ms a busy machine's
/// TLS handshake outlasts, which would send a call to the local fallback.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_envoyproxy_ratelimit_it_serves_on_a_managed_redis() {
    away_from_midnight();
    let server = Managed::start(&[&documented_user("rl-relay-lua", PASSWORD)]);
    let root = config_folder(Some(CONFIG));
    let mut bare = start_bare_with(
        root.path(),
        &[
            ("REDIS_URL", format!("127.0.0.1:{}", server.port)),
            ("REDIS_AUTH", format!("rl-relay-lua:{PASSWORD}")),
            ("REDIS_TLS", "true".into()),
            ("REDIS_TLS_CACERT", server.tls().ca.display().to_string()),
            ("RL_REDIS_BACKEND", "lua".into()),
        ],
        &["--envoyproxy-env", "--timeout-ms", "1000", "--rls-timeout-ms", "2000"],
    );
    bare.health_becomes(200);
    let mut client = bare.client().await;
    let window = hits(&mut client, "window", "acme", 5).await;
    assert_eq!(window, [(OK, 3), (OK, 2), (OK, 1), (OK, 0), (OVER_LIMIT, 0)], "{}", bare.relay.log());
    let bucket = hits(&mut client, "bucket", "acme", 6).await;
    assert_eq!(bucket.iter().filter(|a| a.0 == OK).count(), 5, "{bucket:?}");
    assert!(bare.relay.log().contains("on the lua backend: ready"), "{}", bare.relay.log());
    assert!(!bare.relay.log().contains("fallback"), "{}", bare.relay.log());
    assert_eq!(server.acl_log(), Vec::<String>::new(), "every call allowed to the documented user");
}
