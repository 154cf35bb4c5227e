//! The RLS front through a real gRPC client (envoy-types' generated one)
//! against the relay as a child process and real servers with the module.
//! Limits are per hour or day, so that no test straddles a window's end.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::rls::*;
use common::{Relay, Start};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use testkit::{Cluster, Server};
use tonic_health::pb::health_check_response::ServingStatus;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(format!("{}/tests/rls_config/{name}", env!("CARGO_MANIFEST_DIR")))
}

const API: &str = "\
domain: api
descriptors:
  - key: tight
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: wide
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: free
    rate_limit: { unlimited: true }
  - key: old
    rate_limit: { unit: hour, requests_per_unit: 1, name: old }
  - key: new
    rate_limit: { unit: hour, requests_per_unit: 50, replaces: [ { name: old } ] }
  - key: zero
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: bucket
    rate_limit: { unit: hour, requests_per_unit: 3600, algorithm: token_bucket, burst: 3 }
  - key: sliding
    rate_limit: { unit: hour, requests_per_unit: 3, algorithm: sliding_window }
  - key: exact
    rate_limit: { unit: hour, requests_per_unit: 3, algorithm: exact_window }
  - key: open
    rate_limit: { unit: hour, requests_per_unit: 1000 }
  - key: deny
    rate_limit: { unit: hour, requests_per_unit: 1000, failure_mode: deny }
";

fn with_cost(mut r: RateLimitRequest, hits: u32) -> RateLimitRequest {
    r.hits_addend = hits;
    r
}

fn codes(r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

fn remaining(r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> Vec<u32> {
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_lookups_over_grpc() {
    let server = Server::start(&[]);
    // Batches of a tenth of a second's rate: these limits are too small to
    // lease (a lease landing beside the call would make the numbers below
    // depend on which came first; leases are tested on a hot window below).
    let relay = RlsRelay::start(&[server.url()], false, &fixture("basic_config.yaml"), &["--lease-window-ms", "100"]);
    let mut client = relay.client().await;
    // An unknown domain is OK, and counted.
    let r = ask(&mut client, request("foo_domain", &[&[("key1", "value1")]])).await;
    assert_eq!((r.overall_code, r.statuses.len(), r.statuses[0].code), (OK, 1, OK));
    assert_eq!(r.statuses[0].current_limit, None);
    // Early in a second: the call and its peeks land in one 1 s window
    // (across a boundary the peek would rightly see the next window full).
    while std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_millis() > 300 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let r = ask(
        &mut client,
        request(
            "test-domain",
            &[
                &[("key1", "value1"), ("subkey1", "something")],
                &[("key2", "value3")],
                &[("key4", "foo")],
                &[("key6", "x")],
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    // key1/subkey1 is 5 a second.
    assert_eq!(limit_of(&r.statuses[0]), Some((5, 1, String::new())));
    assert_eq!(r.statuses[0].limit_remaining, 4, "{:?}", r.statuses[0]);
    assert_eq!(limit_of(&r.statuses[1]), None, "key2=value3 has no limit: it is let through");
    assert_eq!(limit_of(&r.statuses[2]), Some((1, 4, "key4_rate_limit".into())));
    assert_eq!(r.statuses[2].limit_remaining, 0);
    assert_eq!(r.statuses[3].limit_remaining, u32::MAX, "unlimited");
    let r = ask(&mut client, request("test-domain", &[&[("key4", "foo")]])).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER_LIMIT, OVER_LIMIT));
    let reset = r.statuses[0].duration_until_reset.unwrap().seconds;
    assert!((1..=86_400).contains(&reset), "a day's window ends within a day: {reset}");
    assert_eq!(relay.metric("rl_relay_rls_domain_not_found_total"), 1.0);
    assert_eq!(relay.metric("rl_relay_rls_unmatched_descriptors_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_and_a_refused_request_takes_nothing() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let both = || with_cost(request("api", &[&[("tight", "a")], &[("wide", "a")]]), 3);
    let r = ask(&mut client, both()).await;
    assert_eq!((r.overall_code, codes(&r), remaining(&r)), (OK, vec![OK, OK], vec![2, 97]));
    // tight has 2 left: a request of 3 is refused, by tight alone.
    let r = ask(&mut client, both()).await;
    assert_eq!((r.overall_code, codes(&r)), (OVER_LIMIT, vec![OVER_LIMIT, OK]));
    // It took nothing from wide (envoyproxy/ratelimit's would have: 94 left)...
    let r = ask(&mut client, request("api", &[&[("wide", "a")]])).await;
    assert_eq!(remaining(&r), vec![96]);
    // ...nor from tight: 2 are still there (envoyproxy/ratelimit's counter would be past 5).
    let r = ask(&mut client, with_cost(request("api", &[&[("tight", "a")]]), 2)).await;
    assert_eq!((r.overall_code, remaining(&r)), (OK, vec![0]));
    let r = ask(&mut client, request("api", &[&[("tight", "a")]])).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    // The counters in Redis say the same: tight 5, wide 4.
    let mut con = server.con();
    for (key, used) in [("rl:rls:{api|tight=a}:fixed:hour", 5), ("rl:rls:{api|wide=a}:fixed:hour", 4)] {
        let limit = if key.contains("tight") { 5 } else { 100 };
        assert_eq!(counted(&mut con, key, limit), used, "{key}");
    }
    // A limit of 0 refuses everything; unlimited and no limit take nothing.
    let r = ask(&mut client, request("api", &[&[("zero", "a")], &[("wide", "a")]])).await;
    assert_eq!((r.overall_code, codes(&r)), (OVER_LIMIT, vec![OVER_LIMIT, OK]));
    // wide, not asked, shows what the relay knows of it (Redis said 96),
    // not its full limit.
    assert_eq!(remaining(&r), vec![0, 96]);
    let r = ask(&mut client, request("api", &[&[("wide", "a")]])).await;
    assert_eq!(remaining(&r), vec![95], "refused from memory by the 0: wide not asked");
    // Statistics count every descriptor by its code, as envoyproxy/ratelimit
    // does, whether Redis or memory refused its request: wide's 3 + 3 + 1 +
    // 1 + 1 hits were all within its limit, though it was charged 5.
    let wide =
        |stat: &str| relay.metric(&format!("ratelimit_service_rate_limit_{stat}{{domain=\"api\",key1=\"wide\"}}"));
    assert_eq!((wide("total_hits"), wide("within_limit"), wide("over_limit")), (9.0, 9.0, 0.0));
}

/// Counts `cost` on the fixed hourly window `key` of `limit` in Redis,
/// past the relay (which does not know of it).
fn spend(con: &mut redis::Connection, key: &str, limit: u64, cost: u64) {
    let _: Vec<i64> = redis::cmd("RL.WINDOW")
        .arg(1)
        .arg(key)
        .arg(limit)
        .arg(3_600_000)
        .arg(&["COST", &cost.to_string(), "FIXED"])
        .query(con)
        .unwrap();
}

/// What a fixed hourly window `key` has counted, read from Redis.
fn counted(con: &mut redis::Connection, key: &str, limit: i64) -> i64 {
    let peek: Vec<i64> =
        redis::cmd("RL.WINDOWPEEK").arg(1).arg(key).arg(limit).arg(3_600_000).arg("FIXED").query(con).unwrap();
    // A peek answers what taking 1 more would leave.
    limit - peek[1] - peek[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_counted_in_another_call_are_given_back() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--lease-window-ms", "100"]);
    let mut client = relay.client().await;
    let mut con = server.con();
    // tight=r has 1 left, which the relay does not know: Redis refuses.
    let tight = "rl:rls:{api|tight=r}:fixed:hour";
    spend(&mut con, tight, 5, 4);
    // tight and wide's first in one call (refused: counts nothing); wide's
    // second (a key once per call) and exact (another mode) in calls of
    // their own, each counting 2 while tight refuses 2.
    let descriptors: [&[(&str, &str)]; 4] = [&[("tight", "r")], &[("wide", "r")], &[("wide", "r")], &[("exact", "r")]];
    let answer = ask(&mut client, with_cost(request("api", &descriptors), 2)).await;
    assert_eq!((answer.overall_code, codes(&answer)), (OVER_LIMIT, vec![OVER_LIMIT, OK, OK, OK]));
    // The refunds are sent once the request is answered, one per call.
    wait_for(|| relay.metric("rl_relay_rls_window_refunds_total") == 2.0, "two window refunds");
    assert_eq!(counted(&mut con, "rl:rls:{api|wide=r}:fixed:hour", 100), 0, "wide gave its 2 back");
    assert_eq!(counted(&mut con, tight, 5), 4, "tight counted nothing");
    let exact: i64 = redis::cmd("EXISTS").arg("rl:rls:{api|exact=r}:exact:hour").query(&mut con).unwrap();
    assert_eq!(exact, 0, "the exact log gave its entry back: no key");
    assert_eq!(relay.metric("rl_relay_rls_window_counts_kept_total"), 0.0);
    assert_eq!(relay.metric("rl_relay_rls_refund_errors_total"), 0.0, "Redis took every refund");
    // Through the relay too: wide has its 100.
    let answer = ask(&mut client, request("api", &[&[("wide", "r")]])).await;
    assert_eq!(remaining(&answer), vec![99]);
}

/// A module older than `RL.WINDOW ... TIME` (a rollback, or a relay
/// upgraded first): windows are still decided by Redis, TIME is dropped
/// after the first refusal (shown in the log and a gauge), and a refused
/// request's windows in other calls keep their counts (under, counted).
/// Once the module is upgraded TIME is taken again within a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_without_time_still_decides_windows() {
    let server = Server::start(&[]);
    let old = common::BeforeTime::start(server.port);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[old.url()], false, &config, &["--lease-window-ms", "100"]);
    let mut client = relay.client().await;
    let mut con = server.con();
    assert_eq!(relay.metric("rl_relay_rls_window_time"), 1.0, "TIME until refused");
    let answer = ask(&mut client, request("api", &[&[("wide", "o")]])).await;
    assert_eq!((answer.overall_code, remaining(&answer)), (OK, vec![99]), "{answer:?}");
    let answer = ask(&mut client, request("api", &[&[("wide", "o")], &[("exact", "o")]])).await;
    assert_eq!((answer.overall_code, remaining(&answer)), (OK, vec![98, 2]), "{answer:?}");
    assert_eq!(old.refused.load(std::sync::atomic::Ordering::Relaxed), 1, "TIME sent once, then dropped");
    assert_eq!(relay.metric("rl_relay_rls_window_time"), 0.0);
    let errors = relay.metric("ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"}");
    assert_eq!(errors, 0.0, "no decision fell back");
    assert!(relay.relay.log().contains("RL.WINDOW refuses TIME: the module predates it"), "{}", relay.relay.log());
    // Refused by tight (Redis's count, unknown to the relay): exact, counted
    // in another call, keeps its count: under, and counted.
    let tight = "rl:rls:{api|tight=o}:fixed:hour";
    spend(&mut con, tight, 5, 5);
    let answer = ask(&mut client, with_cost(request("api", &[&[("tight", "o")], &[("exact", "o")]]), 1)).await;
    assert_eq!((answer.overall_code, codes(&answer)), (OVER_LIMIT, vec![OVER_LIMIT, OK]));
    wait_for(|| relay.metric("rl_relay_rls_window_counts_kept_total") >= 1.0, "the kept count shown");
    assert_eq!(relay.metric("rl_relay_rls_window_refunds_total"), 0.0, "nothing to refund by");
    // exact holds both its counts: the second request's and the refused one's.
    let exact: Vec<i64> = redis::cmd("RL.WINDOWPEEK")
        .arg(1)
        .arg("rl:rls:{api|exact=o}:exact:hour")
        .arg(3)
        .arg(3_600_000)
        .arg("EXACT")
        .query(&mut con)
        .unwrap();
    assert_eq!((exact[0], exact[1]), (1, 0), "2 of 3 counted: one more would leave 0");
    // The module upgraded: within the minute TIME is tried again and taken.
    old.upgraded.store(true, std::sync::atomic::Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(75);
    for n in 0.. {
        if relay.metric("rl_relay_rls_window_time") == 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "TIME was not tried again: {}", relay.relay.log());
        // A new window each time: one call to Redis each.
        let value = format!("p{n}");
        assert_eq!(ask(&mut client, request("api", &[&[("wide", &value)]])).await.overall_code, OK);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(relay.relay.log().contains("RL.WINDOW takes TIME again"), "{}", relay.relay.log());
    // tight full again, in case the hour turned during the wait (a full
    // window refuses this and counts nothing).
    spend(&mut con, tight, 5, 5);
    let answer = ask(&mut client, with_cost(request("api", &[&[("tight", "o")], &[("exact", "o")]]), 1)).await;
    assert_eq!(answer.overall_code, OVER_LIMIT);
    wait_for(|| relay.metric("rl_relay_rls_window_refunds_total") == 1.0, "the exact count given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_per_request_and_per_descriptor() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let mut r = with_cost(request("api", &[&[("tight", "b")], &[("wide", "b")]]), 2);
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 4 });
    let answer = ask(&mut client, r).await;
    assert_eq!((answer.overall_code, remaining(&answer)), (OK, vec![1, 98]), "tight took 4, wide the request's 2");
    // 0 asks and takes nothing.
    let mut r = request("api", &[&[("tight", "b")]]);
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let answer = ask(&mut client, r).await;
    assert_eq!((answer.overall_code, remaining(&answer)), (OK, vec![1]));
    // A request asking for more than the limit is refused and takes
    // nothing (a descriptor's own hits_addend is usage, counted in full:
    // rls_usage.rs).
    let r = with_cost(request("api", &[&[("wide", "b")]]), 1_000_000);
    assert_eq!(ask(&mut client, r).await.overall_code, OVER_LIMIT);
    assert_eq!(remaining(&ask(&mut client, request("api", &[&[("wide", "b")]])).await), vec![97]);
    // is_negative_hits: OK, gives back (rls_usage.rs), counted.
    let mut r = request("api", &[&[("tight", "b")]]);
    r.descriptors[0].is_negative_hits = true;
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    assert_eq!(ask(&mut client, r).await.overall_code, OK);
    assert_eq!(relay.metric("rl_relay_rls_negative_hits_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_unlimited_and_replaces() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    // A shadow limit is counted and reported, never enforced.
    for _ in 0..3 {
        let r = ask(&mut client, request("api", &[&[("shadow", "x")], &[("wide", "x")]])).await;
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![OK, OK]));
    }
    assert_eq!(relay.metric("ratelimit_service_rate_limit_shadow_mode{domain=\"api\",key1=\"shadow\"}"), 2.0);
    assert_eq!(relay.metric("ratelimit_service_rate_limit_over_limit{domain=\"api\",key1=\"shadow\"}"), 2.0);
    assert_eq!(relay.metric("ratelimit_service_rate_limit_total_hits{domain=\"api\",key1=\"shadow\"}"), 3.0);
    assert_eq!(relay.metric("ratelimit_service_rate_limit_within_limit{domain=\"api\",key1=\"wide\"}"), 3.0);
    // `new` replaces `old`: together only new applies; old alone applies.
    for _ in 0..3 {
        let r = ask(&mut client, request("api", &[&[("old", "x")], &[("new", "x")]])).await;
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![OK, OK]));
        assert_eq!(limit_of(&r.statuses[0]), None, "replaced");
    }
    assert_eq!(ask(&mut client, request("api", &[&[("old", "x")]])).await.overall_code, OK);
    assert_eq!(ask(&mut client, request("api", &[&[("old", "x")]])).await.overall_code, OVER_LIMIT);
    let r = ask(&mut client, with_cost(request("api", &[&[("free", "x")]]), 1_000_000)).await;
    assert_eq!((r.overall_code, remaining(&r)), (OK, vec![u32::MAX]));

    // Global shadow mode: statuses say OVER_LIMIT, the overall code OK.
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--rls-shadow-mode"]);
    let mut client = relay.client().await;
    let r = ask(&mut client, with_cost(request("api", &[&[("tight", "g")]]), 6)).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![OVER_LIMIT]));
    assert_eq!(relay.metric("ratelimit_service_global_shadow_mode"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_draft_envoyproxy_and_off() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(API);
    // None by default, as envoyproxy/ratelimit.
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let r = ask(&mut client, request("api", &[&[("tight", "d")]])).await;
    assert!(r.response_headers_to_add.is_empty(), "{:?}", r.response_headers_to_add);

    let relay = RlsRelay::start(&[server.url()], false, &config, &["--rls-headers", "draft"]);
    let mut client = relay.client().await;
    let r = ask(&mut client, with_cost(request("api", &[&[("tight", "h")], &[("old", "h")]]), 1)).await;
    assert_eq!(r.overall_code, OK);
    // An unnamed limit is named by its quota, never by its descriptor.
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"5-per-hour\";q=5;w=3600, \"old\";q=1;w=3600"));
    let binding = header(&r, "RateLimit").unwrap();
    assert!(binding.starts_with("\"old\";r=0;t="), "{binding}");
    assert_eq!(header(&r, "Retry-After"), None);
    let r = ask(&mut client, request("api", &[&[("old", "h")]])).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    let retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry), "{retry}");

    let relay = RlsRelay::start(&[server.url()], false, &config, &["--rls-headers", "envoyproxy"]);
    let mut client = relay.client().await;
    let r = ask(&mut client, request("api", &[&[("tight", "e")]])).await;
    assert_eq!((header(&r, "RateLimit-Limit"), header(&r, "RateLimit-Remaining")), (Some("5"), Some("4")));
    assert!(header(&r, "RateLimit-Reset").is_some() && header(&r, "RateLimit-Policy").is_none());

    let relay = RlsRelay::start(&[server.url()], false, &config, &["--rls-headers", "off"]);
    let mut client = relay.client().await;
    let r = ask(&mut client, request("api", &[&[("tight", "o")]])).await;
    assert!(r.response_headers_to_add.is_empty(), "{:?}", r.response_headers_to_add);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_token_bucket_sliding_and_exact_windows() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    // A bucket of 3 refilled at 1 a second: 3 at once, then refused.
    let mut ok = 0;
    for _ in 0..4 {
        ok += usize::from(ask(&mut client, request("api", &[&[("bucket", "t")]])).await.overall_code == OK);
    }
    assert!((3..=4).contains(&ok), "the burst, and at most one refilled: {ok}");
    for algorithm in ["sliding", "exact"] {
        let codes: Vec<i32> = {
            let mut out = Vec::new();
            for _ in 0..4 {
                out.push(ask(&mut client, request("api", &[&[(algorithm, "t")]])).await.overall_code);
            }
            out
        };
        assert_eq!(codes, [OK, OK, OK, OVER_LIMIT], "{algorithm}");
    }
    let mut con = server.con();
    let keys: Vec<String> = redis::cmd("KEYS").arg("rl:rls:*").query(&mut con).unwrap();
    for key in
        ["rl:rls:{api|bucket=t}:bucket:hour", "rl:rls:{api|sliding=t}:sliding:hour", "rl:rls:{api|exact=t}:exact:hour"]
    {
        assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
    }
    // All or nothing with a bucket: refused by tight, the bucket's token
    // goes back (RL.REFUND or the pool).
    let relay2 = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay2.client().await;
    let r = ask(&mut client, with_cost(request("api", &[&[("bucket", "u")], &[("tight", "u")]]), 3)).await;
    assert_eq!(r.overall_code, OK);
    let r = ask(&mut client, with_cost(request("api", &[&[("bucket", "v")], &[("tight", "u")]]), 3)).await;
    assert_eq!((r.overall_code, codes(&r)), (OVER_LIMIT, vec![OK, OVER_LIMIT]));
    let r = ask(&mut client, with_cost(request("api", &[&[("bucket", "v")]]), 3)).await;
    assert_eq!(r.overall_code, OK, "bucket v's 3 tokens were given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reload_good_and_bad() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("api.yaml");
    std::fs::write(
        &file,
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    )
    .unwrap();
    let relay = RlsRelay::start(&[server.url()], false, dir.path(), &[]);
    let mut client = relay.client().await;
    let r = ask(&mut client, request("api", &[&[("k", "1")]])).await;
    assert_eq!(limit_of(&r.statuses[0]), Some((1, 3, String::new())));
    // A good change is taken within a poll or two.
    std::fs::write(
        &file,
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 20 }\n",
    )
    .unwrap();
    wait_for(|| relay.metric("ratelimit_service_config_load_success") >= 2.0, "the good reload");
    let r = ask(&mut client, request("api", &[&[("k", "1")]])).await;
    assert_eq!(limit_of(&r.statuses[0]), Some((20, 4, String::new())));
    // A second file in the directory is merged in.
    std::fs::write(
        dir.path().join("b.yaml"),
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 7 }\n",
    )
    .unwrap();
    wait_for(|| relay.metric("ratelimit_service_config_load_success") >= 3.0, "the second file");
    let r = ask(&mut client, request("b", &[&[("k", "1")]])).await;
    assert_eq!(limit_of(&r.statuses[0]), Some((7, 4, String::new())));
    // A bad change is refused, logged and counted; the config in force stays.
    std::fs::write(
        &file,
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unt: 20 }\n",
    )
    .unwrap();
    wait_for(|| relay.metric("ratelimit_service_config_load_error") >= 1.0, "the bad reload");
    let log = relay.relay.log();
    assert!(log.contains("api.yaml") && log.contains("requests_per_unt"), "{log}");
    let r = ask(&mut client, request("api", &[&[("k", "1")]])).await;
    assert_eq!(limit_of(&r.statuses[0]), Some((20, 4, String::new())), "the config in force kept");
    assert_eq!(relay.get("/healthcheck").0, 200);
}

#[test]
fn a_bad_config_at_start_refuses_to_start() {
    let (_dir, config) = config_file("domain: api\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight }\n");
    let empty = tempfile::tempdir().unwrap();
    for (path, expected) in [
        (config.display().to_string(), vec!["config.yaml", "descriptors[0].rate_limit.unit", "fortnight"]),
        (empty.path().display().to_string(), vec!["no .yaml or .yml file"]),
        ("/nonexistent/rls.yaml".to_string(), vec!["/nonexistent/rls.yaml"]),
    ] {
        let args = ["--redis", "redis://127.0.0.1:1/", "--rls-listen", "127.0.0.1:0", "--rls-config", path.as_str()];
        let mut relay = Relay::spawn(Start { no_wait: true, ..Start::args(&args) });
        let code = relay.exit_code();
        assert!(code.is_some_and(|c| c != 0), "{code:?}");
        let log = relay.log();
        for part in expected {
            assert!(log.contains(part), "{part} in {log}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_bounds_what_a_caller_sends() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--max-request-bytes", "4096"]);
    let mut client = relay.client().await;
    let big = "v".repeat(8192);
    let e = client.should_rate_limit(request("api", &[&[("wide", big.as_str())]])).await.unwrap_err();
    assert!(matches!(e.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted), "{e:?}");
    let many: Vec<&[(&str, &str)]> = vec![&[("wide", "m")]; 65];
    let e = client.should_rate_limit(request("api", &many)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let entries: Vec<(&str, &str)> = vec![("wide", "m"); 33];
    let e = client.should_rate_limit(request("api", &[&entries])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let long = "v".repeat(2000);
    let e = client.should_rate_limit(request("api", &[&[("wide", long.as_str())]])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = client.should_rate_limit(request("", &[&[("wide", "m")]])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // Still serving after all that.
    assert_eq!(ask(&mut client, request("api", &[&[("wide", "m")]])).await.overall_code, OK);

    // With a token file, a caller without the token is refused.
    let token_dir = tempfile::tempdir().unwrap();
    let token = token_dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--rls-token-file", token.to_str().unwrap()]);
    let mut client = relay.client().await;
    let e = client.should_rate_limit(request("api", &[&[("wide", "t")]])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut r = tonic::Request::new(request("api", &[&[("wide", "t")]]));
    r.metadata_mut().insert("authorization", "Bearer s3cret".parse().unwrap());
    assert_eq!(client.should_rate_limit(r).await.unwrap().into_inner().overall_code, OK);
    assert!(!relay.relay.log().contains("s3cret"), "no secret in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_traffic_each_limit_follows_its_failure_mode() {
    let mut server = Server::start(&[]);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--timeout-ms", "100", "--rls-timeout-ms", "300"]);
    let mut client = relay.client().await;
    wait_for(|| relay.get("/healthcheck").0 == 200, "ready");
    wait_health(&relay, ServingStatus::Serving).await;
    assert_eq!(health(&relay, "ratelimit").await, ServingStatus::Serving as i32);
    let both = || request("api", &[&[("open", "k")]]);
    let deny = || request("api", &[&[("deny", "k")]]);
    for _ in 0..5 {
        assert_eq!(ask(&mut client, both()).await.overall_code, OK);
        assert_eq!(ask(&mut client, deny()).await.overall_code, OK);
    }
    server.kill();
    // Every decision answers, and within the deadline (a loose bound: the
    // machine is shared); open limits fall back, deny limits refuse.
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let t = Instant::now();
        let open = ask(&mut client, both()).await;
        let denied = ask(&mut client, deny()).await;
        worst = worst.max(t.elapsed());
        assert_eq!(open.overall_code, OK);
        assert_eq!(denied.overall_code, OVER_LIMIT);
    }
    assert!(worst < Duration::from_secs(3), "{worst:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(relay.metric("rl_relay_rls_fallback_total") >= 10.0);
    assert!(relay.metric("rl_relay_rls_failure_denied_total") >= 10.0);
    assert!(relay.metric("ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"}") >= 1.0);
    wait_for(|| relay.get("/healthcheck").0 == 500, "not ready without Redis");
    wait_health(&relay, ServingStatus::NotServing).await;
    assert_eq!(health(&relay, "ratelimit").await, ServingStatus::NotServing as i32);
    assert_eq!(relay.metric("rl_relay_rls_ready"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster() {
    let cluster = Cluster::start(3);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&cluster.urls(), true, &config, &[]);
    let mut client = relay.client().await;
    // Descriptors whose counters live on different nodes, in one request.
    let values: Vec<String> = (0..6).map(|i| format!("c{i}")).collect();
    let descriptors: Vec<[(&str, &str); 1]> = values.iter().map(|v| [("wide", v.as_str())]).collect();
    let refs: Vec<&[(&str, &str)]> = descriptors.iter().map(|d| &d[..]).collect();
    let r = ask(&mut client, with_cost(request("api", &refs), 2)).await;
    assert_eq!((r.overall_code, remaining(&r)), (OK, vec![98; 6]));
    let nodes: std::collections::HashSet<u16> =
        values.iter().map(|v| cluster.node_for(&format!("rl:rls:{{api|wide={v}}}:fixed:hour")).port).collect();
    assert!(nodes.len() >= 2, "spread over the cluster");
    for v in &values {
        let key = format!("rl:rls:{{api|wide={v}}}:fixed:hour");
        let exists: i64 = redis::cmd("EXISTS").arg(&key).query(&mut cluster.node_for(&key).con()).unwrap();
        assert_eq!(exists, 1, "{key} on its node");
    }
    // Across nodes, a bucket's tokens go back when another limit refuses.
    let r = ask(&mut client, with_cost(request("api", &[&[("bucket", "x")], &[("tight", "x")]]), 3)).await;
    assert_eq!(r.overall_code, OK);
    let r = ask(&mut client, with_cost(request("api", &[&[("bucket", "y")], &[("tight", "x")]]), 3)).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(ask(&mut client, with_cost(request("api", &[&[("bucket", "y")]]), 3)).await.overall_code, OK);
    assert_eq!(ask(&mut client, request("api", &[&[("tight", "x")]])).await.statuses[0].limit_remaining, 1);
    // Across nodes, windows give back their counts too: tight=z, with 1
    // left unknown to the relay, refuses a request of 2 on its node; the
    // six wide counters on the others give their 2 back.
    let tight = "rl:rls:{api|tight=z}:fixed:hour";
    spend(&mut cluster.node_for(tight).con(), tight, 5, 4);
    let mut with_tight = refs.clone();
    with_tight.push(&[("tight", "z")]);
    let r = ask(&mut client, with_cost(request("api", &with_tight), 2)).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    wait_for(|| relay.metric("rl_relay_rls_window_refunds_total") == 6.0, "six window refunds");
    for v in &values {
        let key = format!("rl:rls:{{api|wide={v}}}:fixed:hour");
        assert_eq!(counted(&mut cluster.node_for(&key).con(), &key, 100), 2, "{key} kept only the first request");
    }
}

fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_window_is_leased_never_over_with_few_redis_calls() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(
        "domain: api\ndescriptors:\n  - key: hot\n    rate_limit: { unit: hour, requests_per_unit: 300 }\n",
    );
    // A batch of 50: 300 an hour is 50 per 10 min lease window.
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--lease-window-ms", "600000"]);
    let client = relay.client().await;
    let callers: Vec<_> = (0..16)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..25 {
                    admitted +=
                        u32::from(ask(&mut client, request("api", &[&[("hot", "k")]])).await.overall_code == OK);
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for c in callers {
        admitted += c.await.unwrap();
    }
    let window_calls = calls(&mut server.con(), "rl.window");
    assert!(admitted <= 300, "never over: {admitted}");
    assert!(admitted >= 250, "under by at most what is held: {admitted}");
    let from_memory = relay.metric("rl_relay_rls_from_memory_total");
    eprintln!("{admitted} admitted, {window_calls} RL.WINDOW calls, {from_memory} from memory");
    assert!(window_calls < 120, "leased: {window_calls} RL.WINDOW calls for 400 requests");
    assert!(from_memory >= 150.0, "{from_memory}");
}

/// The relay's Redis user of docs/security.md's ACL recipe is all the RLS
/// front needs: its keys are under `rl:`, its commands the module's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acl_recipe_user_serves_the_rls_front() {
    let server = Server::start(&[]);
    let mut admin = server.con();
    let _: () = common::relay_acl_recipe(&mut admin, "pw").query(&mut admin).unwrap();
    let url = format!("redis://rl-relay:pw@127.0.0.1:{}/", server.port);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[url], false, &config, &[]);
    wait_for(|| relay.get("/healthcheck").0 == 200, "ready as the restricted user");
    let mut client = relay.client().await;
    let r = ask(
        &mut client,
        with_cost(request("api", &[&[("tight", "acl")], &[("wide", "acl")], &[("bucket", "acl")]]), 2),
    )
    .await;
    assert_eq!((r.overall_code, remaining(&r)), (OK, vec![3, 98, 1]));
    let r = ask(&mut client, with_cost(request("api", &[&[("bucket", "acl2")], &[("tight", "acl")]]), 4)).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    let r = ask(&mut client, request("api", &[&[("sliding", "acl")], &[("exact", "acl")]])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(relay.metric("rl_relay_rls_fallback_total"), 0.0, "every call answered by Redis: {}", relay.relay.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_is_answered_within_the_deadline() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(API);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--timeout-ms", "2000", "--rls-timeout-ms", "200"]);
    let mut client = relay.client().await;
    assert_eq!(ask(&mut client, request("api", &[&[("deny", "s")]])).await.overall_code, OK);
    // Redis stops answering for 3 s (every client paused), without closing.
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(3000).arg("ALL").query(&mut server.con()).unwrap();
    let mut worst = Duration::ZERO;
    for i in 0..4 {
        let t = Instant::now();
        let value = format!("s{i}");
        let r = ask(&mut client, request("api", &[&[("open", value.as_str())], &[("deny", value.as_str())]])).await;
        worst = worst.max(t.elapsed());
        assert_eq!((r.overall_code, codes(&r)), (OVER_LIMIT, vec![OK, OVER_LIMIT]), "{r:?}");
    }
    // 200 ms each, far from the 3 s pause (loose: the machine is shared).
    assert!(worst < Duration::from_millis(1500), "{worst:?}");
    assert!(relay.metric("rl_relay_rls_timeouts_total") >= 1.0);
}
