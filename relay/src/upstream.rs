//! The relay's connection to Redis: one server or a cluster, through
//! redis-rs, reconnecting by itself; every call bounded by a timeout.

use std::time::Duration;

use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, RedisResult, Value};

#[derive(Clone)]
pub enum Upstream {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Upstream {
    /// One server at `urls[0]`, or a cluster discovered from `urls` when
    /// `cluster` is set. Lazy: the relay starts while Redis is down.
    pub async fn open(urls: &[String], cluster: bool, timeout: Duration) -> RedisResult<Upstream> {
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        if cluster {
            let client = ClusterClientBuilder::new(urls.iter().map(String::as_str))
                .tcp_settings(tcp)
                .retries(1)
                .min_retry_wait(0)
                .max_retry_wait(1)
                .build()?;
            let config =
                redis::cluster::ClusterConfig::new().set_connection_timeout(timeout).set_response_timeout(timeout);
            return Ok(Upstream::Cluster(client.get_pending_async_connection_with_config(config)));
        }
        let url = urls.first().map(String::as_str).unwrap_or("redis://127.0.0.1:6379/");
        let info = redis::IntoConnectionInfo::into_connection_info(url)?.set_tcp_settings(tcp);
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        Ok(Upstream::Standalone(ConnectionManager::new_lazy_with_config(redis::Client::open(info)?, config)?))
    }

    /// Sends `args`; in a cluster, to the primary of `key`'s slot (RL.*
    /// commands name numkeys first, which redis-rs would take for the key).
    /// A server error comes back as a value, for the gateway to see as is.
    pub async fn call(&self, args: &[Bytes], key: Option<&[u8]>) -> RedisResult<Value> {
        let mut cmd = Cmd::new();
        for arg in args {
            cmd.arg(arg.as_ref());
        }
        match self {
            Upstream::Standalone(con) => con.clone().send_packed_command(&cmd).await,
            Upstream::Cluster(con) => match key {
                Some(key) => {
                    let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    con.clone().route_command(cmd, routing).await
                }
                None => con.clone().req_packed_command(&cmd).await,
            },
        }
    }
}
