//! The relay's two fronts share one Redis user and so one key space: a
//! RESP client must not change the Envoy (RLS) front's counters (issue 34:
//! an `RL.REFUND` through the RESP front on an exhausted Envoy bucket gave
//! it 100 more OKs, every time). The RLS front's limits are exhausted
//! through real gRPC calls, attacked through the RESP front, and asked
//! again through gRPC.

mod common;

use common::rls::*;
use common::{away_from_midnight, call, Relay, Resp, Start};
use testkit::{server_ms, Cluster, Server};

const CONFIG: &str = "\
domain: api
descriptors:
  - key: bucket
    rate_limit: { unit: hour, requests_per_unit: 2, algorithm: token_bucket, burst: 2 }
  - key: fixed
    rate_limit: { unit: day, requests_per_unit: 2 }
";

const BUCKET: &str = "rl:rls:{api|bucket=a}:bucket:hour";
const FIXED: &str = "rl:rls:{api|fixed=a}:fixed:day";

/// The refusal of a command naming `key` under the default prefix.
fn fenced(key: &str) -> String {
    format!(
        "ERR relay: key '{key}' is under 'rl:rls:', the RLS front's counters (--rls-prefix): not served to RESP \
         clients"
    )
}

/// Asks for `entry` until the Envoy front answers OVER_LIMIT (at most 10 times).
async fn exhaust(relay: &RlsRelay, entry: (&str, &str)) {
    let mut client = relay.client().await;
    for _ in 0..10 {
        if ask(&mut client, request("api", &[&[entry]])).await.overall_code == OVER_LIMIT {
            return;
        }
    }
    panic!("{entry:?} never over its limit");
}

async fn code(relay: &RlsRelay, entry: (&str, &str)) -> i32 {
    ask(&mut relay.client().await, request("api", &[&[entry]])).await.overall_code
}

/// Every command a RESP client could change a bucket or a window with,
/// on the Envoy front's keys, whatever the case of its name.
fn attacks(now_ms: u64) -> Vec<(String, String)> {
    let lift = format!("RL.WINDOW 1 {FIXED} 2 86400000 FIXED COST 2 REFUND {now_ms}");
    vec![
        (format!("RL.REFUND 1 {BUCKET} 100 100 3600000 TOKENS 100"), BUCKET.into()),
        (format!("rl.refund 1 {BUCKET} 100 100 3600000 TOKENS 100"), BUCKET.into()),
        (format!("Rl.ReFuNd 2 rl:gw:{{a}}:s {BUCKET} 100 100 3600000 100 100 3600000 TOKENS 100"), BUCKET.into()),
        (format!("RL.TAKE 1 {BUCKET} 100 100 3600000"), BUCKET.into()),
        (format!("RL.LEASE 1 {BUCKET} 100 100 3600000 WANT 5"), BUCKET.into()),
        (format!("RL.PEEK 1 {BUCKET} 100 100 3600000"), BUCKET.into()),
        (format!("CL.THROTTLE {BUCKET} 100 100 3600"), BUCKET.into()),
        (format!("cl.throttle {FIXED} 100 100 3600"), FIXED.into()),
        (lift.clone(), FIXED.into()),
        (lift.to_lowercase(), FIXED.into()),
        (format!("RL.WINDOWPEEK 1 {FIXED} 2 86400000 FIXED"), FIXED.into()),
        (format!("RL.ACQUIRE 1 {FIXED} 10 60000 ID x"), FIXED.into()),
        (format!("RL.RELEASE 1 {FIXED} ID x"), FIXED.into()),
        (format!("RL.INFLIGHT 1 {FIXED} 10"), FIXED.into()),
        // numkeys the relay cannot read: every argument counts as a key.
        (format!("RL.TAKE +1 {BUCKET} 100 100 3600000"), BUCKET.into()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp_client_cannot_lift_the_envoy_fronts_limits() {
    away_from_midnight();
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    // A refusal is remembered 1 ms: the next call asks Redis.
    let relay = RlsRelay::start(&[server.url()], false, &config, &["--max-refusal-hold-ms", "1"]);
    exhaust(&relay, ("bucket", "a")).await;
    exhaust(&relay, ("fixed", "a")).await;
    let mut redis = server.con();
    for key in [BUCKET, FIXED] {
        let exists: i64 = redis::cmd("EXISTS").arg(key).query(&mut redis).unwrap();
        assert_eq!(exists, 1, "{key} is the Envoy front's counter");
    }
    let mut c = relay.relay.raw();
    let attacks = attacks(server_ms(&mut redis));
    for (line, key) in &attacks {
        assert_eq!(call(&mut c, line), Resp::Error(fenced(key)), "{line}");
    }
    // Not on the allow-list at all.
    for line in [format!("RL.RESET {BUCKET}"), format!("RL.INSPECT {BUCKET}"), format!("DEL {BUCKET}")] {
        assert!(call(&mut c, &line).error().ends_with("is not served by rl-relay"), "{line}");
    }
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(code(&relay, ("bucket", "a")).await, OVER_LIMIT, "the bucket's limit was lifted");
    assert_eq!(code(&relay, ("fixed", "a")).await, OVER_LIMIT, "the window's limit was lifted");
    // Counted, in INFO and /metrics, and said in the log once.
    assert_eq!(relay.relay.info_field("refused_keys"), attacks.len() as u64);
    assert_eq!(relay.metric("rl_relay_refused_keys_total"), attacks.len() as f64);
    let log = relay.relay.log();
    assert!(log.contains("under --rls-prefix 'rl:rls:'"), "{log}");
    assert!(!log.contains("bucket=a"), "the log names no key: {log}");
    // Keys that only look alike are the RESP front's own: served.
    for key in ["rl:rls", "rl:rlsx:{api|bucket=a}:bucket:hour", "RL:RLS:{api|bucket=a}:bucket:hour", "x:rl:rls:k"] {
        let reply = call(&mut c, &format!("RL.TAKE 1 {key} 10 1 1000"));
        assert_eq!(reply.ints()[0], 1, "{key}");
    }
    assert_eq!(relay.relay.info_field("refused_keys"), attacks.len() as u64);
}

/// In a cluster the Envoy front's keys are hash-tagged: the fence is on the
/// key, wherever its slot is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_too() {
    away_from_midnight();
    let cluster = Cluster::start(3);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&cluster.urls(), true, &config, &["--max-refusal-hold-ms", "1"]);
    exhaust(&relay, ("bucket", "a")).await;
    exhaust(&relay, ("fixed", "a")).await;
    let now = server_ms(&mut cluster.node_for(FIXED).con());
    let mut c = relay.relay.raw();
    for (line, key) in attacks(now) {
        assert_eq!(call(&mut c, &line), Resp::Error(fenced(&key)), "{line}");
    }
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(code(&relay, ("bucket", "a")).await, OVER_LIMIT);
    assert_eq!(code(&relay, ("fixed", "a")).await, OVER_LIMIT);
    assert_eq!(call(&mut c, "RL.TAKE 1 rl:gw:{api|bucket=a}:bucket:hour 10 1 1000").ints()[0], 1);
}

/// The fence follows `--rls-prefix`, and holds on a relay that does not
/// serve the RLS front itself (another relay of the fleet may, on the same
/// Redis).
#[test]
fn the_fence_follows_the_prefix_on_every_relay() {
    let s = Server::start(&[]);
    let relay = Relay::start(&s.url(), &[]);
    let mut c = relay.raw();
    assert_eq!(call(&mut c, &format!("RL.REFUND 1 {BUCKET} 10 1 1000 TOKENS 5")), Resp::Error(fenced(BUCKET)));
    let relay = Relay::start(&s.url(), &["--rls-prefix", "edge:"]);
    let mut c = relay.raw();
    assert_eq!(
        call(&mut c, "CL.THROTTLE edge:{api|k=v}:bucket:hour 10 1 1").error(),
        "ERR relay: key 'edge:{api|k=v}:bucket:hour' is under 'edge:', the RLS front's counters (--rls-prefix): \
         not served to RESP clients"
    );
    assert_eq!(call(&mut c, &format!("RL.TAKE 1 {BUCKET} 10 1 1000")).ints()[0], 1, "no longer the RLS front's");
    assert_eq!(relay.info_field("refused_keys"), 1);
    // An empty prefix would give the RLS front every key: refused at start.
    let mut start = Start::args(&["--redis", &s.url(), "--rls-prefix", ""]);
    start.no_wait = true;
    let mut refused = Relay::spawn(start);
    assert_eq!(refused.exit_code(), Some(2));
    assert!(refused.log().contains("--rls-prefix"), "{}", refused.log());
}
