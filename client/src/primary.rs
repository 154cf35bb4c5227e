//! One standalone primary's connection (a fixed address or the master of
//! a Sentinel target): opened on demand in the background, replaced when
//! lost, and resolved again when it points at the wrong server. The rules
//! are in `connection.rs`'s notes; where the primary is, in `endpoint.rs`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionInfo, ErrorKind, Pipeline, RedisError, RedisResult, Value};

use crate::endpoint::{watch_switches, Endpoint, Found};
use crate::lock::lock;

/// Error replies that say the connection points at the wrong server.
pub(crate) const WRONG_SERVER: [&str; 3] = ["READONLY", "MASTERDOWN", "LOADING"];

/// Whether `e` is a reply that says the connection pointed at the wrong
/// server (`READONLY`, `MASTERDOWN`, `LOADING`): the command did not run,
/// and the connection resolves the primary again for the next call.
pub fn is_wrong_server(e: &RedisError) -> bool {
    e.code().is_some_and(|code| WRONG_SERVER.contains(&code))
}
/// Calls in a row without an answer after which the connection is replaced
/// (a server gone without closing it, a DNS name that moved).
const TIMEOUTS_TO_RECONNECT: u32 = 3;
/// How long a connection given up on for timeouts stays open for the calls
/// already sent on it. A stalled Redis (a CLIENT PAUSE, a slow command)
/// runs them when it goes on, but drops unrun the commands of a connection
/// closed meanwhile; callers that timed out may have admitted from a
/// fallback on the promise that Redis counts their calls later.
const DRAIN_FOR: Duration = Duration::from_secs(30);
/// Connections kept open that way at once, at most: a long outage gives one
/// up every few timeouts.
const MOST_DRAINING: u32 = 4;

type Attempt = Shared<BoxFuture<'static, RedisResult<Arc<Live>>>>;
pub(crate) type SwitchHook = Arc<dyn Fn(&ConnectionStatus) + Send + Sync>;

/// Which server a connection talks to, for a gateway's status page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionStatus {
    /// What was configured, without passwords: the URL, `sentinel master
    /// 'NAME' via ...`, or the cluster's seed nodes.
    pub configured: String,
    /// The server calls go to now (`host:port`); `None` while not
    /// connected, and for a cluster (one per shard).
    pub server: Option<String>,
    /// Calls go to a server other than the configured one: the configured
    /// address answered as a replica and this is the primary its `ROLE`
    /// names. Logged when it starts; never silent.
    pub redirected: bool,
    /// Times calls moved to another server than the one before (a Sentinel
    /// switch, a demoted primary left, a DNS name that moved), the first
    /// connection's redirection included: rl-gateway's `Event::ServerSwitch`.
    pub switches: u64,
    /// Times the connection was dropped for pointing at the wrong server
    /// (a `READONLY`, `MASTERDOWN` or `LOADING` reply, a Sentinel's
    /// switch announcement) and the endpoint resolved again.
    pub reresolutions: u64,
}

pub(crate) struct Primary {
    endpoint: Endpoint,
    /// What was configured, for the status and log lines (no password).
    shown: String,
    settings: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// Ask the server its `ROLE` (not for a lease relay).
    check_role: bool,
    live: ArcSwapOption<Live>,
    /// The connection attempt under way: at most one at a time, and
    /// forgotten once it ends, failed or not.
    attempt: Mutex<Option<Attempt>>,
    generations: AtomicU64,
    timeouts: AtomicU32,
    /// Connections given up on that stay open until their calls are
    /// answered ([`DRAIN_FOR`]).
    draining: Arc<AtomicU32>,
    /// The primary a fixed address named last: tried when the configured
    /// server cannot be reached.
    last_redirect: Mutex<Option<ConnectionInfo>>,
    /// The server of the last connection: a new one is a switch.
    last_server: Mutex<Option<String>>,
    switches: AtomicU64,
    reresolutions: AtomicU64,
    /// Told of every switch, after the new connection is in use (the
    /// limiter counts an event, the relay logs it).
    on_switch: Mutex<Vec<SwitchHook>>,
    /// The Sentinel switch watcher, stopped with the connection.
    watcher: OnceLock<tokio::task::AbortHandle>,
}

struct Live {
    con: MultiplexedConnection,
    info: ConnectionInfo,
    server: String,
    redirected: bool,
    closed: Arc<AtomicBool>,
    generation: u64,
}

impl Live {
    fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        if let Some(watcher) = self.watcher.get() {
            watcher.abort();
        }
    }
}

impl Primary {
    /// Nothing is connected yet. Must run inside a tokio runtime (a
    /// Sentinel target's switch watcher starts now).
    pub(crate) fn new(
        endpoint: Endpoint,
        shown: String,
        timeout: Duration,
        connect_timeout: Duration,
        check_role: bool,
    ) -> Arc<Primary> {
        let settings = AsyncConnectionConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(connect_timeout));
        let primary = Arc::new(Primary {
            endpoint,
            shown,
            settings,
            connect_timeout,
            check_role,
            live: ArcSwapOption::empty(),
            attempt: Mutex::new(None),
            generations: AtomicU64::new(0),
            timeouts: AtomicU32::new(0),
            draining: Arc::new(AtomicU32::new(0)),
            last_redirect: Mutex::new(None),
            last_server: Mutex::new(None),
            switches: AtomicU64::new(0),
            reresolutions: AtomicU64::new(0),
            on_switch: Mutex::new(Vec::new()),
            watcher: OnceLock::new(),
        });
        if let Endpoint::Sentinel(s) = &primary.endpoint {
            let weak = Arc::downgrade(&primary);
            let watch = watch_switches(s.sentinels.clone(), s.master.clone(), move |address| match weak.upgrade() {
                Some(primary) => {
                    primary.sentinel_named(&address);
                    true
                }
                None => false,
            });
            let _ = primary.watcher.set(tokio::spawn(watch).abort_handle());
        }
        primary
    }

    /// Calls `hook` at every switch of server.
    pub(crate) fn on_switch(&self, hook: SwitchHook) {
        lock(&self.on_switch).push(hook);
    }

    pub(crate) fn status(&self) -> ConnectionStatus {
        let live = self.live.load_full().filter(|l| l.is_open());
        ConnectionStatus {
            configured: self.shown.clone(),
            server: live.as_ref().map(|l| l.server.clone()),
            redirected: live.is_some_and(|l| l.redirected),
            switches: self.switches.load(Ordering::Relaxed),
            reresolutions: self.reresolutions.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn db(&self) -> i64 {
        self.endpoint.db()
    }

    pub(crate) async fn send(self: &Arc<Self>, cmd: &Cmd) -> RedisResult<Value> {
        let live = self.live().await?;
        let mut pending = Pending { primary: self, live: &live, answered: false };
        let reply = live.con.clone().send_packed_command(cmd).await;
        pending.answered = true;
        self.observe(&live, reply.as_ref().err(), reply.iter());
        reply
    }

    pub(crate) async fn pipeline(
        self: &Arc<Self>,
        pipe: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let live = self.live().await?;
        let mut pending = Pending { primary: self, live: &live, answered: false };
        let reply = live.con.clone().send_packed_commands(pipe, offset, count).await;
        pending.answered = true;
        self.observe(&live, reply.as_ref().err(), reply.iter().flatten());
        reply
    }

    /// A pub/sub connection of its own to the server calls go to.
    pub(crate) async fn subscriber(self: &Arc<Self>) -> RedisResult<redis::aio::PubSub> {
        let live = self.live().await?;
        let pubsub = tokio::time::timeout(self.connect_timeout, async {
            redis::Client::open(live.info.clone())?.get_async_pubsub().await
        });
        pubsub.await.unwrap_or_else(|_| Err(RedisError::from((ErrorKind::Io, "subscribe timed out"))))
    }

    /// The connection, opened (or being opened) if there is none or the
    /// server closed it: nothing was sent on a closed one.
    async fn live(self: &Arc<Self>) -> RedisResult<Arc<Live>> {
        if let Some(live) = self.live.load_full() {
            if live.is_open() {
                return Ok(live);
            }
            self.forget(&live);
        }
        let attempt = {
            let mut slot = lock(&self.attempt);
            if let Some(live) = self.live.load_full().filter(|l| l.is_open()) {
                return Ok(live);
            }
            match &*slot {
                Some(attempt) => attempt.clone(),
                None => {
                    let attempt = self.clone().connect().boxed().shared();
                    *slot = Some(attempt.clone());
                    // It goes on, within connect_timeout, if the call that
                    // started it gives up first.
                    tokio::spawn(attempt.clone().map(drop));
                    attempt
                }
            }
        };
        attempt.await
    }

    async fn connect(self: Arc<Self>) -> RedisResult<Arc<Live>> {
        let last = lock(&self.last_redirect).clone();
        let found = tokio::time::timeout(
            self.connect_timeout,
            self.endpoint.connect(&self.settings, last.as_ref(), self.check_role),
        )
        .await
        .unwrap_or_else(|_| {
            let why = format!("no connection to {} within {:?}", self.shown, self.connect_timeout);
            Err(RedisError::from((ErrorKind::Io, "connect timed out", why)))
        });
        let result = found.map(|found| self.install(found));
        // Failed or not, the next call after this one starts afresh.
        *lock(&self.attempt) = None;
        result
    }

    fn install(&self, found: Found) -> Arc<Live> {
        *lock(&self.last_redirect) = found.redirected.then(|| found.info.clone());
        let before = lock(&self.last_server).replace(found.server.clone());
        let switched = match &before {
            Some(before) => *before != found.server,
            None => found.redirected,
        };
        if switched {
            self.switches.fetch_add(1, Ordering::Relaxed);
            let before = before.as_deref().unwrap_or("none");
            if found.redirected {
                tracing::warn!(target: "rl_client", configured = %self.shown, before, server = %found.server,
                    "the configured Redis answers as a replica: calls go to the primary its ROLE names, not to the configured server");
            } else {
                tracing::warn!(target: "rl_client", configured = %self.shown, before, server = %found.server,
                    "calls go to another Redis server now");
            }
        }
        let live = Arc::new(Live {
            con: found.con,
            info: found.info,
            server: found.server,
            redirected: found.redirected,
            closed: found.closed,
            generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
        });
        self.timeouts.store(0, Ordering::Relaxed);
        self.live.store(Some(live.clone()));
        if switched {
            let status = self.status();
            let hooks = lock(&self.on_switch).clone();
            for hook in hooks {
                hook(&status);
            }
        }
        live
    }

    /// What a call's outcome says about its connection.
    fn observe<'a>(&self, live: &Live, error: Option<&RedisError>, mut replies: impl Iterator<Item = &'a Value>) {
        let code = error.and_then(RedisError::code).or_else(|| {
            replies.find_map(|v| match v {
                Value::ServerError(e) => Some(e.code()),
                _ => None,
            })
        });
        if let Some(code) = code.filter(|c| WRONG_SERVER.contains(c)) {
            return self.reresolve(live, &format!("{code} from {}", live.server));
        }
        match error {
            Some(e) if e.is_timeout() => self.timed_out(live),
            Some(e) if e.is_unrecoverable_error() || e.is_connection_dropped() => {
                self.forget(live);
            }
            // An answer, an error reply among them.
            _ => self.timeouts.store(0, Ordering::Relaxed),
        }
    }

    fn timed_out(&self, live: &Live) {
        if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_TO_RECONNECT && self.forget(live) {
            self.drain(live);
            tracing::warn!(target: "rl_client", configured = %self.shown, server = %live.server,
                "no answer to {TIMEOUTS_TO_RECONNECT} calls in a row: the next call connects again");
        }
    }

    /// Keeps `live` open until Redis has answered every call sent on it (a
    /// PING's answer comes after theirs), [`DRAIN_FOR`] at most.
    fn drain(&self, live: &Live) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if self.draining.fetch_add(1, Ordering::AcqRel) >= MOST_DRAINING {
            self.draining.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(target: "rl_client", configured = %self.shown, server = %live.server,
                "{MOST_DRAINING} connections already wait for a stalled Redis: this one is closed, and the calls it \
                 sent may never run");
            return;
        }
        let mut con = live.con.clone();
        con.set_response_timeout(DRAIN_FOR);
        let draining = self.draining.clone();
        runtime.spawn(async move {
            let _ = redis::cmd("PING").query_async::<()>(&mut con).await;
            draining.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// The sentinels name `address` as the master (empty: none answered).
    fn sentinel_named(&self, address: &str) {
        let Some(live) = self.live.load_full() else { return };
        if !address.is_empty() && live.server != address {
            self.reresolve(&live, &format!("the sentinels switched the master to {address}"));
        }
    }

    /// The connection points at the wrong server: dropped, and the next
    /// call resolves the endpoint again.
    fn reresolve(&self, live: &Live, why: &str) {
        if self.forget(live) {
            self.reresolutions.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target: "rl_client", configured = %self.shown, server = %live.server,
                "{why}: not the primary; the next call resolves the primary again");
        }
    }

    /// Drops `live` if it is still the connection in use; whether it was.
    fn forget(&self, live: &Live) -> bool {
        let _one_at_a_time = lock(&self.attempt);
        let current = self.live.load().as_ref().is_some_and(|l| l.generation == live.generation);
        if current {
            self.live.store(None);
        }
        current
    }
}

/// A call under way: dropped before it was answered (the caller's
/// timeout), it counts as a timeout.
struct Pending<'a> {
    primary: &'a Primary,
    live: &'a Live,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.primary.timed_out(self.live);
        }
    }
}
