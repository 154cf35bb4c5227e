//! The relay's connection to Redis: rl-client's (one server, a Sentinel
//! master or a cluster, reconnecting by itself, TCP_NODELAY, one quick
//! cluster retry, following a failover), with the relay's timeout. A move
//! to another server is logged.

use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, RedisResult, Value};
use rl_client::{Connection, ConnectionStatus, Target, Tls};

use crate::logging::line;

/// How long a readiness probe may take (its connection's own timeouts).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct Upstream(Connection);

impl Upstream {
    /// One server at `urls[0]` (a `redis+sentinel://` URL: the master its
    /// sentinels name), or a cluster discovered from `urls` when `cluster`
    /// is set; `tls` for `rediss://` URLs. Lazy: the relay starts while
    /// Redis is down. Call it inside a tokio runtime.
    pub fn open(urls: &[String], cluster: bool, tls: &Tls, timeout: Duration) -> rl_client::Result<Upstream> {
        let connection = Connection::open_with_tls(&target(urls, cluster)?, tls, timeout, timeout)?;
        connection.on_switch(log_switch);
        Ok(Upstream(connection))
    }

    /// The readiness probe's own connection to the same servers, with the
    /// probe's own timeouts: the calls' connection may be dropped and
    /// made again within `--timeout-ms` (three calls timed out in a row
    /// during a stall), which must not make a stall look like an outage.
    pub fn probe(urls: &[String], cluster: bool, tls: &Tls) -> rl_client::Result<Upstream> {
        Ok(Upstream(Connection::open_with_tls(&target(urls, cluster)?, tls, PROBE_TIMEOUT, PROBE_TIMEOUT)?))
    }

    /// Sends `args`; in a cluster, to the primary of `key`'s slot (RL.*
    /// commands name numkeys first, which redis-rs would take for the key).
    /// A server error comes back as a value, for the gateway to see as is.
    pub async fn call(&self, args: &[Bytes], key: Option<&[u8]>) -> RedisResult<Value> {
        let mut cmd = Cmd::new();
        for arg in args {
            cmd.arg(arg.as_ref());
        }
        self.0.send(&cmd, key).await
    }

    /// Which server the calls go to.
    pub fn status(&self) -> ConnectionStatus {
        self.0.status()
    }
}

/// What `urls` name: one server (or a Sentinel master), or a cluster.
fn target(urls: &[String], cluster: bool) -> rl_client::Result<Target> {
    if !cluster {
        return Target::from_url(urls.first().map_or("redis://127.0.0.1:6379/", String::as_str));
    }
    if urls.iter().any(|u| u.starts_with(rl_client::SENTINEL_SCHEME) || u.starts_with(rl_client::SENTINEL_TLS_SCHEME)) {
        return Err(rl_client::Error::invalid("a cluster is not reached through Sentinel: drop --cluster"));
    }
    Ok(Target::Cluster(urls.to_vec()))
}

fn log_switch(status: &ConnectionStatus) {
    let server = status.server.as_deref().unwrap_or("none");
    let how = if status.redirected {
        "not the configured server: it answers as a replica, and this is the primary its ROLE names"
    } else {
        "the primary now"
    };
    line(format_args!("upstream: calls go to {server}, {how} (configured: {})", status.configured));
}
