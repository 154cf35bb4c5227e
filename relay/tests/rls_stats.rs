//! The RLS front's statistics read by Prometheus' own Python parser, its
//! windows over real time (fixed, sliding, exact, token bucket), and what
//! docs/envoy.md claims beside them: a real relay, real
//! servers with the module, envoy-types' generated gRPC client.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::rls::*;
use common::{Relay, Start};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use testkit::Server;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A sample as prometheus_client's parser read it: its name, its labels
/// sorted, `k="v"` joined by commas.
type SampleKey = (String, String);

/// One family of the page as the parser read it.
struct Family {
    name: String,
    kind: String,
    samples: BTreeMap<SampleKey, f64>,
}

/// `text` read by prometheus_client's parser, each sample keyed by its
/// name and its labels in order.
fn parse_prometheus(text: &str) -> Vec<Family> {
    let family = |f: testkit::prometheus::Family| Family {
        samples: f
            .samples
            .into_iter()
            .map(|s| {
                let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                ((s.name, labels.join(",")), s.value)
            })
            .collect(),
        name: f.name,
        kind: f.kind,
    };
    testkit::prometheus::parse(text).into_iter().map(family).collect()
}

/// The samples of the parsed families, by (sample name, labels).
fn samples(families: &[Family]) -> BTreeMap<SampleKey, f64> {
    families.iter().flat_map(|f| f.samples.iter().map(|(k, v)| (k.clone(), *v))).collect()
}

fn key(name: &str, labels: &str) -> SampleKey {
    (name.to_string(), labels.to_string())
}

fn with_cost(mut r: RateLimitRequest, hits: u32) -> RateLimitRequest {
    r.hits_addend = hits;
    r
}

/// A client that counts the calls it makes.
struct Counted {
    client: RateLimitServiceClient<Channel>,
    calls: u64,
}

impl Counted {
    async fn ask(&mut self, r: RateLimitRequest) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse {
        self.calls += 1;
        ask(&mut self.client, r).await
    }
}

const STATS: &str = "\
domain: stats
descriptors:
  - key: near
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: cost
    rate_limit: { unit: hour, requests_per_unit: 20 }
  - key: outer
    descriptors:
      - key: inner
        rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: deep1
    descriptors:
      - key: deep2
        rate_limit: { unit: hour, requests_per_unit: 100 }
        descriptors:
          - key: deep3
            rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: detailed
    detailed_metric: true
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: v2m
    value_to_metric: true
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: plain
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: kept1
    rate_limit: { unit: hour, requests_per_unit: 100, algorithm: sliding_window }
  - key: kept2
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: g1
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: g2
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: bucket
    rate_limit: { unit: hour, requests_per_unit: 2, algorithm: token_bucket }
";

/// Every `ratelimit_service_rate_limit_*` counter with a known exact value,
/// every other RLS counter too, read by prometheus_client's parser: the
/// page parses, every family has its HELP and TYPE, and each label set
/// holds what the traffic below makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_read_by_prometheus_parser_count_exactly() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(STATS);
    // Batches of a tenth of a second's rate: every limit here is quiet (a
    // batch below two tokens), so every decision is one exact Redis call
    // or a refusal from memory, and the counts below do not depend on
    // when a lease lands.
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--lease-window-ms", "100"]);
    let mut c = Counted { client: relay.client().await, calls: 0 };

    // An unknown domain and an unmatched descriptor: OK, counted, no series.
    assert_eq!(c.ask(request("nope", &[&[("near", "a")]])).await.overall_code, OK);
    assert_eq!(c.ask(request("stats", &[&[("nothing", "x")]])).await.overall_code, OK);

    // near (10 an hour, near past 8): 10 admitted (hits 9 and 10 near),
    // the 11th refused by Redis, the 12th by the deny cache.
    for i in 0..12 {
        let r = c.ask(request("stats", &[&[("near", "a")]])).await;
        assert_eq!(r.overall_code, if i < 10 { OK } else { OVER_LIMIT }, "near hit {}", i + 1);
    }
    // cost (20, near past 16): 15 (to 15), 3 (to 18: 2 near), 2 (to 20: 2
    // near), then 5 refused.
    for (hits, code) in [(15, OK), (3, OK), (2, OK), (5, OVER_LIMIT)] {
        let r = c.ask(with_cost(request("stats", &[&[("cost", "a")]]), hits)).await;
        assert_eq!(r.overall_code, code, "cost {hits}");
    }
    // A nested descriptor (outer, inner: 5, near past 4): 5 admitted, 1 refused.
    for i in 0..6 {
        let r = c.ask(request("stats", &[&[("outer", "a"), ("inner", "b")]])).await;
        assert_eq!(r.overall_code, if i < 5 { OK } else { OVER_LIMIT });
    }
    // Three levels: deep1.deep2 and deep1.deep2.deep3 fold into (deep1, deep2).
    c.ask(request("stats", &[&[("deep1", "a"), ("deep2", "b")]])).await;
    for _ in 0..2 {
        c.ask(request("stats", &[&[("deep1", "a"), ("deep2", "b"), ("deep3", "c")]])).await;
    }
    // detailed_metric and value_to_metric put the value in the series;
    // plain does not.
    for (k, v) in [("detailed", "x"), ("detailed", "x"), ("detailed", "y"), ("v2m", "p"), ("v2m", "q"), ("v2m", "q")] {
        c.ask(request("stats", &[&[(k, v)]])).await;
    }
    for v in ["p", "q"] {
        c.ask(request("stats", &[&[("plain", v)]])).await;
    }
    // Shadow (2, near past 1): 2 admitted, then 2 a shadow limit would
    // refuse (Redis, then the deny cache); every answer OK.
    for _ in 0..4 {
        let r = c.ask(request("stats", &[&[("shadow", "s")]])).await;
        assert_eq!((r.overall_code, r.statuses[0].code), (OK, OK));
    }
    // is_negative_hits: OK, counted apart, given back (a refund call).
    let mut r = request("stats", &[&[("cost", "a")]]);
    r.descriptors[0].is_negative_hits = true;
    assert_eq!(c.ask(r).await.overall_code, OK);
    // Different modes go in different calls: kept2 (3) refuses 2 of its 1
    // left, kept1's 2 were counted in its own call and are given back.
    assert_eq!(c.ask(with_cost(request("stats", &[&[("kept2", "a")]]), 2)).await.overall_code, OK);
    let answer = c.ask(with_cost(request("stats", &[&[("kept1", "a")], &[("kept2", "a")]]), 2)).await;
    assert_eq!((answer.overall_code, answer.statuses[1].code), (OVER_LIMIT, OVER_LIMIT));
    // Two windows of one cost: one RL.WINDOW, then a peek each.
    assert_eq!(c.ask(request("stats", &[&[("g1", "a")], &[("g2", "a")]])).await.overall_code, OK);
    // A token bucket (2, near past 1): 2 admitted, the 3rd refused.
    for i in 0..3 {
        let r = c.ask(request("stats", &[&[("bucket", "b")]])).await;
        assert_eq!(r.overall_code, if i < 2 { OK } else { OVER_LIMIT });
    }
    // A call the front refuses (an empty domain): a service error.
    c.calls += 1;
    let e = c.client.should_rate_limit(request("", &[&[("near", "a")]])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // The refund is sent once the request is answered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while relay.metric("rl_relay_rls_window_refunds_total") < 2.0 {
        assert!(std::time::Instant::now() < deadline, "kept1's count was not given back");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (code, text) = relay.get("/metrics");
    assert_eq!(code, 200);
    let families = parse_prometheus(&text);
    // Every family the parser found has its HELP and a TYPE it read.
    for f in &families {
        assert_ne!(f.kind, "unknown", "{} has no TYPE the parser read", f.name);
        let named = |what: &str| {
            text.lines().any(|l| {
                l.strip_prefix(what)
                    .and_then(|rest| rest.strip_prefix(f.name.as_str()))
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with("_total "))
            })
        };
        assert!(named("# HELP ") && named("# TYPE "), "{} without HELP or TYPE", f.name);
    }
    let got = samples(&families);

    // The envoyproxy/ratelimit series: exactly these label sets, these values.
    let series: [(&str, [u64; 5]); 15] = [
        // labels: [total_hits, over_limit, near_limit, within_limit, shadow_mode]
        ("domain=\"stats\",key1=\"bucket\"", [3, 1, 1, 2, 0]),
        ("domain=\"stats\",key1=\"cost\"", [25, 5, 4, 20, 0]),
        ("domain=\"stats\",key1=\"deep1\",key2=\"deep2\"", [3, 0, 0, 3, 0]),
        ("domain=\"stats\",key1=\"detailed_x\"", [2, 0, 0, 2, 0]),
        ("domain=\"stats\",key1=\"detailed_y\"", [1, 0, 0, 1, 0]),
        ("domain=\"stats\",key1=\"g1\"", [1, 0, 0, 1, 0]),
        ("domain=\"stats\",key1=\"g2\"", [1, 0, 0, 1, 0]),
        ("domain=\"stats\",key1=\"kept1\"", [2, 0, 0, 2, 0]),
        ("domain=\"stats\",key1=\"kept2\"", [4, 2, 0, 2, 0]),
        ("domain=\"stats\",key1=\"near\"", [12, 2, 2, 10, 0]),
        ("domain=\"stats\",key1=\"outer\",key2=\"inner\"", [6, 1, 1, 5, 0]),
        ("domain=\"stats\",key1=\"plain\"", [2, 0, 0, 2, 0]),
        ("domain=\"stats\",key1=\"shadow\"", [4, 2, 1, 2, 2]),
        ("domain=\"stats\",key1=\"v2m_p\"", [1, 0, 0, 1, 0]),
        ("domain=\"stats\",key1=\"v2m_q\"", [2, 0, 0, 2, 0]),
    ];
    let stats = ["total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"];
    let mut expected: BTreeMap<SampleKey, f64> = BTreeMap::new();
    for (labels, values) in &series {
        for (stat, value) in stats.iter().zip(values) {
            expected.insert(key(&format!("ratelimit_service_rate_limit_{stat}_total"), labels), *value as f64);
        }
    }
    for (k, value) in &expected {
        assert_eq!(got.get(k), Some(value), "{}{{{}}}", k.0, k.1);
    }
    let rate_limit: Vec<&SampleKey> = got.keys().filter(|k| k.0.starts_with("ratelimit_service_rate_limit_")).collect();
    assert_eq!(rate_limit, expected.keys().collect::<Vec<_>>(), "no other ratelimit_service_rate_limit_* series");
    for stat in stats {
        let f = families.iter().find(|f| f.name == format!("ratelimit_service_rate_limit_{stat}")).unwrap();
        assert_eq!(f.kind, "counter", "{stat}");
    }

    // The rest of envoyproxy/ratelimit's names and ours, exactly. Redis
    // calls: near 11, cost 4, outer 6, deep 3, detailed 3, v2m 3, plain 2,
    // shadow 3, kept 3 + kept1's refund, g 1 + 2 peeks, bucket 3, the
    // negative hit's refund 1.
    let redis_calls = 11 + 4 + 6 + 3 + 3 + 3 + 2 + 3 + 4 + 3 + 3 + 1;
    for (name, labels, value) in [
        ("ratelimit_service_config_load_success_total", "", 1),
        ("ratelimit_service_config_load_error_total", "", 0),
        ("ratelimit_service_global_shadow_mode_total", "", 0),
        ("ratelimit_service_should_rate_limit_error_total", "err_type=\"redis_error\"", 0),
        ("ratelimit_service_should_rate_limit_error_total", "err_type=\"service_error\"", 1),
        ("ratelimit_service_total_requests_total", "grpc_method=\"ShouldRateLimit\"", c.calls),
        ("ratelimit_service_response_time_seconds_count", "grpc_method=\"ShouldRateLimit\"", c.calls),
        ("ratelimit_service_response_time_seconds_bucket", "grpc_method=\"ShouldRateLimit\",le=\"+Inf\"", c.calls),
        ("rl_relay_rls_domain_not_found_total", "", 1),
        ("rl_relay_rls_unmatched_descriptors_total", "", 1),
        ("rl_relay_rls_from_memory_total", "", 0),
        ("rl_relay_rls_over_limit_from_memory_total", "", 2),
        ("rl_relay_rls_redis_calls_total", "", redis_calls),
        ("rl_relay_rls_window_leases_total", "", 0),
        ("rl_relay_rls_fallback_total", "", 0),
        ("rl_relay_rls_failure_denied_total", "", 0),
        ("rl_relay_rls_refunds_total", "", 0),
        ("rl_relay_rls_given_back_total", "", 0),
        ("rl_relay_rls_window_refunds_total", "", 2),
        ("rl_relay_rls_refund_errors_total", "", 0),
        ("rl_relay_rls_window_counts_kept_total", "", 0),
        ("rl_relay_rls_timeouts_total", "", 0),
        ("rl_relay_rls_negative_hits_total", "", 1),
        ("rl_relay_rls_series_dropped_total", "", 0),
        ("rl_relay_rls_ready", "", 1),
        ("rl_relay_rls_domains", "", 1),
        ("rl_relay_rls_config_files", "", 1),
        ("rl_relay_rls_window_evictions", "", 0),
    ] {
        assert_eq!(got.get(&key(name, labels)), Some(&(value as f64)), "{name}{{{labels}}}");
    }
    let histogram = families.iter().find(|f| f.name == "ratelimit_service_response_time_seconds").unwrap();
    assert_eq!(histogram.kind, "histogram");
    let buckets: Vec<f64> =
        histogram.samples.iter().filter(|(k, _)| k.0.ends_with("_bucket")).map(|(_, v)| *v).collect();
    assert_eq!(buckets.len(), 14, "13 bounds and +Inf");
    // The relay's count of Redis calls is the server's.
    let mut con = server.con();
    let on_server: u64 =
        ["rl.window", "rl.windowpeek", "rl.take", "rl.refund"].iter().map(|c| calls(&mut con, c)).sum();
    assert_eq!(on_server, redis_calls, "commands the server counted");
    assert_eq!((calls(&mut con, "rl.windowpeek"), calls(&mut con, "rl.take")), (2, 3));
}

/// One call of a burst: when it was sent, when answered, and the answer.
struct Call {
    sent: u64,
    answered: u64,
    admitted: bool,
    reset_s: Option<i64>,
}

/// `n` calls in a row of one descriptor.
async fn burst(client: &mut RateLimitServiceClient<Channel>, entries: &[(&str, &str)], n: usize) -> Vec<Call> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let sent = now_ms();
        let r = ask(client, request("time", &[entries])).await;
        let answered = now_ms();
        out.push(Call {
            sent,
            answered,
            admitted: r.overall_code == OK,
            reset_s: r.statuses[0].duration_until_reset.as_ref().map(|d| d.seconds),
        });
    }
    out
}

fn pattern(calls: &[Call]) -> Vec<bool> {
    calls.iter().map(|c| c.admitted).collect()
}

fn admitted(calls: &[Call]) -> u64 {
    calls.iter().filter(|c| c.admitted).count() as u64
}

/// Whether every call of `calls` was sent and answered in epoch second `s`.
fn within_second(calls: &[Call], s: u64) -> bool {
    calls.iter().all(|c| c.sent / 1000 == s && c.answered / 1000 == s)
}

/// Sleeps until epoch ms `at` (now if past).
async fn until(at: u64) {
    tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
}

/// Sleeps until `ms` into a second (this one if still before it, else the next).
async fn into_second(ms: u64) {
    let now = now_ms();
    let start = now - now % 1000;
    until(if now % 1000 < ms { start + ms } else { start + 1000 + ms }).await;
}

const TIME: &str = "\
domain: time
descriptors:
  - key: fixed
    rate_limit: { unit: second, requests_per_unit: 5 }
  - key: fixed10
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: sliding
    rate_limit: { unit: second, requests_per_unit: 10, algorithm: sliding_window }
  - key: exact
    rate_limit: { unit: second, requests_per_unit: 5, algorithm: exact_window }
  - key: bucket
    rate_limit: { unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4 }
";

/// A relay on TIME whose limits are all quiet (a batch of a tenth of a
/// second's rate is at most a token): every decision is Redis's, exact.
fn time_relay(server: &Server) -> (tempfile::TempDir, RlsRelay) {
    let (dir, config) = config_file(TIME);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--lease-window-ms", "100"]);
    (dir, relay)
}

/// Attempts of a timed scenario: one whose calls did not land where the
/// scenario needs them (a busy machine: a burst straddled a second) is
/// tried again with fresh counters; its assertions are not made.
const ATTEMPTS: usize = 4;

/// A fixed window of a second is aligned to the epoch: 5 admitted from
/// the middle of a second, refused until that second ends, 5 again right
/// after it, only ~half a second after the first (a window started at the
/// first request would still be closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_resets_at_the_epoch_aligned_second() {
    let server = Server::start(&[]);
    let (_dir, relay) = time_relay(&server);
    let mut client = relay.client().await;
    for attempt in 0..ATTEMPTS {
        let value = format!("a{attempt}");
        into_second(500).await;
        let first = burst(&mut client, &[("fixed", &value)], 6).await;
        let s = first[0].sent / 1000;
        if !within_second(&first, s) {
            continue;
        }
        assert_eq!(pattern(&first), [true, true, true, true, true, false]);
        // Refused past the middle of a second: the window ends within it.
        assert_eq!(first[5].reset_s, Some(1), "seconds until the window resets");
        until((s + 1) * 1000 + 20).await;
        let second = burst(&mut client, &[("fixed", &value)], 6).await;
        if !within_second(&second, s + 1) {
            continue;
        }
        assert!(second[0].sent - first[0].sent < 1000);
        assert_eq!(pattern(&second), [true, true, true, true, true, false], "a new epoch second, a new window");
        return;
    }
    panic!("no attempt of {ATTEMPTS} kept its bursts within a second each: the machine is too busy");
}

/// A sliding window weighs the previous one: right after the boundary,
/// after a full second of 10, it admits only what the previous second's
/// fading weight leaves (10 x the fraction of the second gone), while a
/// fixed window of 10 admits all 10 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_weighs_the_previous_second() {
    let server = Server::start(&[]);
    let (_dir, relay) = time_relay(&server);
    let mut client = relay.client().await;
    for attempt in 0..ATTEMPTS {
        let value = format!("a{attempt}");
        into_second(50).await;
        let sliding = burst(&mut client, &[("sliding", &value)], 11).await;
        let fixed = burst(&mut client, &[("fixed10", &value)], 11).await;
        let s = sliding[0].sent / 1000;
        if !within_second(&sliding, s) || !within_second(&fixed, s) {
            continue;
        }
        let ten_then_refused: Vec<bool> = (0..11).map(|i| i < 10).collect();
        assert_eq!(pattern(&sliding), ten_then_refused, "the first second: no previous one to weigh");
        assert_eq!(pattern(&fixed), ten_then_refused);
        let start = (s + 1) * 1000;
        until(start + 100).await;
        let sliding = burst(&mut client, &[("sliding", &value)], 10).await;
        let fixed = burst(&mut client, &[("fixed10", &value)], 10).await;
        if !within_second(&sliding, s + 1) || !within_second(&fixed, s + 1) {
            continue;
        }
        assert_eq!(admitted(&fixed), 10, "a fixed window starts empty");
        // Admitted while 10 x (1000 - t) + (n + 1) x 1000 <= 10 x 1000,
        // t ms into the second: n + 1 <= t / 100.
        let (t0, t1) = (sliding[0].sent - start, sliding[9].answered - start);
        let n = admitted(&sliding);
        assert!((t0 / 100..=t1 / 100).contains(&n), "{n} admitted between {t0} and {t1} ms into the second");
        assert!(n < admitted(&fixed), "the sliding window admits fewer: {n}");
        return;
    }
    panic!("no attempt of {ATTEMPTS} kept its bursts within a second each: the machine is too busy");
}

/// An exact window counts the last second, whatever its epoch alignment:
/// 5 admitted late in a second are still counted after the boundary
/// (where a fixed window would admit), and once they are a second old, 5
/// and no more are admitted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_window_admits_the_limit_in_any_rolling_second() {
    let server = Server::start(&[]);
    let (_dir, relay) = time_relay(&server);
    let mut client = relay.client().await;
    for attempt in 0..ATTEMPTS {
        let value = format!("a{attempt}");
        into_second(700).await;
        let first = burst(&mut client, &[("exact", &value)], 6).await;
        let s = first[0].sent / 1000;
        if !within_second(&first, s) {
            continue;
        }
        assert_eq!(pattern(&first), [true, true, true, true, true, false]);
        until((s + 1) * 1000 + 20).await;
        let after = burst(&mut client, &[("exact", &value)], 1).await;
        if after[0].answered >= first[0].sent + 1000 {
            continue; // the first admitted may have left the last second
        }
        assert!(!after[0].admitted, "5 admitted less than a second ago, across the epoch boundary");
        until(first[4].answered + 1000 + 20).await;
        let again = burst(&mut client, &[("exact", &value)], 6).await;
        if again[5].answered >= again[0].sent + 1000 {
            continue; // the burst itself lasted a second
        }
        assert_eq!(pattern(&again), [true, true, true, true, true, false], "a second later: 5 again, no more");
        return;
    }
    panic!("no attempt of {ATTEMPTS} kept its calls within the second they needed: the machine is too busy");
}

/// ceil(2 x ms / 1000): the tokens a bucket of 2 a second refills in `ms`, rounded up.
fn refilled_up(ms: u64) -> u64 {
    (2 * ms).div_ceil(1000)
}

/// A token bucket of 2 a second with a burst of 4: 4 at once, then what
/// refills (2 a second, continuously), and never more than the burst
/// however long it rested. Each bound is in whole tokens from when calls
/// were sent and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_refills_over_time_up_to_its_burst() {
    let server = Server::start(&[]);
    let (_dir, relay) = time_relay(&server);
    let mut client = relay.client().await;
    for attempt in 0..ATTEMPTS {
        let value = format!("a{attempt}");
        let entries = [("bucket", value.as_str())];
        // Full at first: 4, plus at most what refilled during the burst.
        let first = burst(&mut client, &entries, 6).await;
        let n = admitted(&first);
        assert!(pattern(&first)[..4].iter().all(|&a| a), "the burst of 4");
        assert!(n <= 4 + 2 * (first[5].answered - first[0].sent) / 1000, "{n} admitted at once");
        if first[5].admitted {
            continue; // the burst took a second: not empty at its end
        }
        // Empty (less than a token) when its last call was refused; a
        // second later, what refilled since.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let second = burst(&mut client, &entries, 6).await;
        let n = admitted(&second);
        let at_least = (2 * (second[0].sent - first[5].answered) / 1000).min(4);
        let at_most = refilled_up(second[5].answered - first[5].sent);
        assert!((at_least..=at_most).contains(&n), "{n} admitted after a second: {at_least}..={at_most}");
        if second[5].admitted {
            continue;
        }
        // 2.6 s of rest would refill 5: the bucket holds 4 at most.
        tokio::time::sleep(Duration::from_millis(2600)).await;
        let third = burst(&mut client, &entries, 6).await;
        let n = admitted(&third);
        assert!(pattern(&third)[..4].iter().all(|&a| a), "full again");
        assert!(n <= 4 + 2 * (third[5].answered - third[0].sent) / 1000, "{n} admitted: the burst caps the rest");
        return;
    }
    panic!("no attempt of {ATTEMPTS} ended a burst refused: the machine is too busy");
}

const EDGE: &str = "\
domain: edge
descriptors:
  - key: m
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: h
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: d
    rate_limit: { unit: day, requests_per_unit: 100 }
";

async fn health(relay: &RlsRelay, service: &str) -> Result<i32, tonic::Code> {
    let channel = Channel::from_shared(format!("http://127.0.0.1:{}", relay.rls_port)).unwrap();
    let mut client = HealthClient::new(channel.connect().await.unwrap());
    client
        .check(HealthCheckRequest { service: service.into() })
        .await
        .map(|r| r.into_inner().status)
        .map_err(|e| e.code())
}

/// docs/envoy.md, beside what rls.rs tests: gRPC health
/// under the service's full name, `/healthcheck` answering `OK`,
/// `--rls-prefix` and escaped counter keys, windows aligned to their unit
/// (a day ends at UTC midnight), a bad config exiting with status 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_envoy_as_the_readme_says() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(EDGE);
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--rls-prefix", "rl:edge:"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while health(&relay, "envoy.service.ratelimit.v3.RateLimitService").await != Ok(ServingStatus::Serving as i32) {
        assert!(std::time::Instant::now() < deadline, "the service's full name never SERVING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(health(&relay, "ratelimit").await, Ok(ServingStatus::Serving as i32));
    assert_eq!(health(&relay, "nope").await, Err(tonic::Code::NotFound));
    assert_eq!(relay.get("/healthcheck"), (200, "OK".to_string()));

    let mut client = relay.client().await;
    // Each unit's window ends at its epoch-aligned end (UTC midnight for a day).
    for (k, unit_ms) in [("m", 60_000u64), ("h", 3_600_000), ("d", 86_400_000)] {
        loop {
            let sent = now_ms();
            let r = ask(&mut client, request("edge", &[&[(k, "v")]])).await;
            let answered = now_ms();
            if sent / unit_ms != answered / unit_ms {
                continue; // the call straddled the window's end
            }
            let end = (sent / unit_ms + 1) * unit_ms;
            let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds as u64;
            let (lo, hi) = ((end - answered).div_ceil(1000), (end - sent).div_ceil(1000));
            assert!((lo..=hi).contains(&reset), "{k}: {reset} s to the window's end, not {lo}..={hi}");
            break;
        }
    }
    // The prefix, and the descriptor escaped inside one hash tag.
    let r = ask(&mut client, request("edge", &[&[("m", "a|b=c{d}%")]])).await;
    assert_eq!(r.overall_code, OK);
    let exists: i64 =
        redis::cmd("EXISTS").arg("rl:edge:{edge|m=a%7Cb%3Dc%7Bd%7D%25}:fixed:minute").query(&mut server.con()).unwrap();
    assert_eq!(exists, 1, "{:?}", redis::cmd("KEYS").arg("*").query::<Vec<String>>(&mut server.con()));

    // A bad config at start: status 2 (rls.rs checks it is not 0).
    let (_bad, bad) = config_file("domain: edge\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight }\n");
    let args =
        ["--redis", "redis://127.0.0.1:1/", "--rls-listen", "127.0.0.1:0", "--rls-config", bad.to_str().unwrap()];
    let mut refused = Relay::spawn(Start { no_wait: true, ..Start::args(&args) });
    assert_eq!(refused.exit_code(), Some(2), "{}", refused.log());
}
