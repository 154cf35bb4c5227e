//! Counting right through Envoy (issue 36), through a real gRPC client
//! against the relay as a child process and a real server with the module:
//! usage reported after the fact (Envoy AI Gateway's token budgets, Envoy
//! Gateway's response cost), negative hits, and truthful answers.
//!
//! The descriptors are the ones Envoy Gateway's translator generates for a
//! rule with a request and a response cost (`internal/xds/translator/
//! ratelimit.go`): the route's generic key, then the rule's match (a
//! distinct header value: the user). At the request the rule's descriptor
//! carries its own `hits_addend` of the request cost (0 for AI Gateway:
//! look only); at stream end (`apply_on_stream_done`) the same descriptor
//! carries the response cost (the tokens used).

mod common;

use std::time::{Duration, Instant};

use common::rls::*;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use testkit::Server;

/// Envoy Gateway's shape: the route, then the rule's match per user.
const AI: &str = "\
domain: ai
descriptors:
  - key: llm-fixed
    value: llm-fixed
    descriptors:
      - key: rule-0-match-0
        rate_limit: { unit: hour, requests_per_unit: 1000 }
  - key: llm-sliding
    value: llm-sliding
    descriptors:
      - key: rule-0-match-0
        rate_limit: { unit: hour, requests_per_unit: 1000, algorithm: sliding_window }
  - key: llm-exact
    value: llm-exact
    descriptors:
      - key: rule-0-match-0
        rate_limit: { unit: hour, requests_per_unit: 1000, algorithm: exact_window }
  - key: llm-bucket
    value: llm-bucket
    descriptors:
      - key: rule-0-match-0
        rate_limit: { unit: hour, requests_per_unit: 1000, algorithm: token_bucket }
  - key: llm-fast
    value: llm-fast
    descriptors:
      - key: rule-0-match-0
        rate_limit: { unit: second, requests_per_unit: 10, algorithm: token_bucket }
  - key: llm-hot
    value: llm-hot
    descriptors:
      - key: rule-0-match-0
        rate_limit: { unit: hour, requests_per_unit: 36000 }
";

/// The rule's descriptor for `route` and `user`, with its own
/// `hits_addend` (Envoy Gateway's request or response cost) if any.
fn rule(route: &str, user: &str, hits: Option<u64>) -> RateLimitRequest {
    let mut r = request("ai", &[&[(route, route), ("rule-0-match-0", user)]]);
    r.descriptors[0].hits_addend = hits.map(|value| UInt64Value { value });
    r
}

/// The request-time check of AI Gateway: the descriptor with
/// `hits_addend` 0.
fn check(route: &str, user: &str) -> RateLimitRequest {
    rule(route, user, Some(0))
}

/// The stream-done charge: the same descriptor, `hits_addend` the tokens.
fn charge(route: &str, user: &str, tokens: u64) -> RateLimitRequest {
    rule(route, user, Some(tokens))
}

/// A request asking to pass, at the request-level `hits_addend` (1).
fn pass(route: &str, user: &str) -> RateLimitRequest {
    rule(route, user, None)
}

fn key(route: &str, user: &str, kind: &str, unit: &str) -> String {
    format!("rl:rls:{{ai|{route}={route}|rule-0-match-0={user}}}:{kind}:{unit}")
}

/// What a window key counts in Redis now: a peek against a limit far above
/// it answers what one more would leave.
fn window_count(con: &mut redis::Connection, key: &str, mode: &str) -> u64 {
    let limit: u64 = if mode == "EXACT" { 10_000 } else { 1_000_000_000_000 };
    let peek: Vec<i64> =
        redis::cmd("RL.WINDOWPEEK").arg(1).arg(key).arg(limit).arg(3_600_000).arg(mode).query(con).unwrap();
    assert_eq!(peek[0], 1, "{key}: {peek:?}");
    limit - 1 - peek[1] as u64
}

/// A token bucket's level in Redis (negative: in debt), from RL.INSPECT.
fn bucket_tokens(con: &mut redis::Connection, key: &str) -> i64 {
    let info: redis::Value = redis::cmd("RL.INSPECT").arg(key).query(con).unwrap();
    let text = format!("{info:?}");
    // RL.INSPECT answers field/value pairs; find "tokens" and the integer after it.
    let fields: Vec<redis::Value> = match info {
        redis::Value::Array(v) => v,
        redis::Value::Map(m) => m.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        other => panic!("RL.INSPECT {key}: {other:?}"),
    };
    for pair in fields.chunks(2) {
        if let [redis::Value::BulkString(name), value] = pair {
            if name == b"tokens" {
                return match value {
                    redis::Value::Int(n) => *n,
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).parse().unwrap(),
                    other => panic!("tokens of {key}: {other:?}"),
                };
            }
        }
    }
    panic!("RL.INSPECT {key} has no tokens: {text}")
}

fn code(r: &RateLimitResponse) -> i32 {
    r.overall_code
}

/// Envoy AI Gateway's flow on each window algorithm: the request that
/// crosses the budget completes, its usage counts in full, and the next
/// request is refused, at its check (hits_addend 0) and asking to pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_reported_after_the_fact_counts_in_full_on_windows() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(AI);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let mut con = server.con();
    for (route, kind, mode) in
        [("llm-fixed", "fixed", "FIXED"), ("llm-sliding", "sliding", "SLIDING"), ("llm-exact", "exact", "EXACT")]
    {
        // One charge above the whole budget: 1,200 of 1,000.
        let r = ask(&mut client, check(route, "a")).await;
        assert_eq!((code(&r), r.statuses[0].limit_remaining), (OK, 1000), "{route}: a look takes nothing");
        ask(&mut client, charge(route, "a", 1200)).await;
        assert_eq!(window_count(&mut con, &key(route, "a", kind, "hour"), mode), 1200, "{route}: counted in full");
        let r = ask(&mut client, check(route, "a")).await;
        assert_eq!((code(&r), r.statuses[0].limit_remaining), (OVER_LIMIT, 0), "{route}: the next check");
        assert_eq!(code(&ask(&mut client, pass(route, "a")).await), OVER_LIMIT, "{route}: the next request");
        // 300 then 800: the 800 crosses, counts in full, and closes it.
        assert_eq!(code(&ask(&mut client, check(route, "b")).await), OK);
        ask(&mut client, charge(route, "b", 300)).await;
        let r = ask(&mut client, check(route, "b")).await;
        assert_eq!((code(&r), r.statuses[0].limit_remaining), (OK, 700), "{route}");
        ask(&mut client, charge(route, "b", 800)).await;
        assert_eq!(window_count(&mut con, &key(route, "b", kind, "hour"), mode), 1100, "{route}");
        assert_eq!(code(&ask(&mut client, check(route, "b")).await), OVER_LIMIT, "{route}: the next check");
        assert_eq!(code(&ask(&mut client, pass(route, "b")).await), OVER_LIMIT, "{route}: the next request");
        // Exactly the budget: the next check is refused too (nothing left).
        ask(&mut client, charge(route, "c", 1000)).await;
        assert_eq!(code(&ask(&mut client, check(route, "c")).await), OVER_LIMIT, "{route}: spent exactly");
        // A request asking to pass is still all or nothing: refused, it
        // takes nothing (user d has 999 left of 1,000 after one).
        ask(&mut client, charge(route, "d", 999)).await;
        let mut two = pass(route, "d");
        two.hits_addend = 2;
        assert_eq!(code(&ask(&mut client, two).await), OVER_LIMIT, "{route}");
        assert_eq!(window_count(&mut con, &key(route, "d", kind, "hour"), mode), 999, "{route}: refused, took nothing");
        assert_eq!(code(&ask(&mut client, pass(route, "d")).await), OK, "{route}: the last one passes");
    }
}

/// A token bucket goes into debt and refuses until it is paid back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_puts_a_token_bucket_into_debt_until_paid_back() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(AI);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let mut con = server.con();
    assert_eq!(code(&ask(&mut client, check("llm-bucket", "a")).await), OK);
    ask(&mut client, charge("llm-bucket", "a", 1200)).await;
    let tokens = bucket_tokens(&mut con, &key("llm-bucket", "a", "bucket", "hour"));
    assert!((-200..=-199).contains(&tokens), "in debt by the 200 past its 1,000: {tokens}");
    let r = ask(&mut client, check("llm-bucket", "a")).await;
    assert_eq!((code(&r), r.statuses[0].limit_remaining), (OVER_LIMIT, 0));
    // Paid back at 1,000 an hour: 201 tokens (the debt and one) take 723.6 s.
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds;
    assert!((700..=724).contains(&reset), "until the debt is paid and a token is there: {reset} s");
    assert_eq!(code(&ask(&mut client, pass("llm-bucket", "a")).await), OVER_LIMIT);

    // 10 a second, 30 used: refused for the 2 s the debt takes to pay back,
    // then admitted.
    assert_eq!(code(&ask(&mut client, check("llm-fast", "a")).await), OK);
    let charged = Instant::now();
    ask(&mut client, charge("llm-fast", "a", 30)).await;
    assert_eq!(code(&ask(&mut client, check("llm-fast", "a")).await), OVER_LIMIT);
    let deadline = Instant::now() + Duration::from_secs(20);
    while code(&ask(&mut client, pass("llm-fast", "a")).await) != OK {
        assert!(Instant::now() < deadline, "the debt was never paid back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        charged.elapsed() >= Duration::from_millis(2000),
        "admitted before the debt was paid: {:?}",
        charged.elapsed()
    );
}

/// `--rls-stop-increment-when-overlimit` (envoyproxy/ratelimit's
/// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): the charge that crosses the
/// limit counts, charges on a limit already over count nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_increment_when_overlimit_counts_the_crossing_charge_only() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(AI);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--rls-stop-increment-when-overlimit"]);
    let mut client = relay.client().await;
    let mut con = server.con();
    ask(&mut client, charge("llm-fixed", "a", 900)).await;
    ask(&mut client, charge("llm-fixed", "a", 300)).await;
    let key = key("llm-fixed", "a", "fixed", "hour");
    assert_eq!(window_count(&mut con, &key, "FIXED"), 1200, "the crossing charge counts in full");
    let r = ask(&mut client, charge("llm-fixed", "a", 50)).await;
    assert_eq!(code(&r), OVER_LIMIT);
    assert_eq!(window_count(&mut con, &key, "FIXED"), 1200, "over already: not counted");
    ask(&mut client, charge("llm-bucket", "a", 1100)).await;
    ask(&mut client, charge("llm-bucket", "a", 100)).await;
    let tokens = bucket_tokens(&mut con, &self::key("llm-bucket", "a", "bucket", "hour"));
    assert!((-100..=-99).contains(&tokens), "the second charge found the bucket in debt: {tokens}");
}

/// A hot window leased to the relay: usage is paid from the tokens it
/// holds first, the rest counted in Redis, so the two add up to the truth
/// and the window stays closed once the usage crosses its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_on_a_leased_window_adds_up_and_closes_it() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(AI);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--lease-window-ms", "10000"]);
    let mut client = relay.client().await;
    let mut con = server.con();
    // 36,000 an hour is 100 per 10 s lease window: leased in batches.
    let mut asked = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while asked < 50 || relay.metric("rl_relay_rls_from_memory_total") < 1.0 {
        assert!(Instant::now() < deadline, "never paid from memory");
        assert_eq!(code(&ask(&mut client, pass("llm-hot", "a")).await), OK);
        asked += 1;
    }
    ask(&mut client, charge("llm-hot", "a", 40_000)).await;
    let counted = window_count(&mut con, &key("llm-hot", "a", "fixed", "hour"), "FIXED");
    // Redis counts the leased batches (spent or held) and the usage past
    // what was held: at least the truth, at most a batch above it.
    assert!(counted >= asked + 40_000, "{counted} < {asked} asked + 40,000 used");
    assert!(counted <= asked + 40_000 + 200, "{counted}: the held tokens paid part of the usage");
    for _ in 0..50 {
        assert_eq!(code(&ask(&mut client, pass("llm-hot", "a")).await), OVER_LIMIT, "closed to its end");
    }
}

/// A negative hit (`is_negative_hits`) of `n` on the rule's descriptor.
fn give_back(route: &str, user: &str, n: u64) -> RateLimitRequest {
    let mut r = rule(route, user, Some(n));
    r.descriptors[0].is_negative_hits = true;
    r
}

/// `is_negative_hits` gives back exactly what was taken, within the window
/// in progress, never more than it counts and never above the limit: and
/// reserve-then-settle works through Envoy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_hits_give_back_what_was_taken() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(AI);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let mut con = server.con();
    for (route, kind, mode) in
        [("llm-fixed", "fixed", "FIXED"), ("llm-sliding", "sliding", "SLIDING"), ("llm-exact", "exact", "EXACT")]
    {
        let mut ten = pass(route, "n");
        ten.hits_addend = 10;
        assert_eq!(code(&ask(&mut client, ten).await), OK);
        assert_eq!(code(&ask(&mut client, give_back(route, "n", 4)).await), OK);
        assert_eq!(window_count(&mut con, &key(route, "n", kind, "hour"), mode), 6, "{route}: 4 of 10 given back");
        assert_eq!(ask(&mut client, check(route, "n")).await.statuses[0].limit_remaining, 994, "{route}");
        ask(&mut client, give_back(route, "n", 100)).await;
        assert_eq!(window_count(&mut con, &key(route, "n", kind, "hour"), mode), 0, "{route}: never more than counted");
        assert_eq!(ask(&mut client, check(route, "n")).await.statuses[0].limit_remaining, 1000, "{route}: not above");
        // Reserve 500 at the request, 300 used: the 200 given back at the end.
        let mut reserve = pass(route, "r");
        reserve.hits_addend = 500;
        assert_eq!(code(&ask(&mut client, reserve).await), OK);
        ask(&mut client, give_back(route, "r", 200)).await;
        assert_eq!(window_count(&mut con, &key(route, "r", kind, "hour"), mode), 300, "{route}: settled at 300");
    }
    // A bucket: refunded, never above its capacity.
    let mut ten = pass("llm-bucket", "n");
    ten.hits_addend = 10;
    assert_eq!(code(&ask(&mut client, ten).await), OK);
    ask(&mut client, give_back("llm-bucket", "n", 4)).await;
    let tokens = bucket_tokens(&mut con, &key("llm-bucket", "n", "bucket", "hour"));
    assert!((994..=995).contains(&tokens), "4 of 10 given back: {tokens}");
    ask(&mut client, give_back("llm-bucket", "n", 100)).await;
    assert_eq!(ask(&mut client, check("llm-bucket", "n")).await.statuses[0].limit_remaining, 1000, "at most full");
    // A bucket in debt is paid back by a negative hit.
    ask(&mut client, charge("llm-bucket", "d", 1200)).await;
    assert_eq!(code(&ask(&mut client, check("llm-bucket", "d")).await), OVER_LIMIT);
    ask(&mut client, give_back("llm-bucket", "d", 300)).await;
    let r = ask(&mut client, check("llm-bucket", "d")).await;
    assert_eq!(code(&r), OK, "the debt given back: 1,000 - 1,200 + 300");
    assert!((99..=100).contains(&r.statuses[0].limit_remaining), "{:?}", r.statuses[0]);
    assert!(relay.metric("rl_relay_rls_negative_hits_total") >= 9.0);
}

/// `limit_remaining` is exact for a lone caller: it counts down one by one,
/// on a quiet window (each request asks Redis) and on a hot one (leased).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_remaining_counts_down_one_by_one_for_a_lone_caller() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(AI);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--lease-window-ms", "10000"]);
    let mut client = relay.client().await;
    for (route, limit) in [("llm-fixed", 1000), ("llm-hot", 36_000)] {
        let mut seen = Vec::new();
        for _ in 0..300 {
            let r = ask(&mut client, pass(route, "lone")).await;
            assert_eq!(code(&r), OK);
            seen.push(r.statuses[0].limit_remaining);
        }
        let expected: Vec<u32> = (1..=300).map(|n| limit - n).collect();
        assert_eq!(seen, expected, "{route}");
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Refusals answered from memory (the deny cache) carry the window's real
/// end, not the relay's hold of a refusal (`--max-refusal-hold-ms`, 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_from_memory_carry_the_real_reset() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(
        "domain: r\ndescriptors:\n  - key: hour\n    rate_limit: { unit: hour, requests_per_unit: 10 }\n  - key: day\n    \
         rate_limit: { unit: day, requests_per_unit: 10 }\n  - key: exact\n    rate_limit: { unit: hour, \
         requests_per_unit: 10, algorithm: exact_window }\n",
    );
    // Retry-After is the draft's (headers are off by default).
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--rls-headers", "draft"]);
    let mut client = relay.client().await;
    for (k, window_ms) in [("hour", 3_600_000u64), ("day", 86_400_000), ("exact", 3_600_000)] {
        let first = now_ms();
        for _ in 0..10 {
            assert_eq!(code(&ask(&mut client, request("r", &[&[(k, "x")]])).await), OK, "{k}");
        }
        for n in 0..4 {
            let asked = now_ms();
            let r = ask(&mut client, request("r", &[&[(k, "x")]])).await;
            assert_eq!(code(&r), OVER_LIMIT, "{k}");
            let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds as u64;
            // A fixed window ends at its epoch-aligned end; the exact log
            // when its first entry leaves, a window after it was logged.
            let end = if k == "exact" { first + window_ms } else { asked - asked % window_ms + window_ms };
            let (low, high) = ((end - now_ms()) / 1000, (end - asked).div_ceil(1000) + 1);
            assert!(
                (low.saturating_sub(2)..=high).contains(&reset),
                "{k}, refusal {n}: {reset} s, the end in {low}..{high} s"
            );
            let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
            assert_eq!(retry, reset, "{k}: Retry-After is the reset");
        }
    }
    assert!(relay.metric("rl_relay_rls_over_limit_from_memory_total") >= 1.0, "refusals answered from memory");
}
