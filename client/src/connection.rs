//! One Redis connection, standalone, Sentinel or cluster, that sends a
//! command to the primary of a slot within a timeout.
//!
//! Every kind connects lazily and reconnects by itself, so a gateway
//! starts while Redis is down and recovers when it returns. redis-rs's own
//! defaults are tuned for throughput, not for a limiter on the request
//! path: a 500 ms response timeout, Nagle's algorithm on, and 16 cluster
//! retries with backoff. Here every call has the configured timeout (50 ms by
//! default) and TCP_NODELAY, and a cluster call is retried at most once, at
//! once (to follow a MOVED after a resharding); a call that fails is
//! answered by the fallback instead.
//!
//! A standalone or Sentinel primary ([`Primary`]) has one multiplexed
//! connection, opened by the first call that needs it, in the background
//! (within `connect_timeout`, whatever the call's own timeout). An attempt
//! that failed is forgotten: the next call tries again, so the first call
//! after an outage (the breaker's probe) meets a fresh attempt, not the
//! last failure. A connection the server closed (a restart, a failover's
//! `CLIENT KILL`) is replaced before anything is sent on it. A reply of
//! `READONLY`, `MASTERDOWN` or `LOADING` says the connection points at the
//! wrong server: the call fails (it is never sent again: the fallback
//! answers it), and the next call resolves the endpoint again
//! ([`crate::endpoint`]). So do three timeouts in a row (a server gone
//! without closing its connections). Each such re-resolution is logged,
//! counted (rl-gateway's `Event::ServerSwitch`) and shown in
//! [`Connection::status`].
//!
//! Through a lease relay (`Config::relay`), calls go to the relay while its
//! own breaker is closed and to Redis directly while it is open: a relay
//! that refuses connections (it is down) fails over at once, the call
//! itself sent to Redis; a relay that does not answer within half the
//! timeout fails the call (it may have been served: never sent twice) and
//! counts against the relay's breaker. While it is open, a PING in the
//! background probes the relay, so no request waits on a relay that is
//! still down; once it answers, calls go back to it.
//!
//! A relay in front of a Redis that cannot load the module (the client on
//! the Lua backend, the relay on `--redis-backend lua`) speaks the module's
//! commands; on the direct path each module command goes as its script's
//! call ([`crate::script_call`]), loaded first where Redis answers NOSCRIPT,
//! so the limits stay exact while the relay is down. The relay sends its
//! own calls the same way ([`Connection::send_script`]): one copy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::io::tcp::TcpSettings;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, RedisResult, ServerErrorKind, Value};

use crate::breaker::Breaker;
use crate::clock::Clock;
use crate::config::{redacted, Config, Target};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::primary::{ConnectionStatus, Primary};
use crate::script_call::{is_module_command, script_call, Script};
use crate::tls::{self, Loaded, Tls};

/// A connection to Redis (and, in a client, to its relay), reconnecting by
/// itself. Cheap to clone: clones share it.
#[derive(Clone)]
pub struct Connection(Kind);

#[derive(Clone)]
enum Kind {
    Plain(Plain),
    Relayed(Arc<Relayed>),
}

/// One primary (a fixed address or a Sentinel's master) or a cluster.
#[derive(Clone)]
enum Plain {
    Standalone(Arc<Primary>),
    Cluster(ClusterConnection, String),
}

/// A relay in front of Redis, with the relay's own breaker.
struct Relayed {
    relay: Plain,
    direct: Plain,
    breaker: Breaker,
    /// The relay's breaker opened and no probe has answered since.
    down: AtomicBool,
    /// Redis cannot load the module (the Lua backend): on the direct path
    /// module commands go as their scripts' calls.
    scripts: bool,
    clock: Clock,
}

impl Connection {
    /// The connection a client with `config` uses: its target, behind its
    /// relay if it has one. Must run inside a tokio runtime.
    pub(crate) fn for_config(config: &Config) -> Result<Connection> {
        let urls = config.target.urls().chain(config.relay.as_deref());
        let tls = tls::for_urls(&config.tls, urls)?;
        let direct = Plain::open(&config.target, tls.as_ref(), config.timeout, config.connect_timeout)?;
        let Some(relay) = &config.relay else { return Ok(Connection(Kind::Plain(direct))) };
        // A relay answers in well under a millisecond: half the timeout
        // leaves the call's own timeout to see a hung relay counted.
        let relay = Plain::as_given(relay, tls.as_ref(), config.timeout / 2, config.connect_timeout)
            .map_err(|e| Error::invalid(format!("config relay {:?}: {e}", redacted(relay))))?;
        Ok(Connection(Kind::Relayed(Arc::new(Relayed {
            relay,
            direct,
            breaker: Breaker::new(
                config.breaker_trip_after,
                config.breaker_open_for.as_millis().try_into().unwrap_or(u64::MAX),
                config.breaker_failure_rate,
            ),
            down: AtomicBool::new(false),
            scripts: config.backend == crate::config::Backend::Lua,
            clock: config.clock.clone(),
        }))))
    }

    /// Prepares a connection to `target` without waiting for Redis: every
    /// call answers within `timeout`, a (re)connection within
    /// `connect_timeout`. Must run inside a tokio runtime: the reconnecting
    /// machinery spawns tasks on it.
    pub fn open(target: &Target, timeout: Duration, connect_timeout: Duration) -> Result<Connection> {
        Connection::open_with_tls(target, &Tls::default(), timeout, connect_timeout)
    }

    /// [`Connection::open`] with TLS settings for a `rediss://` target
    /// (refused for a target without one: TLS is the URL's scheme).
    pub fn open_with_tls(
        target: &Target,
        tls: &Tls,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Connection> {
        let tls = tls::for_urls(tls, target.urls())?;
        Ok(Connection(Kind::Plain(Plain::open(target, tls.as_ref(), timeout, connect_timeout)?)))
    }

    /// Sends `cmd` to the primary that serves `slot`. Callers bound the
    /// wait with their timeout.
    pub(crate) async fn query(&self, cmd: &Cmd, slot: u16) -> Result<Value> {
        let route = Route::new(slot, SlotAddr::Master);
        // A server error may come back as a value: make it an error.
        Ok(self.route(cmd, Some(route)).await.and_then(Value::extract_error)?)
    }

    /// Sends `pipe` in one round trip to the primary that serves `slot`
    /// (every command's keys must be on that node): one reply per command,
    /// a server error among them as an `Err` of its own.
    pub(crate) async fn query_pipeline(&self, pipe: &redis::Pipeline, slot: u16) -> Result<Vec<Result<Value>>> {
        let route = Route::new(slot, SlotAddr::Master);
        let replies = match &self.0 {
            Kind::Plain(con) => con.pipeline(pipe, route).await,
            Kind::Relayed(r) => r.call(|con, scripts| async move { con.pipeline_as(pipe, route, scripts).await }).await,
        }?;
        Ok(replies.into_iter().map(|v| Ok(v.extract_error()?)).collect())
    }

    /// Sends `cmd` to the primary that serves `key`'s slot (none: any node,
    /// for a command that names no key), through the relay if there is one.
    /// A server error may come back as a value, as the server sent it.
    pub async fn send(&self, cmd: &Cmd, key: Option<&[u8]>) -> redis::RedisResult<Value> {
        self.route(cmd, key.map(|key| Route::with_key(key, SlotAddr::Master))).await
    }

    async fn route(&self, cmd: &Cmd, route: Option<Route>) -> redis::RedisResult<Value> {
        match &self.0 {
            Kind::Plain(con) => con.send(cmd, route).await,
            Kind::Relayed(r) => r.call(|con, scripts| async move { con.send_as(cmd, route, scripts).await }).await,
        }
    }

    /// Sends `argv`, a module command, to Redis (never the relay) as its
    /// Lua script's call, to the primary of `key`'s slot: on NOSCRIPT the
    /// script is loaded there and the call sent once more (NOSCRIPT: it
    /// did not run). A command the scripts do not serve (CL.THROTTLE) is
    /// answered the error naming the module; a server error comes back as
    /// a value, as the server sent it.
    pub async fn send_script<A: AsRef<[u8]>>(&self, argv: &[A], key: Option<&[u8]>) -> RedisResult<Value> {
        self.redis().script(argv, key.map(|key| Route::with_key(key, SlotAddr::Master))).await
    }

    /// Loads the scripts Redis's server of `key`'s slot lacks (`SCRIPT
    /// EXISTS`, then `SCRIPT LOAD` of each missing one): done ahead, a
    /// call's NOSCRIPT retry is the exception.
    pub async fn load_missing_scripts(&self, key: Option<&[u8]>) -> RedisResult<()> {
        self.redis().load_missing_scripts(key.map(|key| Route::with_key(key, SlotAddr::Master))).await
    }

    /// Redis itself (through a relay: the direct connection).
    fn redis(&self) -> &Plain {
        match &self.0 {
            Kind::Plain(con) => con,
            Kind::Relayed(r) => &r.direct,
        }
    }

    /// Like [`Connection::open`], but a fixed address is always the server
    /// used, even when it answers as a replica (an exporter of that one
    /// server); a Sentinel target still follows its master.
    pub fn open_as_given(target: &Target, timeout: Duration, connect_timeout: Duration) -> Result<Connection> {
        Connection::open_as_given_with_tls(target, &Tls::default(), timeout, connect_timeout)
    }

    /// [`Connection::open_as_given`] with TLS settings for a `rediss://` target.
    pub fn open_as_given_with_tls(
        target: &Target,
        tls: &Tls,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Connection> {
        let tls = tls::for_urls(tls, target.urls())?;
        let plain = match target {
            Target::Standalone(url) => Plain::as_given(url, tls.as_ref(), timeout, connect_timeout)?,
            other => Plain::open(other, tls.as_ref(), timeout, connect_timeout)?,
        };
        Ok(Connection(Kind::Plain(plain)))
    }

    /// A pub/sub connection of its own to the server calls go to now (a
    /// standalone or Sentinel target): after a failover, subscribe again
    /// once its stream ends.
    pub async fn subscriber(&self) -> Result<redis::aio::PubSub> {
        match &self.0 {
            Kind::Plain(Plain::Standalone(primary)) => Ok(primary.subscriber().await?),
            _ => Err(Error::invalid("pub/sub needs a standalone or Sentinel target without a relay")),
        }
    }

    /// Which server the calls to Redis go to (through a relay: the
    /// direct connection, used while the relay is down).
    pub fn status(&self) -> ConnectionStatus {
        self.redis().status()
    }

    /// Calls `hook` with the new status each time calls to Redis move to
    /// another server (never for a cluster: its client follows the slot map).
    pub fn on_switch(&self, hook: impl Fn(&ConnectionStatus) + Send + Sync + 'static) {
        if let Plain::Standalone(primary) = self.redis() {
            primary.on_switch(Arc::new(hook));
        }
    }

    /// The slot ranges of a cluster and the primary serving each
    /// (`CLUSTER SLOTS`); empty for a standalone server.
    pub(crate) async fn slot_map(&self) -> Result<Vec<(u16, u16, String)>> {
        self.redis().slot_map().await
    }
}

impl Plain {
    fn open(target: &Target, tls: Option<&Arc<Loaded>>, timeout: Duration, connect_timeout: Duration) -> Result<Plain> {
        match target {
            Target::Standalone(_) | Target::Sentinel { .. } => {
                let endpoint = Endpoint::new(target, tls)?;
                let primary = Primary::new(endpoint, target.to_string(), timeout, connect_timeout, true);
                Ok(Plain::Standalone(primary))
            }
            Target::Cluster(urls) => {
                if urls.is_empty() {
                    return Err(Error::invalid("a cluster target needs at least one node URL"));
                }
                let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str))
                    .tcp_settings(TcpSettings::default().set_nodelay(true))
                    .retries(1)
                    .min_retry_wait(0)
                    .max_retry_wait(1);
                if let Some(tls) = tls {
                    // Every node over TLS (redis-rs refuses a mix), with the same files.
                    builder = builder.certs(tls.certificates());
                    if tls.insecure() {
                        builder = builder.tls(redis::TlsMode::Insecure);
                    }
                    if tls.insecure() || urls.iter().any(|u| u.ends_with("#insecure")) {
                        tls.warn_insecure(&target.to_string());
                    }
                }
                let client = builder.build()?;
                let config = ClusterConfig::new().set_connection_timeout(connect_timeout).set_response_timeout(timeout);
                Ok(Plain::Cluster(client.get_pending_async_connection_with_config(config), target.to_string()))
            }
        }
    }

    /// A lease relay (a server that answers no `ROLE`), or a server used as
    /// given whatever its role.
    fn as_given(url: &str, tls: Option<&Arc<Loaded>>, timeout: Duration, connect_timeout: Duration) -> Result<Plain> {
        let target = Target::Standalone(url.to_owned());
        let endpoint = Endpoint::new(&target, tls)?;
        let primary = Primary::new(endpoint, target.to_string(), timeout, connect_timeout, false);
        Ok(Plain::Standalone(primary))
    }

    fn status(&self) -> ConnectionStatus {
        match self {
            Plain::Standalone(primary) => primary.status(),
            Plain::Cluster(_, shown) => ConnectionStatus {
                configured: shown.clone(),
                server: None,
                redirected: false,
                switches: 0,
                reresolutions: 0,
            },
        }
    }

    async fn send(&self, cmd: &Cmd, route: Option<Route>) -> redis::RedisResult<Value> {
        match self {
            Plain::Standalone(primary) => primary.send(cmd).await,
            Plain::Cluster(con, _) => match route {
                Some(route) => {
                    let route = SingleNodeRoutingInfo::SpecificNode(route);
                    con.clone().route_command(cmd.clone(), RoutingInfo::SingleNode(route)).await
                }
                None => redis::aio::ConnectionLike::req_packed_command(&mut con.clone(), cmd).await,
            },
        }
    }

    async fn pipeline(&self, pipe: &redis::Pipeline, route: Route) -> redis::RedisResult<Vec<Value>> {
        let count = pipe.len();
        match self {
            Plain::Standalone(primary) => primary.pipeline(pipe, 0, count).await,
            Plain::Cluster(con, _) => {
                let route = SingleNodeRoutingInfo::SpecificNode(route);
                con.clone().route_pipeline(pipe.clone(), 0, count, route).await
            }
        }
    }

    async fn slot_map(&self) -> Result<Vec<(u16, u16, String)>> {
        let Plain::Cluster(con, _) = self else { return Ok(Vec::new()) };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        parse_slots(&con.clone().route_command(cmd, random).await?.extract_error()?)
    }
}

/// For code written against redis-rs (scripts, `query_async`): commands go
/// as [`Connection::send`] sends them, to the primary of the first key's
/// slot in a cluster (redis-rs's routing).
impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.route(cmd, None))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match &self.0 {
                Kind::Plain(con) => con.commands(pipe, offset, count).await,
                // Module commands in it go as they are, also on the direct
                // path: rl-client pipelines them through `query_pipeline`.
                Kind::Relayed(r) => r.call(|con, _| async move { con.commands(pipe, offset, count).await }).await,
            }
        })
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Kind::Plain(Plain::Standalone(primary)) => primary.db(),
            Kind::Relayed(r) => match &r.direct {
                Plain::Standalone(primary) => primary.db(),
                Plain::Cluster(..) => 0,
            },
            Kind::Plain(Plain::Cluster(..)) => 0,
        }
    }
}

impl Plain {
    /// A pipeline's replies from `offset`, `count` of them (redis-rs's
    /// `req_packed_commands`).
    async fn commands(&self, pipe: &Pipeline, offset: usize, count: usize) -> redis::RedisResult<Vec<Value>> {
        match self {
            Plain::Standalone(primary) => primary.pipeline(pipe, offset, count).await,
            Plain::Cluster(con, _) => {
                redis::aio::ConnectionLike::req_packed_commands(&mut con.clone(), pipe, offset, count).await
            }
        }
    }
}

/// The module's commands as the Lua scripts' calls, on Redis itself.
impl Plain {
    /// `cmd`, as a script's call when `scripts` and it is a module command.
    async fn send_as(&self, cmd: &Cmd, route: Option<Route>, scripts: bool) -> RedisResult<Value> {
        if scripts {
            let argv = argv(cmd);
            if is_module(&argv) {
                return self.script(&argv, route).await;
            }
        }
        self.send(cmd, route).await
    }

    /// `pipe`, its module commands as scripts' calls when `scripts`.
    async fn pipeline_as(&self, pipe: &Pipeline, route: Route, scripts: bool) -> RedisResult<Vec<Value>> {
        if scripts && pipe.cmd_iter().any(|cmd| is_module(&argv(cmd))) {
            self.script_pipeline(pipe, route).await
        } else {
            self.pipeline(pipe, route).await
        }
    }

    /// A module command as its script's call; on NOSCRIPT (the call did not
    /// run) the script is loaded and the call sent once more.
    async fn script<A: AsRef<[u8]>>(&self, argv: &[A], route: Option<Route>) -> RedisResult<Value> {
        let call = match script_call(argv) {
            Ok(call) => call,
            Err(refused) => return refused_value(&refused),
        };
        let reply = self.send(&call.cmd, route).await;
        if !is_noscript(&reply) {
            return reply;
        }
        self.load(call.script, route).await?;
        self.send(&call.cmd, route).await
    }

    /// A pipeline with its module commands as scripts' calls, in one round
    /// trip; the calls answered NOSCRIPT did not run: their scripts are
    /// loaded and those calls alone sent once more, in a second one. A
    /// command the scripts do not serve is answered here, not sent.
    async fn script_pipeline(&self, pipe: &Pipeline, route: Route) -> RedisResult<Vec<Value>> {
        // Per command: what is sent (and the script it calls), or the answer.
        let mut plan: Vec<Planned> = Vec::with_capacity(pipe.len());
        for cmd in pipe.cmd_iter() {
            let argv = argv(cmd);
            plan.push(match is_module(&argv) {
                false => Ok((cmd.clone(), None)),
                true => match script_call(&argv) {
                    Ok(call) => Ok((call.cmd, Some(call.script))),
                    Err(refused) => Err(refused_value(&refused)?),
                },
            });
        }
        let sent: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].is_ok()).collect();
        let mut replies = self.send_all(&plan, &sent, route).await?;
        let missing: Vec<usize> =
            (0..sent.len()).filter(|&n| noscript(&replies[n]) && script_of(&plan[sent[n]]).is_some()).collect();
        if !missing.is_empty() {
            let mut loaded = Vec::new();
            for script in missing.iter().filter_map(|&n| script_of(&plan[sent[n]])) {
                if !loaded.contains(&script) {
                    self.load(script, Some(route)).await?;
                    loaded.push(script);
                }
            }
            let again: Vec<usize> = missing.iter().map(|&n| sent[n]).collect();
            let answers = self.send_all(&plan, &again, route).await?;
            for (n, answer) in missing.into_iter().zip(answers) {
                replies[n] = answer;
            }
        }
        let mut replies = replies.into_iter();
        Ok(plan.into_iter().map(|p| p.map_or_else(|answer| answer, |_| replies.next().unwrap_or(Value::Nil))).collect())
    }

    /// The planned commands at `which`, in one pipeline: one reply each.
    async fn send_all(&self, plan: &[Planned], which: &[usize], route: Route) -> RedisResult<Vec<Value>> {
        if which.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for cmd in which.iter().filter_map(|&i| plan[i].as_ref().ok()).map(|(cmd, _)| cmd) {
            pipe.add_command(cmd.clone());
        }
        let replies = self.pipeline(&pipe, route).await?;
        if replies.len() != which.len() {
            let why = format!("{} replies to a pipeline of {}", replies.len(), which.len());
            return Err(redis::RedisError::from((ErrorKind::Parse, "pipeline", why)));
        }
        Ok(replies)
    }

    /// `SCRIPT LOAD`s `script` on the server of `route`.
    async fn load(&self, script: Script, route: Option<Route>) -> RedisResult<Value> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(script.source());
        match self.send(&load, route).await? {
            Value::ServerError(e) => Err(e.into()),
            loaded => Ok(loaded),
        }
    }

    /// Loads the scripts the server of `route` lacks.
    async fn load_missing_scripts(&self, route: Option<Route>) -> RedisResult<()> {
        let mut exists = redis::cmd("SCRIPT");
        exists.arg("EXISTS");
        for script in Script::ALL {
            exists.arg(script.sha());
        }
        let held: Vec<i64> = match self.send(&exists, route).await? {
            Value::ServerError(e) => return Err(e.into()),
            held => redis::from_redis_value(held)?,
        };
        for (script, held) in Script::ALL.into_iter().zip(held.into_iter().chain(std::iter::repeat(0))) {
            if held == 0 {
                self.load(script, route).await?;
            }
        }
        Ok(())
    }
}

/// A command's arguments, its name first.
fn argv(cmd: &Cmd) -> Vec<&[u8]> {
    cmd.args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes,
            // A SCAN cursor (no module command has one).
            _ => b"0",
        })
        .collect()
}

fn is_module(argv: &[&[u8]]) -> bool {
    argv.first().is_some_and(|name| is_module_command(name))
}

/// A pipeline's command on the direct path: what is sent (and the script
/// it calls, if it is one's call), or its answer, given without sending.
type Planned = std::result::Result<(Cmd, Option<Script>), Value>;

fn script_of(planned: &Planned) -> Option<Script> {
    planned.as_ref().ok().and_then(|(_, script)| *script)
}

/// `script_call`'s refusal (`ERR ...`) as the server error value a server
/// would have answered.
fn refused_value(refused: &str) -> RedisResult<Value> {
    let (code, detail) = refused.split_once(' ').unwrap_or(("ERR", refused));
    Ok(Value::ServerError(redis::make_extension_error(code.into(), Some(detail.into())).try_into()?))
}

/// Whether Redis answered NOSCRIPT (as a value or as an error).
fn is_noscript(reply: &RedisResult<Value>) -> bool {
    match reply {
        Ok(value) => noscript(value),
        Err(e) => e.kind() == ErrorKind::Server(ServerErrorKind::NoScript),
    }
}

fn noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

impl Relayed {
    /// Runs `call` (a command or a pipeline) on the relay while its breaker
    /// is closed, on Redis directly otherwise; its second argument says
    /// whether module commands go as their scripts' calls (direct, on the
    /// Lua backend).
    async fn call<T, F, Fut>(self: &Arc<Self>, call: F) -> redis::RedisResult<T>
    where
        F: Fn(Plain, bool) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let now = self.clock.now_ms();
        let Some(ticket) = self.breaker.admit(now) else { return call(self.direct.clone(), self.scripts).await };
        if self.down.load(Ordering::Acquire) {
            // The breaker's probe: a PING in the background; this call goes
            // to Redis.
            let this = self.clone();
            tokio::spawn(async move {
                let answered = this.relay.send(&redis::cmd("PING"), None).await.is_ok();
                let now = this.clock.now_ms();
                if answered {
                    this.down.store(false, Ordering::Release);
                    this.breaker.success(ticket, now);
                } else {
                    this.breaker.failure(ticket, now);
                }
            });
            return call(self.direct.clone(), self.scripts).await;
        }
        match call(self.relay.clone(), false).await {
            // The relay did not answer (refused, dropped, timed out); an
            // error it sent is an answer.
            Err(e) if e.kind() == redis::ErrorKind::Io => {
                if self.breaker.failure(ticket, self.clock.now_ms()) {
                    self.down.store(true, Ordering::Release);
                }
                if e.is_connection_refusal() {
                    // Never reached the relay: Redis answers instead.
                    return call(self.direct.clone(), self.scripts).await;
                }
                Err(e)
            }
            reply => {
                self.breaker.success(ticket, self.clock.now_ms());
                reply
            }
        }
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

    #[tokio::test]
    async fn a_bad_relay_url_is_named() {
        let config = Config { relay: Some("not a url".into()), ..Config::standalone("redis://127.0.0.1:1/") };
        let e = Connection::for_config(&config).err().expect("refused").to_string();
        assert!(e.contains("config relay \"not a url\""), "{e}");
        assert!(Connection::for_config(&Config::standalone("redis://127.0.0.1:1/")).is_ok());
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
