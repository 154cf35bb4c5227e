//! Command arguments to typed requests. Pure: byte slices in, values or a
//! clear `ERR ...` message out, and no allocation unless there is an error.
//!
//! Every numkeys command reads `CMD numkeys key [key ...]`, then one group of
//! numbers per key (`capacity refill period_ms` for buckets, `limit
//! window_ms` for windows), then options in any order and case. A key named
//! twice is refused where the keys are opened (`store::keys::DistinctKeys`).

use std::fmt::Write;

use rl_core::gcra::{GcraError, GcraParams};
use rl_core::inflight::{valid_id, InflightParams, MAX_ID_LEN, MAX_INFLIGHT_LIMIT};
use rl_core::limits::{MAX_KEYS, MAX_TIME_MS, MAX_TOKENS, MAX_WINDOW_LIMIT};
use rl_core::window::WindowParams;
use rl_core::INLINE;
use rl_core::{BucketOp, BucketParams, ParamError, WindowMode};
use smallvec::SmallVec;

/// A refusal of the arguments, worded for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError(pub String);

/// Index of the first key in argv: `CMD numkeys key ...`.
pub const FIRST_KEY: usize = 2;

/// Reads numkeys and checks that that many keys follow it. Also used to
/// answer the server's key-position requests, so it never trusts argc.
pub fn numkeys(argv: &[&[u8]]) -> Result<usize, ArgError> {
    let Some(raw) = argv.get(1) else {
        return Err(ArgError("ERR numkeys is missing".into()));
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

/// Keys, one parameter group per key, and what follows the groups.
struct Groups<'a, T> {
    numkeys: usize,
    params: SmallVec<[T; INLINE]>,
    rest: &'a [&'a [u8]],
}

/// Reads the groups of `names.len()` numbers. `make` builds one group's
/// parameters or says which field is out of range. Anything not an integer
/// reads as 0, which every field refuses, so the ranges live in one place:
/// the constructors of rl-core.
fn groups<'a, T, const N: usize>(
    argv: &'a [&'a [u8]],
    names: [&str; N],
    make: impl Fn([u64; N]) -> Result<T, ParamError>,
) -> Result<Groups<'a, T>, ArgError> {
    let numkeys = numkeys(argv)?;
    let keys = &argv[FIRST_KEY..FIRST_KEY + numkeys];
    let mut rest = &argv[FIRST_KEY + numkeys..];
    let mut params = SmallVec::new();
    for (i, key) in keys.iter().enumerate() {
        if rest.len() < N {
            return Err(ArgError(format!(
                "ERR key {} ('{}') lacks its {}: each key needs all {N}",
                i + 1,
                shown(key),
                names.join(" ")
            )));
        }
        let (group, tail) = rest.split_at(N);
        let values: [u64; N] = std::array::from_fn(|f| int(group[f]).unwrap_or(0));
        params.push(make(values).map_err(|e| {
            let f = names.iter().position(|&n| n == e.field).unwrap_or(0);
            ArgError(format!(
                "ERR {} of key {} ('{}') must be an integer from 1 to {}, got '{}'",
                names[f],
                i + 1,
                shown(key),
                e.max,
                shown(group[f])
            ))
        })?);
        rest = tail;
    }
    Ok(Groups { numkeys, params, rest })
}

/// An option: its name, and the largest value it takes (None: a flag).
type OptionSpec = (&'static str, Option<u64>);

/// Reads the options after the groups; each may be given once. Values are
/// integers from 1 to the option's maximum; flags read as Some(1).
fn options<const K: usize>(
    rest: &[&[u8]],
    specs: [OptionSpec; K],
    numkeys: usize,
    group: &[&str],
) -> Result<[Option<u64>; K], ArgError> {
    let mut found = [None; K];
    let mut rest = rest;
    while let [name, tail @ ..] = rest {
        let Some(i) = specs.iter().position(|(n, _)| name.eq_ignore_ascii_case(n.as_bytes())) else {
            return Err(unknown_option(name, &specs, numkeys, group));
        };
        let (opt, max) = specs[i];
        if found[i].is_some() {
            return Err(ArgError(format!("ERR option {opt} is given more than once")));
        }
        match max {
            None => {
                found[i] = Some(1);
                rest = tail;
            }
            Some(max) => {
                let Some(raw) = tail.first() else {
                    return Err(ArgError(format!("ERR option {opt} needs a value")));
                };
                found[i] = Some(int(raw).filter(|v| (1..=max).contains(v)).ok_or_else(|| {
                    ArgError(format!("ERR {opt} must be an integer from 1 to {max}, got '{}'", shown(raw)))
                })?);
                rest = &tail[1..];
            }
        }
    }
    Ok(found)
}

fn unknown_option(name: &[u8], specs: &[OptionSpec], numkeys: usize, group: &[&str]) -> ArgError {
    if int(name).is_some() {
        let noun = if numkeys == 1 { "key takes" } else { "keys take" };
        return ArgError(format!(
            "ERR too many numbers: {numkeys} {noun} {} ({} per key), found an extra '{}'",
            group.len() * numkeys,
            group.join(" "),
            shown(name)
        ));
    }
    let list: Vec<String> =
        specs.iter().map(|(n, max)| if max.is_some() { format!("{n} n") } else { n.to_string() }).collect();
    ArgError(format!("ERR unknown option '{}' (options: {})", shown(name), list.join(", ")))
}

const BUCKET_GROUP: [&str; 3] = ["capacity", "refill", "period_ms"];
const WINDOW_GROUP: [&str; 2] = ["limit", "window_ms"];

fn bucket_groups<'a>(argv: &'a [&'a [u8]]) -> Result<Groups<'a, BucketParams>, ArgError> {
    groups(argv, BUCKET_GROUP, |[c, r, p]| BucketParams::new(c, r, p))
}

/// RL.TAKE, RL.PEEK, RL.LEASE and RL.REFUND: buckets and what to do to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketArgs {
    /// The keys are `argv[FIRST_KEY..FIRST_KEY + numkeys]`.
    pub numkeys: usize,
    pub buckets: SmallVec<[BucketParams; INLINE]>,
    pub op: BucketOp,
}

/// RL.TAKE: `... [COST n] [FORCE]`.
pub fn parse_take(argv: &[&[u8]]) -> Result<BucketArgs, ArgError> {
    let g = bucket_groups(argv)?;
    let [cost, force] = options(g.rest, [("COST", Some(MAX_TOKENS)), ("FORCE", None)], g.numkeys, &BUCKET_GROUP)?;
    let cost = cost.unwrap_or(1);
    let op = if force.is_some() { BucketOp::Force { cost } } else { BucketOp::Take { cost } };
    Ok(BucketArgs { numkeys: g.numkeys, buckets: g.params, op })
}

/// RL.PEEK: `... [COST n]`.
pub fn parse_peek(argv: &[&[u8]]) -> Result<BucketArgs, ArgError> {
    let g = bucket_groups(argv)?;
    let [cost] = options(g.rest, [("COST", Some(MAX_TOKENS))], g.numkeys, &BUCKET_GROUP)?;
    Ok(BucketArgs { numkeys: g.numkeys, buckets: g.params, op: BucketOp::Peek { cost: cost.unwrap_or(1) } })
}

/// RL.LEASE: `... WANT n [MIN m]`.
pub fn parse_lease(argv: &[&[u8]]) -> Result<BucketArgs, ArgError> {
    let g = bucket_groups(argv)?;
    let [want, min] =
        options(g.rest, [("WANT", Some(MAX_TOKENS)), ("MIN", Some(MAX_TOKENS))], g.numkeys, &BUCKET_GROUP)?;
    let want = want.ok_or_else(|| ArgError("ERR RL.LEASE needs WANT n: how many tokens to lease".into()))?;
    let min = min.unwrap_or(1);
    if min > want {
        return Err(ArgError(format!("ERR MIN ({min}) must not exceed WANT ({want})")));
    }
    Ok(BucketArgs { numkeys: g.numkeys, buckets: g.params, op: BucketOp::Lease { want, min } })
}

/// RL.REFUND: `... TOKENS n`.
pub fn parse_refund(argv: &[&[u8]]) -> Result<BucketArgs, ArgError> {
    let g = bucket_groups(argv)?;
    let [tokens] = options(g.rest, [("TOKENS", Some(MAX_TOKENS))], g.numkeys, &BUCKET_GROUP)?;
    let tokens = tokens.ok_or_else(|| ArgError("ERR RL.REFUND needs TOKENS n: how many tokens to give back".into()))?;
    Ok(BucketArgs { numkeys: g.numkeys, buckets: g.params, op: BucketOp::Refund { tokens } })
}

/// RL.WINDOW and RL.WINDOWPEEK: `... [COST n] [SLIDING | EXACT | FIXED]
/// [TIME] [REFUND at_ms]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowArgs {
    pub numkeys: usize,
    pub windows: SmallVec<[WindowParams; INLINE]>,
    pub cost: u64,
    pub mode: WindowMode,
    /// TIME: the reply ends with the server's reading the call decided at.
    pub time: bool,
    /// REFUND at_ms: give back `cost` counted by the call that answered
    /// `at_ms` with TIME, instead of counting.
    pub refund_at_ms: Option<u64>,
}

/// `max_log` is the largest limit an EXACT window may have (module config).
pub fn parse_window(argv: &[&[u8]], max_log: u64) -> Result<WindowArgs, ArgError> {
    let g = groups(argv, WINDOW_GROUP, |[limit, window]| WindowParams::new(limit, window, MAX_WINDOW_LIMIT))?;
    let [cost, sliding, exact, fixed, time, refund_at_ms] = options(
        g.rest,
        [
            ("COST", Some(MAX_WINDOW_LIMIT)),
            ("SLIDING", None),
            ("EXACT", None),
            ("FIXED", None),
            ("TIME", None),
            ("REFUND", Some(MAX_TIME_MS)),
        ],
        g.numkeys,
        &WINDOW_GROUP,
    )?;
    let mode = match (sliding, exact, fixed) {
        (_, None, None) => WindowMode::Sliding,
        (None, Some(_), None) => WindowMode::Exact,
        (None, None, Some(_)) => WindowMode::Fixed,
        _ => return Err(ArgError("ERR choose one of SLIDING, EXACT and FIXED".into())),
    };
    if mode == WindowMode::Exact {
        let keys = &argv[FIRST_KEY..FIRST_KEY + g.numkeys];
        if let Some((i, w)) = g.params.iter().enumerate().find(|(_, w)| w.limit() > max_log) {
            return Err(ArgError(format!(
                "ERR limit of key {} ('{}') is {}, above the EXACT maximum of {max_log} (an exact log keeps \
                 one entry per admitted request; raise it with the module option max-log-limit)",
                i + 1,
                shown(keys[i]),
                w.limit()
            )));
        }
    }
    Ok(WindowArgs {
        numkeys: g.numkeys,
        windows: g.params,
        cost: cost.unwrap_or(1),
        mode,
        time: time.is_some(),
        refund_at_ms,
    })
}

/// RL.ACQUIRE and RL.INFLIGHT: in-flight limits, the id and the cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    pub numkeys: usize,
    pub limits: SmallVec<[InflightParams; INLINE]>,
    /// None: the module makes one.
    pub id: Option<&'a [u8]>,
    pub cost: u64,
}

const INFLIGHT_GROUP: [&str; 2] = ["limit", "timeout_ms"];

/// `... limit timeout_ms [...] [ID id] [COST n]`; `max_limit` is the
/// module option max-inflight-limit.
pub fn parse_acquire<'a>(argv: &'a [&'a [u8]], max_limit: u64) -> Result<AcquireArgs<'a>, ArgError> {
    let g = groups(argv, INFLIGHT_GROUP, |[limit, timeout]| InflightParams::new(limit, timeout, MAX_INFLIGHT_LIMIT))?;
    let (id, rest) = split_id(g.rest)?;
    let [cost] = options(&rest, [("COST", Some(MAX_INFLIGHT_LIMIT))], g.numkeys, &INFLIGHT_GROUP)?;
    let keys = &argv[FIRST_KEY..FIRST_KEY + g.numkeys];
    if let Some((i, p)) = g.params.iter().enumerate().find(|(_, p)| p.limit() > max_limit) {
        return Err(ArgError(format!(
            "ERR limit of key {} ('{}') is {}, above the in-flight maximum of {max_limit} (a key keeps one slot \
             per request in flight; raise it with the module option max-inflight-limit)",
            i + 1,
            shown(keys[i]),
            p.limit()
        )));
    }
    Ok(AcquireArgs { numkeys: g.numkeys, limits: g.params, id, cost: cost.unwrap_or(1) })
}

/// RL.RELEASE: `numkeys key [key ...] ID id`.
pub fn parse_release<'a>(argv: &'a [&'a [u8]]) -> Result<(usize, &'a [u8]), ArgError> {
    let numkeys = numkeys(argv)?;
    match split_id(&argv[FIRST_KEY + numkeys..])? {
        (Some(id), rest) if rest.is_empty() => Ok((numkeys, id)),
        (_, rest) => Err(ArgError(match rest.first() {
            Some(extra) => format!(
                "ERR RL.RELEASE takes numkeys key [key ...] ID id; found '{}' after {numkeys} key(s): check numkeys",
                shown(extra)
            ),
            None => "ERR RL.RELEASE needs ID id after its keys: the id RL.ACQUIRE answered".into(),
        })),
    }
}

type Tokens<'a> = SmallVec<[&'a [u8]; 8]>;

/// Takes `ID id` out of the options (it is the one option whose value is
/// not a number).
fn split_id<'a>(rest: &'a [&'a [u8]]) -> Result<(Option<&'a [u8]>, Tokens<'a>), ArgError> {
    let mut id = None;
    let mut others = SmallVec::new();
    let mut tokens = rest.iter();
    while let Some(&t) = tokens.next() {
        if !t.eq_ignore_ascii_case(b"ID") {
            others.push(t);
            continue;
        }
        let value = tokens.next().ok_or_else(|| ArgError("ERR option ID needs a value".into()))?;
        if id.replace(*value).is_some() {
            return Err(ArgError("ERR option ID is given more than once".into()));
        }
        if !valid_id(value) {
            return Err(ArgError(format!("ERR ID must be 1 to {MAX_ID_LEN} bytes, got {} bytes", value.len())));
        }
    }
    Ok((id, others))
}

/// CL.THROTTLE: `key max_burst count_per_period period [quantity]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleArgs {
    pub quota: GcraParams,
    pub quantity: i64,
}

pub fn parse_throttle(argv: &[&[u8]]) -> Result<ThrottleArgs, ArgError> {
    if !(5..=6).contains(&argv.len()) {
        return Err(ArgError(
            "ERR wrong number of arguments for 'cl.throttle': CL.THROTTLE key max_burst count_per_period period [quantity]"
                .into(),
        ));
    }
    // redis-cell parses with Rust's i64 parser, which takes a sign ("+5",
    // "-0"); the same here, so that no call it accepts is refused. Negative
    // values are refused: redis-cell computes nonsense from them.
    let signed = |i: usize, name: &str| {
        std::str::from_utf8(argv[i])
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|v| *v >= 0)
            .ok_or_else(|| ArgError(format!("ERR {name} must be a non-negative integer, got '{}'", shown(argv[i]))))
    };
    let (burst, count, period) = (signed(2, "max_burst")?, signed(3, "count_per_period")?, signed(4, "period")?);
    let quantity = if argv.len() == 6 { signed(5, "quantity")? } else { 1 };
    let quota = GcraParams::new(burst, count, period).map_err(|e| {
        ArgError(match e {
            GcraError::Count => "ERR count_per_period must be at least 1".into(),
            GcraError::Period => {
                format!("ERR period must be from 1 to {} seconds", rl_core::gcra::MAX_PERIOD_S)
            }
            GcraError::ZeroRate => "ERR count_per_period is too high for the period: under one nanosecond apart".into(),
            GcraError::MaxBurst | GcraError::Quantity | GcraError::Overflow => {
                "ERR max_burst is too large for this rate".into()
            }
        })
    })?;
    Ok(ThrottleArgs { quota, quantity })
}

/// The refusal of a call that names `key` twice.
pub fn named_twice(key: &[u8]) -> String {
    format!("ERR key '{}' is named more than once", shown(key))
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
        assert_eq!((a.numkeys, a.op), (1, BucketOp::Take { cost: 1 }));
        assert_eq!(a.buckets[0], BucketParams::new(200, 100, 1000).unwrap());
    }

    #[test]
    fn several_keys_options_any_case_and_order() {
        let a = parse_take(&argv("RL.TAKE 3 a b c 1 2 3 4 5 6 7 8 9 force cost 2")).unwrap();
        assert_eq!((a.numkeys, a.op), (3, BucketOp::Force { cost: 2 }));
        assert_eq!(a.buckets[2], BucketParams::new(7, 8, 9).unwrap());
    }

    #[test]
    fn peek_takes_no_force() {
        let e = parse_peek(&argv("RL.PEEK 1 k 1 1 1 FORCE")).unwrap_err().0;
        assert_eq!(e, "ERR unknown option 'FORCE' (options: COST n)");
    }

    #[test]
    fn numkeys_errors() {
        assert_eq!(parse_take(&argv("RL.TAKE")).unwrap_err().0, "ERR numkeys is missing");
        assert_eq!(err("RL.TAKE 0 k 1 1 1"), "ERR numkeys must be an integer from 1 to 32, got '0'");
        assert_eq!(err("RL.TAKE -1 k 1 1 1"), "ERR numkeys must be an integer from 1 to 32, got '-1'");
        assert_eq!(err("RL.TAKE 33 k"), "ERR numkeys must be an integer from 1 to 32, got '33'");
        assert_eq!(err("RL.TAKE x k"), "ERR numkeys must be an integer from 1 to 32, got 'x'");
        assert_eq!(err("RL.TAKE 3 a b"), "ERR numkeys is 3 but only 2 arguments follow it");
    }

    #[test]
    fn group_errors_name_the_argument_and_key() {
        assert_eq!(
            err("RL.TAKE 1 k 10 5"),
            "ERR key 1 ('k') lacks its capacity refill period_ms: each key needs all 3"
        );
        assert_eq!(
            err("RL.TAKE 2 a b 1 1 1 COST 2"),
            "ERR key 2 ('b') lacks its capacity refill period_ms: each key needs all 3"
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
        assert_eq!(err("RL.TAKE 1 k 1 1 1 FORCE FORCE"), "ERR option FORCE is given more than once");
        assert_eq!(err("RL.TAKE 1 k 1 1 1 FAST"), "ERR unknown option 'FAST' (options: COST n, FORCE)");
        assert_eq!(
            err("RL.TAKE 1 k 1 1 1 7"),
            "ERR too many numbers: 1 key takes 3 (capacity refill period_ms per key), found an extra '7'"
        );
    }

    #[test]
    fn lease() {
        let a = parse_lease(&argv("RL.LEASE 1 k 10 1 1000 WANT 5 MIN 2")).unwrap();
        assert_eq!(a.op, BucketOp::Lease { want: 5, min: 2 });
        assert_eq!(
            parse_lease(&argv("RL.LEASE 1 k 10 1 1000 WANT 5")).unwrap().op,
            BucketOp::Lease { want: 5, min: 1 }
        );
        assert_eq!(
            parse_lease(&argv("RL.LEASE 1 k 10 1 1000")).unwrap_err().0,
            "ERR RL.LEASE needs WANT n: how many tokens to lease"
        );
        assert_eq!(
            parse_lease(&argv("RL.LEASE 1 k 10 1 1000 WANT 2 MIN 3")).unwrap_err().0,
            "ERR MIN (3) must not exceed WANT (2)"
        );
    }

    #[test]
    fn refund() {
        assert_eq!(parse_refund(&argv("RL.REFUND 1 k 10 1 1000 TOKENS 4")).unwrap().op, BucketOp::Refund { tokens: 4 });
        assert!(parse_refund(&argv("RL.REFUND 1 k 10 1 1000")).unwrap_err().0.contains("needs TOKENS n"));
    }

    #[test]
    fn window() {
        let a = parse_window(&argv("RL.WINDOW 2 a b 100 60000 10 1000 COST 3 exact"), 10_000).unwrap();
        assert_eq!((a.numkeys, a.cost, a.mode), (2, 3, WindowMode::Exact));
        assert_eq!(a.windows[1], WindowParams::new(10, 1000, MAX_WINDOW_LIMIT).unwrap());
        assert_eq!(parse_window(&argv("RL.WINDOW 1 a 1 1"), 1).unwrap().mode, WindowMode::Sliding);
        assert_eq!(parse_window(&argv("RL.WINDOW 1 a 1 1 FIXED"), 1).unwrap().mode, WindowMode::Fixed);
        assert_eq!(
            parse_window(&argv("RL.WINDOW 1 a 1 1 FIXED EXACT"), 1).unwrap_err().0,
            "ERR choose one of SLIDING, EXACT and FIXED"
        );
        assert!(parse_window(&argv("RL.WINDOW 1 a 20000 1000 EXACT"), 10_000)
            .unwrap_err()
            .0
            .starts_with("ERR limit of key 1 ('a') is 20000, above the EXACT maximum of 10000"));
        assert!(parse_window(&argv("RL.WINDOW 1 a 20000 1000 SLIDING"), 10_000).is_ok());
        assert_eq!(
            parse_window(&argv("RL.WINDOW 1 a 10 1000 60000"), 10).unwrap_err().0,
            "ERR too many numbers: 1 key takes 2 (limit window_ms per key), found an extra '60000'"
        );
        assert!(parse_window(&argv("RL.WINDOW 1 a 0 1000"), 10).unwrap_err().0.starts_with("ERR limit of key 1"));
        let a = parse_window(&argv("RL.WINDOW 1 a 5 1000 fixed time"), 10).unwrap();
        assert_eq!((a.time, a.refund_at_ms), (true, None));
        let a = parse_window(&argv("RL.WINDOW 1 a 5 1000 COST 2 REFUND 1764650000300"), 10).unwrap();
        assert_eq!((a.time, a.refund_at_ms, a.cost), (false, Some(1_764_650_000_300), 2));
        assert_eq!(
            parse_window(&argv("RL.WINDOW 1 a 5 1000 REFUND 0"), 10).unwrap_err().0,
            format!("ERR REFUND must be an integer from 1 to {MAX_TIME_MS}, got '0'")
        );
        assert_eq!(
            parse_window(&argv("RL.WINDOW 1 a 5 1000 REFUND"), 10).unwrap_err().0,
            "ERR option REFUND needs a value"
        );
    }

    #[test]
    fn throttle() {
        let a = parse_throttle(&argv("CL.THROTTLE k 15 30 60")).unwrap();
        assert_eq!((a.quota.limit(), a.quantity), (16, 1));
        assert_eq!(parse_throttle(&argv("CL.THROTTLE k 15 30 60 0")).unwrap().quantity, 0);
        assert!(parse_throttle(&argv("CL.THROTTLE k 15 30")).unwrap_err().0.contains("wrong number of arguments"));
        assert_eq!(
            parse_throttle(&argv("CL.THROTTLE k -1 30 60")).unwrap_err().0,
            "ERR max_burst must be a non-negative integer, got '-1'"
        );
        assert_eq!(
            parse_throttle(&argv("CL.THROTTLE k 1 0 60")).unwrap_err().0,
            "ERR count_per_period must be at least 1"
        );
        assert!(parse_throttle(&argv("CL.THROTTLE k 1 1 0")).unwrap_err().0.starts_with("ERR period must be"));
        assert!(parse_throttle(&argv("CL.THROTTLE k 1 1 1 x")).unwrap_err().0.starts_with("ERR quantity"));
        // Signs as redis-cell's parser takes them.
        let a = parse_throttle(&argv("CL.THROTTLE k +15 +30 +60 -0")).unwrap();
        assert_eq!((a.quota.limit(), a.quantity), (16, 0));
        for bad in
            ["CL.THROTTLE k 1 1 1 -1", "CL.THROTTLE k 1 1 1 ++1", "CL.THROTTLE k 1 1 1 +", "CL.THROTTLE k 1 1 1 1.0"]
        {
            assert!(parse_throttle(&argv(bad)).unwrap_err().0.starts_with("ERR quantity must be"), "{bad}");
        }
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
        for bad in [&b""[..], b"-1", b"+1", b"1 ", b"0x10", b"1_000", b"18446744073709551616", b"123456789012345678901"]
        {
            assert_eq!(int(bad), None, "{:?}", bad);
        }
    }

    mod hostile {
        use super::*;
        use proptest::prelude::*;

        /// Tokens that stress a parser, plus random bytes and huge strings.
        fn token() -> impl Strategy<Value = Vec<u8>> {
            let words: Vec<&'static str> = vec![
                "0",
                "1",
                "2",
                "3",
                "32",
                "33",
                "-1",
                "+1",
                "007",
                "1.5",
                "1e3",
                "nan",
                "inf",
                "-inf",
                "",
                " ",
                "18446744073709551615",
                "18446744073709551616",
                "9223372036854775807",
                "-9223372036854775808",
                "100000000000000",
                "100000000000001",
                "63072000000",
                "63072000001",
                "1000000000000",
                "COST",
                "cost",
                "FORCE",
                "WANT",
                "MIN",
                "TOKENS",
                "SLIDING",
                "EXACT",
                "FIXED",
                "k",
                "{u}k",
            ];
            prop_oneof![
                4 => proptest::sample::select(words).prop_map(|w| w.as_bytes().to_vec()),
                1 => proptest::collection::vec(any::<u8>(), 0..12),
                1 => (1usize..200_000).prop_map(|n| vec![b'9'; n]),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

            #[test]
            fn parsers_never_panic_and_keep_their_ranges(
                args in proptest::collection::vec(token(), 0..40),
                max_log in 1u64..20_000,
            ) {
                let mut argv: Vec<&[u8]> = vec![b"CMD"];
                argv.extend(args.iter().map(|a| a.as_slice()));
                let mut errors = Vec::new();
                for (peek, parsed) in [(false, parse_take(&argv)), (true, parse_peek(&argv))] {
                    match parsed {
                        Ok(a) => {
                            prop_assert!((1..=MAX_KEYS).contains(&a.numkeys));
                            prop_assert_eq!(a.buckets.len(), a.numkeys);
                            prop_assert!(a.op.validate().is_ok());
                            let is_peek = matches!(a.op, BucketOp::Peek { .. });
                            prop_assert!(!peek || is_peek);
                        }
                        Err(e) => errors.push(e),
                    }
                }
                match parse_lease(&argv) {
                    Ok(a) => {
                        let ok = matches!(a.op, BucketOp::Lease { want, min } if 1 <= min && min <= want && want <= MAX_TOKENS);
                        prop_assert!(ok);
                    }
                    Err(e) => errors.push(e),
                }
                match parse_refund(&argv) {
                    Ok(a) => {
                        let ok = matches!(a.op, BucketOp::Refund { tokens } if (1..=MAX_TOKENS).contains(&tokens));
                        prop_assert!(ok);
                    }
                    Err(e) => errors.push(e),
                }
                match parse_window(&argv, max_log) {
                    Ok(a) => {
                        prop_assert_eq!(a.windows.len(), a.numkeys);
                        if a.mode == WindowMode::Exact {
                            prop_assert!(a.windows.iter().all(|w| w.limit() <= max_log));
                        }
                    }
                    Err(e) => errors.push(e),
                }
                if let Err(e) = parse_throttle(&argv) {
                    errors.push(e);
                }
                // Every refusal is one clear line of bounded length.
                for e in errors {
                    prop_assert!(e.0.starts_with("ERR "), "{}", e.0);
                    prop_assert!(!e.0.contains('\n') && !e.0.contains('\r') && !e.0.contains('\0'));
                    prop_assert!(e.0.len() < 400, "{} bytes: {}", e.0.len(), e.0);
                }
            }
        }
    }
}
