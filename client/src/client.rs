//! Typed calls for every module command, on either backend.
//!
//! These are exact and unguarded: a Redis failure is an `Err`. The
//! rl-gateway's `Limiter` adds leases, the deny cache, the breaker and
//! the fallback on top of them.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, ErrorKind, ServerErrorKind, Value};
use rl_core::inflight::InflightParams;
use rl_core::limits::{in_range, MAX_KEYS, MAX_WINDOW_LIMIT};
use rl_core::{BucketOp, BucketParams, WindowMode};

use crate::config::{Backend, Config};
use crate::connection::Connection;
use crate::decision::{Decision, Grant};
use crate::error::{Error, Result};
use crate::inflight::{new_id, validate_cost, validate_id, Acquired, Inflight};
use crate::params::{bucket_params, period_ms, LUA_MAX_UNITS};
use crate::script_call::{INFLIGHT_SCRIPT, LUA_SCRIPT, WINDOW_SCRIPT};
use crate::slot::slot_of;

/// What a window call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WindowOp {
    Take,
    /// A take answered with the clock reading it decided at (TIME).
    Timed,
    Peek,
    /// Gives back what the call decided at this reading counted (REFUND).
    Refund(u64),
}

/// One token bucket for a raw call: its key and parameters, checked when made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    key: String,
    params: BucketParams,
}

impl Bucket {
    /// `capacity` tokens at most, `refill` more every `period` (whole ms).
    pub fn new(key: impl Into<String>, capacity: u64, refill: u64, period: Duration) -> Result<Bucket> {
        let key = key.into();
        let params =
            bucket_params(capacity, refill, period).map_err(|why| Error::invalid(format!("bucket '{key}': {why}")))?;
        Ok(Bucket { key, params })
    }

    /// The bucket's key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// One window limit for RL.WINDOW: at most `limit` in any `window`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    key: String,
    limit: u64,
    window_ms: u64,
}

impl Window {
    /// At most `limit` (1 to 10^12) in any `window` (whole ms, up to two years).
    pub fn new(key: impl Into<String>, limit: u64, window: Duration) -> Result<Window> {
        let key = key.into();
        let bad = |why: String| Error::invalid(format!("window '{key}': {why}"));
        in_range("limit", limit, 1, MAX_WINDOW_LIMIT).map_err(|e| bad(e.to_string()))?;
        let window_ms = period_ms(window).map_err(|why| bad(why.replacen("period", "window", 1)))?;
        Ok(Window { key, limit, window_ms })
    }

    /// The window's key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// The module command carrying out `op` on `keys`.
fn module_cmd(op: BucketOp, keys: &[String], params: &[BucketParams]) -> Cmd {
    let mut cmd = redis::cmd(match op {
        BucketOp::Take { .. } | BucketOp::Force { .. } => "RL.TAKE",
        BucketOp::Peek { .. } => "RL.PEEK",
        BucketOp::Lease { .. } => "RL.LEASE",
        BucketOp::Refund { .. } => "RL.REFUND",
    });
    cmd.arg(keys.len()).arg(keys);
    push_params(&mut cmd, params);
    match op {
        BucketOp::Take { cost } | BucketOp::Peek { cost } => cmd.arg("COST").arg(cost),
        BucketOp::Force { cost } => cmd.arg("COST").arg(cost).arg("FORCE"),
        BucketOp::Lease { want, min } => cmd.arg("WANT").arg(want).arg("MIN").arg(min),
        BucketOp::Refund { tokens } => cmd.arg("TOKENS").arg(tokens),
    };
    cmd
}

/// The Lua script's arguments for `op`: its name, the amount and the
/// lease's minimum (the amount again for the others).
fn lua_args(op: BucketOp) -> (&'static str, u64, u64) {
    match op {
        BucketOp::Take { cost } => ("take", cost, cost),
        BucketOp::Peek { cost } => ("peek", cost, cost),
        BucketOp::Force { cost } => ("force", cost, cost),
        BucketOp::Lease { want, min } => ("lease", want, min),
        BucketOp::Refund { tokens } => ("refund", tokens, tokens),
    }
}

/// Typed calls to the module (or the Lua backend), each with the
/// configured timeout. Cheap to clone: clones share one connection.
///
/// ```no_run
/// use std::time::Duration;
/// use rl_client::{Bucket, Client, Config};
///
/// # async fn run() -> Result<(), rl_client::Error> {
/// let client = Client::new(&Config::standalone("redis://127.0.0.1:6379/"))?;
/// let second = Duration::from_secs(1);
/// let buckets = [
///     Bucket::new("rl:{user42}:s", 200, 100, second)?,
///     Bucket::new("rl:{user42}:m", 5000, 5000, 60 * second)?,
/// ];
/// let d = client.take(&buckets, 1).await?;
/// if !d.allowed {
///     println!("refused by bucket {}, retry in {:?}", d.rule, d.retry_after);
/// }
/// let grant = client.lease(&buckets, 50, 1).await?;
/// println!("leased {} tokens", grant.tokens);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    conn: Connection,
    /// What carries the limits out on Redis: its limits (2^52, no
    /// CL.THROTTLE) bind whatever the calls are written in.
    backend: Backend,
    /// The language the calls are written in. The module's on the Lua
    /// backend too when a relay is in front: the relay speaks only the
    /// module's commands (it runs the scripts itself), and while it is down
    /// the connection sends each as its script's call (connection.rs). One
    /// language per client keeps its pipelines and their replies as the
    /// module's, whichever way a call goes.
    speaks: Backend,
    timeout: Duration,
    script: Arc<redis::Script>,
    inflight_script: Arc<redis::Script>,
    window_script: Arc<redis::Script>,
}

impl Client {
    /// Prepares the connection described by `config` without waiting for
    /// Redis (it connects on first use and reconnects by itself). Call it
    /// inside a tokio runtime.
    pub fn new(config: &Config) -> Result<Client> {
        config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid("Client::new must be called inside a tokio runtime"));
        }
        Ok(Client {
            conn: Connection::for_config(config)?,
            backend: config.backend,
            speaks: if config.relay.is_some() { Backend::Module } else { config.backend },
            timeout: config.timeout,
            script: Arc::new(redis::Script::new(&LUA_SCRIPT)),
            inflight_script: Arc::new(redis::Script::new(&INFLIGHT_SCRIPT)),
            window_script: Arc::new(redis::Script::new(&WINDOW_SCRIPT)),
        })
    }

    /// Which backend carries the calls out on Redis (its limits bind),
    /// as configured: [`Backend::Lua`] also behind a relay, where the
    /// calls are the module's commands (the relay's language).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether [`Client::take_command`] and [`Client::pipeline`] serve:
    /// the calls are the module's commands (the module, or a relay in
    /// front of the Lua backend).
    #[doc(hidden)]
    pub fn pipelines(&self) -> bool {
        self.speaks == Backend::Module
    }

    /// The connection the calls go through (its status: which server).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// RL.TAKE: takes `cost` tokens from every bucket, or from none.
    pub async fn take(&self, buckets: &[Bucket], cost: u64) -> Result<Decision> {
        let (keys, params) = split(buckets)?;
        self.run(BucketOp::Take { cost }, &keys, &params).await
    }

    /// RL.PEEK: what RL.TAKE would answer now, writing nothing.
    pub async fn peek(&self, buckets: &[Bucket], cost: u64) -> Result<Decision> {
        let (keys, params) = split(buckets)?;
        self.run(BucketOp::Peek { cost }, &keys, &params).await
    }

    /// RL.TAKE ... FORCE: takes `cost` even into debt (always allowed), for
    /// a cost settled higher after the response was sent.
    pub async fn take_forced(&self, buckets: &[Bucket], cost: u64) -> Result<Decision> {
        let (keys, params) = split(buckets)?;
        self.run(BucketOp::Force { cost }, &keys, &params).await
    }

    /// RL.LEASE: takes as many tokens as every bucket can give, up to
    /// `want`, or none when fewer than `min`.
    pub async fn lease(&self, buckets: &[Bucket], want: u64, min: u64) -> Result<Grant> {
        let (keys, params) = split(buckets)?;
        self.grant(BucketOp::Lease { want, min }, &keys, &params).await
    }

    /// RL.REFUND: gives `tokens` unused tokens back to every bucket, never
    /// above capacity.
    pub async fn refund(&self, buckets: &[Bucket], tokens: u64) -> Result<Decision> {
        let (keys, params) = split(buckets)?;
        self.run(BucketOp::Refund { tokens }, &keys, &params).await
    }

    /// RL.WINDOW: counts `cost` in every window, or in none. On the Lua
    /// backend, the same by its window script (limit x window_ms at most
    /// 2^52; an EXACT limit at most 10,000).
    pub async fn window(&self, windows: &[Window], cost: u64, mode: WindowMode) -> Result<Decision> {
        Ok(self.window_call(WindowOp::Take, windows, cost, mode).await?.0)
    }

    /// RL.WINDOW ... TIME: as [`Client::window`], and the server's clock
    /// reading the call decided at, which names it for
    /// [`Client::window_refund`].
    pub async fn window_timed(&self, windows: &[Window], cost: u64, mode: WindowMode) -> Result<(Decision, u64)> {
        let (decision, at) = self.window_call(WindowOp::Timed, windows, cost, mode).await?;
        Ok((decision, at.ok_or_else(|| Error::Reply("RL.WINDOW ... TIME answered without the time".into()))?))
    }

    /// RL.WINDOW ... REFUND at_ms: gives back `cost` counted by the call
    /// that answered `at_ms` ([`Client::window_timed`]), where it still
    /// counts; never more than a window counts. The windows as they stand.
    pub async fn window_refund(&self, windows: &[Window], cost: u64, mode: WindowMode, at_ms: u64) -> Result<Decision> {
        Ok(self.window_call(WindowOp::Refund(at_ms), windows, cost, mode).await?.0)
    }

    /// RL.WINDOWPEEK: what RL.WINDOW would answer, writing nothing.
    pub async fn window_peek(&self, windows: &[Window], cost: u64, mode: WindowMode) -> Result<Decision> {
        Ok(self.window_call(WindowOp::Peek, windows, cost, mode).await?.0)
    }

    /// CL.THROTTLE, as redis-cell answers it: `max_burst`,
    /// `count_per_period` per `period` (whole seconds), `quantity` tokens.
    /// Module only.
    pub async fn throttle(
        &self,
        key: &str,
        max_burst: u64,
        count_per_period: u64,
        period: Duration,
        quantity: u64,
    ) -> Result<Decision> {
        if self.backend == Backend::Lua {
            return Err(Error::Unsupported("CL.THROTTLE"));
        }
        if period.is_zero() || period.subsec_nanos() != 0 {
            return Err(Error::invalid(format!("CL.THROTTLE period must be whole seconds, got {period:?}")));
        }
        let mut cmd = redis::cmd("CL.THROTTLE");
        cmd.arg(key).arg(max_burst).arg(count_per_period).arg(period.as_secs()).arg(quantity);
        let reply = self.integers(&cmd, slot_of(key)).await?;
        Decision::from_throttle_reply(&reply)
    }

    /// RL.ACQUIRE: takes `cost` slots under `id` in every key, or in none.
    /// `id` renews a slot it already holds (a new deadline, no second
    /// slot); without one the module makes one (the Lua backend: the
    /// client). Release it with [`Client::release`] and the answered id.
    pub async fn acquire(&self, limits: &[Inflight], id: Option<&str>, cost: u64) -> Result<Acquired> {
        let (keys, params) = split_inflight(limits);
        self.inflight_call(true, &keys, &params, id, cost).await
    }

    /// RL.INFLIGHT: what RL.ACQUIRE would answer now, writing nothing.
    pub async fn inflight(&self, limits: &[Inflight], id: Option<&str>, cost: u64) -> Result<Acquired> {
        let (keys, params) = split_inflight(limits);
        self.inflight_call(false, &keys, &params, id, cost).await
    }

    /// RL.RELEASE: gives `id`'s slot back in each key that holds it; the
    /// number of keys that did. An unknown, released or expired id
    /// releases nothing (0): never an error, never room not taken.
    pub async fn release<K: AsRef<str>>(&self, keys: &[K], id: &str) -> Result<u64> {
        validate_keys(keys)?;
        validate_id(id)?;
        let slot = slot_of(keys[0].as_ref());
        let mut cmd = match self.speaks {
            Backend::Module => redis::cmd("RL.RELEASE"),
            Backend::Lua => self.inflight_evalsha(),
        };
        cmd.arg(keys.len());
        for k in keys {
            cmd.arg(k.as_ref());
        }
        match self.speaks {
            Backend::Module => cmd.arg("ID").arg(id),
            Backend::Lua => cmd.arg("release").arg(id),
        };
        let value = self.with_timeout(self.script_query(&INFLIGHT_SCRIPT, &cmd, slot)).await?;
        let released: i64 = redis::from_redis_value(value).map_err(|e| Error::Reply(e.to_string()))?;
        u64::try_from(released).map_err(|_| Error::Reply(format!("RL.RELEASE answered {released}")))
    }

    /// RL.ACQUIRE (`write`) or RL.INFLIGHT on keys and limits checked when made.
    #[doc(hidden)]
    pub async fn inflight_call(
        &self,
        write: bool,
        keys: &[String],
        params: &[InflightParams],
        id: Option<&str>,
        cost: u64,
    ) -> Result<Acquired> {
        if keys.len() != params.len() {
            return Err(Error::invalid("one in-flight limit per key"));
        }
        validate_keys(keys)?;
        validate_cost(cost)?;
        if let Some(id) = id {
            validate_id(id)?;
        }
        let mut cmd = match self.speaks {
            Backend::Module => redis::cmd(if write { "RL.ACQUIRE" } else { "RL.INFLIGHT" }),
            Backend::Lua => self.inflight_evalsha(),
        };
        cmd.arg(keys.len()).arg(keys);
        match self.speaks {
            Backend::Module => {
                push_inflight(&mut cmd, params);
                if let Some(id) = id {
                    cmd.arg("ID").arg(id);
                }
                cmd.arg("COST").arg(cost);
            }
            Backend::Lua => {
                // The script cannot make an unguessable id: the client does.
                let id = match id {
                    Some(id) => id.to_owned(),
                    None if write => new_id(),
                    None => String::new(),
                };
                cmd.arg(if write { "acquire" } else { "inflight" }).arg(id).arg(cost);
                push_inflight(&mut cmd, params);
            }
        }
        let value = self.with_timeout(self.script_query(&INFLIGHT_SCRIPT, &cmd, slot_of(&keys[0]))).await?;
        Acquired::from_reply(value, keys.len())
    }

    fn inflight_evalsha(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.inflight_script.get_hash());
        cmd
    }

    async fn window_call(
        &self,
        op: WindowOp,
        windows: &[Window],
        cost: u64,
        mode: WindowMode,
    ) -> Result<(Decision, Option<u64>)> {
        let keys: Vec<&str> = windows.iter().map(|w| w.key.as_str()).collect();
        let limits = windows.iter().map(|w| (w.limit, w.window_ms));
        self.windows_decision(op, &keys, limits, cost, mode).await
    }

    /// A window call on either backend: its decision, and the clock
    /// reading when `op` asked for it.
    async fn windows_decision<K: AsRef<str>>(
        &self,
        op: WindowOp,
        keys: &[K],
        limits: impl Iterator<Item = (u64, u64)>,
        cost: u64,
        mode: WindowMode,
    ) -> Result<(Decision, Option<u64>)> {
        let cmd = self.window_command(op, keys, limits, cost, mode)?;
        let slot = slot_of(keys[0].as_ref());
        let mut reply =
            self.with_timeout(async { integers(self.script_query(&WINDOW_SCRIPT, &cmd, slot).await?) }).await?;
        let at = match (op, reply.len()) {
            (WindowOp::Timed, 7) => reply.pop().and_then(|t| u64::try_from(t).ok()),
            _ => None,
        };
        Ok((Decision::from_reply(&reply, keys.len())?, at))
    }

    /// RL.WINDOW for a policy's window rules, each given as its bucket
    /// stand-in (`limit` per `window_ms`, checked when the policy was built).
    #[doc(hidden)]
    pub async fn run_windows(
        &self,
        mode: WindowMode,
        keys: &[String],
        params: &[BucketParams],
        cost: u64,
    ) -> Result<Decision> {
        if keys.len() != params.len() {
            return Err(Error::invalid("one parameter set per key"));
        }
        let limits = params.iter().map(|p| (p.capacity(), p.period_ms()));
        Ok(self.windows_decision(WindowOp::Take, keys, limits, cost, mode).await?.0)
    }

    /// RL.WINDOW (RL.WINDOWPEEK for a peek), or on the Lua backend the
    /// window script's EVALSHA with the same arguments.
    fn window_command<K: AsRef<str>>(
        &self,
        op: WindowOp,
        keys: &[K],
        limits: impl Iterator<Item = (u64, u64)>,
        cost: u64,
        mode: WindowMode,
    ) -> Result<Cmd> {
        validate_keys(keys)?;
        in_range("cost", cost, 1, MAX_WINDOW_LIMIT)?;
        if self.speaks == Backend::Lua {
            let (name, time, at) = match op {
                WindowOp::Take => ("take", 0, 0),
                WindowOp::Timed => ("take", 1, 0),
                WindowOp::Peek => ("peek", 0, 0),
                WindowOp::Refund(at) => ("refund", 0, at),
            };
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.window_script.get_hash()).arg(keys.len());
            for k in keys {
                cmd.arg(k.as_ref());
            }
            cmd.arg(mode.name().to_ascii_lowercase()).arg(name).arg(cost).arg(time).arg(at);
            for (limit, window_ms) in limits {
                cmd.arg(limit).arg(window_ms);
            }
            return Ok(cmd);
        }
        let mut cmd = redis::cmd(if op == WindowOp::Peek { "RL.WINDOWPEEK" } else { "RL.WINDOW" });
        cmd.arg(keys.len());
        for k in keys {
            cmd.arg(k.as_ref());
        }
        for (limit, window_ms) in limits {
            cmd.arg(limit).arg(window_ms);
        }
        cmd.arg("COST").arg(cost).arg(mode.name());
        match op {
            WindowOp::Timed => {
                cmd.arg("TIME");
            }
            WindowOp::Refund(at) => {
                cmd.arg("REFUND").arg(at);
            }
            WindowOp::Take | WindowOp::Peek => {}
        }
        Ok(cmd)
    }

    /// The module command that takes `cost` from a policy group's keys:
    /// RL.TAKE for buckets, RL.WINDOW for windows (`window`), checked as
    /// the single calls check. Module commands only ([`Client::pipelines`]):
    /// the Lua backend's EVALSHA cannot be reloaded inside a pipeline (its
    /// windows go one call each, [`Client::run_windows`]); behind a relay
    /// the connection does that on its direct path.
    #[doc(hidden)]
    pub fn take_command(
        &self,
        window: Option<WindowMode>,
        keys: &[String],
        params: &[BucketParams],
        cost: u64,
    ) -> Result<Cmd> {
        if keys.len() != params.len() {
            return Err(Error::invalid("one parameter set per key"));
        }
        match window {
            Some(_) if self.speaks == Backend::Lua => Err(Error::Unsupported("a pipelined RL.WINDOW")),
            Some(mode) => {
                let limits = params.iter().map(|p| (p.capacity(), p.period_ms()));
                self.window_command(WindowOp::Take, keys, limits, cost, mode)
            }
            None if self.speaks == Backend::Lua => Err(Error::Unsupported("a pipelined RL.TAKE")),
            None => {
                let op = BucketOp::Take { cost };
                op.validate()?;
                validate_keys(keys)?;
                Ok(module_cmd(op, keys, params))
            }
        }
    }

    /// Sends `cmds` (each on `keys` keys) to the primary serving `slot` in
    /// one round trip, within one timeout: each command's decision, or its
    /// own error. `Err` when the round trip itself failed.
    #[doc(hidden)]
    pub async fn pipeline(&self, cmds: Vec<(Cmd, usize)>, slot: u16) -> Result<Vec<Result<Decision>>> {
        let mut pipe = redis::pipe();
        let mut keys = Vec::with_capacity(cmds.len());
        for (cmd, n) in cmds {
            pipe.add_command(cmd);
            keys.push(n);
        }
        let replies = self.with_timeout(self.conn.query_pipeline(&pipe, slot)).await?;
        if replies.len() != keys.len() {
            return Err(Error::Reply(format!("{} replies to a pipeline of {}", replies.len(), keys.len())));
        }
        Ok(replies.into_iter().zip(keys).map(|(reply, n)| Decision::from_reply(&integers(reply?)?, n)).collect())
    }

    /// Runs a bucket operation on the backend: its decision.
    #[doc(hidden)]
    pub async fn run(&self, op: BucketOp, keys: &[String], params: &[BucketParams]) -> Result<Decision> {
        let reply = self.bucket_call(op, keys, params).await?;
        Decision::from_reply(&reply, keys.len())
    }

    /// A lease, which answers a grant.
    #[doc(hidden)]
    pub async fn grant(&self, op: BucketOp, keys: &[String], params: &[BucketParams]) -> Result<Grant> {
        let reply = self.bucket_call(op, keys, params).await?;
        Grant::from_reply(&reply, keys.len())
    }

    async fn bucket_call(&self, op: BucketOp, keys: &[String], params: &[BucketParams]) -> Result<Vec<i64>> {
        op.validate()?;
        if keys.len() != params.len() {
            return Err(Error::invalid("one parameter set per key"));
        }
        validate_keys(keys)?;
        let slot = slot_of(&keys[0]);
        if self.backend == Backend::Lua {
            if let Some(i) = params.iter().position(|p| p.capacity() as u128 * p.period_ms() as u128 > LUA_MAX_UNITS) {
                return Err(Error::invalid(format!(
                    "bucket '{}': capacity x period_ms must be at most 2^52 on the Lua backend",
                    keys[i]
                )));
            }
        }
        match self.speaks {
            Backend::Module => self.integers(&module_cmd(op, keys, params), slot).await,
            Backend::Lua => {
                let (name, n, min) = lua_args(op);
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(self.script.get_hash()).arg(keys.len()).arg(keys).arg(name).arg(n).arg(min);
                push_params(&mut cmd, params);
                self.with_timeout(async { integers(self.script_query(&LUA_SCRIPT, &cmd, slot).await?) }).await
            }
        }
    }

    /// Sends `cmd`; written as the Lua backend's it is an EVALSHA of
    /// `script`, which is loaded on that node when it answers NOSCRIPT
    /// (after a restart or a failover), then sent once more.
    async fn script_query(&self, script: &str, cmd: &Cmd, slot: u16) -> Result<Value> {
        match self.conn.query(cmd, slot).await {
            Err(Error::Redis(e))
                if self.speaks == Backend::Lua && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
            {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(script);
                self.conn.query(&load, slot).await?;
                self.conn.query(cmd, slot).await
            }
            reply => reply,
        }
    }

    async fn integers(&self, cmd: &Cmd, slot: u16) -> Result<Vec<i64>> {
        self.with_timeout(async { integers(self.conn.query(cmd, slot).await?) }).await
    }

    async fn with_timeout<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.timeout, call).await.unwrap_or(Err(Error::Timeout))
    }

    /// The cluster's slot ranges and their primaries (empty when standalone).
    #[doc(hidden)]
    pub async fn slot_map(&self, timeout: Duration) -> Result<Vec<(u16, u16, String)>> {
        tokio::time::timeout(timeout, self.conn.slot_map()).await.unwrap_or(Err(Error::Timeout))
    }
}

fn push_params(cmd: &mut Cmd, params: &[BucketParams]) {
    for p in params {
        cmd.arg(p.capacity()).arg(p.refill()).arg(p.period_ms());
    }
}

fn push_inflight(cmd: &mut Cmd, params: &[InflightParams]) {
    for p in params {
        cmd.arg(p.limit()).arg(p.timeout_ms());
    }
}

fn split_inflight(limits: &[Inflight]) -> (Vec<String>, Vec<InflightParams>) {
    (limits.iter().map(|l| l.key().to_owned()).collect(), limits.iter().map(|l| l.params).collect())
}

fn integers(value: Value) -> Result<Vec<i64>> {
    redis::from_redis_value::<Vec<i64>>(value).map_err(|e| Error::Reply(e.to_string()))
}

fn split(buckets: &[Bucket]) -> Result<(Vec<String>, Vec<BucketParams>)> {
    Ok((buckets.iter().map(|b| b.key.clone()).collect(), buckets.iter().map(|b| b.params).collect()))
}

/// 1 to 32 distinct keys, as the module demands.
fn validate_keys<K: AsRef<str>>(keys: &[K]) -> Result<()> {
    if keys.is_empty() || keys.len() > MAX_KEYS {
        return Err(Error::invalid(format!("a call takes 1 to {MAX_KEYS} keys, got {}", keys.len())));
    }
    for (i, k) in keys.iter().enumerate() {
        if keys[..i].iter().any(|o| o.as_ref() == k.as_ref()) {
            return Err(Error::invalid(format!("key '{}' is named more than once", k.as_ref())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rl_core::limits::MAX_TOKENS;

    #[test]
    fn raw_arguments_are_checked_before_sending() {
        let s = Duration::from_secs(1);
        assert!(Bucket::new("k", 0, 1, s).unwrap_err().to_string().contains("bucket 'k': capacity must be"));
        assert!(Window::new("w", 0, s).unwrap_err().to_string().contains("window 'w': limit must be"));
        assert!(Window::new("w", 1, Duration::ZERO).unwrap_err().to_string().contains("window must be"));
        assert!(validate_keys(&["a", "b", "a"]).unwrap_err().to_string().contains("'a' is named more than once"));
        assert!(validate_keys::<&str>(&[]).is_err());
        assert!(BucketOp::Take { cost: 0 }.validate().is_err());
        assert!(BucketOp::Lease { want: 5, min: 6 }.validate().unwrap_err().to_string().contains("min must be"));
        assert!(BucketOp::Refund { tokens: MAX_TOKENS + 1 }.validate().is_err());
        assert!(BucketOp::Lease { want: 5, min: 5 }.validate().is_ok());
    }
}
