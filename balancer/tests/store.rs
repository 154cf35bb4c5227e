//! The share store against a real server: fencing, versions and ages on
//! the server's clock, usage counted in one round trip and taken once.

use std::time::Duration;

use rl_balancer::store::{self, StoreError, DEFAULT_KEY};
use rl_gateway::global::{RuleShares, Share, ShareTable};
use testkit::PlainServer;

fn table(share: u32) -> ShareTable {
    let mut t = ShareTable::default();
    let mut r = RuleShares { default: 333_333, ..Default::default() };
    r.subjects.insert("acme".into(), Share::steady(share));
    t.rules.insert("api".into(), r);
    t
}

#[tokio::test]
async fn a_stale_balancer_is_fenced_off() {
    let server = PlainServer::start();
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    assert_eq!(store::claim(&mut con, DEFAULT_KEY, 1).await.unwrap(), 0);
    assert_eq!(store::write(&mut con, DEFAULT_KEY, 1, &table(100_000)).await.unwrap(), 1);
    // A restarted balancer claims epoch 2; the old one's writes are refused.
    assert_eq!(store::claim(&mut con, DEFAULT_KEY, 2).await.unwrap(), 1);
    match store::write(&mut con, DEFAULT_KEY, 1, &table(900_000)).await {
        Err(StoreError::Stale(e)) => assert!(e.contains("epoch 1 is below 2"), "{e}"),
        other => panic!("a stale write must be fenced off, got {other:?}"),
    }
    assert!(matches!(store::claim(&mut con, DEFAULT_KEY, 1).await, Err(StoreError::Stale(_))));
    let read = store::sync(&mut con, DEFAULT_KEY, &[]).await.unwrap();
    assert_eq!((read.version, read.epoch, read.table), (1, Ok(2), table(100_000)));
    // The new one writes; an unchanged table is a heartbeat: same version.
    assert_eq!(store::write(&mut con, DEFAULT_KEY, 2, &table(700_000)).await.unwrap(), 2);
    assert_eq!(store::write(&mut con, DEFAULT_KEY, 2, &table(700_000)).await.unwrap(), 2);
}

#[tokio::test]
async fn ages_come_from_the_servers_clock() {
    let server = PlainServer::start();
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let never = store::sync(&mut con, DEFAULT_KEY, &[]).await.unwrap();
    assert_eq!((never.version, never.table.clone()), (0, ShareTable::default()));
    assert!(never.age > Duration::from_secs(86_400), "a table never written is as old as can be");
    store::claim(&mut con, DEFAULT_KEY, 1).await.unwrap();
    store::write(&mut con, DEFAULT_KEY, 1, &table(100_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    store::write(&mut con, DEFAULT_KEY, 1, &table(100_000)).await.unwrap(); // heartbeat
    tokio::time::sleep(Duration::from_millis(100)).await;
    let read = store::sync(&mut con, DEFAULT_KEY, &[]).await.unwrap();
    assert!(read.age >= Duration::from_millis(100) && read.age < Duration::from_millis(300), "{:?}", read.age);
    assert!(read.since_change >= Duration::from_millis(400), "{:?}", read.since_change);
}

#[tokio::test]
async fn usage_is_added_in_the_sync_and_taken_once() {
    let server = PlainServer::start();
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    store::sync(&mut con, DEFAULT_KEY, &[("api", "acme", 70), ("api", "quiet:1", 2)]).await.unwrap();
    store::sync(&mut con, DEFAULT_KEY, &[("api", "acme", 30)]).await.unwrap();
    let mut usage = store::take_usage(&mut con, DEFAULT_KEY).await.unwrap();
    usage.sort();
    assert_eq!(usage, vec![("api".into(), "acme".into(), 100), ("api".into(), "quiet:1".into(), 2)]);
    assert!(store::take_usage(&mut con, DEFAULT_KEY).await.unwrap().is_empty(), "taken once");
}

#[tokio::test]
async fn a_corrupt_table_is_an_error_not_a_panic() {
    let server = PlainServer::start();
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("HSET").arg(DEFAULT_KEY).arg("table").arg("{oops").query_async(&mut con).await.unwrap();
    let e = store::sync(&mut con, DEFAULT_KEY, &[]).await.unwrap_err();
    assert!(matches!(e, StoreError::Corrupt(_)), "{e:?}");
    assert!(e.to_string().contains("field table of rl:shares = \"{oops\" is not JSON"), "{e}");
}

/// Gateways confirm the version they enforce with a plain HSET; the
/// balancer reads each with its age (stamped on the region's clock when
/// first seen); only the version written confirms it (a higher one is of
/// another table); a confirmation older than the expiry, or one no
/// gateway writes, is deleted; a gateway that leaves is gone at once.
#[tokio::test]
async fn gateways_confirm_the_version_they_enforce() {
    let server = PlainServer::start();
    let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    store::report_applied(&mut con, DEFAULT_KEY, "eu-a", 1).await.unwrap();
    store::report_applied(&mut con, DEFAULT_KEY, "eu-b", 2).await.unwrap();
    store::report_applied(&mut con, DEFAULT_KEY, "eu-c", 9).await.unwrap();
    let expiry = Duration::from_secs(60);
    let mut seen = store::confirmations(&mut con, DEFAULT_KEY, expiry).await.unwrap();
    seen.sort_by(|a, b| a.gateway.cmp(&b.gateway));
    let versions: Vec<(&str, u64)> = seen.iter().map(|a| (a.gateway.as_str(), a.version)).collect();
    assert_eq!(versions, [("eu-a", 1), ("eu-b", 2), ("eu-c", 9)]);
    assert!(seen.iter().all(|a| a.age < Duration::from_secs(5)), "{seen:?}");
    let waiting = rl_balancer::confirm::unconfirmed(&seen, 2, expiry);
    assert_eq!(waiting.iter().map(|a| a.gateway.as_str()).collect::<Vec<_>>(), ["eu-a", "eu-c"]);
    // Stamped on the server's clock when first seen; rewritten plain by the next sync.
    let applied = store::applied_key(DEFAULT_KEY);
    let stamped: String = redis::cmd("HGET").arg(&applied).arg("eu-b").query_async(&mut con).await.unwrap();
    assert!(stamped.starts_with("2 ") && stamped.len() > 10, "{stamped}");
    // Old and foreign fields are deleted by the read.
    let _: () = redis::cmd("HSET").arg(&applied).arg("eu-old").arg("3 1000").query_async(&mut con).await.unwrap();
    let _: () = redis::cmd("HSET").arg(&applied).arg("eu-junk").arg("abc").query_async(&mut con).await.unwrap();
    assert_eq!(store::confirmations(&mut con, DEFAULT_KEY, expiry).await.unwrap().len(), 3);
    let left: Vec<String> = redis::cmd("HKEYS").arg(&applied).query_async(&mut con).await.unwrap();
    assert_eq!(left.len(), 3, "{left:?}");
    store::leave(&mut con, DEFAULT_KEY, "eu-a").await.unwrap();
    assert_eq!(store::confirmations(&mut con, DEFAULT_KEY, expiry).await.unwrap().len(), 2);
}
