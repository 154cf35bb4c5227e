//! Where a standalone primary is: found when a connection is opened, and
//! found again whenever the connection is lost or points at the wrong
//! server.
//!
//! - A fixed address (`redis://host:port/`, or a managed service's DNS
//!   name, looked up again at every connection) is connected to as given
//!   and asked its `ROLE`. A server that answers as a replica (a primary
//!   demoted by a standalone `FAILOVER`) is left for the primary it names,
//!   reached with the configured credentials and database: the connection
//!   then reports that it talks to a server other than the configured one.
//!   Once the configured server is the primary again, the next connection
//!   goes back to it. A server that refuses `ROLE` (an ACL without it, a
//!   proxy) is used as it is.
//! - A Sentinel target asks the sentinels for the master (redis-rs's
//!   `redis::sentinel`: each sentinel in turn, the master it names checked
//!   with `ROLE`), and [`watch_switches`] follows the sentinels'
//!   `+switch-master` announcements.
//! - A `rediss://` address is reached over TLS ([`crate::tls`]); the
//!   primary a demoted server names, and a Sentinel's master when its
//!   sentinels are `rediss://`, too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{
    Sentinel, SentinelClient, SentinelClientBuilder, SentinelNodeConnectionInfo, SentinelServerType,
};
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, Role};

use crate::config::{redacted, NodeAuth, Target, SENTINEL_PORT};
use crate::error::{Error, Result};
use crate::tls::Loaded;

/// Where the primary is. Made once per connection: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Endpoint {
    Fixed(ConnectionInfo, Option<Arc<Loaded>>),
    Sentinel(Sentinels),
}

/// A master that sentinels watch.
pub(crate) struct Sentinels {
    pub(crate) master: String,
    /// How to reach each sentinel (its own credentials).
    pub(crate) sentinels: Vec<ConnectionInfo>,
    /// How to talk to the master once found.
    node: SentinelNodeConnectionInfo,
    /// The master's database.
    db: i64,
    /// redis-rs's lookup, which keeps a connection to each sentinel.
    lookup: tokio::sync::Mutex<Lookup>,
    /// The sentinels and the master speak TLS.
    tls: Option<Arc<Loaded>>,
}

/// redis-rs's Sentinel lookup. Over TLS, its `SentinelClient`: the one
/// type that hands the master's connections (its `ROLE` check) the CA and
/// the client certificate; its sentinels then share one user.
enum Lookup {
    Plain(Sentinel),
    Tls(SentinelClient),
}

/// A connection to the server an endpoint resolved to.
pub(crate) struct Found {
    pub(crate) con: MultiplexedConnection,
    /// `host:port` (or the socket's path) of the server.
    pub(crate) server: String,
    /// How it was reached: tried again when the configured server cannot be.
    pub(crate) info: ConnectionInfo,
    /// Not the configured server: the primary a demoted one named.
    pub(crate) redirected: bool,
    /// Set once the server closed the connection (its reader ended).
    pub(crate) closed: Arc<AtomicBool>,
}

impl Endpoint {
    /// The endpoint of a standalone or Sentinel `target`; `tls`: loaded
    /// when a URL of it is `rediss://` ([`crate::tls::for_urls`]).
    pub(crate) fn new(target: &Target, tls: Option<&Arc<Loaded>>) -> Result<Endpoint> {
        match target {
            Target::Standalone(url) => {
                Ok(Endpoint::Fixed(with_tls(url.as_str().into_connection_info()?, tls)?, tls.cloned()))
            }
            Target::Sentinel { master, sentinels, node } => {
                if master.is_empty() {
                    return Err(Error::invalid("a Sentinel target needs the master's name"));
                }
                if sentinels.is_empty() {
                    return Err(Error::invalid(format!("the Sentinel target '{master}' needs at least one sentinel")));
                }
                let sentinels = sentinels
                    .iter()
                    .map(|s| {
                        let info = sentinel_info(s).and_then(|info| with_tls(info, tls));
                        info.map_err(|e| Error::invalid(format!("sentinel '{}': {e}", redacted(s))))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let tls_sentinels = sentinels.iter().filter(|s| matches!(s.addr(), ConnectionAddr::TcpTls { .. }));
                let lookup = match (tls_sentinels.count(), tls) {
                    (0, _) => Lookup::Plain(Sentinel::build(sentinels.clone())?),
                    (n, Some(tls)) if n == sentinels.len() => Lookup::Tls(
                        tls_lookup(&sentinels, master, node, tls)
                            .map_err(|e| Error::invalid(format!("the Sentinel target '{master}' over TLS: {e}")))?,
                    ),
                    _ => {
                        return Err(Error::invalid(format!(
                            "the Sentinel target '{master}': every sentinel is rediss:// or none is"
                        )))
                    }
                };
                Ok(Endpoint::Sentinel(Sentinels {
                    master: master.clone(),
                    sentinels,
                    node: node_info(node),
                    db: node.db,
                    lookup: tokio::sync::Mutex::new(lookup),
                    tls: tls.cloned(),
                }))
            }
            Target::Cluster(_) => Err(Error::invalid("a cluster has no single endpoint")),
        }
    }

    /// Connects to the primary; `last`: the server a fixed address was
    /// redirected to before, tried when the configured one cannot be
    /// reached. `check_role`: false for a server that is known to be no
    /// Redis (a lease relay).
    pub(crate) async fn connect(
        &self,
        config: &AsyncConnectionConfig,
        last: Option<&ConnectionInfo>,
        check_role: bool,
    ) -> redis::RedisResult<Found> {
        match self {
            Endpoint::Fixed(info, tls) if !check_role => open(info, config, tls.as_deref()).await,
            Endpoint::Fixed(info, tls) => fixed(info, config, last, tls.as_deref()).await,
            Endpoint::Sentinel(s) => {
                let client = match &mut *s.lookup.lock().await {
                    Lookup::Plain(lookup) => lookup.async_master_for(&s.master, Some(&s.node)).await?,
                    Lookup::Tls(lookup) => lookup.async_get_client().await?,
                };
                open(client.get_connection_info(), config, s.tls.as_deref()).await
            }
        }
    }

    /// The database calls run in.
    pub(crate) fn db(&self) -> i64 {
        match self {
            Endpoint::Fixed(info, _) => info.redis_settings().db(),
            Endpoint::Sentinel(s) => s.db,
        }
    }
}

/// `info` with the TLS settings redis-rs needs for its own connections to
/// it (pub/sub, the sentinels): a `rediss://` address only.
fn with_tls(info: ConnectionInfo, tls: Option<&Arc<Loaded>>) -> redis::RedisResult<ConnectionInfo> {
    let ConnectionAddr::TcpTls { host, port, insecure, .. } = info.addr().clone() else { return Ok(info) };
    let Some(tls) = tls else {
        return Err(RedisError::from((ErrorKind::InvalidClientConfig, "rediss:// without TLS settings")));
    };
    let info = redis::Client::build_with_tls(info, tls.certificates())?.get_connection_info().clone();
    if insecure || !tls.insecure() {
        return Ok(info);
    }
    // The insecure setting reaches redis-rs's connections as `#insecure`.
    let addr = ConnectionAddr::TcpTls { host, port, insecure: true, tls_params: None };
    Ok(info.set_addr(addr))
}

/// A Sentinel lookup over TLS: the sentinels and the master with `tls`'s
/// files, the master with `node`'s credentials and database.
fn tls_lookup(
    sentinels: &[ConnectionInfo],
    master: &str,
    node: &NodeAuth,
    tls: &Loaded,
) -> redis::RedisResult<SentinelClient> {
    let user = |info: &ConnectionInfo| {
        let settings = info.redis_settings();
        (settings.username().map(str::to_owned), settings.password().map(str::to_owned))
    };
    let (username, password) = user(&sentinels[0]);
    if sentinels.iter().any(|s| user(s) != (username.clone(), password.clone())) {
        return Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "the sentinels must share one user and password over TLS",
        )));
    }
    let insecure =
        tls.insecure() || sentinels.iter().any(|s| matches!(s.addr(), ConnectionAddr::TcpTls { insecure: true, .. }));
    let mode = if insecure { redis::TlsMode::Insecure } else { redis::TlsMode::Secure };
    if insecure {
        tls.warn_insecure(&format!("sentinel master '{master}'"));
    }
    let mut builder =
        SentinelClientBuilder::new(sentinels.iter().map(|s| s.addr().clone()), master, SentinelServerType::Master)?
            .set_client_to_sentinel_tls_mode(mode)
            .set_client_to_sentinel_certificates(tls.certificates())
            .set_client_to_redis_tls_mode(mode)
            .set_client_to_redis_certificates(tls.certificates())
            .set_client_to_redis_db(node.db)
            .set_client_to_redis_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    if let Some(username) = &node.username {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = &node.password {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(username) = &username {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = &password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    builder.build()
}

/// `info` moved to `host:port`, over TLS as before if it was.
fn moved(info: &ConnectionInfo, host: String, port: u16) -> ConnectionInfo {
    let addr = match info.addr() {
        ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
            ConnectionAddr::TcpTls { host, port, insecure: *insecure, tls_params: tls_params.clone() }
        }
        _ => ConnectionAddr::Tcp(host, port),
    };
    info.clone().set_addr(addr)
}

/// A fixed address: the server, or the primary it names when it answers
/// as a replica.
async fn fixed(
    info: &ConnectionInfo,
    config: &AsyncConnectionConfig,
    last: Option<&ConnectionInfo>,
    tls: Option<&Loaded>,
) -> redis::RedisResult<Found> {
    let mut found = match open(info, config, tls).await {
        Ok(found) => found,
        // The configured server is unreachable; the primary it named last may not be.
        Err(e) => match last.filter(|l| l.addr() != info.addr()) {
            Some(last) => {
                let mut found = primary(last, config, tls).await.map_err(|_| e)?;
                found.redirected = true;
                return Ok(found);
            }
            None => return Err(e),
        },
    };
    match role(&mut found.con).await {
        Some(Role::Replica { primary_ip, primary_port, .. }) => {
            let followed = moved(info, primary_ip, primary_port);
            let mut primary = primary(&followed, config, tls).await.map_err(|e| {
                let text = format!(
                    "{} answers as a replica of {}, which is not usable: {e}",
                    found.server,
                    address(&followed)
                );
                RedisError::from((ErrorKind::Io, "wrong server", text))
            })?;
            primary.redirected = true;
            Ok(primary)
        }
        Some(Role::Sentinel { .. }) => Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "wrong server",
            format!(
                "{} is a sentinel: configure a Sentinel target (the master's name and the sentinels)",
                found.server
            ),
        ))),
        // A primary, or a server that does not say.
        _ => Ok(found),
    }
}

/// A connection to `info`'s server if it answers as a primary (or does not say).
async fn primary(
    info: &ConnectionInfo,
    config: &AsyncConnectionConfig,
    tls: Option<&Loaded>,
) -> redis::RedisResult<Found> {
    let mut found = open(info, config, tls).await?;
    match role(&mut found.con).await {
        Some(Role::Replica { .. } | Role::Sentinel { .. }) => {
            Err(RedisError::from((ErrorKind::Io, "wrong server", format!("{} is not a primary", found.server))))
        }
        _ => Ok(found),
    }
}

/// The server's `ROLE`; `None` when it will not say.
async fn role(con: &mut MultiplexedConnection) -> Option<Role> {
    redis::cmd("ROLE").query_async::<Role>(con).await.ok()
}

/// Opens a connection to `info` with TCP_NODELAY (over TLS for a
/// `rediss://` address, with `tls`); its reader runs as a task of its own,
/// and marks the connection closed when it ends.
pub(crate) async fn open(
    info: &ConnectionInfo,
    config: &AsyncConnectionConfig,
    tls: Option<&Loaded>,
) -> redis::RedisResult<Found> {
    let closed = Arc::new(AtomicBool::new(false));
    let server = address(info);
    let redis = info.redis_settings();
    let con = match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            tcp.set_nodelay(true)?;
            start(redis, tcp, config, &closed).await.map_err(|e| maybe_tls_only(e, &server))?
        }
        ConnectionAddr::TcpTls { host, port, insecure, .. } => {
            let Some(tls) = tls else {
                return Err(RedisError::from((ErrorKind::InvalidClientConfig, "rediss:// without TLS settings")));
            };
            let tcp = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            tcp.set_nodelay(true)?;
            let stream = tls.handshake(tcp, host, *insecure, &server).await?;
            start(redis, stream, config, &closed).await.map_err(|e| tls.setup_failed(e, &server))?
        }
        ConnectionAddr::Unix(path) => {
            let socket = tokio::net::UnixStream::connect(path).await?;
            start(redis, socket, config, &closed).await?
        }
        other => {
            return Err(RedisError::from((ErrorKind::InvalidClientConfig, "unsupported address", other.to_string())))
        }
    };
    Ok(Found { con, server, info: info.clone(), redirected: false, closed })
}

/// The connection on `stream`, its reader spawned: `closed` is set when it ends.
async fn start<S>(
    redis: &redis::RedisConnectionInfo,
    stream: S,
    config: &AsyncConnectionConfig,
    closed: &Arc<AtomicBool>,
) -> redis::RedisResult<MultiplexedConnection>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin + 'static,
{
    let (con, reader) = MultiplexedConnection::new_with_config(redis, stream, config.clone()).await?;
    let flag = closed.clone();
    tokio::spawn(async move {
        reader.await;
        flag.store(true, Ordering::Release);
    });
    Ok(con)
}

/// A plaintext connection that the server dropped while it was being set
/// up: what a TLS-only port does. Says so.
fn maybe_tls_only(e: RedisError, server: &str) -> RedisError {
    if !(e.is_connection_dropped() || e.is_io_error() || e.is_unrecoverable_error()) {
        return e;
    }
    let text =
        format!("{server} closed the connection while it was set up ({e}): if it speaks TLS only, use rediss://");
    RedisError::from((ErrorKind::Io, "connection closed", text))
}

/// `host:port`, or a socket's path: never credentials.
pub(crate) fn address(info: &ConnectionInfo) -> String {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        ConnectionAddr::Unix(path) => path.display().to_string(),
        other => other.to_string(),
    }
}

/// A sentinel's address: `host:port` (port 26379 when left out) or a
/// `redis://` URL with the sentinel's own credentials.
fn sentinel_info(text: &str) -> redis::RedisResult<ConnectionInfo> {
    if text.contains("://") {
        return text.into_connection_info();
    }
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) => {
            let port = port.parse::<u16>().map_err(|_| {
                RedisError::from((ErrorKind::InvalidClientConfig, "bad port", format!("'{port}' is not a port")))
            })?;
            (host, port)
        }
        None => (text, SENTINEL_PORT),
    };
    if host.is_empty() {
        return Err(RedisError::from((ErrorKind::InvalidClientConfig, "no host")));
    }
    ConnectionAddr::Tcp(host.trim_matches(['[', ']']).to_owned(), port).into_connection_info()
}

/// The master's connection settings, kept apart from the sentinels' own.
fn node_info(node: &NodeAuth) -> SentinelNodeConnectionInfo {
    let mut redis = redis::RedisConnectionInfo::default().set_db(node.db);
    if let Some(user) = &node.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &node.password {
        redis = redis.set_password(password);
    }
    SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(redis)
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
}

/// How long the switch watcher waits for a sentinel before trying the next.
const SENTINEL_WAIT: Duration = Duration::from_secs(2);
/// How long it waits, no sentinel answering, before trying them again.
const SENTINEL_RETRY: Duration = Duration::from_secs(1);

/// Follows `master`'s switches until `switched` answers false (its
/// connection is gone): subscribed to `+switch-master` on one sentinel at
/// a time, it hands each new address (`host:port`) of the master to
/// `switched`, and the address a sentinel names whenever it subscribes
/// (a switch while it was not subscribed is not missed).
pub(crate) async fn watch_switches(sentinels: Vec<ConnectionInfo>, master: String, switched: impl Fn(String) -> bool) {
    loop {
        for info in &sentinels {
            let Ok(Ok(mut messages)) = tokio::time::timeout(SENTINEL_WAIT, subscribe(info)).await else { continue };
            if let Ok(Ok(Some(address))) = tokio::time::timeout(SENTINEL_WAIT, named_master(info, &master)).await {
                if !switched(address) {
                    return;
                }
            }
            while let Some(message) = messages.next().await {
                let text: String = message.get_payload().unwrap_or_default();
                // "<name> <old ip> <old port> <new ip> <new port>"
                let words: Vec<&str> = text.split_whitespace().collect();
                if let [name, _, _, ip, port] = words[..] {
                    if name == master && !switched(format!("{ip}:{port}")) {
                        return;
                    }
                }
            }
        }
        if !switched(String::new()) {
            return;
        }
        tokio::time::sleep(SENTINEL_RETRY).await;
    }
}

async fn subscribe(info: &ConnectionInfo) -> redis::RedisResult<redis::aio::PubSubStream> {
    let mut pubsub = redis::Client::open(info.clone())?.get_async_pubsub().await?;
    pubsub.subscribe("+switch-master").await?;
    Ok(pubsub.into_on_message())
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME`: `host:port`, or `None` for a master it does not know.
async fn named_master(info: &ConnectionInfo, master: &str) -> redis::RedisResult<Option<String>> {
    let mut con = redis::Client::open(info.clone())?.get_multiplexed_async_connection().await?;
    let named: Option<(String, u16)> =
        redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(master).query_async(&mut con).await?;
    Ok(named.map(|(host, port)| format!("{host}:{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_addresses_take_a_default_port_or_a_url() {
        let info = sentinel_info("10.0.0.7").unwrap();
        assert_eq!(address(&info), "10.0.0.7:26379");
        assert_eq!(address(&sentinel_info("10.0.0.7:5000").unwrap()), "10.0.0.7:5000");
        assert_eq!(address(&sentinel_info("[::1]:5000").unwrap()), "::1:5000");
        let info = sentinel_info("redis://admin:pw@10.0.0.7:5000/").unwrap();
        assert_eq!((address(&info), info.redis_settings().password()), ("10.0.0.7:5000".into(), Some("pw")));
        assert!(sentinel_info("10.0.0.7:port").unwrap_err().to_string().contains("'port' is not a port"));
        assert!(sentinel_info(":1").is_err());
    }
}
