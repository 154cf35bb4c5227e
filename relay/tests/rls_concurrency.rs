//! `algorithm: concurrency` through Envoy (issue 36): at most
//! `requests_per_unit` requests in flight, on RL.ACQUIRE / RL.RELEASE,
//! through a real gRPC client against the relay and a real server with the
//! module. The descriptor's last entry names the slot (Envoy's
//! `request_headers` action sending `x-request-id`): taken at the request,
//! given back by the negative hit at stream end, healed after one `unit`
//! when never given back.

mod common;

use std::time::{Duration, Instant};

use common::rls::*;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use testkit::Server;

const SLOTS: &str = "\
domain: c
descriptors:
  - key: user
    descriptors:
      - key: request_id
        rate_limit: { unit: minute, requests_per_unit: 2, algorithm: concurrency }
  - key: short
    descriptors:
      - key: request_id
        rate_limit: { unit: second, requests_per_unit: 2, algorithm: concurrency }
  - key: tight
    rate_limit: { unit: hour, requests_per_unit: 1 }
";

/// The request of `id` for `user`'s slots (under `key`).
fn take(key: &str, user: &str, id: &str) -> RateLimitRequest {
    request("c", &[&[(key, user), ("request_id", id)]])
}

/// Its stream end: the same descriptor, a negative hit of 1.
fn release(key: &str, user: &str, id: &str) -> RateLimitRequest {
    let mut r = take(key, user, id);
    r.descriptors[0].is_negative_hits = true;
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    r
}

/// The slots held in Redis (RL.INSPECT's live `in_flight`).
fn in_flight(con: &mut redis::Connection, key: &str) -> i64 {
    let fields: Vec<redis::Value> = redis::cmd("RL.INSPECT").arg(key).query(con).unwrap();
    for pair in fields.chunks(2) {
        if let [redis::Value::BulkString(name), redis::Value::Int(n)] = pair {
            if name == b"in_flight" {
                return *n;
            }
        }
    }
    0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_are_taken_and_given_back_never_more_room_than_taken() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(SLOTS);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let mut con = server.con();
    let key = "rl:rls:{c|user=a}:inflight:minute";
    assert_eq!(ask(&mut client, take("user", "a", "r1")).await.overall_code, OK);
    let r = ask(&mut client, take("user", "a", "r2")).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    assert_eq!(in_flight(&mut con, key), 2);
    assert_eq!(ask(&mut client, take("user", "a", "r3")).await.overall_code, OVER_LIMIT, "2 in flight");
    // A request asked again with its id (Envoy retrying the call) renews
    // its slot: no second one.
    assert_eq!(ask(&mut client, take("user", "a", "r2")).await.overall_code, OK);
    assert_eq!(in_flight(&mut con, key), 2);
    // r1's stream ends: its slot is given back, r3 gets in.
    assert_eq!(ask(&mut client, release("user", "a", "r1")).await.overall_code, OK);
    assert_eq!(in_flight(&mut con, key), 1);
    assert_eq!(ask(&mut client, take("user", "a", "r3")).await.overall_code, OK);
    // r1 released again (a repeated release): no room it did not take.
    assert_eq!(ask(&mut client, release("user", "a", "r1")).await.overall_code, OK);
    assert_eq!(in_flight(&mut con, key), 2);
    assert_eq!(ask(&mut client, take("user", "a", "r4")).await.overall_code, OVER_LIMIT);
    // Another user has slots of its own.
    assert_eq!(ask(&mut client, take("user", "b", "r1")).await.overall_code, OK);
    // Refused by another limit, a request takes no slot.
    assert_eq!(ask(&mut client, request("c", &[&[("tight", "t")]])).await.overall_code, OK);
    let both = RateLimitRequest {
        descriptors: vec![
            take("user", "c", "x").descriptors.remove(0),
            request("c", &[&[("tight", "t")]]).descriptors.remove(0),
        ],
        ..take("user", "c", "x")
    };
    assert_eq!(ask(&mut client, both).await.overall_code, OVER_LIMIT);
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight(&mut con, "rl:rls:{c|user=c}:inflight:minute") != 0 {
        assert!(Instant::now() < deadline, "the refused request's slot was not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A slot's id is 1 to 64 bytes (the module's ID): refused, named.
    for id in [String::new(), "x".repeat(65)] {
        let e = client.should_rate_limit(take("user", "a", &id)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("names a concurrency slot"), "{}", e.message());
    }
    // The subject alone (no entry naming a slot) has no limit at its depth:
    // let through, as any descriptor the config does not match.
    let r = ask(&mut client, request("c", &[&[("user", "a")]])).await;
    assert_eq!((r.overall_code, r.statuses[0].current_limit.is_none()), (OK, true));
}

/// Envoy dies holding slots: they heal after one `unit`, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_of_a_caller_that_died_heal_after_a_unit() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(SLOTS);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let mut client = relay.client().await;
    let taken = Instant::now();
    assert_eq!(ask(&mut client, take("short", "a", "d1")).await.overall_code, OK);
    assert_eq!(ask(&mut client, take("short", "a", "d2")).await.overall_code, OK);
    // Never released (the caller died): refused until their deadline.
    let r = ask(&mut client, take("short", "a", "n")).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert!(r.statuses[0].duration_until_reset.as_ref().unwrap().seconds <= 1, "{:?}", r.statuses[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ask(&mut client, take("short", "a", "n")).await.overall_code != OK {
        assert!(Instant::now() < deadline, "the dead caller's slots never healed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(taken.elapsed() >= Duration::from_millis(1000), "healed before the unit: {:?}", taken.elapsed());
}
