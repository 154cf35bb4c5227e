//! A Redis without the module: the relay is not ready (`/healthcheck` 500,
//! `/ready` 503, gRPC health NOT_SERVING), says why in its log and a
//! metric, and is ready again once the module is loaded.

mod common;

use std::time::{Duration, Instant};

use common::rls::*;
use testkit::{module_path, PlainServer};
use tonic_health::pb::health_check_response::ServingStatus;

const CONFIG: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";

fn wait_for(what: &str, relay: &RlsRelay, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "never {what}: {}", relay.relay.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_module_it_is_not_ready_and_says_why_until_it_is_loaded() {
    let redis = PlainServer::start_with(&["--enable-module-command".as_ref(), "yes".as_ref()]);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&[redis.url()], false, &config, &[]);
    wait_for("logged the module missing", &relay, || relay.relay.log().contains("without the redis-rl module"));
    assert_eq!(relay.get("/healthcheck").0, 500);
    assert_eq!(relay.get("/ready").0, 503);
    assert!(relay.get("/ready").1.contains("module"), "{}", relay.get("/ready").1);
    assert_eq!(relay.metric("rl_relay_module_missing"), 1.0);
    assert_eq!(relay.metric("rl_relay_ready"), 0.0);
    wait_health(&relay, ServingStatus::NotServing).await;
    assert_eq!(health(&relay, "ratelimit").await, ServingStatus::NotServing as i32);

    let _: () = redis::cmd("MODULE").arg("LOAD").arg(module_path().to_str().unwrap()).query(&mut redis.con()).unwrap();
    wait_for("ready", &relay, || relay.get("/healthcheck").0 == 200);
    wait_health(&relay, ServingStatus::Serving).await;
    assert_eq!(relay.metric("rl_relay_module_missing"), 0.0);
    assert_eq!(relay.get("/ready").0, 200);
    // Decided by Redis: a limit of 1 admits one.
    let mut client = relay.client().await;
    let codes = [
        ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code,
        ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code,
    ];
    assert_eq!(codes, [OK, OVER_LIMIT], "{}", relay.relay.log());
    assert!(calls(&mut redis.con(), "rl.window") >= 1);
}
