//! Live rules behind rl-client's tower layer (feature `tower`): every
//! request is checked by the rule its API key matches and by the rule its
//! address matches, each with its own buckets, so sending a key does not
//! escape the limit on the address, nor the other way round.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::SystemTime;

use rl_client::{BoxFuture, Checked, Decide, Error, Facts, Limiter, Policy, Result, Source};

use crate::live::LiveRules;
use crate::snapshot::{CompiledRule, Request};

impl AsRef<Policy> for CompiledRule {
    fn as_ref(&self) -> &Policy {
        self.policy()
    }
}

/// [`LiveRules`] as a [`Decide`] for `RateLimitLayer`.
///
/// A request is seen twice: as its API key (`Request::subject`) and as its
/// client address (`Request::ip`), both with its endpoint. The most
/// specific rule of each view applies (overrides and shadow rules as in
/// [`LiveRules::check`]); when both views land on the same rule and the
/// same buckets (a shared rule), it counts once. All are charged, or, on a
/// refusal, the ones charged before it get their tokens back.
#[derive(Clone)]
pub struct LiveDecide {
    rules: LiveRules,
}

impl LiveDecide {
    /// Decides with `rules`.
    pub fn new(rules: LiveRules) -> LiveDecide {
        LiveDecide { rules }
    }
}

impl Decide for LiveDecide {
    fn decide(&self, facts: Facts) -> BoxFuture<Result<Vec<Checked>>> {
        let rules = self.rules.clone();
        Box::pin(async move {
            let route = facts.route.as_str();
            let mut views = Vec::with_capacity(2);
            if let Some(key) = facts.key.as_deref() {
                views.push(Request::new().subject(key).endpoint(route));
            }
            if let Some(ip) = facts.ip {
                views.push(Request::new().ip(ip).endpoint(route));
            }
            if views.is_empty() {
                return Err(Error::invalid("live rules need an API key or a client address: the request has neither"));
            }
            // The same rule and buckets through both views count once.
            let snapshot = rules.snapshot();
            let mut seen = HashSet::new();
            let now = SystemTime::now();
            views.retain(|view| {
                let rule = snapshot.matching(view, now).enforced;
                let subject = snapshot.bucket_subject(&rule, view).unwrap_or_default();
                seen.insert((rule.id().to_owned(), subject))
            });
            let limiter = rules.limiter();
            let mut out: Vec<Checked> = Vec::with_capacity(views.len());
            let mut charged = Vec::with_capacity(views.len());
            for view in &views {
                let verdict = rules.check_cost(view, facts.cost).await?;
                let allowed = verdict.decision.allowed;
                if allowed && matches!(verdict.decision.source, Source::Redis | Source::Lease) {
                    charged.push((verdict.rule.clone(), verdict.subject.clone()));
                }
                out.push(Checked {
                    policy: verdict.rule as Arc<dyn AsRef<Policy> + Send + Sync>,
                    decision: verdict.decision,
                });
                if !allowed {
                    for (rule, subject) in &charged {
                        if !rule.policy().rules().iter().all(|r| r.window_mode().is_some()) {
                            let _ = limiter.refund(rule.policy(), subject, facts.cost).await;
                        }
                    }
                    break;
                }
            }
            Ok(out)
        })
    }

    fn limiter(&self) -> &Limiter {
        self.rules.limiter()
    }
}
