//! The RLS front's statistics read by Prometheus' own Python parser: a
//! real relay, real servers with the module, envoy-types' generated gRPC
//! client.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use common::rls::*;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use testkit::Server;
use tonic::transport::Channel;

/// A sample as prometheus_client's parser read it: its name, its labels
/// sorted, `k="v"` joined by commas.
type SampleKey = (String, String);

/// One family of the page as the parser read it.
struct Family {
    name: String,
    kind: String,
    samples: BTreeMap<SampleKey, f64>,
}

/// `text` read by prometheus_client's parser (unpacked under .deps/ by
/// `make servers`), through the script rules' tests use.
fn parse_prometheus(text: &str) -> Vec<Family> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = repo.join(".deps/prometheus-client");
    assert!(
        lib.join("prometheus_client/parser.py").exists(),
        "Prometheus' Python parser is not under {}: run `make servers` (it fetches the prometheus-client wheel)",
        lib.display()
    );
    let mut child = Command::new("python3")
        .arg(repo.join("rules/tests/support/promparse.py"))
        .env("PYTHONPATH", &lib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the parser refused the text: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    let families: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the parser's JSON");
    let str_of = |v: &serde_json::Value| v.as_str().unwrap().to_string();
    families
        .as_array()
        .unwrap()
        .iter()
        .map(|f| Family {
            name: str_of(&f["name"]),
            kind: str_of(&f["type"]),
            samples: f["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let labels: BTreeMap<&String, String> =
                        s["labels"].as_object().unwrap().iter().map(|(k, v)| (k, str_of(v))).collect();
                    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                    ((str_of(&s["name"]), labels.join(",")), s["value"].as_f64().unwrap())
                })
                .collect(),
        })
        .collect()
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

/// A request of one descriptor with its own `hits_addend`.
fn costing(domain: &str, entries: &[(&str, &str)], hits: u64) -> RateLimitRequest {
    let mut r = request(domain, &[entries]);
    r.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
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
    rate_limit: { unit: hour, requests_per_unit: 100 }
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
    // is_negative_hits: OK, counted apart, nothing asked.
    let mut r = request("stats", &[&[("cost", "a")]]);
    r.descriptors[0].is_negative_hits = true;
    assert_eq!(c.ask(r).await.overall_code, OK);
    // Different costs go in different calls: kept2 (3) refuses 2 of its 1
    // left, kept1's 1 was counted in its own call and stays counted.
    assert_eq!(c.ask(costing("stats", &[("kept2", "a")], 2)).await.overall_code, OK);
    let mut r = request("stats", &[&[("kept1", "a")], &[("kept2", "a")]]);
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    r.descriptors[1].hits_addend = Some(UInt64Value { value: 2 });
    let answer = c.ask(r).await;
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
        ("domain=\"stats\",key1=\"kept1\"", [1, 0, 0, 1, 0]),
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
    // shadow 3, kept 3, g 1 + 2 peeks, bucket 3.
    let redis_calls = 11 + 4 + 6 + 3 + 3 + 3 + 2 + 3 + 3 + 3 + 3;
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
        ("rl_relay_rls_window_counts_kept_total", "", 1),
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
