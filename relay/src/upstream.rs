//! The relay's connection to Redis: rl-client's (one server or a cluster,
//! reconnecting by itself, TCP_NODELAY, one quick cluster retry), with the
//! relay's timeout.

use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, RedisResult, Value};
use rl_client::{Connection, Target};

#[derive(Clone)]
pub struct Upstream(Connection);

impl Upstream {
    /// One server at `urls[0]`, or a cluster discovered from `urls` when
    /// `cluster` is set. Lazy: the relay starts while Redis is down.
    pub fn open(urls: &[String], cluster: bool, timeout: Duration) -> rl_client::Result<Upstream> {
        let target = if cluster {
            Target::Cluster(urls.to_vec())
        } else {
            Target::Standalone(urls.first().cloned().unwrap_or_else(|| "redis://127.0.0.1:6379/".into()))
        };
        Ok(Upstream(Connection::open(&target, timeout, timeout)?))
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
}
