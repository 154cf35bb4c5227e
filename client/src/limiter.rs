//! The limiter a gateway calls on every request: typed calls guarded by a
//! timeout and a per-shard breaker, with leases for busy subjects, a deny
//! cache for refused ones, a local fallback, and shadow rules.
//!
//! Error direction, path by path (the crate README has the table):
//! - a call answered by Redis is exact (the module's guarantee);
//! - leased tokens are taken before they are spent: never over, only under;
//! - the deny cache only refuses, until the retry time Redis named: never over;
//! - the outage fallback allows about `slack` times the limit fleet-wide:
//!   a bucket at most `max(slack x capacity, gateways)` at once and `slack`
//!   x its rate after (a share below one token is one token per gateway),
//!   a window at most `slack` x its limit in any window;
//! - window rules are evaluated after the buckets, so a request refused by a
//!   window has spent its bucket tokens: under, never over.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rl_core::limits::{MAX_TOKENS, MAX_WINDOW_LIMIT};
use rl_core::BucketOp;

use crate::breaker::{Breaker, Ticket};
use crate::client::Client;
use crate::clock::{millis, Clock};
use crate::config::{Backend, Config};
use crate::connection::Target;
use crate::decision::{Decision, Source};
use crate::deny_cache::DenyCache;
use crate::error::{Error, Result};
use crate::fallback::{Answer, Fallback, Scale};
use crate::lease::{share_ms, Leases};
use crate::metrics::{Counters, Event, Metrics};
use crate::policy::{Group, Policy, GROUP_KINDS};
use crate::shards::Shards;
use crate::subject::validate_subject;
use crate::SubjectRef;

/// Decides requests against [`Policy`] rules. Cheap to clone; clones share
/// everything (connection, caches, breakers, counters).
///
/// ```no_run
/// use rl_client::{Config, Limiter, Policy, Rule};
///
/// # async fn run() -> Result<(), rl_client::Error> {
/// let limiter = Limiter::new(Config { gateways: 12, ..Config::standalone("redis://127.0.0.1:6379/") })?;
/// let api = Policy::builder("api")
///     .rule(Rule::per_second("per_second", 100).burst(200))
///     .rule(Rule::per_minute("per_minute", 5000))
///     .build()?;
///
/// let d = limiter.check(&api, "user42").await?;
/// if !d.allowed {
///     let rule = api.rule(d.rule).map_or("?", |r| r.name());
///     println!("429: over '{rule}', retry in {:?}", d.retry_after);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: Config,
    gateways: AtomicU32,
    pub(crate) shards: Shards,
    pub(crate) deny: DenyCache,
    pub(crate) leases: Leases,
    fallback: Fallback,
    counters: Counters,
    sink: Option<Arc<dyn Metrics>>,
    /// The runtime the limiter was made in: background work (lease top-ups,
    /// the cluster's slot map) always has one to run on.
    runtime: tokio::runtime::Handle,
}

/// The evaluation of one group of a policy's rules for one subject,
/// borrowed from the request: all a decision from memory needs. Nothing is
/// allocated for it: the keys are built only for a call to Redis, and a
/// lease's owned refill only for a background top-up.
#[derive(Clone, Copy)]
pub(crate) struct Evaluation<'a> {
    pub(crate) policy: &'a Policy,
    pub(crate) group: &'a Group,
    pub(crate) shadow: bool,
    pub(crate) subject: &'a str,
}

impl<'a> Evaluation<'a> {
    /// Its key in the local maps (leases, deny cache, fallback).
    pub(crate) fn key(&self) -> SubjectRef<'a> {
        SubjectRef(self.group.id, self.shadow, self.subject)
    }

    /// The group's bucket or window keys, for a call to Redis.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.policy.group_keys(self.group, self.subject)
    }

    pub(crate) fn prefix(&self) -> &'a str {
        self.policy.prefix()
    }

    /// `d` with its binding index turned from the group's into the policy's.
    pub(crate) fn mapped(&self, d: Decision) -> Decision {
        mapped(&self.group.rules, d)
    }
}

/// `d` with its binding index turned from a group's (`rules`: group index
/// -> policy rule index) into the policy's.
pub(crate) fn mapped(rules: &[usize], d: Decision) -> Decision {
    Decision { rule: rules.get(d.rule).copied().unwrap_or(d.rule), ..d }
}

/// Two allowed groups' decisions as one: the binding rule is the one with
/// the fewest tokens left.
pub(crate) fn combined(before: Option<Decision>, d: Decision) -> Decision {
    match before {
        Some(a) => {
            let tighter = if d.remaining < a.remaining { d } else { a };
            Decision { reset_after: a.reset_after.max(d.reset_after), ..tighter }
        }
        None => d,
    }
}

/// A call the shard's breaker admitted: the breaker, and the ticket to
/// report the outcome with.
pub(crate) type Admitted = (Arc<Breaker>, Ticket);

impl Limiter {
    /// A limiter for `config`. Does not wait for Redis: it connects in the
    /// background, so a gateway starts (on its fallback) while Redis is
    /// down. Call it inside a tokio runtime (an error otherwise): its
    /// background work runs there.
    pub fn new(config: Config) -> Result<Limiter> {
        Limiter::build(config, None)
    }

    /// Like [`Limiter::new`], also sending every event to `metrics`.
    pub fn with_metrics(config: Config, metrics: Arc<dyn Metrics>) -> Result<Limiter> {
        Limiter::build(config, Some(metrics))
    }

    fn build(config: Config, sink: Option<Arc<dyn Metrics>>) -> Result<Limiter> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::invalid(
                "Limiter::new must be called inside a tokio runtime: lease top-ups run in the background there",
            )
        })?;
        let client = Client::new(&config)?;
        let cluster = matches!(config.target, Target::Cluster(_));
        let shards = Shards::new(
            cluster,
            config.breaker_trip_after,
            millis(config.breaker_open_for),
            config.breaker_failure_rate,
            millis(config.topology_refresh),
        );
        Ok(Limiter {
            inner: Arc::new(Inner {
                client,
                gateways: AtomicU32::new(config.gateways),
                shards,
                deny: DenyCache::new(config.deny_cache_entries),
                leases: Leases::new(config.lease_entries),
                fallback: Fallback::new(config.fallback_entries),
                counters: Counters::default(),
                sink,
                runtime,
                config,
            }),
        })
    }

    /// Decides one request (cost 1) of `subject` against every rule of `policy`.
    pub async fn check(&self, policy: &Policy, subject: &str) -> Result<Decision> {
        self.check_cost(policy, subject, 1).await
    }

    /// Decides a request costing `cost` tokens of every rule.
    ///
    /// Redis failures never surface here: the fallback answers. The only
    /// errors are bad input (an empty subject or one with braces, a cost
    /// out of range, a policy beyond the Lua backend's range).
    pub async fn check_cost(&self, policy: &Policy, subject: &str, cost: u64) -> Result<Decision> {
        self.check_input(policy, subject, BucketOp::Take { cost })?;
        // The clock, read once for the decisions made from memory.
        let now = self.inner.now_ms();
        self.refresh_topology(now);
        let (enforced, shadow) = if self.inner.shards.refuses(subject, now) {
            // While the shard's breaker refuses, the fallback decides, and
            // nothing is awaited.
            let by = |shadow| move |group| Evaluation { policy, group, shadow, subject };
            let enforced = self.outage_groups(&policy.enforced, by(false), cost, now);
            (enforced, self.outage_groups(&policy.shadow, by(true), cost, now))
        } else if policy.shadow.is_empty() {
            (self.evaluate_groups(policy, &policy.enforced, false, subject, cost, now).await, None)
        } else {
            // Boxed: inline, a second group's future would double the size
            // of every check's future, moved on every check.
            let enforced = self.evaluate_groups(policy, &policy.enforced, false, subject, cost, now);
            let shadow = Box::pin(self.evaluate_groups(policy, &policy.shadow, true, subject, cost, now));
            tokio::join!(enforced, shadow)
        };
        self.finish(policy, enforced, shadow)
    }

    /// The request's decision from its enforced groups' and its shadow
    /// groups' (each `None` when the policy has none), counted.
    // Inlined: called apart, it made every check 20 ns slower (measured on
    // the lease spend, 155 -> 178 ns).
    #[inline]
    pub(crate) fn finish(
        &self,
        policy: &Policy,
        enforced: Option<Decision>,
        shadow: Option<Decision>,
    ) -> Result<Decision> {
        let shadow_refused = shadow.filter(|d| !d.allowed).map(|d| d.rule);
        let decision = match (enforced, shadow) {
            (Some(d), _) => Decision { shadow_refused, ..d },
            // Only shadow rules: reported, never enforced.
            (None, Some(s)) => Decision { allowed: true, retry_after: Some(Duration::ZERO), shadow_refused, ..s },
            (None, None) => return Err(Error::invalid("a policy needs at least one rule")),
        };
        let name = |i: usize| policy.rule(i).map(|r| r.name());
        if decision.allowed {
            self.inner.record(Event::Allowed, policy.prefix(), None);
            if let Some(rule) = shadow_refused {
                self.inner.record(Event::ShadowRefused, policy.prefix(), name(rule));
            }
        } else {
            self.inner.record(Event::Refused, policy.prefix(), name(decision.rule));
        }
        Ok(decision)
    }

    /// Takes `extra` more tokens from every rule of the subject, into debt
    /// if need be: for a cost found higher once the response is known
    /// (RL.TAKE ... FORCE). `None` when Redis could not be reached (the
    /// debit is then lost: under-counted, counted as an error).
    pub async fn settle(&self, policy: &Policy, subject: &str, extra: u64) -> Result<Option<Decision>> {
        self.adjust(policy, subject, BucketOp::Force { cost: extra }).await
    }

    /// Gives `tokens` back to every rule of the subject, never above
    /// capacity: for a cost found lower than was taken (RL.REFUND).
    pub async fn refund(&self, policy: &Policy, subject: &str, tokens: u64) -> Result<Option<Decision>> {
        self.adjust(policy, subject, BucketOp::Refund { tokens }).await
    }

    async fn adjust(&self, policy: &Policy, subject: &str, op: BucketOp) -> Result<Option<Decision>> {
        self.check_input(policy, subject, op)?;
        if policy.buckets.is_empty() {
            return Err(Error::invalid(format!(
                "policy '{}' has only window rules: windows are neither settled nor refunded",
                policy.prefix()
            )));
        }
        let t = Evaluation { policy, group: &policy.buckets, shadow: false, subject };
        let Some(admitted) = self.inner.shards.admit(subject, self.inner.now_ms()) else {
            return Ok(None);
        };
        let keys = t.keys();
        // Boxed, as a check's call is: held inline, the call's future (8 KB)
        // made every caller's future that large, a batch's on every request.
        let call = Box::pin(self.inner.client.run(op, &keys, &t.group.params));
        Ok(self.guarded(t.prefix(), admitted, call).await.ok().map(|d| t.mapped(d)))
    }

    /// Bad input is the caller's error, never a decision.
    pub(crate) fn check_input(&self, policy: &Policy, subject: &str, op: BucketOp) -> Result<()> {
        validate_subject(subject)?;
        op.validate()?;
        let lua = self.inner.client.backend() == Backend::Lua;
        if lua && !policy.fits_lua() {
            return Err(Error::invalid(format!(
                "policy '{}' has a rule with capacity x period_ms above 2^52: the Lua backend cannot count it exactly",
                policy.prefix()
            )));
        }
        if policy.has_windows() {
            if lua {
                return Err(Error::invalid(format!(
                    "policy '{}' has window rules: the Lua backend has no RL.WINDOW",
                    policy.prefix()
                )));
            }
            if let BucketOp::Take { cost } = op {
                if cost > MAX_WINDOW_LIMIT {
                    return Err(Error::invalid(format!(
                        "cost must be at most {MAX_WINDOW_LIMIT} on a policy with window rules, got {cost}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Which shadow rule of `policy` (an index into its rules) would refuse
    /// this request, evaluating its shadow rules only and recording nothing:
    /// live rules run a shadow rule set beside the enforced one.
    pub async fn shadow_refusal(&self, policy: &Policy, subject: &str, cost: u64) -> Result<Option<usize>> {
        self.check_input(policy, subject, BucketOp::Take { cost })?;
        let d = self.evaluate_groups(policy, &policy.shadow, true, subject, cost, self.inner.now_ms()).await;
        Ok(d.filter(|d| !d.allowed).map(|d| d.rule))
    }

    /// Counts an event decided outside the limiter (live rules' shadow refusals).
    pub fn record(&self, event: Event, policy: &str, rule: Option<&str>) {
        self.inner.record(event, policy, rule);
    }

    /// The fleet size changed (from service discovery): leases and the
    /// fallback are sized from it.
    pub fn set_gateways(&self, gateways: u32) {
        self.inner.gateways.store(gateways.max(1), Ordering::Relaxed);
    }

    /// Totals of every [`Event`] since the limiter was made.
    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Every shard the limiter knows and whether its circuit breaker is open
    /// now: `host:port` of a cluster's primaries (`unknown` until the slot
    /// map is read), or `standalone`.
    pub fn shards(&self) -> Vec<(String, bool)> {
        self.inner.shards.states(self.inner.now_ms())
    }

    /// The clock it decides from memory by ([`Config::clock`]).
    pub fn clock(&self) -> &Clock {
        &self.inner.config.clock
    }

    /// The typed, unguarded calls on the same connection.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Evaluates `groups` in order and stops at the first refusal: none of
    /// the groups after it counts the request. `None` when there are none.
    ///
    /// A refusal remembered for any group (the deny cache) refuses at once,
    /// before any group is asked: a subject refused by its quota does not
    /// pay an RL.TAKE, and spend bucket tokens, on every request. And once a
    /// call fails on the shard, the groups after it (the same subject, so
    /// the same slot) are answered by the fallback without asking: a check
    /// waits at most one timeout, however many groups it has.
    pub(crate) async fn evaluate_groups(
        &self,
        policy: &Policy,
        groups: &[Group],
        shadow: bool,
        subject: &str,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let i = &self.inner;
        let evaluation = |group| Evaluation { policy, group, shadow, subject };
        if i.shards.refuses(subject, now) {
            return self.outage_groups(groups, evaluation, cost, now);
        }
        // A policy has at most one group of each kind of call.
        let gateways = i.gateways();
        let batch = |k| groups.get(k).map_or(1, |g| self.batch(g, gateways));
        let batches: [u64; GROUP_KINDS] = std::array::from_fn(batch);
        // A leased group checks its own entry when its lease runs short:
        // the tokens it holds are paid for.
        for (group, _) in groups.iter().zip(batches).filter(|(_, batch)| *batch == 1) {
            if let Some(d) = i.deny.check(&evaluation(group).key(), cost, now) {
                i.record(Event::DenyCacheHit, policy.prefix(), None);
                return Some(d);
            }
        }
        let mut shard_down = false;
        let mut allowed: Option<Decision> = None;
        for (group, batch) in groups.iter().zip(batches) {
            let t = evaluation(group);
            let d = if batch > 1 {
                self.leased(t, cost, batch, now, &mut shard_down).await
            } else {
                self.evaluate(t, cost, now, &mut shard_down).await
            };
            if !d.allowed {
                return Some(d);
            }
            allowed = Some(combined(allowed, d));
        }
        allowed
    }

    /// [`Limiter::evaluate_groups`] while the shard's breaker refuses: every
    /// group goes to the fallback at once, one entry (which keeps the
    /// subject's refusal) and one lock each; leased tokens are left unspent
    /// (under, never over). Only fail-closed groups ask the deny cache
    /// first. Nothing to await.
    fn outage_groups<'a>(
        &self,
        groups: &'a [Group],
        evaluation: impl Fn(&'a Group) -> Evaluation<'a>,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let i = &self.inner;
        for t in groups.iter().filter(|g| g.fail_closed.is_some()).map(&evaluation) {
            if let Some(d) = i.deny.check(&t.key(), cost, now) {
                i.record(Event::DenyCacheHit, t.prefix(), None);
                return Some(d);
            }
        }
        let mut allowed: Option<Decision> = None;
        for group in groups {
            let d = self.degraded(&evaluation(group), cost, now);
            if !d.allowed {
                return Some(d);
            }
            allowed = Some(combined(allowed, d));
        }
        allowed
    }

    /// A quiet subject's group: the request asks Redis (its deny-cache
    /// entry was looked at first), unless the shard already failed this
    /// check or its breaker is open.
    async fn evaluate(&self, t: Evaluation<'_>, cost: u64, now: u64, shard_down: &mut bool) -> Decision {
        let i = &self.inner;
        let Some(admitted) = self.admit(&t, now, shard_down) else {
            return self.degraded(&t, cost, now);
        };
        let (keys, params) = (t.keys(), &t.group.params);
        // Boxed: see `leased`.
        let answer = match t.group.window {
            None => {
                let call = Box::pin(i.client.run(BucketOp::Take { cost }, &keys, params));
                self.guarded(t.prefix(), admitted, call).await
            }
            Some(mode) => {
                let call = Box::pin(i.client.run_windows(mode, &keys, params, cost));
                self.guarded(t.prefix(), admitted, call).await
            }
        };
        self.answered(&t, cost, now, answer.as_ref().map_err(|e| e.is_shard_failure()).copied(), shard_down)
    }

    /// The decision for Redis's answer to `t` (a refusal is remembered in
    /// the deny cache), or the fallback's when the call failed (`Err`:
    /// whether the shard failed).
    pub(crate) fn answered(
        &self,
        t: &Evaluation,
        cost: u64,
        now: u64,
        answer: std::result::Result<Decision, bool>,
        shard_down: &mut bool,
    ) -> Decision {
        let i = &self.inner;
        match answer {
            Ok(d) => {
                // Held at least this gateway's share of the refill of `cost`:
                // asking sooner, a subject pressing its limit from every
                // gateway would cost a call per gateway per retry time.
                let hold = t.group.params.get(d.rule).map_or(0, |r| share_ms(r, cost, i.gateways()));
                let d = t.mapped(d);
                i.deny.refused(&t.key(), cost, &d, now, hold);
                d
            }
            Err(shard_failure) => {
                *shard_down |= shard_failure;
                self.degraded(t, cost, i.now_ms())
            }
        }
    }

    /// Redis could not answer: fail-closed rules refuse, the others limit
    /// locally at this gateway's share of the limit times the slack (one
    /// token at least; a window whose share is below one token refuses).
    ///
    /// While the shard's breaker is closed, Redis answers other calls and
    /// may admit the whole limit itself (and a call that timed out may have
    /// taken its tokens there too): the fallback then allows `slack - 1`
    /// times the share, so the fleet stays within `slack` x the limit. With
    /// the breaker open it allows `slack` x the share, after the subject's
    /// refusal in the deny cache, which the fallback's entry keeps (a check
    /// during an outage comes here without asking the deny cache).
    pub(crate) fn degraded(&self, t: &Evaluation, cost: u64, now: u64) -> Decision {
        let i = &self.inner;
        let closed = |local: usize| {
            i.record(Event::Fallback, t.prefix(), None);
            let open_for = i.config.breaker_open_for;
            t.mapped(Decision {
                allowed: false,
                remaining: 0,
                retry_after: Some(open_for),
                reset_after: open_for,
                limit: t.group.params.get(local).map_or(0, |p| p.capacity()),
                rule: local,
                source: Source::FailClosed,
                shadow_refused: None,
            })
        };
        if let Some(local) = t.group.fail_closed {
            return closed(local);
        }
        let slack = i.config.fallback_slack;
        let full = i.shards.refuses(t.subject, now);
        let scale = Scale {
            rules: &t.group.params,
            window: t.group.window.is_some(),
            slack: if full { slack } else { slack - 1.0 },
            full,
            gateways: i.gateways(),
            policy: t.prefix(),
        };
        let (key, cost) = (t.key(), cost.min(MAX_TOKENS));
        let taken = if full {
            i.fallback.take_unless_refused(&key, &scale, cost, now, || i.deny.check(&key, cost, now))
        } else {
            i.fallback.take(&key, &scale, cost, now).map(Answer::Local)
        };
        match taken {
            Ok(Answer::Local(d)) => {
                i.record(Event::Fallback, t.prefix(), None);
                t.mapped(Decision::from_core(&d, Source::Fallback))
            }
            Ok(Answer::Refused(d)) => {
                i.record(Event::DenyCacheHit, t.prefix(), None);
                d
            }
            // A window whose share is below one token: refused rather than a
            // token on every gateway in every window.
            Err(below) => closed(below),
        }
    }

    /// Whether this check may call `t`'s shard: not once a call of the
    /// check failed there, nor while its breaker is open (which counts as a
    /// failure of the shard for the check's other groups). Asked before a
    /// call is built, so a refusal costs no keys and no command.
    pub(crate) fn admit(&self, t: &Evaluation, now: u64, shard_down: &mut bool) -> Option<Admitted> {
        if *shard_down {
            return None;
        }
        let admitted = self.inner.shards.admit(t.subject, now);
        *shard_down = admitted.is_none();
        admitted
    }

    /// Runs `call`, which the shard's breaker admitted, and tells the
    /// breaker how it went.
    pub(crate) async fn guarded<T>(
        &self,
        policy: &str,
        admitted: Admitted,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let result = call.await;
        self.report(policy, admitted, result.as_ref().err());
        result
    }

    /// Tells the breaker that admitted a call how it went (`failure`: its
    /// error, if any).
    pub(crate) fn report(&self, policy: &str, admitted: Admitted, failure: Option<&Error>) {
        let i = &self.inner;
        let (breaker, ticket) = admitted;
        match failure {
            None => breaker.success(ticket, i.now_ms()),
            Some(e) => {
                i.record(Event::Error, policy, None);
                if !e.is_shard_failure() {
                    breaker.success(ticket, i.now_ms()); // the shard answered; the call was at fault
                } else if breaker.failure(ticket, i.now_ms()) {
                    i.record(Event::BreakerOpened, policy, None);
                }
            }
        }
    }

    /// Reads a cluster's slot map when due, in the background.
    pub(crate) fn refresh_topology(&self, now: u64) {
        let i = &self.inner;
        // Standalone: nothing to refresh.
        if !i.shards.is_cluster() || !i.shards.refresh_due(now) {
            return;
        }
        // Dropped unfinished (its runtime shut down): the refresh counts as
        // failed, so the flag never stays set.
        struct Pending(Limiter);
        impl Drop for Pending {
            fn drop(&mut self) {
                let i = &self.0.inner;
                if i.shards.is_refreshing() {
                    i.shards.failed(i.now_ms());
                }
            }
        }
        let pending = Pending(self.clone());
        i.spawn(async move {
            let i = &pending.0.inner;
            match i.client.slot_map(i.config.connect_timeout).await {
                Ok(map) if !map.is_empty() => i.shards.installed(&map, i.now_ms()),
                _ => i.shards.failed(i.now_ms()),
            }
        });
    }
}

impl Inner {
    pub(crate) fn now_ms(&self) -> u64 {
        self.config.clock.now_ms()
    }

    pub(crate) fn gateways(&self) -> u32 {
        self.gateways.load(Ordering::Relaxed)
    }

    /// Background work goes on the runtime the limiter was made in. If that
    /// runtime has shut down the task is dropped, and with it what it holds
    /// (a lease call in flight), which clears its flags.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(task);
    }

    pub(crate) fn record(&self, event: Event, policy: &str, rule: Option<&str>) {
        // At most once per shard per breaker_open_for: no flood in an outage.
        if event == Event::BreakerOpened {
            tracing::warn!(target: "rl_client", policy, "circuit breaker opened: a Redis shard fails; its subjects use the fallback");
        }
        self.counters.record(event, policy, rule);
        if let Some(sink) = &self.sink {
            sink.record(event, policy, rule);
        }
    }
}
