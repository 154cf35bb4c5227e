//! The balancer's line to one region's Redis: every call waits an optional
//! injected delay first (the simulation's cross-region latency) and is
//! bounded by a timeout. The connection is rl-client's: it reconnects by
//! itself, takes a `redis+sentinel://` URL (the master, followed across a
//! failover), and leaves a server that answers `READONLY`, `MASTERDOWN` or
//! `LOADING` (a demoted primary) for the primary found again. A call that
//! met the wrong server failed (nothing ran): the next round retries it.

use std::time::Duration;

use rl_gateway::{Connection, Target};

use crate::store;
use rl_gateway::global::store::{Corrupt, Read, StoreError};
use rl_gateway::global::ShareTable;

/// Why a call to a region did not answer.
#[derive(Debug)]
pub enum CallError {
    /// A newer balancer has claimed the region: this one must stop.
    Fenced(String),
    /// The region's share table holds what no balancer writes: nothing
    /// was written there; it needs an operator.
    Corrupt(Corrupt),
    /// No answer, a timeout or an error: a write may have landed.
    Unreachable(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Fenced(e) => write!(f, "fenced off: {e}"),
            CallError::Corrupt(c) => write!(f, "{c}"),
            CallError::Unreachable(e) => write!(f, "unreachable: {e}"),
        }
    }
}

impl From<StoreError> for CallError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Stale(s) => CallError::Fenced(s),
            StoreError::Corrupt(c) => CallError::Corrupt(c),
            StoreError::Redis(e) => CallError::Unreachable(e.to_string()),
        }
    }
}

/// One region, cheap to clone into a task.
#[derive(Clone)]
pub struct Link {
    /// The region's name.
    pub name: String,
    con: Connection,
    key: String,
    timeout: Duration,
    delay: Option<(Duration, Duration)>,
}

impl Link {
    /// A region at `url` (`redis://`, `rediss://` with `tls`, or `redis+sentinel://`; not connected
    /// yet); `key`: the share table's hash; `delay`: an injected wait drawn
    /// from this range before every call. Must run inside a tokio runtime.
    pub fn new(
        name: &str,
        url: &str,
        key: &str,
        tls: &rl_gateway::Tls,
        timeout: Duration,
        delay: Option<(Duration, Duration)>,
    ) -> Result<Link, String> {
        // The URL may carry a password: the message names the region only.
        let bad = |e: rl_gateway::Error| format!("region {name}: bad Redis URL: {e}");
        let target = Target::from_url(url).map_err(bad)?;
        let con = Connection::open_with_tls(&target, tls, timeout, timeout).map_err(bad)?;
        Ok(Link { name: name.to_string(), con, key: key.to_string(), timeout, delay })
    }

    /// Waits the injected delay, then runs `call` with the connection,
    /// within the timeout.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, CallError>
    where
        F: FnOnce(Connection, String) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        if let Some((lo, hi)) = self.delay {
            let ms = fastrand::u64(lo.as_millis() as u64..=hi.as_millis().max(lo.as_millis()) as u64);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        match tokio::time::timeout(self.timeout, call(self.con.clone(), self.key.clone())).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Unreachable(format!("no answer within {:?}", self.timeout))),
        }
    }

    /// The server calls go to (`host:port`), else what was configured;
    /// never credentials.
    pub fn address(&self) -> String {
        let status = self.con.status();
        status.server.unwrap_or(status.configured)
    }

    /// Whether the server has the redis-rl module (its gateways enforce
    /// shares with it): a read-only `RL.INSPECT` of the table's key, which
    /// only a server without the module answers "unknown command".
    pub async fn has_module(&self) -> Result<bool, CallError> {
        self.call(|mut con, key| async move {
            let answer: redis::RedisResult<redis::Value> =
                redis::cmd("RL.INSPECT").arg(&key).query_async(&mut con).await;
            match answer {
                Ok(_) => Ok(true),
                // Any other answer of the server (WRONGTYPE, NOPERM) names a command it has.
                Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_) | redis::ErrorKind::Extension) => {
                    Ok(!e.to_string().to_lowercase().contains("unknown command"))
                }
                Err(e) => Err(CallError::Unreachable(e.to_string())),
            }
        })
        .await
    }

    /// Claims `epoch` here; answers the epoch that was in force.
    pub async fn claim(&self, epoch: u64) -> Result<u64, CallError> {
        self.call(|mut con, key| async move { Ok(store::claim(&mut con, &key, epoch).await?) }).await
    }

    /// Claims `epoch` here over whatever is stored; answers what was.
    pub async fn take_over(&self, epoch: u64) -> Result<String, CallError> {
        self.call(|mut con, key| async move { Ok(store::take_over(&mut con, &key, epoch).await?) }).await
    }

    /// Reads and clears the region's usage since the last call.
    pub async fn take_usage(&self) -> Result<Vec<(String, String, u64)>, CallError> {
        self.call(|mut con, key| async move {
            store::take_usage(&mut con, &key).await.map_err(|e| CallError::Unreachable(e.to_string()))
        })
        .await
    }

    /// The epoch in force here.
    pub async fn epoch(&self) -> Result<u64, CallError> {
        self.call(|mut con, key| async move { Ok(store::epoch(&mut con, &key).await?) }).await
    }

    /// Reads the region's table with its ages.
    pub async fn read(&self) -> Result<Read, CallError> {
        self.call(|mut con, key| async move { Ok(store::sync(&mut con, &key, &[]).await?) }).await
    }

    /// The region's gateways' confirmations of the version they enforce
    /// (those older than `expiry` deleted and left out).
    pub async fn confirmations(&self, expiry: Duration) -> Result<Vec<crate::confirm::Applied>, CallError> {
        self.call(|mut con, key| async move {
            store::confirmations(&mut con, &key, expiry).await.map_err(|e| CallError::Unreachable(e.to_string()))
        })
        .await
    }

    /// Writes the region's table as the balancer of `epoch`; answers its version.
    pub async fn write(&self, epoch: u64, table: ShareTable) -> Result<u64, CallError> {
        self.call(|mut con, key| async move { Ok(store::write(&mut con, &key, epoch, &table).await?) }).await
    }
}
