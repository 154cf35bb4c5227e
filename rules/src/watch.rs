//! Background refresh of live rules, off the request path.
//!
//! From Redis: a subscription to the rules channel brings "version N is
//! out" at once; a poll of the version (every 5 s by default) catches a
//! missed message or a lost subscription, so a new version reaches every
//! gateway within one poll interval plus a fetch. From a file: its
//! contents are polled.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubStream;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};

use rl_client::{Error, Result};

use crate::live::{Installed, LiveRules};
use crate::spec::{read, RuleSetSpec};
use crate::store::{RulesStore, Stored, DEFAULT_KEY};

/// Where and how often to look for rules in Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSource {
    /// A standalone server, `redis://host:port/`, or a Sentinel master,
    /// `redis+sentinel://host:port,host:port/NAME` (see
    /// [`Target::from_url`](rl_client::Target::from_url)): the rules are
    /// read from the primary, followed across a failover.
    pub url: String,
    /// The rules hash, also the channel. Default `rl:rules`.
    pub key: String,
    /// How often the version is polled, whatever the channel says. Default 5 s.
    pub poll_every: Duration,
    /// Longest wait for any call. Default 2 s.
    pub timeout: Duration,
}

/// The URL without its password: a source may be logged.
impl std::fmt::Debug for RedisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSource")
            .field("url", &rl_client::redacted(&self.url))
            .field("key", &self.key)
            .field("poll_every", &self.poll_every)
            .field("timeout", &self.timeout)
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
        }
    }
}

/// A running refresh; dropping it stops it.
#[derive(Debug)]
pub struct Watcher {
    task: JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LiveRules {
    /// Keeps the rules current from Redis (see [`RulesStore`] for the
    /// layout), starting with a read now. Call it inside a tokio runtime.
    pub fn watch_redis(&self, source: RedisSource) -> Result<Watcher> {
        if source.poll_every.is_zero() || source.timeout.is_zero() {
            return Err(Error::invalid("a rules source needs poll_every and timeout above zero"));
        }
        let runtime = runtime()?;
        let store = RulesStore::new(&source.url, &source.key, source.timeout)?;
        let rules = self.clone();
        Ok(Watcher { task: runtime.spawn(watch_redis(rules, store, source)) })
    }

    /// Keeps the rules current from a rule file, loaded again when its
    /// contents change (read every `every`). A file without `version` is
    /// loaded as the next version.
    pub fn watch_file(&self, path: impl Into<PathBuf>, every: Duration) -> Result<Watcher> {
        let rules = self.clone();
        Ok(Watcher { task: runtime()?.spawn(watch_file(rules, path.into(), every.max(Duration::from_millis(10)))) })
    }
}

fn runtime() -> Result<tokio::runtime::Handle> {
    tokio::runtime::Handle::try_current()
        .map_err(|_| Error::invalid("a rules watcher must be started inside a tokio runtime"))
}

async fn watch_redis(rules: LiveRules, store: RulesStore, source: RedisSource) {
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
                // "version N is out": fetch it now unless it is not newer.
                Some(payload) => {
                    // An unreadable announcement is checked too: the read decides.
                    let current = rules.snapshot().version();
                    if !matches!(payload.trim().parse::<u64>(), Ok(v) if v <= current) {
                        next_poll = Instant::now();
                    }
                }
                None => {
                    tracing::warn!(target: "rl_rules", channel = store.key(), poll_every = ?source.poll_every, "rules channel closed: polling until it is back");
                    messages = None;
                }
            },
            _ = sleep_until(wake) => {}
        }
        if Instant::now() >= next_poll {
            refresh(&rules, &store).await;
            next_poll = after(source.poll_every);
        }
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

/// Reads the version; fetches and installs the whole hash when newer.
async fn refresh(rules: &LiveRules, store: &RulesStore) {
    // Named in log lines and the status: never with its password.
    let source = &rl_client::redacted(store.url());
    let version = match store.version().await {
        Ok(v) => v,
        Err(e) => return rules.refresh_failed(source, &e),
    };
    let current = rules.snapshot().version();
    if version <= current {
        return rules.confirmed();
    }
    if rules.was_rejected(version) {
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
        Err(e) => return rules.rejected(Some(version), &label, &e),
    };
    match &stored.rules {
        // install counts and remembers its own refusals.
        Some(set) => {
            let _ = rules.install(set, &stored.overrides, stored.version, &label);
        }
        None => {
            let e = Error::Rules("the store has a version but no rules".to_owned());
            rules.rejected(Some(stored.version), &label, &e);
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
                if let Ok(Installed::NotNewer) = rules.install_as(&spec, &[], version, &source, named) {
                    let e = Error::Rules(format!("version {version} is not above version {current} in force"));
                    rules.rejected(Some(version), &source, &e);
                }
            }
            // Unreadable: it names no version, and none is marked refused.
            Err(e) => rules.rejected(None, &source, &e),
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
