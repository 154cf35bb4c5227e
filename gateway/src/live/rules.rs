//! The rules a gateway decides with: one snapshot, swapped whole.
//!
//! A request loads the current snapshot once (an `Arc`, through arc-swap)
//! and uses nothing else, so it never sees half of a rule set: a new
//! version applies to requests that start after the swap. Loading happens
//! off the request path (a watcher, or a call to [`LiveRules::install`]);
//! a rule set that fails its checks is refused whole and the one in force
//! stays.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use http::HeaderMap;
use quick_cache::sync::Cache;

use crate::http::headers::{self, PolicyHeaders};
use crate::{Backend, Decision, Error, Event, Limiter, NoPermit, Permit, Result};

use crate::global::RegionalShares;
use crate::live::fleet::Origin;
use crate::live::regional::Regional;
use crate::live::server_limits::server_refusals;
use crate::live::snapshot::{CompiledRule, Request, Snapshot};
use crate::live::spec::{RuleSetSpec, RuleSpec};

/// The rule a shadow rule would have enforced, had it been enforced.
#[derive(Clone, Debug)]
pub struct ShadowRefusal {
    /// The shadow rule.
    pub rule: Arc<CompiledRule>,
    /// Index of its refusing limit in `rule.policy().rules()`.
    pub limit: usize,
}

/// What live rules decided for one request.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// The decision of the enforced rule.
    pub decision: Decision,
    /// The enforced rule that decided.
    pub rule: Arc<CompiledRule>,
    /// The subject its buckets are kept under (a subject, `ip:<network>`,
    /// or `*:<rule id>` for a shared rule).
    pub subject: String,
    /// The snapshot version the request used, all of it.
    pub version: u64,
    /// A shadow rule that would have refused this allowed request.
    pub shadow: Option<ShadowRefusal>,
    /// For a global rule, the region's share of its limits that decided
    /// (what the headers announce), with its headers; `None` for any other
    /// rule.
    pub regional: Option<Arc<PolicyHeaders>>,
}

impl Verdict {
    /// The rate-limit headers for this verdict (see [`headers`]).
    pub fn headers(&self, now: SystemTime) -> HeaderMap {
        let policy = self.regional.as_ref().unwrap_or(self.rule.headers());
        headers::for_decision(policy, &self.decision, now)
    }
}

/// The verdict of a rule without rates: allowed, nothing counted.
fn no_rate() -> Decision {
    Decision {
        allowed: true,
        remaining: u64::MAX,
        retry_after: Some(Duration::ZERO),
        reset_after: Duration::ZERO,
        limit: u64::MAX,
        rule: 0,
        source: crate::Source::Redis,
        shadow_refused: None,
    }
}

/// What live rules answered for one request's in-flight slots
/// ([`LiveRules::acquire`]).
#[derive(Debug)]
pub struct Admission {
    /// `Ok(Some(permit))`: a slot in every in-flight limit of the rule,
    /// held until the permit drops; `Ok(None)`: the rule has no in-flight
    /// limits; `Err`: refused (the binding limit, what is in flight, when
    /// the earliest slot's deadline passes).
    pub permit: std::result::Result<Option<Permit>, NoPermit>,
    /// The enforced rule whose limits were taken.
    pub rule: Arc<CompiledRule>,
    /// The subject its slots are kept under (as [`Verdict::subject`]).
    pub subject: String,
    /// The snapshot version the request used.
    pub version: u64,
}

/// Where the rules in force stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RulesStatus {
    /// The version in force.
    pub version: u64,
    /// The id of the publication in force, unique per change to the rules
    /// store (`None` for a set not from a store): a gateway following
    /// Redis takes the store's set whenever its id or version differs from
    /// this, whatever the version.
    pub publication: Option<String>,
    /// The lineage of the set in force: the id of the store's line of
    /// versions, new when a store that lost its rules is published again.
    pub lineage: Option<String>,
    /// Where it came from (`initial`, a file, a Redis URL).
    pub source: String,
    /// When it was installed.
    pub installed_at: SystemTime,
    /// Time since the source last confirmed (or gave) the snapshot: a
    /// gateway that cannot refresh keeps its snapshot, and this grows.
    pub age: Duration,
    /// Rule sets refused by their checks since start.
    pub rejected: u64,
    /// Refreshes that could not read the source since start.
    pub refresh_failures: u64,
    /// The last refusal or failure, if the last attempt was not a success.
    pub last_error: Option<String>,
}

/// One shadow rule's refusals of one subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShadowEntry {
    /// The shadow rule's id.
    pub rule: String,
    /// The subject it would have refused.
    pub subject: String,
    /// How often, since the gateway started.
    pub refusals: u64,
}

/// How installing a rule set went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Installed {
    /// Now in force.
    Now(u64),
    /// Not newer than the version in force: nothing changed.
    NotNewer,
}

/// Live rules over one [`Limiter`]. Cheap to clone; clones share the
/// snapshot, the status and the shadow log.
///
/// ```no_run
/// use std::net::IpAddr;
/// use rl_gateway::live::{LiveRules, RedisSource, Request, RuleSetSpec};
/// use rl_gateway::{Config, Limiter};
///
/// # async fn run() -> Result<(), rl_gateway::Error> {
/// let limiter = Limiter::new(Config::standalone("redis://10.0.0.5:6379/"))?;
/// // The rules shipped with the gateway: in force until Redis has newer ones.
/// let rules = LiveRules::new(limiter, &RuleSetSpec::from_file("rules.toml")?)?;
/// let _watcher = rules.watch_redis(RedisSource::new("redis://10.0.0.5:6379/"))?;
///
/// // On every request:
/// let ip: IpAddr = "2001:db8:1:2::7".parse().unwrap();
/// let request = Request::new().subject("key_8f3").ip(ip).plan("pro").endpoint("GET /search");
/// let verdict = rules.check(&request).await?;
/// if !verdict.decision.allowed {
///     // 429 with verdict.headers(SystemTime::now())
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LiveRules {
    inner: Arc<Inner>,
}

struct Inner {
    limiter: Limiter,
    current: ArcSwap<Snapshot>,
    /// Serializes installs and holds their bookkeeping; never taken on the
    /// request path.
    state: Mutex<State>,
    shadow_log: Cache<(Arc<str>, Box<str>), Arc<AtomicU64>>,
    /// Global rules: this region's share of them (regional.rs).
    regional: Regional,
}

struct State {
    source: String,
    origin: Origin,
    /// What keeps the rules current ("Redis", "a file"): one source of
    /// truth per gateway.
    follows: Option<&'static str>,
    installed_at: SystemTime,
    confirmed: Instant,
    rejected: u64,
    refresh_failures: u64,
    last_error: Option<String>,
    /// The newest version refused (and its publication), so a watcher
    /// does not fetch it again.
    rejected_version: Option<(u64, Option<String>)>,
}

impl Inner {
    /// The install bookkeeping. A poisoned lock (a panic elsewhere while
    /// held) still holds consistent plain data, so it is used as is.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Subjects the shadow log remembers; the least seen go first.
const SHADOW_LOG_ENTRIES: usize = 10_000;

impl LiveRules {
    /// Live rules starting from `initial` (its `version`, or 0), checked
    /// as the limiter's backend needs. Call it inside a tokio runtime.
    pub fn new(limiter: Limiter, initial: &RuleSetSpec) -> Result<LiveRules> {
        let lua = limiter.client().backend() == Backend::Lua;
        let snapshot = Snapshot::compile_with(initial, &[], initial.version.unwrap_or(0), lua, None)?;
        Ok(LiveRules {
            inner: Arc::new(Inner {
                limiter,
                current: ArcSwap::from_pointee(snapshot),
                state: Mutex::new(State {
                    source: "initial".to_owned(),
                    origin: Origin::default(),
                    follows: None,
                    installed_at: SystemTime::now(),
                    confirmed: Instant::now(),
                    rejected: 0,
                    refresh_failures: 0,
                    last_error: None,
                    rejected_version: None,
                }),
                shadow_log: Cache::new(SHADOW_LOG_ENTRIES),
                regional: Regional::default(),
            }),
        })
    }

    /// Whether the limiter's server accepts every limit of the rules in
    /// force: an EXACT window above its `max-log-limit`, or an in-flight
    /// limit above its `max-inflight-limit`, passes every check of the rule
    /// format and then errors at Redis on every request. A gateway asks
    /// before it serves, and does not start on an error, which names each
    /// rule, limit and the module option to raise (as `rlctl publish`
    /// refuses such a set). A server that cannot be asked now (down) is no
    /// refusal: the gateway starts, and says so.
    pub async fn verify_server(&self) -> Result<()> {
        match server_refusals(self.limiter().client(), &self.snapshot()).await {
            Ok(faults) if faults.is_empty() => Ok(()),
            Ok(faults) => {
                Err(Error::Rules(format!("rule set rejected: the limiter's server refuses {}", faults.join("; "))))
            }
            Err(e) => {
                tracing::warn!(target: "rl_rules", error = %e, "cannot ask the limiter's server about the rules' limits: starting on them unchecked");
                Ok(())
            }
        }
    }

    /// The snapshot in force: what a request starting now uses.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.current.load_full()
    }

    /// Sets this gateway's region and where its shares of global rules
    /// come from (rl-balancer's `RegionShares`), once, at start: every
    /// global rule is then enforced at the region's share (see docs/global-limits.md).
    pub fn set_region_shares(&self, shares: Arc<dyn RegionalShares>) -> Result<()> {
        self.inner.regional.set(shares)
    }

    /// Global rules' side: this region's share of them.
    #[cfg(feature = "tower")]
    pub(crate) fn regional(&self) -> &Regional {
        &self.inner.regional
    }

    /// The limiter the rules decide with.
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    /// Decides one request (cost 1).
    pub async fn check(&self, request: &Request<'_>) -> Result<Verdict> {
        self.check_cost(request, 1).await
    }

    /// Decides a request costing `cost` against the rule it matches in the
    /// snapshot in force when it started. Errors are bad input only (no
    /// subject and no IP, a subject with braces, a cost out of range).
    pub async fn check_cost(&self, request: &Request<'_>, cost: u64) -> Result<Verdict> {
        // One load: everything below uses this snapshot and nothing else.
        let snapshot = self.inner.current.load_full();
        let matched = snapshot.matching(request, SystemTime::now());
        let subject = snapshot.bucket_subject(&matched.enforced, request)?;
        if !matched.enforced.has_rates() {
            // In-flight limits only: no rate to ask ([`acquire`](Self::acquire) takes the slots).
            let decision = no_rate();
            return Ok(Verdict {
                decision,
                rule: matched.enforced,
                subject,
                version: snapshot.version(),
                shadow: None,
                regional: None,
            });
        }
        let limiter = &self.inner.limiter;
        // A shadow rule never fails a request: without a subject of its own
        // it is skipped.
        let shadow_subject = matched.shadow.as_ref().and_then(|rule| snapshot.bucket_subject(rule, request).ok());
        let shadow_check = async {
            match (&matched.shadow, &shadow_subject) {
                (Some(rule), Some(s)) => self.inner.regional.shadow_refusal(limiter, rule, s, cost).await,
                _ => Ok(None),
            }
        };
        let (decision, shadow) =
            tokio::join!(self.inner.regional.check_cost(limiter, &matched.enforced, &subject, cost), shadow_check);
        let (decision, regional) = decision?;
        // Only an allowed request is one the shadow rule would have changed.
        let shadow = match (shadow.unwrap_or(None), matched.shadow, shadow_subject) {
            (Some(limit), Some(rule), Some(s)) if decision.allowed => {
                self.log_shadow(&rule, limit, &s);
                Some(ShadowRefusal { rule, limit })
            }
            _ => None,
        };
        Ok(Verdict { decision, rule: matched.enforced, subject, version: snapshot.version(), shadow, regional })
    }

    /// Takes a slot in every in-flight limit of the rule `request` matches
    /// (cost 1); see [`Admission`]. Call it after [`check`](Self::check)
    /// allowed the request, so a refused rate costs no slot, and hold the
    /// permit until the response is sent. Redis failures never surface
    /// (fail-closed rules refuse, the others limit locally); errors are bad
    /// input only, as for `check`.
    pub async fn acquire(&self, request: &Request<'_>) -> Result<Admission> {
        self.acquire_cost(request, 1).await
    }

    /// Takes `cost` slots (a request that weighs more) in every in-flight
    /// limit of the rule `request` matches.
    pub async fn acquire_cost(&self, request: &Request<'_>, cost: u64) -> Result<Admission> {
        let snapshot = self.inner.current.load_full();
        let rule = snapshot.matching(request, SystemTime::now()).enforced;
        let subject = snapshot.bucket_subject(&rule, request)?;
        let permit = match rule.inflight() {
            Some(policy) => self.inner.limiter.acquire_cost(policy, &subject, cost).await?.map(Some),
            None => Ok(None),
        };
        Ok(Admission { permit, rule, subject, version: snapshot.version() })
    }

    pub(crate) fn log_shadow(&self, rule: &Arc<CompiledRule>, limit: usize, subject: &str) {
        let name = rule.policy().rule(limit).map(|r| r.name());
        self.inner.limiter.record(Event::ShadowRefused, rule.policy().prefix(), name);
        let key: (Arc<str>, Box<str>) = (rule.id().into(), subject.into());
        // One counter per subject even when two refusals of it land at once
        // (shadow rules are asked in the background): the cache's guard
        // makes the second wait for the first's insert.
        let first = || {
            tracing::info!(
                target: "rl_rules",
                rule = rule.id(),
                limit = name.unwrap_or("?"),
                subject,
                "shadow rule would have refused this subject (counted from now on in LiveRules::shadow_report)"
            );
            Ok::<_, std::convert::Infallible>(Arc::new(AtomicU64::new(0)))
        };
        let Ok(count) = self.inner.shadow_log.get_or_insert_with(&key, first);
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// Which subjects each shadow rule would have refused, and how often,
    /// most refused first (at most 10,000 subjects are remembered).
    pub fn shadow_report(&self) -> Vec<ShadowEntry> {
        let mut out: Vec<ShadowEntry> = self
            .inner
            .shadow_log
            .iter()
            .map(|((rule, subject), n)| ShadowEntry {
                rule: rule.to_string(),
                subject: subject.to_string(),
                refusals: n.load(Ordering::Relaxed),
            })
            .collect();
        out.sort_by(|a, b| b.refusals.cmp(&a.refusals).then_with(|| (&a.rule, &a.subject).cmp(&(&b.rule, &b.subject))));
        out
    }

    /// Installs a rule set (with `overrides`) as `version` if it is newer
    /// than the one in force and passes every check; otherwise the one in
    /// force stays, and a refusal is counted and reported in [`status`](Self::status).
    pub fn install(&self, spec: &RuleSetSpec, overrides: &[RuleSpec], version: u64, source: &str) -> Result<Installed> {
        let origin = self.inner.state().origin.clone();
        self.install_as(spec, overrides, version, &origin, source, true)
    }

    /// [`install`](Self::install) of a set from `origin`: one of another
    /// publication than the set in force is taken whatever its version;
    /// `named` false for a set that names no version of its own (a file
    /// loaded as the next one): refused, it marks no version as refused.
    pub(crate) fn install_as(
        &self,
        spec: &RuleSetSpec,
        overrides: &[RuleSpec],
        version: u64,
        origin: &Origin,
        source: &str,
        named: bool,
    ) -> Result<Installed> {
        let mut state = self.inner.state();
        let current = self.inner.current.load();
        // A set of the store's is installed unless it is the one in force:
        // the store is the truth, even gone back. Others only move forward.
        let same = state.origin.publication == origin.publication;
        let not_newer = match origin.publication {
            Some(_) => version == current.version(),
            None => version <= current.version(),
        };
        if same && not_newer {
            return Ok(Installed::NotNewer);
        }
        let lua = self.inner.limiter.client().backend() == Backend::Lua;
        match Snapshot::compile_with(spec, overrides, version, lua, Some(&current)) {
            Ok(snapshot) => {
                for warning in snapshot.warnings() {
                    tracing::warn!(target: "rl_rules", version, source, %warning, "rule set installed with a warning");
                }
                self.inner.current.store(Arc::new(snapshot));
                state.source = source.to_owned();
                state.origin = origin.clone();
                state.installed_at = SystemTime::now();
                state.confirmed = Instant::now();
                state.last_error = None;
                let newer = |(v, p): &(u64, Option<String>)| *v > version && *p == origin.publication;
                state.rejected_version = state.rejected_version.take().filter(newer);
                let (publication, lineage) = (origin.publication.as_deref(), origin.lineage.as_deref());
                tracing::info!(target: "rl_rules", version, publication, lineage, source, "rule set installed: in force");
                Ok(Installed::Now(version))
            }
            Err(e) => {
                drop(state);
                self.rejected(named.then_some(version), origin.publication.as_deref(), source, &e);
                Err(e)
            }
        }
    }

    /// A rule set was refused: counted, logged, and reported in the
    /// status; the one in force stays. A `version` (of `publication`)
    /// newer than the one in force, or of another publication, is
    /// remembered, so a watcher does not fetch it again; a set that names
    /// no version (a file that does not parse) marks none.
    pub(crate) fn rejected(&self, version: Option<u64>, publication: Option<&str>, source: &str, error: &Error) {
        let mut state = self.inner.state();
        state.rejected += 1;
        let current = self.inner.current.load().version();
        let other = state.origin.publication.as_deref() != publication;
        if let Some(newer) = version.filter(|&v| v > current || other) {
            state.rejected_version = Some((newer, publication.map(str::to_owned)));
        }
        let of = publication.map(|p| format!(" (publication {p})")).unwrap_or_default();
        let text = match version {
            Some(version) => format!("version {version}{of} from {source}: {error}"),
            None => format!("{source}: {error}"),
        };
        tracing::error!(target: "rl_rules", refused = %text, in_force = current, "rule set refused: the one in force stays");
        state.last_error = Some(text);
    }

    /// Where the rules in force stand: version, source, age, refusals.
    pub fn status(&self) -> RulesStatus {
        let state = self.inner.state();
        RulesStatus {
            version: self.inner.current.load().version(),
            publication: state.origin.publication.clone(),
            lineage: state.origin.lineage.clone(),
            source: state.source.clone(),
            installed_at: state.installed_at,
            age: state.confirmed.elapsed(),
            rejected: state.rejected,
            refresh_failures: state.refresh_failures,
            last_error: state.last_error.clone(),
        }
    }

    /// The source was read and holds what is in force: the snapshot is
    /// current.
    pub(crate) fn confirmed(&self) {
        let mut state = self.inner.state();
        state.confirmed = Instant::now();
        let current = self.inner.current.load().version();
        if !matches!(&state.rejected_version, Some((r, p)) if *r > current || *p != state.origin.publication) {
            state.rejected_version = None;
            state.last_error = None;
        }
    }

    /// The source was read and does not hold what is in force (it is
    /// behind, or lost its rules): the snapshot stays, unconfirmed, so its
    /// age grows, and `why` is the status's `last_error`.
    pub(crate) fn unconfirmed(&self, why: String) {
        let mut state = self.inner.state();
        if state.last_error.as_deref() != Some(why.as_str()) {
            tracing::error!(target: "rl_rules", error = %why, "the rules source does not hold the set in force");
        }
        state.last_error = Some(why);
    }

    /// Marks `what` ("Redis", "a file") as what keeps these rules current;
    /// refused while another watcher does: two sources would each take
    /// the other's set for a change and undo it.
    pub(crate) fn follow(&self, what: &'static str) -> Result<()> {
        let mut state = self.inner.state();
        match state.follows {
            Some(other) => Err(Error::invalid(format!(
                "these rules already follow {other}: one source of truth per gateway (drop that watcher first; \
                 a file only to start with: LiveRules::start)"
            ))),
            None => {
                state.follows = Some(what);
                Ok(())
            }
        }
    }

    /// The watcher stopped: another source may be followed.
    pub(crate) fn unfollow(&self) {
        self.inner.state().follows = None;
    }

    /// The version and origin in force, read together.
    pub(crate) fn identity(&self) -> (u64, Origin) {
        let state = self.inner.state();
        (self.inner.current.load().version(), state.origin.clone())
    }

    /// The source could not be read; the snapshot in force stays.
    pub(crate) fn refresh_failed(&self, source: &str, error: &Error) {
        let mut state = self.inner.state();
        state.refresh_failures += 1;
        let text = format!("cannot refresh rules from {source}: {error}");
        // Logged when the failing starts, not on every poll.
        if state.last_error.as_deref() != Some(text.as_str()) {
            let in_force = self.inner.current.load().version();
            tracing::warn!(target: "rl_rules", error = %text, in_force, "cannot refresh rules: the ones in force stay");
        }
        state.last_error = Some(text);
    }

    /// Whether `version` was already refused: a watcher skips fetching it again.
    pub(crate) fn was_rejected(&self, version: u64, publication: Option<&str>) -> bool {
        matches!(&self.inner.state().rejected_version, Some((v, p)) if *v == version && p.as_deref() == publication)
    }
}
