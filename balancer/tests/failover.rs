//! The balancer's line to a region, and a gateway's share table reads,
//! across a failover (issue 26): through Redis Sentinel (a
//! `redis+sentinel://` region URL, `SENTINEL FAILOVER`) and on a fixed
//! address whose primary a standalone `FAILOVER` demoted. Within 5 s the
//! balancer's writes land on the new primary, and a gateway reads them
//! there.

use std::time::{Duration, Instant};

use rl_balancer::link::Link;
use rl_balancer::store::DEFAULT_KEY;
use rl_gateway::global::ShareTable;
use rl_gateway::global::{GatewayConfig, RegionShares};
use testkit::{role, SentinelSet, Server, MASTER};

/// The bound: the new primary is used within this of the switch.
const FOLLOW_WITHIN: Duration = Duration::from_secs(5);

const TIMEOUT: Duration = Duration::from_secs(1);

/// The table's version as `server` holds it.
fn stored_version(server: &Server) -> Option<u64> {
    redis::cmd("HGET").arg(DEFAULT_KEY).arg("version").query(&mut server.con()).unwrap()
}

/// Writes as the balancer of epoch 1 until a write is answered, within
/// [`FOLLOW_WITHIN`]; the version it wrote.
async fn until_written(link: &Link) -> u64 {
    let started = Instant::now();
    loop {
        match link.write(1, ShareTable::default()).await {
            Ok(version) => return version,
            Err(e) => assert!(started.elapsed() < FOLLOW_WITHIN, "{FOLLOW_WITHIN:?} after the switch: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Claims epoch 1 and writes a table on the primary; a gateway reads it.
async fn written_and_read(link: &Link, shares: &RegionShares, primary: &Server) {
    assert_eq!(link.claim(1).await.unwrap(), 0);
    let version = link.write(1, ShareTable::default()).await.unwrap();
    assert_eq!(stored_version(primary), Some(version));
    assert_eq!(shares.refresh_now().await.unwrap(), version);
}

/// After a switch to `new`: the balancer writes there, the gateway reads
/// what it wrote, and both name `new` as the server they talk to.
async fn followed(link: &Link, shares: &RegionShares, new: &Server) {
    let version = until_written(link).await;
    assert_eq!(stored_version(new), Some(version), "the write landed on the new primary");
    assert_eq!(link.address(), format!("127.0.0.1:{}", new.port));
    let started = Instant::now();
    loop {
        match shares.refresh_now().await {
            Ok(read) if read == version => break,
            other => assert!(started.elapsed() < FOLLOW_WITHIN, "the gateway reads {other:?}, not {version}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_through_sentinel_is_written_on_the_new_primary() {
    let set = SentinelSet::start(1);
    let url = format!("redis+sentinel://{}/{MASTER}", set.addresses().join(","));
    let link = Link::new("eu", &url, DEFAULT_KEY, &Default::default(), TIMEOUT, None).unwrap();
    let shares = RegionShares::new(GatewayConfig::new("eu", url.as_str())).unwrap();
    let old = set.primary().port;
    written_and_read(&link, &shares, set.primary()).await;

    let new = tokio::task::block_in_place(|| set.failover());
    assert_ne!(new.port, old);
    // Until the sentinels demote it, the old primary still takes writes
    // (lost when it resyncs from the new one), whoever sends them: Sentinel's
    // replication is asynchronous. Write once it is demoted.
    let demoted = set.servers.iter().find(|s| s.port == old).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while role(demoted) != "slave" {
        assert!(Instant::now() < deadline, "the sentinels did not demote the old primary");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    followed(&link, &shares, new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_on_a_fixed_address_leaves_a_primary_demoted_by_failover() {
    let primary = Server::start(&[]);
    let replica = primary.replica(&[]);
    let link = Link::new("eu", &primary.url(), DEFAULT_KEY, &Default::default(), TIMEOUT, None).unwrap();
    let shares = RegionShares::new(GatewayConfig::new("eu", primary.url())).unwrap();
    written_and_read(&link, &shares, &primary).await;

    let _: () = redis::cmd("FAILOVER").arg("TIMEOUT").arg(5000).query(&mut primary.con()).expect("FAILOVER");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(role(&primary) == "slave" && role(&replica) == "master") {
        assert!(Instant::now() < deadline, "the FAILOVER did not complete");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    followed(&link, &shares, &replica).await;
}
