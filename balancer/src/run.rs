//! The balancer's loop: every interval, one round over every region.
//!
//! A round: claim the epoch in every region (fencing: a newer balancer's
//! claim makes this one stop), read and clear each region's usage, read its
//! table, plan (`plan_round`), write the lowered tables, wait until every
//! gateway of every region written confirms the lowered version (`confirm`),
//! then write the raised tables. A raise is only ever written after the
//! lowers it pairs with were acknowledged by every live region and
//! confirmed by their gateways: a gateway still on the old, higher share
//! (not read yet, a read sent before the lowering landed, or a host too
//! busy to run its refresh) cannot coexist with a raised one, however late
//! it is. The raise comes the barrier (the gateways' refresh plus their
//! read timeout) after the last acknowledgement, as before confirmations
//! existed (a gateway too old to confirm is covered by that time), and
//! only if confirmed by then; else it waits for the next round (logged
//! and counted).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::config::{Config, RedisBackend, Spans};
use crate::epoch;
use crate::link::{CallError, Link};
use crate::round::{plan_round, GlobalRule};
use crate::status::{RoundReport, Status};
use rl_gateway::global::held_by_unreachable;
use rl_gateway::global::store::{parse_stored, MAX_EPOCH};
use rl_gateway::global::store::{Corrupt, Read};
use rl_gateway::global::WHOLE;
use rl_gateway::global::{RuleShares, ShareTable};

/// Why a balancer stopped.
#[derive(Debug)]
pub enum Stopped {
    /// A region holds a higher epoch (a newer balancer claimed it, or
    /// `--epoch` was below it): this one must not write again.
    Fenced(String),
    /// The configuration is wrong, or a region cannot be balanced (no
    /// module, no epoch left).
    Config(String),
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stopped::Fenced(e) | Stopped::Config(e) => write!(f, "{e}"),
        }
    }
}

/// What the balancer remembers of a region between rounds.
struct Region {
    link: Link,
    /// The highest table the region may hold: the last read, or the last
    /// write that may have landed.
    last: Option<ShareTable>,
    /// When this balancer last wrote (or tried to write) to it.
    last_write: Option<Instant>,
    /// Since when it has not been usable (unreachable or corrupt), and why.
    out: Option<(Instant, Out)>,
    down: bool,
    /// Whether this balancer's claim landed here once (until then
    /// `--take-over` applies).
    claimed: bool,
    /// Whether the server passed the backend check: it has the module,
    /// or the gateways run the Lua scripts (`--redis-backend lua`, or
    /// `auto` finding no module).
    checked: bool,
}

/// Why a region is not usable this round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out {
    Unreachable,
    Corrupt,
}

impl Out {
    fn text(self) -> &'static str {
        match self {
            Out::Unreachable => "unreachable",
            Out::Corrupt => "corrupt (its share table)",
        }
    }
}

/// One balancer: its regions, rules and epoch.
pub struct Balancer {
    config: Config,
    spans: Spans,
    regions: Vec<Region>,
    epoch: u64,
    started: Instant,
    status: Arc<Status>,
    reloads: (mpsc::UnboundedSender<Vec<GlobalRule>>, mpsc::UnboundedReceiver<Vec<GlobalRule>>),
}

/// Sends new rules to a running balancer: taken between two rounds if the
/// configuration with them passes the same checks as at the start, else
/// refused (logged and counted) and the rules in force stay.
#[derive(Clone, Debug)]
pub struct RuleReloads(mpsc::UnboundedSender<Vec<GlobalRule>>);

impl RuleReloads {
    /// Queues `rules` for the next pause between rounds.
    pub fn send(&self, rules: Vec<GlobalRule>) {
        let _ = self.0.send(rules);
    }
}

/// A region's answer to the first part of a round.
struct Visit {
    usage: Vec<(String, String, u64)>,
    read: Read,
    /// With `--take-over`, the epoch that was stored and replaced.
    replaced: Option<String>,
}

impl Balancer {
    /// Checks the configuration ([`Config::check`]: refused with every
    /// relation it breaks, warned about what only weakens it) and opens
    /// (lazily) a line to every region.
    pub fn new(config: Config) -> Result<Balancer, Stopped> {
        for warning in config.check().map_err(Stopped::Config)? {
            tracing::warn!("{warning}");
        }
        let spans = Spans::of(&config);
        let mut regions = Vec::with_capacity(config.regions.len());
        for (name, url) in &config.regions {
            let link = Link::new(name, url, &config.key, &config.tls, config.timeout, config.delay)
                .map_err(Stopped::Config)?;
            regions.push(Region {
                link,
                last: None,
                last_write: None,
                out: None,
                down: config.down.contains(name),
                claimed: false,
                checked: config.backend == RedisBackend::Lua,
            });
        }
        let status = Arc::new(Status::new(config.regions.len(), config.rules.len()));
        for (name, _) in &config.regions {
            status.backend(name, config.backend.name());
        }
        Ok(Balancer {
            epoch: config.epoch.unwrap_or(0),
            config,
            spans,
            regions,
            started: Instant::now(),
            status,
            reloads: mpsc::unbounded_channel(),
        })
    }

    /// Its rounds, regions, epoch and reloads, for `--metrics`.
    pub fn status(&self) -> Arc<Status> {
        self.status.clone()
    }

    /// A handle that sends it new rules while it runs (SIGHUP).
    pub fn rule_reloads(&self) -> RuleReloads {
        RuleReloads(self.reloads.0.clone())
    }

    /// Takes `rules` if the configuration with them passes the checks of
    /// [`Balancer::new`]; the regions, epoch and tables stay. A rule that
    /// left stops being written (its gateways fall back to the fixed split
    /// at stale_after); a new one starts from its default split.
    pub fn replace_rules(&mut self, rules: Vec<GlobalRule>) -> Result<(), String> {
        let mut config = self.config.clone();
        config.rules = rules;
        config.check()?;
        let count = config.rules.len();
        self.spans = Spans::of(&config);
        self.config = config;
        self.status.reloaded(Some(count));
        Ok(())
    }

    /// The epoch this balancer writes with (0 until the first round picks one).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Runs rounds every interval until `stop` resolves or a newer balancer
    /// takes over.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) -> Result<(), Stopped> {
        let mut ticks = tokio::time::interval(self.config.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return Ok(()),
                Some(rules) = self.reloads.1.recv() => {
                    let count = rules.len();
                    match self.replace_rules(rules) {
                        Ok(()) => tracing::info!(rules = count, "rules reloaded"),
                        Err(e) => {
                            self.status.reloaded(None);
                            tracing::error!("rules not reloaded, the rules in force stay: {e}");
                        }
                    }
                    continue;
                }
                _ = ticks.tick() => {}
            }
            let report = self.round().await?;
            self.status.round(&report);
            let versions: Vec<String> = report
                .versions
                .iter()
                .zip(&self.config.regions)
                .map(|(v, r)| format!("{}={}", r.0, v.map_or("-".into(), |v| v.to_string())))
                .collect();
            tracing::info!(
                epoch = report.epoch,
                ms = report.duration.as_millis() as u64,
                reached = report.reached.len(),
                of = self.regions.len(),
                versions = %versions.join(","),
                raised = report.raised,
                unconfirmed = report.unconfirmed_gateways,
                held = report.held.as_deref().unwrap_or("-"),
                "round"
            );
        }
    }

    /// One round. `Err` only when fenced off, misconfigured, or a region
    /// cannot be balanced (no module; no epoch left below the ceiling).
    pub async fn round(&mut self) -> Result<RoundReport, Stopped> {
        let start = Instant::now();
        let n = self.regions.len();
        self.check_modules().await?;
        if self.epoch == 0 {
            match self.pick_epoch().await? {
                Some(epoch) => self.epoch = epoch,
                None => {
                    let held =
                        "fewer than a majority of regions answered: the epoch is picked above every one they hold";
                    let report = RoundReport { versions: vec![None; n], held: Some(held.into()), ..Default::default() };
                    return Ok(self.finish(report, start));
                }
            }
        }
        // Claim, take usage, read: every region at once.
        let take_over: Vec<bool> = self.regions.iter().map(|r| self.config.take_over && !r.claimed).collect();
        let checked: Vec<bool> = self.regions.iter().map(|r| r.checked).collect();
        let visits = self.each_indexed(|r, link, epoch| {
            let (take_over, checked) = (take_over[r], checked[r]);
            async move {
                if !checked {
                    // Nothing is written before the module check answered.
                    return Err(CallError::Unreachable("no answer to the module check yet".into()));
                }
                let replaced = if take_over {
                    Some(link.take_over(epoch).await?)
                } else {
                    link.claim(epoch).await.map(|_| None)?
                };
                let usage = link.take_usage().await?;
                let read = link.read().await?;
                Ok(Visit { usage, read, replaced })
            }
        });
        let visits = visits.await;
        let mut report = RoundReport { epoch: self.epoch, versions: vec![None; n], ..Default::default() };
        let mut reached = vec![false; n];
        let mut usage = vec![Vec::new(); n];
        let mut current = vec![ShareTable::default(); n];
        // How long ago each table last changed: ramps in it have run that
        // much longer (an unreachable region's: counted as none, so its
        // ramps only ever run slower).
        let mut since_change = vec![Duration::ZERO; n];
        for (r, visit) in visits.into_iter().enumerate() {
            let epoch = self.epoch;
            let explicit = self.config.epoch.is_some();
            let region = &mut self.regions[r];
            match visit {
                Ok(v) => {
                    match region.out.take() {
                        Some((_, Out::Unreachable)) => {
                            tracing::warn!(region = %region.link.name, "region reachable again")
                        }
                        Some((_, Out::Corrupt)) => {
                            tracing::warn!(region = %region.link.name, "region's share table is readable again")
                        }
                        None => {}
                    }
                    if let Some(stored) = v.replaced.filter(|s| parse_stored(s).map_or(true, |e| e >= epoch)) {
                        tracing::warn!(region = %region.link.name, replaced = %stored, epoch, "epoch taken over (--take-over): the stored epoch is replaced by this balancer's");
                    }
                    region.claimed = true;
                    reached[r] = true;
                    report.reached.push(region.link.name.clone());
                    current[r] = in_force_bound(&v.read, &self.config, self.spans.aged_margin, r);
                    since_change[r] = v.read.since_change;
                    region.last = Some(v.read.table);
                    usage[r] = v.usage;
                }
                Err(CallError::Fenced(e)) if !region.claimed && explicit => {
                    return Err(Stopped::Fenced(format!(
                        "--{e} in force in region {}: a balancer with a higher epoch runs or ran; leave --epoch out to pick one above it (or, if no other balancer runs, add --take-over)",
                        region.link.name
                    )))
                }
                Err(CallError::Fenced(e)) => return Err(fenced(&region.link.name, &e)),
                Err(CallError::Corrupt(c)) => {
                    region.out.get_or_insert((start, Out::Corrupt)).1 = Out::Corrupt;
                    warn_corrupt(&region.link.name, &c);
                    current[r] = region.last.clone().unwrap_or_default();
                }
                Err(CallError::Unreachable(e)) => {
                    let since = region.out.get_or_insert((start, Out::Unreachable));
                    since.1 = Out::Unreachable;
                    let for_ms = since.0.elapsed().as_millis() as u64;
                    tracing::warn!(region = %region.link.name, error = %e, for_ms, "region unreachable");
                    current[r] = region.last.clone().unwrap_or_default();
                }
            }
        }
        if reached.iter().filter(|&&x| x).count() * 2 <= n {
            // Without a majority this balancer may be the cut-off one:
            // write nothing, let the tables age.
            report.held = Some("fewer than a majority of regions reached".into());
            return Ok(self.finish(report, start));
        }
        let live: Vec<bool> = (0..n).map(|r| reached[r] && !self.regions[r].down).collect();
        let mut budgets = BTreeMap::new();
        for rule in &self.config.rules {
            match self.budget(rule, &reached) {
                Ok(b) => {
                    budgets.insert(rule.id.clone(), b);
                }
                Err(why) => {
                    report.held = Some(why);
                }
            }
        }
        let tables = if report.held.is_some() {
            // Rewrite what the gateways may enforce (an aged table bounded
            // by the fixed split, so the heartbeat raises nobody): no change.
            (current.clone(), current.clone())
        } else {
            let mut lower = vec![ShareTable::default(); n];
            let mut raise = vec![ShareTable::default(); n];
            for rule in &self.config.rules {
                let t = plan_round(
                    std::slice::from_ref(rule),
                    &usage,
                    &current,
                    &since_change,
                    &live,
                    budgets[&rule.id],
                    self.config.busiest,
                );
                for r in 0..n {
                    lower[r].rules.extend(t.lower[r].rules.clone());
                    raise[r].rules.extend(t.raise[r].rules.clone());
                }
            }
            (lower, raise)
        };
        let (lower, raise) = tables;
        // Phase one: the lowered tables to every reachable region (a region
        // asserted down gets its zeros here and is live from the next round).
        // A held round must not refresh a down region's old table.
        let held = report.held.is_some();
        let to: Vec<bool> = (0..n).map(|r| reached[r] && !(held && self.regions[r].down)).collect();
        let acked = self.write_all(&lower, &to, &mut report).await?;
        for (region, &acked) in self.regions.iter_mut().zip(&acked) {
            if acked && region.down {
                tracing::warn!(region = %region.link.name, "region asserted down is reachable: written 0 shares, it starts from the floor next round");
                region.down = false;
            }
        }
        let raises = (0..n).any(|r| live[r] && raise[r] != lower[r]);
        if raises && (0..n).all(|r| !live[r] || acked[r]) {
            match self.confirm(&report.versions, &acked).await {
                Ok(()) => {
                    self.write_all(&raise, &live, &mut report).await?;
                    report.raised = true;
                }
                Err((why, gateways)) => {
                    tracing::warn!(gateways, "raise waits for the next round: {why}");
                    (report.unconfirmed, report.unconfirmed_gateways) = (Some(why), gateways);
                }
            }
        }
        Ok(self.finish(report, start))
    }

    /// Waits the barrier, and answers whether every gateway of each region
    /// in `written` confirmed the version written there (`versions`)
    /// within it: `Err` names what still waits (and how many gateways). A poll is
    /// sent every quarter of the gateways' refresh without waiting for the
    /// last one's answer (each carries the call's latency), so a
    /// confirmation is seen a quarter refresh after it lands; a region
    /// seen confirmed once stays confirmed (versions only grow).
    async fn confirm(&self, versions: &[Option<u64>], written: &[bool]) -> Result<(), (String, usize)> {
        let deadline = tokio::time::Instant::now() + self.spans.barrier;
        let expiry = self.config.stale_after.saturating_add(self.config.settle);
        let pace = (self.config.gateway_refresh / 4).max(Duration::from_millis(5));
        let mut waiting: Vec<Option<(String, usize)>> = (0..versions.len())
            .map(|r| {
                let name = &self.regions[r].link.name;
                versions[r]
                    .filter(|_| written[r])
                    .map(|v| (format!("region {name}: no confirmation of version {v} read yet"), 0))
            })
            .collect();
        let mut polls = JoinSet::new();
        let mut next_poll = tokio::time::Instant::now() + pace;
        loop {
            if waiting.iter().all(Option::is_none) {
                // Never before the barrier: a gateway too old to confirm
                // (or whose ACL refuses it) is covered by the time it had.
                tokio::time::sleep_until(deadline).await;
                return Ok(());
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = tokio::time::sleep_until(next_poll) => {
                    next_poll += pace;
                    for (r, region) in self.regions.iter().enumerate() {
                        if waiting[r].is_some() {
                            let link = region.link.clone();
                            polls.spawn(async move { (r, link.confirmations(expiry).await) });
                        }
                    }
                }
                Some(Ok((r, answer))) = polls.join_next(), if !polls.is_empty() => {
                    let (Some(version), name) = (versions[r], &self.regions[r].link.name) else { continue };
                    if waiting[r].is_none() {
                        continue;
                    }
                    waiting[r] = match answer {
                        Ok(reports) => {
                            let late = crate::confirm::unconfirmed(&reports, version, expiry);
                            (!late.is_empty()).then(|| (crate::confirm::describe(name, version, &late), late.len()))
                        }
                        Err(e) => Some((format!("region {name}: its gateways' confirmations not read: {e}"), 0)),
                    };
                }
            }
        }
        let still: Vec<&(String, usize)> = waiting.iter().flatten().collect();
        Err((still.iter().map(|w| w.0.as_str()).collect::<Vec<_>>().join("; "), still.iter().map(|w| w.1).sum()))
    }

    fn finish(&self, mut report: RoundReport, start: Instant) -> RoundReport {
        report.duration = start.elapsed();
        report.tables = self.regions.iter().map(|r| r.last.clone()).collect();
        report
    }

    /// Writes `tables[r]` to every region with `to[r]`, at once; answers
    /// which acknowledged. A failed write may have landed: the region is
    /// assumed to hold the higher of the two tables.
    async fn write_all(
        &mut self,
        tables: &[ShareTable],
        to: &[bool],
        report: &mut RoundReport,
    ) -> Result<Vec<bool>, Stopped> {
        let tables_for_tasks = tables.to_vec();
        let to_for_tasks = to.to_vec();
        let results = self
            .each_indexed(move |r, link, epoch| {
                let table = tables_for_tasks[r].clone();
                let write = to_for_tasks[r];
                async move {
                    if write {
                        link.write(epoch, table).await.map(Some)
                    } else {
                        Ok(None)
                    }
                }
            })
            .await;
        let mut acked = vec![false; tables.len()];
        for (r, result) in results.into_iter().enumerate() {
            let region = &mut self.regions[r];
            if !to[r] {
                continue;
            }
            region.last_write = Some(Instant::now());
            match result {
                Ok(version) => {
                    acked[r] = true;
                    report.versions[r] = version;
                    region.last = Some(tables[r].clone());
                }
                Err(CallError::Fenced(e)) => return Err(fenced(&region.link.name, &e)),
                // Refused before any write: the region holds what it held.
                Err(CallError::Corrupt(c)) => warn_corrupt(&region.link.name, &c),
                Err(CallError::Unreachable(e)) => {
                    tracing::warn!(region = %region.link.name, error = %e, "write failed (it may have landed)");
                    let last = region.last.take().unwrap_or_default();
                    region.last = Some(higher(&last, &tables[r]));
                }
            }
        }
        Ok(acked)
    }

    /// The part of `rule` the reachable regions may share: the whole less
    /// what each unreachable region may still hold (0 for a region asserted
    /// down). `Err`: hold this round (within the grace, or a region never
    /// seen whose table could still be in force).
    fn budget(&self, rule: &GlobalRule, reached: &[bool]) -> Result<u32, String> {
        let fixed = rule.split.default_split();
        let mut budget = WHOLE;
        for (r, region) in self.regions.iter().enumerate() {
            if reached[r] || region.down {
                continue;
            }
            let (out_since, why) = region.out.map_or((Duration::ZERO, Out::Unreachable), |(s, why)| (s.elapsed(), why));
            if out_since < self.config.grace {
                return Err(format!("region {} {} for less than --grace", region.link.name, why.text()));
            }
            // A write before this balancer started is older than its start.
            let since = region.last_write.unwrap_or(self.started).elapsed();
            let lag = self.spans.unreachable_lag;
            let gone = self.config.stale_after.saturating_add(self.config.settle).saturating_add(lag);
            let held = match &region.last {
                Some(table) => held_in(table, &rule.id, fixed[r], |last| {
                    held_by_unreachable(last, fixed[r], since, self.config.stale_after, self.config.settle, lag)
                }),
                None if since >= gone => fixed[r],
                None => {
                    return Err(format!(
                        "region {} never read: its table may be in force until {:?} after start",
                        region.link.name, gone
                    ))
                }
            };
            budget = budget.saturating_sub(held);
        }
        Ok(budget)
    }

    /// Epoch: `--epoch`, or above every epoch the regions hold, with random
    /// low bits so two balancers starting together do not pick the same.
    /// `None` until a majority answered (a minority may not hold the
    /// highest). A corrupt epoch is left to the claims to report.
    async fn pick_epoch(&self) -> Result<Option<u64>, Stopped> {
        if let Some(epoch) = self.config.epoch {
            return Ok(Some(epoch));
        }
        let epochs = self.each(|link, _| async move { link.epoch().await }).await;
        let answered = epochs.iter().filter(|e| !matches!(e, Err(CallError::Unreachable(_)))).count();
        if answered * 2 <= self.regions.len() {
            return Ok(None);
        }
        let (highest, at) = epochs
            .iter()
            .zip(&self.regions)
            .filter_map(|(e, region)| e.as_ref().ok().map(|&e| (e, region.link.name.as_str())))
            .max()
            .unwrap_or((0, "-"));
        match epoch::next_above(highest) {
            Some(epoch) => Ok(Some(epoch)),
            None if self.config.take_over => {
                tracing::warn!(highest, region = %at, "no epoch left above the highest: --take-over starts over from the bottom");
                Ok(Some(epoch::from_the_bottom()))
            }
            None => Err(Stopped::Config(format!(
                "no epoch is left above {highest}, the epoch in force in region {at} (the ceiling is {MAX_EPOCH}; only an epoch given by hand gets this high): if no other balancer runs, restart with --take-over, which starts the epochs over from the bottom"
            ))),
        }
    }

    /// Every region first reached is checked for the module (its gateways
    /// enforce shares with it) before anything is written there; with
    /// `--redis-backend auto` a region without it is taken, and logged:
    /// its gateways must run the Lua scripts (never a silent fallback).
    async fn check_modules(&mut self) -> Result<(), Stopped> {
        if self.regions.iter().all(|r| r.checked) {
            return Ok(());
        }
        let checked: Vec<bool> = self.regions.iter().map(|r| r.checked).collect();
        let answers = self
            .each_indexed(|r, link, _| {
                let checked = checked[r];
                async move {
                    if checked {
                        Ok(true)
                    } else {
                        link.has_module().await
                    }
                }
            })
            .await;
        for (region, answer) in self.regions.iter_mut().zip(answers) {
            match answer {
                Ok(true) => {
                    region.checked = true;
                    self.status.backend(&region.link.name, RedisBackend::Module.name());
                }
                Ok(false) if self.config.backend == RedisBackend::Auto => {
                    tracing::warn!(
                        region = %region.link.name,
                        server = %region.link.address(),
                        "no redis-rl module there (--redis-backend auto): its gateways must enforce their shares with rl-client's Lua scripts (backend = \"lua\")"
                    );
                    region.checked = true;
                    self.status.backend(&region.link.name, RedisBackend::Lua.name());
                }
                Ok(false) => {
                    return Err(Stopped::Config(format!(
                        "region {} ({}): the server has no redis-rl module (RL.INSPECT is an unknown command there), so its gateways cannot enforce shares in it: load the module there (loadmodule /path/to/libredis_rl.so), run its gateways on the Lua scripts (backend = \"lua\") with --redis-backend lua or auto, or leave the region out of --region and of the rules",
                        region.link.name,
                        region.link.address()
                    )))
                }
                // Unreachable or worse: checked when it answers.
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Runs `f` on every region at once; answers in the regions' order.
    async fn each<T, F, Fut>(&self, f: F) -> Vec<Result<T, CallError>>
    where
        T: Send + 'static,
        F: Fn(Link, u64) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>> + Send + 'static,
    {
        self.each_indexed(|_, link, epoch| f(link, epoch)).await
    }

    async fn each_indexed<T, F, Fut>(&self, f: F) -> Vec<Result<T, CallError>>
    where
        T: Send + 'static,
        F: Fn(usize, Link, u64) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>> + Send + 'static,
    {
        let mut set = JoinSet::new();
        for (r, region) in self.regions.iter().enumerate() {
            let call = f(r, region.link.clone(), self.epoch);
            set.spawn(async move { (r, call.await) });
        }
        let mut out: Vec<Option<Result<T, CallError>>> = (0..self.regions.len()).map(|_| None).collect();
        while let Some(joined) = set.join_next().await {
            let (r, result) = joined.expect("a region task does not panic");
            out[r] = Some(result);
        }
        out.into_iter().map(|o| o.expect("every region answered")).collect()
    }
}

/// What a region's gateways may enforce with this table read: the table
/// itself while it is fresh; once it is old enough (within `margin`,
/// [`Spans::aged_margin`], of `stale_after`) that gateways may have fallen
/// back before the lowering lands, the smaller of it and the fixed split
/// (a phase-one write must not raise a gateway that already fell back).
fn in_force_bound(read: &Read, config: &Config, margin: Duration, r: usize) -> ShareTable {
    if read.age.saturating_add(margin) < config.stale_after {
        return read.table.clone();
    }
    let mut table = ShareTable::default();
    for rule in &config.rules {
        let fixed = rule.split.default_split()[r];
        // A rule missing from the table: its gateways are on the fixed split.
        let mut shares =
            read.table.rules.get(&rule.id).cloned().unwrap_or(RuleShares { default: fixed, ..Default::default() });
        shares.default = shares.default.min(fixed);
        for s in shares.subjects.values_mut() {
            s.share = s.share.min(fixed);
            s.from = s.from.min(s.share);
        }
        table.rules.insert(rule.id.clone(), shares);
    }
    table
}

/// A newer balancer's claim refused this one's in `region`.
fn fenced(region: &str, e: &str) -> Stopped {
    Stopped::Fenced(format!("another balancer with a higher epoch took over in region {region} ({e}); this one stops"))
}

/// A corrupt share table, reported as what it is, with what to do.
fn warn_corrupt(region: &str, c: &Corrupt) {
    let remedy = if c.field == "epoch" {
        "this balancer cannot fence the region and leaves it alone; if no other balancer runs, restart with --take-over to claim it over the stored value".to_string()
    } else {
        format!(
            "the balancer leaves the region alone: its gateways keep their last table, then fall back to the fixed split after --stale-after; once they have, repair it with HDEL {} {} (the next write rewrites it)",
            c.key, c.field
        )
    };
    tracing::warn!(region = %region, "{c}; {remedy}");
}

/// The most `held` gives over every share of `rule` in `table` (its
/// default and each subject's), or over the fixed split when the table
/// does not have the rule.
fn held_in(table: &ShareTable, rule: &str, fixed: u32, held: impl Fn(u32) -> u32) -> u32 {
    match table.rules.get(rule) {
        None => held(fixed),
        Some(r) => r.subjects.values().map(|s| held(s.share)).chain([held(r.default)]).max().unwrap_or(0),
    }
}

/// Share by share, the higher of two tables.
fn higher(a: &ShareTable, b: &ShareTable) -> ShareTable {
    let mut out = a.clone();
    for (rule, theirs) in &b.rules {
        let ours = out.rules.entry(rule.clone()).or_insert_with(|| theirs.clone());
        let base = ours.default;
        // Subjects only `a` names follow `b`'s default there.
        for (subject, s) in ours.subjects.iter_mut() {
            if !theirs.subjects.contains_key(subject) {
                s.share = s.share.max(theirs.default);
            }
        }
        ours.default = ours.default.max(theirs.default);
        for (subject, s) in &theirs.subjects {
            let mine = ours.subjects.entry(subject.clone()).or_insert(rl_gateway::global::Share::steady(base));
            mine.share = mine.share.max(s.share);
            mine.from = mine.from.min(s.from);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::config;
    use rl_gateway::global::Share;

    fn table(default: u32, acme: Option<u32>) -> ShareTable {
        let mut t = ShareTable::default();
        let mut r = RuleShares { default, ..Default::default() };
        if let Some(s) = acme {
            r.subjects.insert("acme".into(), Share::steady(s));
        }
        t.rules.insert("api".into(), r);
        t
    }

    #[test]
    fn an_aged_table_is_bounded_by_the_fixed_split() {
        let c = config();
        let read = |age_s| Read {
            version: 1,
            epoch: Ok(1),
            table: table(200_000, Some(900_000)),
            age: Duration::from_secs(age_s),
            since_change: Duration::from_secs(age_s),
        };
        let margin = Spans::of(&c).aged_margin;
        assert_eq!(in_force_bound(&read(5), &c, margin, 0), table(200_000, Some(900_000)));
        assert_eq!(in_force_bound(&read(290), &c, margin, 0), table(200_000, Some(333_333)));
        let never = Read { table: ShareTable::default(), ..read(u32::MAX as u64) };
        assert_eq!(in_force_bound(&never, &c, margin, 0), table(333_333, None), "no table: the fixed split");
        // Calls slower than the interval: the read, the round's other
        // calls and the lowering (four calls) may all come before a
        // gateway falls back.
        let mut c = config();
        (c.interval, c.timeout, c.stale_after) =
            (Duration::from_millis(200), Duration::from_millis(400), Duration::from_secs(3));
        let margin = Spans::of(&c).aged_margin;
        let read_ms = |age_ms| Read { age: Duration::from_millis(age_ms), ..read(0) };
        assert_eq!(in_force_bound(&read_ms(1100), &c, margin, 0), table(200_000, Some(900_000)));
        assert_eq!(
            in_force_bound(&read_ms(1300), &c, margin, 0),
            table(200_000, Some(333_333)),
            "1.3 s + 4 x 400 ms reach 3 s"
        );
    }

    #[test]
    fn higher_takes_each_share_at_its_highest() {
        let h = higher(&table(300_000, Some(100_000)), &table(200_000, Some(700_000)));
        assert_eq!(h.rules["api"].default, 300_000);
        assert_eq!(h.rules["api"].subjects["acme"].share, 700_000);
        let with_new = higher(&table(300_000, None), &table(100_000, Some(50_000)));
        assert_eq!(with_new.lookup("api", "acme").unwrap().share, 300_000, "a new entry never lowers the default");
        assert_eq!(held_in(&table(300_000, Some(600_000)), "api", 333_333, |s| s), 600_000);
        assert_eq!(held_in(&ShareTable::default(), "api", 333_333, |s| s), 333_333);
    }

    #[test]
    fn bad_configurations_are_refused_with_the_reason() {
        let mut c = config();
        c.down.insert("mars".into());
        assert!(Balancer::new(c).err().unwrap().to_string().contains("--down mars: no such region"));
        let mut c = config();
        c.regions[0].1 = "nonsense://me:secret@host".into();
        let e = Balancer::new(c).err().unwrap().to_string();
        assert!(e.contains("region eu: bad Redis URL") && !e.contains("secret"), "{e}");
    }
}
