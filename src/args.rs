//! Command arguments to typed requests. Pure: byte slices in, values or a
//! clear `ERR ...` message out, and no allocation unless there is an error.

use std::fmt::Write;

use rl_core::acquire::INLINE;
use rl_core::limits::{MAX_KEYS, MAX_PERIOD_MS, MAX_TOKENS};
use rl_core::{BucketParams, ParamError};
use smallvec::SmallVec;

/// A refusal of the arguments, worded for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError(pub String);

impl ArgError {
    fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

/// Index of the first key in argv: `CMD numkeys key ...`.
pub const FIRST_KEY: usize = 2;

/// `RL.TAKE` and `RL.PEEK`: `numkeys key... (capacity refill period_ms)... [COST n]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakeArgs {
    /// The keys are `argv[FIRST_KEY..FIRST_KEY + numkeys]`.
    pub numkeys: usize,
    pub buckets: SmallVec<[BucketParams; INLINE]>,
    pub cost: u64,
}

/// Reads numkeys and checks that that many keys follow it. Also used to
/// answer the server's key-position requests, so it never trusts argc.
pub fn numkeys(argv: &[&[u8]]) -> Result<usize, ArgError> {
    let Some(raw) = argv.get(1) else {
        return Err(ArgError::new("ERR numkeys is missing"));
    };
    let n = int(raw)
        .filter(|n| (1..=MAX_KEYS as u64).contains(n))
        .ok_or_else(|| ArgError(format!("ERR numkeys must be an integer from 1 to {MAX_KEYS}, got '{}'", shown(raw))))?
        as usize;
    let after = argv.len() - FIRST_KEY;
    if after < n {
        let follow = if after == 1 { "argument follows" } else { "arguments follow" };
        return Err(ArgError(format!("ERR numkeys is {n} but only {after} {follow} it")));
    }
    Ok(n)
}

pub fn parse_take(argv: &[&[u8]]) -> Result<TakeArgs, ArgError> {
    let numkeys = numkeys(argv)?;
    let keys = &argv[FIRST_KEY..FIRST_KEY + numkeys];
    no_repeated_key(keys)?;
    let mut rest = &argv[FIRST_KEY + numkeys..];
    let mut buckets = SmallVec::new();
    for (i, key) in keys.iter().enumerate() {
        let [c, r, p, tail @ ..] = rest else {
            return Err(ArgError(format!(
                "ERR key {} ('{}') lacks its capacity refill period_ms: each key needs all three",
                i + 1,
                shown(key)
            )));
        };
        // Anything not an integer reads as 0, which BucketParams refuses
        // for the same field: the ranges live in one place.
        let params = BucketParams::new(int(c).unwrap_or(0), int(r).unwrap_or(0), int(p).unwrap_or(0));
        buckets.push(params.map_err(|e| {
            let (name, raw, max) = match e {
                ParamError::Capacity => ("capacity", c, MAX_TOKENS),
                ParamError::Refill => ("refill", r, MAX_TOKENS),
                ParamError::Period => ("period_ms", p, MAX_PERIOD_MS),
            };
            ArgError(format!(
                "ERR {name} of key {} ('{}') must be an integer from 1 to {max}, got '{}'",
                i + 1,
                shown(key),
                shown(raw)
            ))
        })?);
        rest = tail;
    }
    let mut cost = None;
    while let [name, tail @ ..] = rest {
        if name.eq_ignore_ascii_case(b"COST") {
            cost = Some(option_value("COST", cost, tail, MAX_TOKENS)?);
            rest = &tail[1..];
        } else {
            return Err(unknown_option(name, numkeys, "COST n"));
        }
    }
    Ok(TakeArgs { numkeys, buckets, cost: cost.unwrap_or(1) })
}

/// The value of an option that takes a positive integer, once.
fn option_value(name: &str, seen: Option<u64>, tail: &[&[u8]], max: u64) -> Result<u64, ArgError> {
    if seen.is_some() {
        return Err(ArgError(format!("ERR option {name} is given more than once")));
    }
    let Some(raw) = tail.first() else {
        return Err(ArgError(format!("ERR option {name} needs a value")));
    };
    int(raw).filter(|v| (1..=max).contains(v)).ok_or_else(|| {
        ArgError(format!("ERR {name} must be an integer from 1 to {max}, got '{}'", shown(raw)))
    })
}

fn unknown_option(name: &[u8], numkeys: usize, options: &str) -> ArgError {
    if int(name).is_some() {
        let noun = if numkeys == 1 { "key takes" } else { "keys take" };
        return ArgError(format!(
            "ERR too many numbers: {numkeys} {noun} {} (capacity refill period_ms per key), found an extra '{}'",
            3 * numkeys,
            shown(name)
        ));
    }
    ArgError(format!("ERR unknown option '{}' (options: {options})", shown(name)))
}

fn no_repeated_key(keys: &[&[u8]]) -> Result<(), ArgError> {
    for (i, k) in keys.iter().enumerate() {
        if keys[..i].contains(k) {
            return Err(ArgError(format!("ERR key '{}' is named more than once", shown(k))));
        }
    }
    Ok(())
}

/// A non-negative decimal integer without sign, spaces or exponent; `None`
/// for anything else, including values above u64.
pub fn int(raw: &[u8]) -> Option<u64> {
    if raw.is_empty() || raw.len() > 20 {
        return None;
    }
    raw.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add((b - b'0') as u64)
    })
}

/// An argument as it may appear in an error message: at most 40 bytes,
/// printable ASCII kept, anything else as \xNN.
pub fn shown(raw: &[u8]) -> String {
    const MAX: usize = 40;
    let mut s = String::new();
    for &b in raw.iter().take(MAX) {
        if (0x20..0x7f).contains(&b) && b != b'\'' {
            s.push(b as char);
        } else {
            let _ = write!(s, "\\x{b:02x}");
        }
    }
    if raw.len() > MAX {
        let _ = write!(s, "... ({} bytes)", raw.len());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<&[u8]> {
        s.split(' ').map(str::as_bytes).collect()
    }

    fn err(s: &str) -> String {
        parse_take(&argv(s)).unwrap_err().0
    }

    #[test]
    fn one_key_default_cost() {
        let a = parse_take(&argv("RL.TAKE 1 k 200 100 1000")).unwrap();
        assert_eq!(a.numkeys, 1);
        assert_eq!(a.cost, 1);
        assert_eq!(a.buckets[0], BucketParams::new(200, 100, 1000).unwrap());
    }

    #[test]
    fn several_keys_and_cost_any_case() {
        let a = parse_take(&argv("RL.TAKE 3 a b c 1 2 3 4 5 6 7 8 9 cost 2")).unwrap();
        assert_eq!(a.numkeys, 3);
        assert_eq!(a.cost, 2);
        assert_eq!(a.buckets[2], BucketParams::new(7, 8, 9).unwrap());
    }

    #[test]
    fn numkeys_errors() {
        assert_eq!(
            parse_take(&argv("RL.TAKE")).unwrap_err().0,
            "ERR numkeys is missing"
        );
        assert_eq!(err("RL.TAKE 0 k 1 1 1"), "ERR numkeys must be an integer from 1 to 32, got '0'");
        assert_eq!(err("RL.TAKE -1 k 1 1 1"), "ERR numkeys must be an integer from 1 to 32, got '-1'");
        assert_eq!(err("RL.TAKE 33 k"), "ERR numkeys must be an integer from 1 to 32, got '33'");
        assert_eq!(err("RL.TAKE x k"), "ERR numkeys must be an integer from 1 to 32, got 'x'");
        assert_eq!(err("RL.TAKE 3 a b"), "ERR numkeys is 3 but only 2 arguments follow it");
    }

    #[test]
    fn triple_errors_name_the_argument_and_key() {
        assert_eq!(
            err("RL.TAKE 1 k 10 5"),
            "ERR key 1 ('k') lacks its capacity refill period_ms: each key needs all three"
        );
        assert_eq!(
            err("RL.TAKE 2 a b 1 1 1 COST 2"),
            "ERR key 2 ('b') lacks its capacity refill period_ms: each key needs all three"
        );
        assert_eq!(
            err("RL.TAKE 2 a b 1 1 1 COST 2 3"),
            "ERR capacity of key 2 ('b') must be an integer from 1 to 100000000000000, got 'COST'"
        );
        for bad in ["0", "-5", "1.5", "nan", "inf", "+5", " 5", "1e3", "", "18446744073709551616"] {
            let msg = parse_take(&[b"RL.TAKE", b"1", b"k", b"10", bad.as_bytes(), b"1000"]).unwrap_err().0;
            assert!(msg.starts_with("ERR refill of key 1 ('k') must be an integer from 1 to"), "{bad}: {msg}");
        }
        assert_eq!(
            err("RL.TAKE 1 k 10 1 63072000001"),
            "ERR period_ms of key 1 ('k') must be an integer from 1 to 63072000000, got '63072000001'"
        );
        assert!(err("RL.TAKE 1 k 100000000000001 1 1").starts_with("ERR capacity of key 1"));
    }

    #[test]
    fn option_errors() {
        assert_eq!(err("RL.TAKE 1 k 1 1 1 COST"), "ERR option COST needs a value");
        assert_eq!(err("RL.TAKE 1 k 1 1 1 COST 0"), "ERR COST must be an integer from 1 to 100000000000000, got '0'");
        assert_eq!(err("RL.TAKE 1 k 1 1 1 COST 1 COST 2"), "ERR option COST is given more than once");
        assert_eq!(err("RL.TAKE 1 k 1 1 1 FAST"), "ERR unknown option 'FAST' (options: COST n)");
        assert_eq!(
            err("RL.TAKE 1 k 1 1 1 7"),
            "ERR too many numbers: 1 key takes 3 (capacity refill period_ms per key), found an extra '7'"
        );
    }

    #[test]
    fn repeated_key() {
        assert_eq!(err("RL.TAKE 2 k k 1 1 1 1 1 1"), "ERR key 'k' is named more than once");
    }

    #[test]
    fn shown_is_bounded_and_printable() {
        assert_eq!(shown(b"a\r\n\0'"), "a\\x0d\\x0a\\x00\\x27");
        let long = vec![b'x'; 1000];
        assert_eq!(shown(&long), format!("{}... (1000 bytes)", "x".repeat(40)));
    }

    #[test]
    fn int_is_strict() {
        assert_eq!(int(b"0"), Some(0));
        assert_eq!(int(b"007"), Some(7));
        assert_eq!(int(b"18446744073709551615"), Some(u64::MAX));
        for bad in [&b""[..], b"-1", b"+1", b"1 ", b"0x10", b"1_000", b"18446744073709551616", b"123456789012345678901"] {
            assert_eq!(int(bad), None, "{:?}", bad);
        }
    }
}
