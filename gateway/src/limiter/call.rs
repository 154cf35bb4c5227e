//! A call to Redis through its shard's breaker: asked before the call is
//! built (a refusal costs no keys and no command), and told how it went.
//! Every path that calls Redis (checks, batches, leases, permits,
//! adjustments) goes this way.

use std::future::Future;

use rl_client::{Error, Result};

use super::inner::Admitted;
use super::Limiter;
use crate::metrics::Event;

impl Limiter {
    /// Whether this check may call `subject`'s shard: not once a call of
    /// the check failed there, nor while its breaker is open (which counts
    /// as a failure of the shard for the check's other groups).
    pub(super) fn admit(&self, subject: &str, now: u64, shard_down: &mut bool) -> Option<Admitted> {
        if *shard_down {
            return None;
        }
        let admitted = self.inner.admit_call(subject, now);
        *shard_down = admitted.is_none();
        admitted
    }

    /// Runs `call`, which the shard's breaker admitted, and tells the
    /// breaker how it went.
    pub(super) async fn guarded<T>(
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
    pub(super) fn report(&self, policy: &str, admitted: Admitted, failure: Option<&Error>) {
        let i = &self.inner;
        let (breaker, ticket) = admitted;
        match failure {
            None => breaker.success(ticket, i.now_ms()),
            Some(e) => {
                i.record(Event::Error, policy, None);
                if !e.is_shard_failure() {
                    // The shard answered; the call was at fault.
                    i.record(Event::ServerRefused, policy, None);
                    breaker.success(ticket, i.now_ms());
                } else if breaker.failure(ticket, i.now_ms()) {
                    i.record(Event::BreakerOpened, policy, None);
                }
            }
        }
    }
}
