//! The RESP front keeps off the RLS front's keys. Both fronts reach Redis
//! as the relay's one user, so no Redis ACL can tell them apart: an
//! `RL.REFUND` sent through the RESP front on an Envoy counter
//! (`rl:rls:{...}:bucket:hour`) lifted the Envoy front's limit (issue 34).
//! Every command a RESP client sends that names a key under `--rls-prefix`
//! is refused, on every relay (one that does not serve the RLS front may
//! share its Redis with one that does), counted and logged without the key.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;

use super::allow::shown;
use crate::command;
use crate::logging::Throttled;
use crate::stats::Counters;

#[derive(Debug)]
pub struct Fence {
    prefix: String,
    log: Throttled,
}

impl Fence {
    /// The fence around keys under `prefix`; an empty prefix would make
    /// every key the RLS front's, and is refused.
    pub fn new(prefix: &str) -> Result<Fence, String> {
        if prefix.is_empty() {
            return Err("--rls-prefix is empty: the RLS front's counters need a prefix of their own, apart from \
                        the keys RESP clients use (the default is rl:rls:)"
                .into());
        }
        Ok(Fence { prefix: prefix.to_string(), log: Throttled::new(Duration::from_secs(10)) })
    }

    /// The error for `args` if one of its keys is under the prefix (keys
    /// are bytes: `RL:RLS:x` and `rl:rlsx` are other keys); counted.
    pub fn refusal(&self, args: &[Bytes], counters: &Counters) -> Option<String> {
        let key = command::keys(args).iter().find(|k| k.starts_with(self.prefix.as_bytes()))?;
        let refused = counters.refused_keys.fetch_add(1, Relaxed) + 1;
        let name = args.first().map(|n| shown(n)).unwrap_or_default();
        self.log.log(|| {
            format!(
                "refused {name} from a RESP client: it names a key under --rls-prefix '{}', the RLS front's \
                 counters ({refused} such commands refused so far)",
                self.prefix
            )
        });
        Some(format!(
            "ERR relay: key '{}' is under '{}', the RLS front's counters (--rls-prefix): not served to RESP clients",
            shown(key),
            self.prefix
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    #[test]
    fn refuses_keys_under_the_prefix_alone() {
        let fence = Fence::new("rl:rls:").unwrap();
        let counters = Counters::default();
        let refused = |line: &str| fence.refusal(&args(line), &counters);
        let error = refused("rl.refund 2 rl:gw:a rl:rls:{d|k=v}:bucket:hour 1 1 1 1 1 1 TOKENS 1").unwrap();
        assert_eq!(
            error,
            "ERR relay: key 'rl:rls:{d|k=v}:bucket:hour' is under 'rl:rls:', the RLS front's counters \
             (--rls-prefix): not served to RESP clients"
        );
        assert!(refused("CL.THROTTLE rl:rls:k 1 1 1").is_some());
        for line in [
            "RL.TAKE 1 rl:rlsx:k 1 1 1",
            "RL.TAKE 1 RL:RLS:k 1 1 1",
            "RL.TAKE 1 rl:rls 1 1 1",
            "RL.TAKE 1 {rl:rls:k} 1 1 1",
            // Not a key: an id, a number.
            "RL.ACQUIRE 1 k 10 60000 ID rl:rls:x",
            "PING rl:rls:k",
        ] {
            assert_eq!(refused(line), None, "{line}");
        }
        assert_eq!(counters.refused_keys.load(Relaxed), 2);
        assert!(Fence::new("").unwrap_err().contains("--rls-prefix is empty"));
    }
}
