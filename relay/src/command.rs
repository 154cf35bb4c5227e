//! A gateway's command, read as far as the relay needs: the module's public
//! commands (the only ones that ever reach Redis through the relay), the
//! RL.TAKE and RL.LEASE calls it can serve from its pools among them. A
//! call it cannot read (a bad argument, an unknown option) is forwarded as
//! is, so the gateway gets the module's own error, word for word.

use bytes::Bytes;
use rl_core::limits::MAX_KEYS;
use rl_core::{BucketOp, BucketParams};

use crate::pool::Need;

/// The module's public commands: what the relay forwards, and nothing
/// else. Not RL.INSPECT (for operators, on Redis itself) nor the internal
/// RL.SET, RL.LOGADD, RL.SLOT.
pub const FORWARDED: [&str; 10] = [
    "RL.TAKE",
    "RL.PEEK",
    "RL.LEASE",
    "RL.REFUND",
    "RL.WINDOW",
    "RL.WINDOWPEEK",
    "CL.THROTTLE",
    "RL.ACQUIRE",
    "RL.RELEASE",
    "RL.INFLIGHT",
];

/// Whether `name` is one of [`FORWARDED`] (any case).
pub fn is_forwarded(name: &[u8]) -> bool {
    FORWARDED.iter().any(|f| f.as_bytes().eq_ignore_ascii_case(name))
}

/// The keys a forwarded command names, where the module reads them: the
/// `numkeys` keys after it for the RL. commands, the first argument of
/// CL.THROTTLE; none for any other command. A numkeys the relay cannot
/// read makes every argument after it a key (the module refuses such a
/// call anyway, but a fence on keys must not depend on that).
pub fn keys(args: &[Bytes]) -> &[Bytes] {
    let Some(name) = args.first() else { return &[] };
    if !is_forwarded(name) {
        return &[];
    }
    if name.eq_ignore_ascii_case(b"CL.THROTTLE") {
        return args.get(1..2).unwrap_or_default();
    }
    let rest = args.get(2..).unwrap_or_default();
    match args.get(1).and_then(int) {
        Some(n) => &rest[..rest.len().min(usize::try_from(n).unwrap_or(usize::MAX))],
        None => rest,
    }
}

/// A command as the relay sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// RL.TAKE (without FORCE) or RL.LEASE on `keys` with `params`.
    Buckets { lease: bool, keys: Vec<Bytes>, params: Vec<BucketParams>, need: Need },
    /// Anything else: forwarded, to the slot of `key` when it names one.
    Forward { key: Option<Bytes> },
}

impl Call {
    pub fn parse(args: &[Bytes]) -> Call {
        let name = args.first().map(Bytes::as_ref).unwrap_or_default();
        let numkeys_style = name.get(..3).is_some_and(|p| p.eq_ignore_ascii_case(b"RL.")) && args.len() > 2;
        let key = if numkeys_style { args.get(2) } else { args.get(1) }.cloned();
        let served = if name.eq_ignore_ascii_case(b"RL.TAKE") {
            buckets(args, false)
        } else if name.eq_ignore_ascii_case(b"RL.LEASE") {
            buckets(args, true)
        } else {
            None
        };
        served.unwrap_or(Call::Forward { key })
    }
}

fn int(arg: &Bytes) -> Option<u64> {
    std::str::from_utf8(arg).ok()?.parse().ok()
}

/// `numkeys key... (capacity refill period_ms)... options` of RL.TAKE
/// (COST n) or RL.LEASE (WANT n [MIN m]); None for anything the module
/// would refuse or the relay does not serve (FORCE).
fn buckets(args: &[Bytes], lease: bool) -> Option<Call> {
    let numkeys = usize::try_from(int(args.get(1)?)?).ok().filter(|n| (1..=MAX_KEYS).contains(n))?;
    let keys = args.get(2..2 + numkeys)?.to_vec();
    if (1..keys.len()).any(|i| keys[..i].contains(&keys[i])) {
        return None;
    }
    let numbers = args.get(2 + numkeys..2 + numkeys * 4)?;
    let params = numbers
        .chunks(3)
        .map(|t| BucketParams::new(int(&t[0])?, int(&t[1])?, int(&t[2])?).ok())
        .collect::<Option<Vec<_>>>()?;
    let (mut cost, mut want, mut min) = (None, None, None);
    let mut options = args[2 + numkeys * 4..].iter();
    while let Some(option) = options.next() {
        let is = |word: &[u8]| option.eq_ignore_ascii_case(word);
        let slot = match lease {
            false if is(b"COST") => &mut cost,
            true if is(b"WANT") => &mut want,
            true if is(b"MIN") => &mut min,
            _ => return None,
        };
        if slot.replace(int(options.next()?)?).is_some() {
            return None;
        }
    }
    let op = match lease {
        false => BucketOp::Take { cost: cost.unwrap_or(1) },
        true => BucketOp::Lease { want: want?, min: min.unwrap_or(1) },
    };
    let need = match op.validate().ok()? {
        BucketOp::Take { cost } => Need { want: cost, min: cost },
        BucketOp::Lease { want, min } => Need { want, min },
        _ => return None,
    };
    Some(Call::Buckets { lease, keys, params, need })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(|s| Bytes::copy_from_slice(s.as_bytes())).collect()
    }

    fn need(line: &str) -> Option<(bool, usize, Need)> {
        match Call::parse(&args(line)) {
            Call::Buckets { lease, keys, params, need } => {
                assert_eq!(keys.len(), params.len());
                Some((lease, keys.len(), need))
            }
            Call::Forward { .. } => None,
        }
    }

    #[test]
    fn reads_takes_and_leases() {
        assert_eq!(need("RL.TAKE 1 k 10 1 1000"), Some((false, 1, Need { want: 1, min: 1 })));
        assert_eq!(need("rl.take 2 a b 10 1 1000 5 1 10 cost 3"), Some((false, 2, Need { want: 3, min: 3 })));
        assert_eq!(need("RL.LEASE 1 k 10 1 1000 WANT 5"), Some((true, 1, Need { want: 5, min: 1 })));
        assert_eq!(need("RL.LEASE 1 k 10 1 1000 min 2 want 5"), Some((true, 1, Need { want: 5, min: 2 })));
    }

    #[test]
    fn what_the_module_would_refuse_or_the_relay_does_not_serve_is_forwarded() {
        for line in [
            "RL.TAKE 1 k 10 1 1000 FORCE",
            "RL.TAKE 1 k 10 1 1000 COST 0",
            "RL.TAKE 1 k 10 1 1000 COST 1 COST 2",
            "RL.TAKE 1 k 10 1",
            "RL.TAKE 2 k k 10 1 1000 10 1 1000",
            "RL.TAKE 0 k",
            "RL.TAKE x k 10 1 1000",
            "RL.TAKE 1 k 0 1 1000",
            "RL.TAKE 1 k nan 1 1000",
            "RL.LEASE 1 k 10 1 1000",
            "RL.LEASE 1 k 10 1 1000 WANT 2 MIN 3",
            "RL.LEASE 1 k 10 1 1000 WANT",
            "RL.PEEK 1 k 10 1 1000",
            "RL.REFUND 1 k 10 1 1000 TOKENS 3",
            "GET k",
        ] {
            assert_eq!(need(line), None, "{line}");
        }
        assert_eq!(Call::parse(&args("RL.REFUND 1 k 10 1 1000 TOKENS 3")), Call::Forward { key: Some("k".into()) });
        assert_eq!(Call::parse(&args("GET g")), Call::Forward { key: Some("g".into()) });
        assert_eq!(Call::parse(&args("PING")), Call::Forward { key: None });
    }

    #[test]
    fn keys_are_read_where_the_module_reads_them() {
        let keys = |line: &str| -> Vec<String> {
            let args = args(line);
            super::keys(&args).iter().map(|k| String::from_utf8_lossy(k).into_owned()).collect()
        };
        assert_eq!(keys("RL.TAKE 2 a b 1 1 1 1 1 1 COST 2"), ["a", "b"]);
        assert_eq!(keys("rl.refund 1 k 1 1 1 TOKENS 1"), ["k"]);
        assert_eq!(keys("RL.ACQUIRE 1 k 10 60000 ID x"), ["k"]);
        assert_eq!(keys("Cl.Throttle k 1 1 1"), ["k"]);
        assert_eq!(keys("CL.THROTTLE"), Vec::<String>::new());
        // More keys than arguments: the ones there are.
        assert_eq!(keys("RL.PEEK 5 a b"), ["a", "b"]);
        // A numkeys the relay cannot read: every argument after it.
        assert_eq!(keys("RL.WINDOW x a 1 1"), ["a", "1", "1"]);
        assert_eq!(keys("RL.WINDOW"), Vec::<String>::new());
        // Not the module's: none (the allow-list refuses them by name).
        assert_eq!(keys("GET k"), Vec::<String>::new());
        assert_eq!(keys("RL.INSPECT k"), Vec::<String>::new());
    }

    #[test]
    fn the_forwarded_commands_are_the_modules_public_ones() {
        for name in ["RL.TAKE", "rl.take", "Cl.Throttle", "RL.INFLIGHT"] {
            assert!(is_forwarded(name.as_bytes()), "{name}");
        }
        for name in ["RL.INSPECT", "RL.SET", "RL.LOGADD", "RL.SLOT", "RESET", "RL.TAKEX", ""] {
            assert!(!is_forwarded(name.as_bytes()), "{name}");
        }
    }
}
