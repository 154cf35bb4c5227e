//! Live rules behind rl-gateway's http tower layer (feature `tower`): a request
//! with an API key is checked by the rule its key matches, a request
//! without one by the rule its address matches; a rule with
//! `ip_tier = "all"` limits keyed requests by their address too. The
//! matched rules' in-flight limits are held for the life of the response.

use std::sync::Arc;
use std::time::SystemTime;

use crate::http::headers::View;
use crate::http::{BoxFuture, Checked, Decide, Decided, Facts, InflightChecked};
use crate::{Check, Error, Limiter, Result};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;

use crate::live::regional::{refusal, Scaled};
use crate::live::rules::LiveRules;
use crate::live::snapshot::{CompiledRule, Request};
use crate::live::spec::IpTier;

/// [`LiveRules`] as a [`Decide`] for `RateLimitLayer`.
///
/// A request with an API key is seen as its key (`Request::subject`), one
/// without as its client address (`Request::ip`), both with its endpoint
/// (the route template where the framework has one). A keyed request is
/// also seen by its address when the rule its address matches says
/// `ip_tier = "all"` (the keys behind one address then share its buckets).
/// The most specific rule of each view applies (overrides and shadow rules
/// as in [`LiveRules::check`]); when both views land on the same rule and
/// the same buckets (a shared rule), it counts once. The rates are decided
/// in one [`Limiter::check_batch`]: from memory where it can, else one
/// round trip per shard, all or nothing; then, if every rate allowed, the
/// rules' in-flight limits are taken and held until the response is done.
/// Header members carry the view (`"key.<rule id>.<limit>"`,
/// `"ip.<rule id>.<limit>"`), so one rule reached through both views names
/// two distinct members.
#[derive(Clone)]
pub struct LiveDecide {
    rules: LiveRules,
    /// Room for requests' shadow checks running in the background.
    shadow_slots: Arc<Semaphore>,
}

/// Shadow checks in the background at once, at most. While Redis is slow
/// they pile up (each lasts up to the call timeout); beyond this many, a
/// request waits for its own, as every request did before they moved to
/// the background: the pile stops growing.
const SHADOW_IN_FLIGHT: usize = 1024;

impl LiveDecide {
    /// Decides with `rules`.
    pub fn new(rules: LiveRules) -> LiveDecide {
        LiveDecide { rules, shadow_slots: Arc::new(Semaphore::new(SHADOW_IN_FLIGHT)) }
    }

    /// At most `checks` shadow checks in the background at once (default
    /// 1,024); beyond them a request waits for its own.
    pub fn shadow_in_flight(self, checks: usize) -> LiveDecide {
        LiveDecide { shadow_slots: Arc::new(Semaphore::new(checks)), ..self }
    }
}

/// Asks the shadow rules of an allowed request. What they would have said
/// is only reported, so this runs in the background where it can (see
/// [`SHADOW_IN_FLIGHT`]), and a shadow rule that cannot be asked never fails
/// a request.
async fn shadow_checks(rules: LiveRules, shadows: Vec<(Arc<CompiledRule>, String)>, cost: u64) {
    for (rule, subject) in shadows {
        match rules.regional().shadow_refusal(rules.limiter(), &rule, &subject, cost).await {
            Ok(Some(limit)) => rules.log_shadow(&rule, limit, &subject),
            Ok(None) => {}
            Err(e) => tracing::debug!(target: "rl_rules", rule = rule.id(), error = %e, "shadow rule not asked"),
        }
    }
}

/// One view of a request and what it matched.
struct Viewed {
    view: View,
    rule: Arc<CompiledRule>,
    subject: String,
    shadow: Option<(Arc<CompiledRule>, String)>,
}

impl LiveDecide {
    /// The views of a request, each with the rule it matches and that
    /// rule's bucket subject, in one snapshot: its API key, and its
    /// address when it has no key or the rule its address matches says
    /// `ip_tier = "all"`. The same rule and buckets reached through both
    /// views count once.
    fn views(&self, facts: &Facts) -> Result<Vec<Viewed>> {
        let route = facts.route.as_str();
        let mut requests = Vec::with_capacity(2);
        if let Some(key) = facts.key.as_deref() {
            requests.push((View::Key, Request::new().subject(key).endpoint(route)));
        }
        if let Some(ip) = facts.ip {
            requests.push((View::Ip, Request::new().ip(ip).endpoint(route)));
        }
        if requests.is_empty() {
            return Err(Error::invalid("live rules need an API key or a client address: the request has neither"));
        }
        let snapshot = self.rules.snapshot();
        let now = SystemTime::now();
        let mut views: Vec<Viewed> = Vec::with_capacity(requests.len());
        for (view, request) in requests {
            let matched = snapshot.matching(&request, now);
            // A keyed request is limited by its key's rules, unless the
            // rule its address matches is an IP tier for every request.
            if view == View::Ip && facts.key.is_some() && matched.enforced.ip_tier() != IpTier::All {
                continue;
            }
            let subject = snapshot.bucket_subject(&matched.enforced, &request)?;
            if views.iter().any(|v| v.rule.id() == matched.enforced.id() && v.subject == subject) {
                continue;
            }
            // A shadow rule never fails a request: without a subject of
            // its own it is skipped.
            let shadow = matched.shadow.and_then(|r| snapshot.bucket_subject(&r, &request).ok().map(|s| (r, s)));
            views.push(Viewed { view, rule: matched.enforced, subject, shadow });
        }
        Ok(views)
    }
}

impl Decide for LiveDecide {
    fn decide(&self, facts: Facts) -> BoxFuture<Result<Decided>> {
        // What each view matched is found before the future is made: it
        // carries only the views and the cost, so its box stays small.
        let views = match self.views(&facts) {
            Ok(views) => views,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let (rules, cost, shadow_slots) = (self.rules.clone(), facts.cost, self.shadow_slots.clone());
        Box::pin(async move {
            let limiter = rules.limiter();
            let regional = rules.regional();
            // The views whose rule has rates (a rule may be in-flight only).
            let rated: Vec<&Viewed> = views.iter().filter(|v| v.rule.has_rates()).collect();
            // A global rule is checked at this region's share of it.
            let scaled = rated.iter().map(|v| regional.scaled(&v.rule, &v.subject)).collect::<Result<Vec<_>>>()?;
            let decisions = if scaled.iter().any(|s| matches!(s, Scaled::Refused)) {
                // A share here worth less than one token refuses the
                // request: nothing else is charged (all or nothing).
                rated.iter().zip(&scaled).map(|(v, s)| matches!(s, Scaled::Refused).then(|| refusal(&v.rule))).collect()
            } else {
                let checks: Vec<Check> = rated
                    .iter()
                    .zip(&scaled)
                    .filter_map(|(v, s)| Some(Check { policy: s.policy()?, subject: &v.subject, cost }))
                    .collect();
                limiter.check_batch(&checks).await?
            };
            let allowed = decisions.iter().all(|d| d.is_some_and(|d| d.allowed));
            let mut checked = Vec::with_capacity(rated.len());
            let mut shadows = Vec::new();
            for ((v, decision), scaled) in rated.iter().zip(decisions).zip(scaled) {
                if decision.is_some() {
                    regional.demanded(&v.rule, &v.subject, cost);
                }
                // A global rule announces what this region enforces: its
                // share, which `r` counts down from.
                let policy = match scaled {
                    Scaled::Regional(policy) => policy,
                    _ => v.rule.headers().clone(),
                };
                // Undecided (another view refused from memory first), it is
                // still announced: the same members on every response.
                checked.push(Checked { policy, decision, view: Some(v.view) });
            }
            // Only an allowed request is one a shadow rule would have changed.
            if allowed {
                shadows.extend(views.iter().filter_map(|v| v.shadow.clone()));
            }
            let inflight = if allowed { acquire_all(limiter, &views, cost).await? } else { not_asked(&views) };
            if !shadows.is_empty() {
                let checks = shadow_checks(rules.clone(), shadows, cost);
                match (Handle::try_current(), shadow_slots.try_acquire_owned()) {
                    (Ok(runtime), Ok(slot)) => {
                        runtime.spawn(async move {
                            checks.await;
                            drop(slot);
                        });
                    }
                    // No room (Redis slow) or no runtime to spawn on: here.
                    _ => checks.await,
                }
            }
            Ok(Decided { checked, inflight })
        })
    }

    fn limiter(&self) -> &Limiter {
        self.rules.limiter()
    }
}

/// The in-flight slots of every view's rule, in order, once every rate
/// allowed the request; after a refusal the rest are not asked (the slots
/// taken go back as their permits drop with the refusal).
async fn acquire_all(limiter: &Limiter, views: &[Viewed], cost: u64) -> Result<Vec<InflightChecked>> {
    let mut out = Vec::new();
    let mut refused = false;
    for v in views {
        let Some(headers) = v.rule.inflight_headers() else { continue };
        let outcome = if refused {
            None
        } else {
            let outcome = limiter.acquire_cost(headers.policy(), &v.subject, cost).await?;
            refused = outcome.is_err();
            Some(outcome)
        };
        out.push(InflightChecked { policy: headers.clone(), view: Some(v.view), outcome });
    }
    Ok(out)
}

/// The in-flight limits of a request a rate refused: announced, not asked.
fn not_asked(views: &[Viewed]) -> Vec<InflightChecked> {
    views
        .iter()
        .filter_map(|v| {
            let headers = v.rule.inflight_headers()?;
            Some(InflightChecked { policy: headers.clone(), view: Some(v.view), outcome: None })
        })
        .collect()
}
