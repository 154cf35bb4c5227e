//! Whether the limiter's server accepts a rule set's limits: an EXACT
//! window above its `max-log-limit`, or an in-flight limit above its
//! `max-inflight-limit`, passes every check of the rule format and then
//! errors at Redis on every request (the outage fallback decides). The
//! server is asked with read-only calls (RL.WINDOWPEEK, RL.INFLIGHT) on a
//! probe subject's keys, so no CONFIG permission is needed and the answer
//! is the server's own, whatever its options.

use crate::{Backend, Client, Error, Inflight, Result, Window, WindowMode};

use crate::live::snapshot::Snapshot;

/// The subject whose keys the probes read; nothing is written.
const PROBE: &str = "rl-limits-probe";

/// What the server refuses of `snapshot`, one line per limit naming the
/// rule, the limit and the server's words; empty when it accepts all.
/// Errors when the server cannot be asked (unreachable, a refusal that is
/// not about a limit): the caller decides what that means. On the Lua
/// backend there is nothing to ask: its script has no such options.
pub async fn server_refusals(client: &Client, snapshot: &Snapshot) -> Result<Vec<String>> {
    if client.backend() == Backend::Lua {
        return Ok(Vec::new());
    }
    let mut faults = Vec::new();
    for rule in snapshot.rules() {
        let policy = rule.policy();
        let keys = policy.keys(PROBE)?;
        for (limit, key) in policy.rules().iter().zip(keys) {
            if limit.window_mode() != Some(WindowMode::Exact) {
                continue;
            }
            let window = Window::new(key, limit.capacity(), limit.period())?;
            let answer = client.window_peek(&[window], 1, WindowMode::Exact).await;
            if let Some(why) = refused(answer.err(), "max-log-limit")? {
                faults.push(format!("rule '{}' limit '{}': {why}", rule.id(), limit.name()));
            }
        }
        let Some(inflight) = rule.inflight() else { continue };
        for (limit, key) in inflight.rules().iter().zip(inflight.keys(PROBE)?) {
            let slots = Inflight::new(key, limit.limit(), limit.timeout())?;
            if let Some(why) = refused(client.inflight(&[slots], None, 1).await.err(), "max-inflight-limit")? {
                faults.push(format!("rule '{}' limit '{}': {why}", rule.id(), limit.name()));
            }
        }
    }
    Ok(faults)
}

/// The server's refusal when it is about `option`; `None` when it
/// accepted; an error when the call failed otherwise.
fn refused(error: Option<Error>, option: &str) -> Result<Option<String>> {
    match error {
        None => Ok(None),
        Some(Error::Redis(e)) if e.to_string().contains(option) => {
            Ok(Some(format!("the server refuses it: {}", e.detail().unwrap_or(&e.to_string()))))
        }
        Some(e) => Err(e),
    }
}
