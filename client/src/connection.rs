//! One Redis connection, standalone or cluster, that sends a command to the
//! primary of a slot within a timeout.
//!
//! Both kinds connect lazily and reconnect by themselves, so a gateway
//! starts while Redis is down and recovers when it returns. redis-rs's own
//! defaults are tuned for throughput, not for a limiter on the request
//! path: a 500 ms response timeout, Nagle's algorithm on, and 16 cluster
//! retries with backoff. Here every call has the configured timeout (50 ms by
//! default) and TCP_NODELAY, and a cluster call is retried at most once, at
//! once (to follow a MOVED after a resharding); a call that fails is
//! answered by the fallback instead.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::io::tcp::TcpSettings;
use redis::{Cmd, IntoConnectionInfo, Value};

use crate::error::{Error, Result};

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One server (or a primary behind a failover proxy): `redis://host:port/`.
    Standalone(String),
    /// Redis Cluster: the URLs of some of its nodes, to discover the rest.
    Cluster(Vec<String>),
}

#[derive(Clone)]
pub(crate) enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    /// Prepares a connection without waiting for Redis. Must run inside a
    /// tokio runtime: the reconnecting machinery spawns tasks on it.
    pub(crate) fn open(target: &Target, timeout: Duration, connect_timeout: Duration) -> Result<Connection> {
        let tcp = TcpSettings::default().set_nodelay(true);
        match target {
            Target::Standalone(url) => {
                let info = url.as_str().into_connection_info()?.set_tcp_settings(tcp);
                let client = redis::Client::open(info)?;
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeout))
                    .set_connection_timeout(Some(connect_timeout))
                    // One reconnect attempt per failure; the circuit breaker
                    // decides when the next request may try again.
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(100));
                Ok(Connection::Standalone(ConnectionManager::new_lazy_with_config(client, config)?))
            }
            Target::Cluster(urls) => {
                if urls.is_empty() {
                    return Err(Error::invalid("a cluster target needs at least one node URL"));
                }
                let client = ClusterClientBuilder::new(urls.iter().map(String::as_str))
                    .tcp_settings(tcp)
                    .retries(1)
                    .min_retry_wait(0)
                    .max_retry_wait(1)
                    .build()?;
                let config = ClusterConfig::new().set_connection_timeout(connect_timeout).set_response_timeout(timeout);
                Ok(Connection::Cluster(client.get_pending_async_connection_with_config(config)))
            }
        }
    }

    /// Sends `cmd` to the primary that serves `slot`. Callers bound the
    /// wait with their timeout.
    pub(crate) async fn query(&self, cmd: &Cmd, slot: u16) -> Result<Value> {
        let reply = match self {
            Connection::Standalone(con) => con.clone().send_packed_command(cmd).await,
            Connection::Cluster(con) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                con.clone().route_command(cmd.clone(), RoutingInfo::SingleNode(route)).await
            }
        };
        // A server error may come back as a value: make it an error.
        Ok(reply.and_then(Value::extract_error)?)
    }

    /// Sends `pipe` in one round trip to the primary that serves `slot`
    /// (every command's keys must be on that node): one reply per command,
    /// a server error among them as an `Err` of its own.
    pub(crate) async fn query_pipeline(&self, pipe: &redis::Pipeline, slot: u16) -> Result<Vec<Result<Value>>> {
        let count = pipe.len();
        let replies = match self {
            Connection::Standalone(con) => con.clone().send_packed_commands(pipe, 0, count).await,
            Connection::Cluster(con) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                con.clone().route_pipeline(pipe.clone(), 0, count, route).await
            }
        }?;
        Ok(replies.into_iter().map(|v| Ok(v.extract_error()?)).collect())
    }

    /// The slot ranges of a cluster and the primary serving each
    /// (`CLUSTER SLOTS`); empty for a standalone server.
    pub(crate) async fn slot_map(&self) -> Result<Vec<(u16, u16, String)>> {
        let Connection::Cluster(con) = self else { return Ok(Vec::new()) };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        parse_slots(&con.clone().route_command(cmd, random).await?.extract_error()?)
    }
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id], replicas...], ...]`.
fn parse_slots(reply: &Value) -> Result<Vec<(u16, u16, String)>> {
    let bad = || Error::Reply(format!("CLUSTER SLOTS answered {reply:?}"));
    let Value::Array(ranges) = reply else { return Err(bad()) };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else { return Err(bad()) };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return Err(bad());
        };
        let host = match primary.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(bad()),
        };
        let Some(Value::Int(port)) = primary.get(1) else { return Err(bad()) };
        let (Ok(start), Ok(end)) = (u16::try_from(*start), u16::try_from(*end)) else { return Err(bad()) };
        out.push((start, end, format!("{host}:{port}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn reads_cluster_slots() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7000), bulk("id")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7001), bulk("id2")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7002), bulk("id3")]),
            ]),
        ]);
        assert_eq!(
            parse_slots(&reply).unwrap(),
            [(0, 5460, "127.0.0.1:7000".to_string()), (5461, 16383, "127.0.0.1:7001".to_string())]
        );
        assert!(parse_slots(&Value::Int(3)).is_err());
        assert!(parse_slots(&Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_err());
    }
}
