//! The relay itself, whatever front a gateway reaches it by: the pools, the
//! connection to Redis, the counters and readiness. RL.TAKE and RL.LEASE
//! are served from the pools; the module's other public commands are
//! forwarded; nothing else ever reaches Redis (`command::is_forwarded`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::auth::Credentials;
use crate::command::{self, Call};
use crate::health::{Health, PROBE_EVERY};
use crate::limits::Limits;
use crate::pool::{Need, Plan, Pools};
use crate::reply::Reply;
use crate::stats::{self, Counters, SubjectNames, View};
use crate::upstream::Upstream;

/// Where the tokens of a served RL.TAKE came from: what undoing it takes
/// (a front deciding several requests all or nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A pool's tokens (held, or just leased): [`Relay::give_back`].
    Pool,
    /// Redis took them (the request was forwarded): an RL.REFUND.
    Redis,
    /// Nothing was taken: Redis did not answer, or answered an error.
    Failed,
}

/// What the fronts share besides the pools.
#[derive(Debug, Default)]
pub struct Options {
    /// Longest wait for Redis.
    pub timeout: Duration,
    /// Ceilings on what a client sends and holds.
    pub limits: Limits,
    /// What a client must present first (none: no authentication).
    pub credentials: Credentials,
    /// Subjects by their names in INFO and metrics (else their tags hashed).
    pub show_subjects: bool,
}

pub struct Relay {
    pools: Mutex<Pools>,
    upstream: Upstream,
    timeout: Duration,
    pub limits: Limits,
    pub credentials: Credentials,
    pub counters: Counters,
    pub health: Health,
    names: SubjectNames,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Relay errors in words the gateway's breaker counts as a shard failure.
fn unavailable(e: impl std::fmt::Display) -> Reply {
    Reply::error(format!("TRYAGAIN relay: Redis unavailable: {e}"))
}

impl Relay {
    pub fn new(pools: Pools, upstream: Upstream, options: Options) -> Relay {
        Relay {
            pools: Mutex::new(pools),
            upstream,
            timeout: options.timeout,
            limits: options.limits,
            credentials: options.credentials,
            counters: Counters::default(),
            health: Health::default(),
            names: SubjectNames::new(options.show_subjects),
        }
    }

    /// What carries the module's commands out on Redis (module or lua).
    pub fn backend(&self) -> &crate::upstream::Choice {
        self.upstream.backend()
    }

    pub fn pools(&self) -> MutexGuard<'_, Pools> {
        self.pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `INFO relay`'s text.
    pub fn info(&self) -> String {
        let pools = self.pools();
        stats::info(&self.view(&pools))
    }

    /// The Prometheus text.
    pub fn metrics(&self) -> String {
        let pools = self.pools();
        stats::metrics(&self.view(&pools))
    }

    fn view<'a>(&'a self, pools: &'a Pools) -> View<'a> {
        View {
            counters: &self.counters,
            pools,
            names: &self.names,
            ready: self.health.ready(),
            module_missing: self.health.module_missing(),
            backend: self.upstream.backend().name(),
            max_clients: self.limits.max_clients,
        }
    }

    /// Probes Redis every second until the process ends, on the probe's
    /// own connection ([`Upstream::probe`]): readiness.
    pub async fn probe_forever(self: Arc<Self>, probe: Upstream) {
        loop {
            let outcome = crate::health::probe(&probe).await;
            self.health.probed(outcome, probe.backend().name());
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// One of the module's public commands: RL.TAKE and RL.LEASE served
    /// from the pools, the others forwarded. Anything else is refused
    /// (the fronts refuse it first, by name).
    pub async fn call(self: &Arc<Self>, args: Vec<Bytes>) -> Reply {
        if !args.first().is_some_and(|name| command::is_forwarded(name)) {
            return Reply::error("ERR relay: not one of the module's commands");
        }
        match Call::parse(&args) {
            Call::Buckets { lease, keys, params, need } => {
                let plan = self.plan(&keys, &params, need);
                self.answer(plan, lease, keys, params, need, &args).await.0
            }
            Call::Forward { key } => self.forward(&args, key.as_deref()).await,
        }
    }

    /// What the pools make of a request for `need` tokens of the buckets
    /// `keys`: answered from memory, a lease call, or forwarded. A plan
    /// made must be answered ([`Relay::answer`]) or [`Relay::cancel`]led.
    pub fn plan(&self, keys: &[Bytes], params: &[rl_core::BucketParams], need: Need) -> Plan {
        self.counters.requests.fetch_add(1, Relaxed);
        self.pools().plan(keys, params, need, now_ms())
    }

    /// A plan that will not be answered (a front refused the request
    /// first): its lease call, if it claimed one, is not on its way.
    pub fn cancel(&self, keys: &[Bytes], plan: Plan) {
        if let Plan::Lease { .. } | Plan::Answer { top_up: Some(_), .. } = plan {
            self.pools().failed(keys);
        }
    }

    /// Tokens a request took from a pool (from memory or a lease call's
    /// grant) and did not use, put back (dropped if the lease expired
    /// meanwhile). They were granted to the relay: never over.
    pub fn give_back(&self, keys: &[Bytes], tokens: u64) {
        self.pools().give_back(keys, tokens, now_ms());
    }

    /// The reply to a plan, and where its tokens came from; `args` is the
    /// request as sent when it is forwarded.
    pub async fn answer(
        self: &Arc<Self>,
        plan: Plan,
        lease: bool,
        keys: Vec<Bytes>,
        params: Vec<rl_core::BucketParams>,
        need: Need,
        args: &[Bytes],
    ) -> (Reply, Origin) {
        match plan {
            Plan::Answer { reply, top_up } => {
                self.counters.from_memory.fetch_add(1, Relaxed);
                if let Some(want) = top_up {
                    // In the background: the request is answered now.
                    let relay = self.clone();
                    tokio::spawn(async move { relay.top_up(keys, params, want).await });
                }
                (Reply::six(reply, lease), Origin::Pool)
            }
            Plan::Lease { want, min } => {
                let call = lease_args(&keys, &params, want, min);
                match self.lease_call(&call, &keys).await {
                    Ok(upstream) => {
                        let reply = self.pools().settle(&keys, want, upstream, Some(need), now_ms());
                        (Reply::six(reply.unwrap_or(rl_core::Reply { granted: 0, ..upstream }), lease), Origin::Pool)
                    }
                    Err(e) => {
                        self.pools().failed(&keys);
                        (e, Origin::Failed)
                    }
                }
            }
            Plan::Forward => {
                let reply = self.forward(args, keys.first().map(|k| k.as_ref())).await;
                match reply.module_reply() {
                    Some(upstream) => {
                        self.pools().forwarded(&keys, &params, need, upstream, now_ms());
                        (reply, Origin::Redis)
                    }
                    None => (reply, Origin::Failed),
                }
            }
        }
    }

    /// A pool's background top-up: RL.LEASE WANT want MIN 1.
    async fn top_up(&self, keys: Vec<Bytes>, params: Vec<rl_core::BucketParams>, want: u64) {
        let call = lease_args(&keys, &params, want, 1);
        match self.lease_call(&call, &keys).await {
            Ok(upstream) => {
                self.pools().settle(&keys, want, upstream, None, now_ms());
            }
            Err(_) => self.pools().failed(&keys),
        }
    }

    /// One RL.LEASE to Redis and its reply; a failure is the reply to send.
    async fn lease_call(&self, call: &[Bytes], keys: &[Bytes]) -> Result<rl_core::Reply, Reply> {
        self.counters.upstream_leases.fetch_add(1, Relaxed);
        match tokio::time::timeout(self.timeout, self.upstream.call(call, keys.first().map(|k| k.as_ref()))).await {
            Ok(Ok(value)) => {
                let reply = Reply::from(value);
                reply.module_reply().ok_or(reply)
            }
            Ok(Err(e)) => Err(self.failed("RL.LEASE", e)),
            Err(_) => Err(self.failed("RL.LEASE", format!("no answer in {:?}", self.timeout))),
        }
    }

    async fn forward(&self, args: &[Bytes], key: Option<&[u8]>) -> Reply {
        self.counters.forwarded.fetch_add(1, Relaxed);
        self.send(args, key).await
    }

    /// One of the module's commands, built by a front, sent to Redis (in a
    /// cluster to the primary of `key`'s slot) within the timeout; a
    /// failure to reach Redis is counted, logged and answered TRYAGAIN.
    pub async fn send(&self, args: &[Bytes], key: Option<&[u8]>) -> Reply {
        let name = || String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        match tokio::time::timeout(self.timeout, self.upstream.call(args, key)).await {
            Ok(Ok(value)) => Reply::from(value),
            Ok(Err(e)) if e.kind() == redis::ErrorKind::Io || e.is_timeout() || e.is_connection_dropped() => {
                self.failed(&name(), e)
            }
            Ok(Err(e)) => error_reply(&e),
            Err(_) => self.failed(&name(), format!("no answer in {:?}", self.timeout)),
        }
    }

    /// A call to Redis that failed: counted, logged (rate limited), and the
    /// gateway's TRYAGAIN.
    fn failed(&self, what: &str, e: impl std::fmt::Display) -> Reply {
        self.counters.upstream_failures.fetch_add(1, Relaxed);
        self.health.failed(what, &e);
        unavailable(e)
    }
}

/// A server error redis-rs raised instead of returning: its code and text.
fn error_reply(e: &redis::RedisError) -> Reply {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => Reply::error(format!("{code} {detail}")),
        (Some(code), None) => Reply::error(code.to_string()),
        _ => Reply::error(format!("ERR relay: {e}")),
    }
}

fn lease_args(keys: &[Bytes], params: &[rl_core::BucketParams], want: u64, min: u64) -> Vec<Bytes> {
    let mut args = Vec::with_capacity(4 + keys.len() * 4 + 4);
    args.push(Bytes::from_static(b"RL.LEASE"));
    args.push(keys.len().to_string().into());
    args.extend(keys.iter().cloned());
    for p in params {
        for n in [p.capacity(), p.refill(), p.period_ms()] {
            args.push(n.to_string().into());
        }
    }
    for (name, n) in [("WANT", want), ("MIN", min)] {
        args.push(Bytes::from_static(name.as_bytes()));
        args.push(n.to_string().into());
    }
    args
}
