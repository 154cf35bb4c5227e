//! The balancer on regions whose Redis speaks only TLS (managed Redis):
//! `rediss://` regions with one CA file holding each region's CA, its
//! rounds read the usage and write the share tables over TLS.

use std::time::Duration;

use rl_balancer::store::{self, DEFAULT_KEY};
use rl_balancer::{Balancer, Config, GlobalRule};
use rl_gateway::global::{SplitParams, WHOLE};
use testkit::{Server, Tls};

async fn con(s: &Server) -> redis::aio::MultiplexedConnection {
    let client = s.tls().expect("a TLS server").client(&s.url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_over_tls_follow_the_traffic() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start_tls(Tls::Server, &[])).collect();
    // One CA file for every region: the three test CAs, one after another.
    let dir = tempfile::tempdir().unwrap();
    let cas = dir.path().join("cas.pem");
    let pem: String = servers.iter().map(|s| std::fs::read_to_string(&s.tls().unwrap().ca).unwrap()).collect();
    std::fs::write(&cas, pem).unwrap();
    let rule = GlobalRule {
        id: "api".into(),
        split: SplitParams::new(50_000, vec![1, 1, 1]).unwrap(),
        ramp: Duration::from_secs(1),
    };
    let regions = ["eu", "us", "ap"].iter().zip(&servers).map(|(n, s)| (n.to_string(), s.url())).collect();
    let mut config = Config::new(regions, vec![rule]);
    config.tls = rl_gateway::Tls { ca_file: Some(cas), ..rl_gateway::Tls::default() };
    config.timeout = Duration::from_secs(2);
    let mut b = Balancer::new(config).unwrap();
    for _ in 0..3 {
        for (s, n) in servers.iter().zip([700, 200, 100]) {
            store::sync(&mut con(s).await, DEFAULT_KEY, &[("api", "acme", n)]).await.unwrap();
        }
        b.round().await.expect("a round over TLS");
    }
    let mut shares = Vec::new();
    for s in &servers {
        let read = store::sync(&mut con(s).await, DEFAULT_KEY, &[]).await.unwrap();
        let ages = (read.age, read.since_change);
        let stale = Duration::from_secs(300);
        shares.push(read.table.in_force("api", "acme", WHOLE / 3, ages, stale, Duration::from_secs(10)).0.share);
    }
    assert!(shares[0] > shares[1] && shares[1] > shares[2], "the shares follow the traffic: {shares:?}");
    assert!(shares.iter().sum::<u32>() <= WHOLE, "{shares:?}");
}
