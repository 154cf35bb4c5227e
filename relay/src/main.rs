//! `rl-relay`: the lease relay's binary.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rl_relay::pool::{Pools, Settings};
use rl_relay::server::Relay;
use rl_relay::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A lease relay for redis-rl: gateways connect to it as to Redis.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address gateways connect to.
    #[arg(long, default_value = "127.0.0.1:6380")]
    listen: String,
    /// Redis URL (repeat with --cluster for a cluster's seed nodes).
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis: Vec<String>,
    /// The --redis URLs are nodes of a Redis Cluster.
    #[arg(long)]
    cluster: bool,
    /// Relays sharing the limits (one per data centre group): a batch is
    /// the relay's share, rate / relays.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    relays: u32,
    /// A batch is this many ms of the relay's share of the rate.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    lease_window_ms: u64,
    /// Held tokens unspent this long after their last grant are dropped.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    lease_ttl_ms: u64,
    /// Longest wait for Redis; past it the gateway gets a TRYAGAIN error.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
    /// Most subjects holding a lease; past it new subjects are forwarded.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_subjects: u64,
    /// Serve Prometheus metrics over HTTP on this address.
    #[arg(long)]
    metrics: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let timeout = Duration::from_millis(args.timeout_ms);
    let upstream =
        Upstream::open(&args.redis, args.cluster, timeout).map_err(|e| format!("--redis {:?}: {e}", args.redis))?;
    let settings = Settings {
        window_ms: args.lease_window_ms,
        ttl_ms: args.lease_ttl_ms,
        relays: args.relays,
        max_subjects: usize::try_from(args.max_subjects).unwrap_or(usize::MAX),
    };
    let relay = Arc::new(Relay::new(Pools::new(settings), upstream, timeout));
    let listener = TcpListener::bind(&args.listen).await.map_err(|e| format!("--listen {}: {e}", args.listen))?;
    if let Some(address) = &args.metrics {
        let metrics = TcpListener::bind(address).await.map_err(|e| format!("--metrics {address}: {e}"))?;
        tokio::spawn(serve_metrics(relay.clone(), metrics));
    }
    eprintln!("rl-relay: listening on {} for {:?}", listener.local_addr()?, args.redis);
    relay.serve(listener).await;
    Ok(())
}

/// Answers any HTTP request with the metrics: all a scraper needs.
async fn serve_metrics(relay: Arc<Relay>, listener: TcpListener) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else { continue };
        let body = rl_relay::stats::metrics(&relay);
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
        });
    }
}
