//! What decides a group when Redis cannot: a fail-closed rule refuses; the
//! others limit locally at this gateway's share of the limit times the
//! slack (one token at least; a window whose share is below one token
//! refuses). The bounds are in `fallback.rs` and the crate README.

use rl_client::{Decision, Source};
use rl_core::limits::MAX_TOKENS;

use super::evaluate::Evaluation;
use super::Limiter;
use crate::fallback::{Answer, Scale};
use crate::metrics::Event;

impl Limiter {
    /// Redis could not answer `t`.
    ///
    /// While the shard's breaker is closed, Redis answers other calls and
    /// may admit the whole limit itself (and a call that timed out may have
    /// taken its tokens there too): the fallback then allows `slack - 1`
    /// times the share, so the fleet stays within `slack` x the limit. With
    /// the breaker open it allows `slack` x the share, after the subject's
    /// refusal in the deny cache, which the fallback's entry keeps (a check
    /// during an outage comes here without asking the deny cache).
    pub(super) fn degraded(&self, t: &Evaluation, cost: u64, now: u64) -> Decision {
        let i = &self.inner;
        let closed = |local: usize| {
            i.record(Event::Fallback, t.prefix(), None);
            let open_for = i.config().connection.breaker_open_for;
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
        let slack = i.config().fallback_slack;
        let full = i.breaker_refuses(t.subject, now);
        let scale = Scale {
            rules: &t.group.params,
            window: t.group.window.is_some(),
            slack: if full { slack } else { slack - 1.0 },
            full,
            gateways: i.gateways(),
            policy: t.prefix(),
        };
        match i.local_take(&t.key(), &scale, cost.min(MAX_TOKENS), now, full) {
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
}
