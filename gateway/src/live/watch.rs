//! Background refresh of live rules, off the request path.
//!
//! From Redis: a subscription to the rules channel brings "version N of
//! lineage L is out" at once; a poll of the version and lineage (every 5 s
//! by default) catches a missed message or a lost subscription, so a new
//! version reaches every gateway within one poll interval plus a fetch.
//! Each poll also writes what the gateway runs to `<key>:gateways`, for
//! `rlctl status`. The channel also carries `unlock SUBJECT`: the gateway
//! drops its deny entries and leases of that subject. From a file: its
//! contents are polled. One source per gateway: a second watcher of
//! other rules is refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubStream;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};

use crate::{Error, Result};

use crate::live::fleet::{default_gateway_name, GatewayReport, Origin};
use crate::live::rules::{Installed, LiveRules};
use crate::live::server_limits::server_refusals;
use crate::live::snapshot::Snapshot;
use crate::live::spec::{read, RuleSetSpec};
use crate::live::store::{unix_ms, RulesStore, Stored, DEFAULT_KEY, UNLOCK};

/// Where and how often to look for rules in Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSource {
    /// A standalone server, `redis://host:port/`, or a Sentinel master,
    /// `redis+sentinel://host:port,host:port/NAME` (see
    /// [`Target::from_url`](crate::Target::from_url)): the rules are
    /// read from the primary, followed across a failover.
    pub url: String,
    /// The rules hash, also the channel. Default `rl:rules`.
    pub key: String,
    /// How often the version is polled, whatever the channel says. Default 5 s.
    pub poll_every: Duration,
    /// Longest wait for any call. Default 2 s.
    pub timeout: Duration,
    /// The name this gateway reports under in `<key>:gateways` (what
    /// `rlctl status` lists). Default: the host name, `:`, the process id.
    pub gateway: Option<String>,
    /// TLS settings for a `rediss://` URL (the limiter's `Config::tls`
    /// when the rules are on the same server). Default none.
    pub tls: crate::Tls,
}

/// The URL without its password: a source may be logged.
impl std::fmt::Debug for RedisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSource")
            .field("url", &crate::redacted(&self.url))
            .field("key", &self.key)
            .field("poll_every", &self.poll_every)
            .field("timeout", &self.timeout)
            .field("gateway", &self.gateway)
            .finish()
    }
}

impl RedisSource {
    /// The defaults, on the server at `url`.
    pub fn new(url: impl Into<String>) -> RedisSource {
        RedisSource {
            url: url.into(),
            key: DEFAULT_KEY.to_owned(),
            poll_every: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            gateway: None,
            tls: crate::Tls::default(),
        }
    }
}

/// A running refresh; dropping it stops it (and another source may then
/// be watched).
pub struct Watcher {
    task: JoinHandle<()>,
    rules: LiveRules,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("running", &!self.task.is_finished()).finish()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
        self.rules.unfollow();
    }
}

impl LiveRules {
    /// Keeps the rules current from Redis (see [`RulesStore`] for the
    /// layout), starting with a read now: the store's set is taken when it
    /// is newer or of another lineage than the one in force. Refused while
    /// another watcher keeps these rules current. Call it inside a tokio
    /// runtime.
    pub fn watch_redis(&self, source: RedisSource) -> Result<Watcher> {
        if source.poll_every.is_zero() || source.timeout.is_zero() {
            return Err(Error::invalid("a rules source needs poll_every and timeout above zero"));
        }
        let runtime = runtime()?;
        let store = RulesStore::with_tls(&source.url, &source.key, &source.tls, source.timeout)?;
        self.follow("Redis")?;
        let rules = self.clone();
        Ok(Watcher { task: runtime.spawn(watch_redis(rules, store, source)), rules: self.clone() })
    }

    /// Keeps the rules current from a rule file, loaded again when its
    /// contents change (read every `every`). A file without `version` is
    /// loaded as the next version. Refused while another watcher keeps
    /// these rules current (a gateway following Redis starts from its file
    /// with [`LiveRules::start`] instead).
    pub fn watch_file(&self, path: impl Into<PathBuf>, every: Duration) -> Result<Watcher> {
        let runtime = runtime()?;
        self.follow("a file")?;
        let rules = self.clone();
        let task = runtime.spawn(watch_file(rules, path.into(), every.max(Duration::from_millis(10))));
        Ok(Watcher { task, rules: self.clone() })
    }

    /// A gateway following Redis, started from what is there: the store's
    /// set when it has a good one (that the limiter's server accepts), else
    /// the rule file at `bootstrap` (the store empty, unreachable, or its
    /// set refused: counted and `last_error`; a refused set with no good
    /// file starts all the same, the refusal counted). A broken file does
    /// not stop a gateway while the store has a set: it starts from the
    /// store, and the file's refusal is counted in its status's `rejected`
    /// (and is `last_error` until the store confirms the set), and logged.
    /// Errors when neither gives a set. Call it inside a tokio runtime.
    pub async fn start(
        limiter: crate::Limiter,
        bootstrap: impl AsRef<Path>,
        source: RedisSource,
    ) -> Result<(LiveRules, Watcher)> {
        let path = bootstrap.as_ref();
        let file = RuleSetSpec::from_file(path);
        let store = RulesStore::with_tls(&source.url, &source.key, &source.tls, source.timeout)?;
        let stored = match timeout(source.timeout, store.read()).await {
            Ok(Ok(stored)) => stored.check_overrides().map(|()| stored),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Rules(format!("no answer within {:?}", source.timeout))),
        };
        let label = format!("{} {}", store.url(), store.key());
        let rules = match (&stored, &file) {
            (Ok(Stored { rules: Some(set), .. }), _) => {
                let stored = stored.as_ref().expect("matched Ok");
                // As the watcher does: a set the limiter's server refuses
                // would make every request of its rule error at Redis.
                let refusal = server_refusal(limiter.client(), set, stored).await;
                // With no file to start from, the refused set starts all the
                // same (its other rules apply), the refusal in the status.
                let (refusal, in_force_anyway) = match (refusal, &file) {
                    (Some(refused), Err(_)) => (None, Some(refused)),
                    (refusal, _) => (refusal, None),
                };
                let rules = refusal
                    .map_or(Ok(()), Err)
                    .and_then(|()| LiveRules::new(limiter.clone(), set))
                    .and_then(|rules| {
                        rules.install_as(set, &stored.overrides, stored.version, &origin(stored), &label, true)?;
                        Ok(rules)
                    })
                    .or_else(|store_fault| match &file {
                        Ok(spec) => {
                            let rules = LiveRules::new(limiter.clone(), spec)?;
                            rules.rejected(Some(stored.version), stored.publication.as_deref(), &label, &store_fault);
                            Ok(rules)
                        }
                        Err(file_fault) => Err(Error::Rules(format!(
                            "no rules to start from: {label}: {store_fault}; {}: {file_fault}",
                            path.display()
                        ))),
                    })?;
                if let Err(fault) = &file {
                    let why = Error::Rules(format!("{fault} (started from {label})"));
                    rules.rejected(None, None, &path.display().to_string(), &why);
                }
                if let Some(refused) = in_force_anyway {
                    let why = Error::Rules(format!(
                        "{refused} (in force all the same: {} gives no rules to start from)",
                        path.display()
                    ));
                    rules.rejected(None, None, &label, &why);
                }
                rules
            }
            (_, Ok(spec)) => {
                let rules = LiveRules::new(limiter, spec)?;
                if let Err(e) = &stored {
                    rules.refresh_failed(&label, e);
                }
                rules
            }
            (Ok(_), Err(file_fault)) => {
                return Err(Error::Rules(format!(
                    "no rules to start from: {label} holds none, and {}: {file_fault}",
                    path.display()
                )))
            }
            (Err(store_fault), Err(file_fault)) => {
                return Err(Error::Rules(format!(
                    "no rules to start from: {label}: {store_fault}; {}: {file_fault}",
                    path.display()
                )))
            }
        };
        let watcher = rules.watch_redis(source)?;
        Ok((rules, watcher))
    }
}

fn runtime() -> Result<tokio::runtime::Handle> {
    tokio::runtime::Handle::try_current()
        .map_err(|_| Error::invalid("a rules watcher must be started inside a tokio runtime"))
}

async fn watch_redis(rules: LiveRules, store: RulesStore, source: RedisSource) {
    let name = source.gateway.clone().unwrap_or_else(default_gateway_name);
    let mut messages: Option<PubSubStream> = None;
    let mut next_poll = Instant::now();
    let mut next_subscribe = Instant::now();
    loop {
        if messages.is_none() && Instant::now() >= next_subscribe {
            match timeout(source.timeout, subscribe(&store)).await {
                Ok(Ok(stream)) => {
                    messages = Some(stream);
                    // Read once subscribed: nothing published before is missed.
                    next_poll = Instant::now();
                }
                Ok(Err(e)) => {
                    tracing::debug!(target: "rl_rules", channel = store.key(), error = %e, "cannot subscribe to the rules channel")
                }
                Err(_) => {
                    tracing::debug!(target: "rl_rules", channel = store.key(), timeout = ?source.timeout, "rules channel: no answer")
                }
            }
            next_subscribe = after(source.poll_every);
        }
        let wake = if messages.is_some() { next_poll } else { next_poll.min(next_subscribe) };
        tokio::select! {
            message = next_message(&mut messages) => match message {
                Some(payload) => match payload.strip_prefix(UNLOCK) {
                    Some(subject) => {
                        let dropped = rules.limiter().forget_subject(subject);
                        tracing::info!(target: "rl_rules", subject, dropped, "unlocked: the subject's deny entries and leases dropped");
                    }
                    // "version N, change ID is out": fetch it now unless it
                    // is what is in force. An unreadable announcement is
                    // checked too: the read decides.
                    None => {
                        if !announces_nothing_new(&payload, rules.identity()) {
                            next_poll = Instant::now();
                        }
                    }
                },
                None => {
                    tracing::warn!(target: "rl_rules", channel = store.key(), poll_every = ?source.poll_every, "rules channel closed: polling until it is back");
                    messages = None;
                }
            },
            _ = sleep_until(wake) => {}
        }
        if Instant::now() >= next_poll {
            refresh(&rules, &store).await;
            report(&rules, &store, &name, source.poll_every).await;
            next_poll = after(source.poll_every);
        }
    }
}

/// Whether an announcement (`VERSION ID`) is of the set in force.
fn announces_nothing_new(payload: &str, (version, origin): (u64, Origin)) -> bool {
    let mut parts = payload.split_whitespace();
    let announced = parts.next().and_then(|v| v.parse::<u64>().ok());
    let id = parts.next();
    announced == Some(version) && id.is_some() && id == origin.publication.as_deref()
}

/// Where a stored set comes from.
fn origin(stored: &Stored) -> Origin {
    Origin { publication: stored.publication.clone(), lineage: stored.lineage.clone() }
}

/// Writes what this gateway runs for `rlctl status`; a failure is logged
/// at debug (the rules in force do not depend on it).
async fn report(rules: &LiveRules, store: &RulesStore, name: &str, poll_every: Duration) {
    let status = rules.status();
    let report = GatewayReport {
        version: status.version,
        publication: status.publication,
        lineage: status.lineage,
        age_ms: status.age.as_millis().min(u64::MAX as u128) as u64,
        last_error: status.last_error,
        reported_at_ms: unix_ms(std::time::SystemTime::now()),
        poll_every_ms: poll_every.as_millis().min(u64::MAX as u128) as u64,
    };
    if let Err(e) = store.report(name, &report).await {
        tracing::debug!(target: "rl_rules", gateway = name, error = %e, "cannot report the rules in force");
    }
}

/// A subscription to the rules channel on the server the store talks to
/// (after a failover, the new primary once this one's stream ends).
async fn subscribe(store: &RulesStore) -> Result<PubSubStream> {
    let mut pubsub = store.connection().subscriber().await?;
    pubsub.subscribe(store.key()).await?;
    Ok(pubsub.into_on_message())
}

/// The next message's payload; `None` once the subscription is lost.
/// Without a subscription, never.
async fn next_message(messages: &mut Option<PubSubStream>) -> Option<String> {
    match messages {
        Some(stream) => stream.next().await.map(|m| m.get_payload::<String>().unwrap_or_default()),
        None => std::future::pending().await,
    }
}

/// Reads the version and the change's id; fetches and installs the whole
/// hash when either differs from the set in force (the store is the one
/// source of truth: a store that went back, restored or failed over, is
/// followed too). An emptied store leaves the set in force unconfirmed
/// (its age grows) and says why.
async fn refresh(rules: &LiveRules, store: &RulesStore) {
    // Named in log lines and the status: never with its password.
    let source = &crate::redacted(store.url());
    let (version, theirs) = match store.head().await {
        Ok(head) => head,
        Err(e) => return rules.refresh_failed(source, &e),
    };
    let (current, ours) = rules.identity();
    if version == 0 && theirs.publication.is_none() {
        // Nothing published: a gateway on its own first set is current; one
        // that followed the store has lost its source.
        return match &ours.lineage {
            None => rules.confirmed(),
            Some(lineage) => rules.unconfirmed(format!(
                "{source} {} holds no rules (lost: a restart without persistence?): version {current} of lineage \
                 {lineage} stays until a set is published",
                store.key()
            )),
        };
    }
    if version == current && theirs.publication == ours.publication {
        return rules.confirmed();
    }
    if theirs.lineage == ours.lineage && theirs.lineage.is_some() && version <= current {
        tracing::warn!(target: "rl_rules", store = version, in_force = current, "the rules store went back (a restore, or a failover that lost a change): following it");
    }
    if rules.was_rejected(version, theirs.publication.as_deref()) {
        return;
    }
    let fields = match store.fields().await {
        Ok(fields) => fields,
        Err(e) => return rules.refresh_failed(source, &e),
    };
    let label = format!("{source} {}", store.key());
    // The hash may have moved on since its version was read: what is
    // installed, or refused, is the version the fields hold.
    let stored = match Stored::from_fields(&fields).and_then(|s| s.check_overrides().map(|()| s)) {
        Ok(stored) => stored,
        Err(e) => return rules.rejected(Some(version), theirs.publication.as_deref(), &label, &e),
    };
    match &stored.rules {
        // install_as counts and remembers its own refusals.
        Some(set) => {
            if let Some(e) = server_refusal(rules.limiter().client(), set, &stored).await {
                return rules.rejected(Some(stored.version), stored.publication.as_deref(), &label, &e);
            }
            let _ = rules.install_as(set, &stored.overrides, stored.version, &origin(&stored), &label, true);
        }
        None => {
            let e = Error::Rules("the store has a version but no rules".to_owned());
            rules.rejected(Some(stored.version), stored.publication.as_deref(), &label, &e);
        }
    }
}

/// The limiter's server's refusal of a stored set's limits (an EXACT
/// window above its max-log-limit): installed, every request of the rule
/// would error at Redis. `None` when it accepts them, when the set does
/// not compile (installing it names why), or when the server cannot be
/// asked now (the set is installed: its requests fail over as any).
async fn server_refusal(client: &crate::Client, set: &RuleSetSpec, stored: &Stored) -> Option<Error> {
    let snapshot = Snapshot::compile(set, &stored.overrides, stored.version).ok()?;
    match server_refusals(client, &snapshot).await {
        Ok(faults) if faults.is_empty() => None,
        Ok(faults) => {
            Some(Error::Rules(format!("rule set rejected: the limiter's server refuses {}", faults.join("; "))))
        }
        Err(e) => {
            tracing::debug!(target: "rl_rules", error = %e, "cannot ask the limiter's server about the set's limits");
            None
        }
    }
}

async fn watch_file(rules: LiveRules, path: PathBuf, every: Duration) {
    let source = path.display().to_string();
    // The contents tell a changed file: a modification time and a size can
    // stay the same (a copy that keeps times, a coarse filesystem clock).
    let mut seen = contents(&path).await.ok();
    loop {
        tokio::time::sleep(every).await;
        let text = match contents(&path).await {
            Ok(text) => text,
            Err(e) => {
                rules.refresh_failed(&source, &e);
                continue;
            }
        };
        if seen.as_ref() == Some(&text) {
            rules.confirmed();
            continue;
        }
        let current = rules.snapshot().version();
        match RuleSetSpec::from_text(&path, &text) {
            Ok(spec) => {
                let version = spec.version.unwrap_or(current.saturating_add(1));
                // Installed, or refused and counted by install, unless not
                // newer. A file without a version names none: refused, it
                // marks none (Redis's next version must still be fetched).
                let named = spec.version.is_some();
                if let Ok(Installed::NotNewer) =
                    rules.install_as(&spec, &[], version, &Origin::default(), &source, named)
                {
                    let e = Error::Rules(format!("version {version} is not above version {current} in force"));
                    rules.rejected(Some(version), None, &source, &e);
                }
            }
            // Unreadable: it names no version, and none is marked refused.
            Err(e) => rules.rejected(None, None, &source, &e),
        }
        seen = Some(text);
    }
}

/// A rule file's text, read off the runtime's threads.
async fn contents(path: &Path) -> Result<String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || read(&path)).await.map_err(|e| Error::Rules(e.to_string()))?
}

/// `d` from now: far ahead, instead of overflowing, for a huge `d`.
fn after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or(now + Duration::from_secs(365 * 86_400))
}
