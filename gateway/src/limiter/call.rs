//! A call to Redis through its shard's breaker: asked before the call is
//! built (a refusal costs no keys and no command), and told how it went.
//! Every path that calls Redis (checks, batches, leases, permits,
//! adjustments) goes this way.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
                    name_a_missing_module(e, i.now_ms());
                    breaker.success(ticket, i.now_ms());
                } else if breaker.failure(ticket, i.now_ms()) {
                    i.record(Event::BreakerOpened, policy, None);
                }
            }
        }
    }
}

/// A refusal that says the command is unknown means the limiter's Redis has
/// no redis-rl module: said as such (once a minute at most, for the whole
/// process), since the rules then all follow their failure modes.
fn name_a_missing_module(e: &Error, now_ms: u64) {
    static LAST_SAID_MS: AtomicU64 = AtomicU64::new(0);
    let text = e.to_string();
    if !text.contains("unknown command") {
        return;
    }
    let last = LAST_SAID_MS.load(Relaxed);
    if last != 0 && now_ms.saturating_sub(last) < 60_000 {
        return;
    }
    if LAST_SAID_MS.compare_exchange(last, now_ms.max(1), Relaxed, Relaxed).is_err() {
        return;
    }
    tracing::error!(
        target: "rl_gateway",
        error = %text,
        "the limiter's Redis does not know the redis-rl commands: the module is not loaded there. Load it \
         (loadmodule), or on a Redis that cannot load modules use the Lua backend (Config::backend = \
         Backend::Lua; RL_BACKEND=lua for the example gateway). Until then every rule follows its failure mode"
    );
}
