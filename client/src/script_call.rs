//! The module's commands as calls of the Lua backend's scripts, for a
//! caller that speaks the module's argv (the relay on a Redis that cannot
//! load the module): one home for the scripts (the typed calls run the
//! same ones) and for turning `RL.TAKE numkeys key ... [COST n]` into
//! `EVALSHA sha numkeys key ... take n n ...`.
//!
//! The scripts answer in the module's shapes (six integers, a seventh with
//! TIME; RL.ACQUIRE's six with the id; RL.RELEASE's count), so a reply
//! needs no mapping back. What the argv reader checks is the structure
//! (numkeys, a group of numbers per key, the options, each once); the
//! numbers themselves the scripts check, with an error naming the field.

use std::sync::LazyLock;

use redis::Cmd;
use rl_core::inflight::{MAX_ID_LEN, MAX_INFLIGHT_LIMIT};
use rl_core::limits::{MAX_CLOCK_AHEAD_MS, MAX_KEYS, MAX_PERIOD_MS, MAX_TOKENS, MAX_WAIT_MS, MAX_WINDOW_LIMIT};

use crate::params::{LUA_MAX_UNITS, MAX_LUA_LOG_LIMIT};

/// The Lua backend's script (its SHA1 names it in EVALSHA), with the
/// core's limits written into it.
pub(crate) static LUA_SCRIPT: LazyLock<String> = LazyLock::new(|| lua_script(include_str!("bucket.lua")));
/// The Lua backend's windows (RL.WINDOW and RL.WINDOWPEEK).
pub(crate) static WINDOW_SCRIPT: LazyLock<String> = LazyLock::new(|| lua_script(include_str!("window.lua")));
/// The Lua backend's in-flight limits, over sorted sets.
pub(crate) static INFLIGHT_SCRIPT: LazyLock<String> = LazyLock::new(|| lua_script(include_str!("inflight.lua")));

/// The argument helpers followed by `template`, with each `{{NAME}}`
/// replaced by that limit of rl-core.
fn lua_script(template: &str) -> String {
    let template = [include_str!("script_args.lua"), template].join("\n");
    let limits = [
        ("MAX_TOKENS", MAX_TOKENS as u128),
        ("MAX_PERIOD_MS", MAX_PERIOD_MS as u128),
        ("MAX_WAIT_MS", MAX_WAIT_MS as u128),
        ("MAX_KEYS", MAX_KEYS as u128),
        ("LUA_MAX_UNITS", LUA_MAX_UNITS),
        ("MAX_INFLIGHT_LIMIT", MAX_INFLIGHT_LIMIT as u128),
        ("MAX_ID_LEN", MAX_ID_LEN as u128),
        ("MAX_WINDOW_LIMIT", MAX_WINDOW_LIMIT as u128),
        ("MAX_LUA_LOG_LIMIT", MAX_LUA_LOG_LIMIT as u128),
        ("MAX_CLOCK_AHEAD_MS", MAX_CLOCK_AHEAD_MS as u128),
    ];
    limits.iter().fold(template, |text, (name, value)| text.replace(&format!("{{{{{name}}}}}"), &value.to_string()))
}

/// One of the Lua backend's scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Script {
    /// Token buckets: RL.TAKE, RL.PEEK, RL.LEASE, RL.REFUND.
    Bucket,
    /// Windows: RL.WINDOW, RL.WINDOWPEEK.
    Window,
    /// In-flight limits: RL.ACQUIRE, RL.INFLIGHT, RL.RELEASE.
    Inflight,
}

static HASHED: LazyLock<[redis::Script; 3]> = LazyLock::new(|| {
    [redis::Script::new(&LUA_SCRIPT), redis::Script::new(&WINDOW_SCRIPT), redis::Script::new(&INFLIGHT_SCRIPT)]
});

impl Script {
    /// Every script (to load them all at once).
    pub const ALL: [Script; 3] = [Script::Bucket, Script::Window, Script::Inflight];

    /// Its text, for `SCRIPT LOAD`.
    pub fn source(self) -> &'static str {
        match self {
            Script::Bucket => &LUA_SCRIPT,
            Script::Window => &WINDOW_SCRIPT,
            Script::Inflight => &INFLIGHT_SCRIPT,
        }
    }

    /// Its SHA1, for `EVALSHA`.
    pub fn sha(self) -> &'static str {
        HASHED[self as usize].get_hash()
    }
}

/// A module command as a script call: `EVALSHA` of `script`.
#[derive(Clone, Debug)]
pub struct ScriptCall {
    /// The script to `SCRIPT LOAD` when the server answers NOSCRIPT.
    pub script: Script,
    /// `EVALSHA sha numkeys keys... args...`.
    pub cmd: Cmd,
}

/// `argv` (a module command, its name first) as the call of the script
/// that does the same; an `ERR ...` text for a command the scripts do not
/// serve (CL.THROTTLE) or arguments that cannot be read.
pub fn script_call<A: AsRef<[u8]>>(argv: &[A]) -> Result<ScriptCall, String> {
    let name = argv.first().map(|n| String::from_utf8_lossy(n.as_ref()).to_ascii_uppercase()).unwrap_or_default();
    if !SERVED.contains(&name.as_str()) {
        return Err(needs_module(&name));
    }
    let (keys, rest) = keys(argv, &name)?;
    // An id RL.ACQUIRE is not given: made here (the script cannot make an
    // unguessable one), as the module makes one and the typed calls do.
    let made: String;
    let mut script_args: Vec<&[u8]> = Vec::with_capacity(rest.len() + 5);
    let script = match name.as_str() {
        "RL.TAKE" | "RL.PEEK" | "RL.LEASE" | "RL.REFUND" => {
            let (groups, options) = split_groups(rest, keys.len(), &["capacity", "refill", "period_ms"])?;
            let (op, n, min): (&[u8], &[u8], &[u8]) = match name.as_str() {
                "RL.TAKE" => {
                    let [cost, force] = read_options(options, [("COST", true), ("FORCE", false)])?;
                    let cost = cost.unwrap_or(b"1");
                    (if force.is_some() { b"force" } else { b"take" }, cost, cost)
                }
                "RL.PEEK" => {
                    let [cost] = read_options(options, [("COST", true)])?;
                    let cost = cost.unwrap_or(b"1");
                    (b"peek", cost, cost)
                }
                "RL.LEASE" => {
                    let [want, min] = read_options(options, [("WANT", true), ("MIN", true)])?;
                    let want = want.ok_or("ERR RL.LEASE needs WANT n: how many tokens to lease")?;
                    (b"lease", want, min.unwrap_or(b"1"))
                }
                _ => {
                    let [tokens] = read_options(options, [("TOKENS", true)])?;
                    let tokens = tokens.ok_or("ERR RL.REFUND needs TOKENS n: how many tokens to give back")?;
                    (b"refund", tokens, tokens)
                }
            };
            script_args.extend([op, n, min]);
            script_args.extend(groups);
            Script::Bucket
        }
        "RL.WINDOW" | "RL.WINDOWPEEK" => {
            let (groups, options) = split_groups(rest, keys.len(), &["limit", "window_ms"])?;
            let [cost, sliding, exact, fixed, time, refund] = read_options(
                options,
                [
                    ("COST", true),
                    ("SLIDING", false),
                    ("EXACT", false),
                    ("FIXED", false),
                    ("TIME", false),
                    ("REFUND", true),
                ],
            )?;
            let mode: &[u8] = match (sliding, exact, fixed) {
                (_, None, None) => b"sliding",
                (None, Some(_), None) => b"exact",
                (None, None, Some(_)) => b"fixed",
                _ => return Err("ERR choose one of SLIDING, EXACT and FIXED".into()),
            };
            let op: &[u8] = match (refund, name.as_str()) {
                (Some(_), "RL.WINDOWPEEK") => {
                    return Err("ERR RL.WINDOWPEEK counts nothing, so it has nothing to REFUND: use RL.WINDOW".into())
                }
                (Some(_), _) => b"refund",
                (None, "RL.WINDOWPEEK") => b"peek",
                (None, _) => b"take",
            };
            let time: &[u8] = if time.is_some() { b"1" } else { b"0" };
            script_args.extend([mode, op, cost.unwrap_or(b"1"), time, refund.unwrap_or(b"0")]);
            script_args.extend(groups);
            Script::Window
        }
        "RL.ACQUIRE" | "RL.INFLIGHT" => {
            let (groups, options) = split_groups(rest, keys.len(), &["limit", "timeout_ms"])?;
            let [id, cost] = read_options(options, [("ID", true), ("COST", true)])?;
            let write = name == "RL.ACQUIRE";
            let id = match id {
                Some(id) => id,
                None if write => {
                    made = crate::inflight::new_id();
                    made.as_bytes()
                }
                None => b"",
            };
            script_args.extend([if write { &b"acquire"[..] } else { b"inflight" }, id, cost.unwrap_or(b"1")]);
            script_args.extend(groups);
            Script::Inflight
        }
        "RL.RELEASE" => {
            let [id] = read_options(rest, [("ID", true)])?;
            let id = id.ok_or("ERR RL.RELEASE needs ID id after its keys: the id RL.ACQUIRE answered")?;
            script_args.extend([&b"release"[..], id]);
            Script::Inflight
        }
        _ => return Err(needs_module(&name)),
    };
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.sha()).arg(keys.len());
    for key in keys {
        cmd.arg(key.as_ref());
    }
    for arg in script_args {
        cmd.arg(arg);
    }
    Ok(ScriptCall { script, cmd })
}

/// Whether `name` is a module command (RL.*, CL.THROTTLE, any case): one
/// that goes as its script's call on a Redis without the module, or is
/// refused there by name ([`script_call`]).
pub fn is_module_command(name: &[u8]) -> bool {
    name.get(..3).is_some_and(|p| p.eq_ignore_ascii_case(b"RL.")) || name.eq_ignore_ascii_case(b"CL.THROTTLE")
}

/// The module commands the scripts serve.
const SERVED: [&str; 9] = [
    "RL.TAKE",
    "RL.PEEK",
    "RL.LEASE",
    "RL.REFUND",
    "RL.WINDOW",
    "RL.WINDOWPEEK",
    "RL.ACQUIRE",
    "RL.INFLIGHT",
    "RL.RELEASE",
];

/// The refusal of a command the scripts do not serve (CL.THROTTLE).
fn needs_module(name: &str) -> String {
    format!("ERR {name} needs the redis-rl module: the Lua scripts serve {}", SERVED.join(", "))
}

/// The keys after numkeys (1 to 32 of them, all present), and what follows.
fn keys<'a, A: AsRef<[u8]>>(argv: &'a [A], name: &str) -> Result<(&'a [A], &'a [A]), String> {
    let raw = argv.get(1).ok_or_else(|| format!("ERR {name}: numkeys is missing"))?;
    let n = std::str::from_utf8(raw.as_ref())
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|n| (1..=MAX_KEYS).contains(n))
        .ok_or_else(|| {
            format!(
                "ERR numkeys must be an integer from 1 to {MAX_KEYS}, got '{}'",
                String::from_utf8_lossy(raw.as_ref())
            )
        })?;
    let after = &argv[2..];
    if after.len() < n {
        return Err(format!("ERR numkeys is {n} but only {} arguments follow it", after.len()));
    }
    Ok(after.split_at(n))
}

/// One group of `names.len()` numbers per key (as they came: the scripts
/// check them), and the options after them.
fn split_groups<'a, A: AsRef<[u8]>>(
    rest: &'a [A],
    keys: usize,
    names: &[&str],
) -> Result<(impl Iterator<Item = &'a [u8]>, &'a [A]), String> {
    let width = keys * names.len();
    if rest.len() < width {
        return Err(format!(
            "ERR {keys} key(s) need {width} numbers ({} per key), found {}",
            names.join(" "),
            rest.len()
        ));
    }
    let (groups, options) = rest.split_at(width);
    Ok((groups.iter().map(AsRef::as_ref), options))
}

/// The options `specs` (name, whether it takes a value), in any order and
/// case, each at most once; anything else is refused by name.
fn read_options<'a, A: AsRef<[u8]>, const K: usize>(
    mut rest: &'a [A],
    specs: [(&str, bool); K],
) -> Result<[Option<&'a [u8]>; K], String> {
    let mut found = [None; K];
    while let [name, tail @ ..] = rest {
        let name = name.as_ref();
        let Some(i) = specs.iter().position(|(n, _)| name.eq_ignore_ascii_case(n.as_bytes())) else {
            let known: Vec<&str> = specs.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "ERR unknown option '{}' (options: {})",
                String::from_utf8_lossy(name),
                known.join(", ")
            ));
        };
        let (option, takes_value) = specs[i];
        if found[i].is_some() {
            return Err(format!("ERR option {option} is given more than once"));
        }
        if takes_value {
            let [value, after @ ..] = tail else { return Err(format!("ERR option {option} needs a value")) };
            found[i] = Some(value.as_ref());
            rest = after;
        } else {
            found[i] = Some(b"1");
            rest = tail;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lua_script_holds_the_core_limits() {
        let number = |name: &str| -> u128 {
            let line = LUA_SCRIPT.lines().find_map(|l| l.strip_prefix(&format!("local {name} = "))).unwrap();
            line.split_whitespace().next().unwrap().parse().unwrap()
        };
        assert!(!LUA_SCRIPT.contains("{{"), "a placeholder is left");
        assert!(!INFLIGHT_SCRIPT.contains("{{"), "a placeholder is left in the in-flight script");
        assert_eq!(number("MAX_TOKENS"), MAX_TOKENS as u128);
        assert_eq!(number("MAX_PERIOD"), MAX_PERIOD_MS as u128);
        assert_eq!(number("MAX_WAIT"), MAX_WAIT_MS as u128);
        assert_eq!(number("MAX_KEYS"), MAX_KEYS as u128);
        assert_eq!(number("EXACT"), LUA_MAX_UNITS);
    }

    fn call(line: &str) -> Result<(Script, Vec<String>), String> {
        let argv: Vec<&str> = line.split(' ').collect();
        let call = script_call(&argv)?;
        let args = call.cmd.args_iter().map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("not a plain argument: {other:?}"),
        });
        Ok((call.script, args.skip(1).collect()))
    }

    #[test]
    fn module_commands_become_the_scripts_calls() {
        let sha = |s: Script| s.sha().to_string();
        let expect = |line: &str, script: Script, args: &str| {
            let mut want = vec!["EVALSHA".to_string(), sha(script)];
            want.extend(args.split(' ').map(String::from));
            let (got_script, mut got) = call(line).unwrap();
            got.insert(0, "EVALSHA".into());
            assert_eq!((got_script, got), (script, want), "{line}");
        };
        expect("RL.TAKE 1 k 10 1 1000", Script::Bucket, "1 k take 1 1 10 1 1000");
        expect("rl.take 2 a b 10 1 1000 5 1 60 force cost 3", Script::Bucket, "2 a b force 3 3 10 1 1000 5 1 60");
        expect("RL.PEEK 1 k 10 1 1000 COST 2", Script::Bucket, "1 k peek 2 2 10 1 1000");
        expect("RL.LEASE 1 k 10 1 1000 WANT 5", Script::Bucket, "1 k lease 5 1 10 1 1000");
        expect("RL.LEASE 1 k 10 1 1000 MIN 2 WANT 5", Script::Bucket, "1 k lease 5 2 10 1 1000");
        expect("RL.REFUND 1 k 10 1 1000 TOKENS 4", Script::Bucket, "1 k refund 4 4 10 1 1000");
        expect("RL.WINDOW 1 w 10 1000", Script::Window, "1 w sliding take 1 0 0 10 1000");
        expect("RL.WINDOW 2 a b 10 1000 5 60 COST 2 FIXED TIME", Script::Window, "2 a b fixed take 2 1 0 10 1000 5 60");
        expect("RL.WINDOW 1 w 10 1000 EXACT REFUND 1234", Script::Window, "1 w exact refund 1 0 1234 10 1000");
        expect("RL.WINDOWPEEK 1 w 10 1000 EXACT", Script::Window, "1 w exact peek 1 0 0 10 1000");
        expect("RL.ACQUIRE 1 k 5 60000 ID r1 COST 2", Script::Inflight, "1 k acquire r1 2 5 60000");
        expect("RL.INFLIGHT 1 k 5 60000", Script::Inflight, "1 k inflight  1 5 60000");
        expect("RL.RELEASE 2 a b ID r1", Script::Inflight, "2 a b release r1");
        // No id: one is made, 32 hex characters as the module's.
        let (_, args) = call("RL.ACQUIRE 1 k 5 60000").unwrap();
        assert!(args[4].len() == 32 && args[4].bytes().all(|b| b.is_ascii_hexdigit()), "{args:?}");
    }

    #[test]
    fn what_the_scripts_cannot_read_is_refused_by_name() {
        for (line, why) in [
            ("CL.THROTTLE k 10 1 60 1", "CL.THROTTLE needs the redis-rl module"),
            ("RL.INSPECT k", "RL.INSPECT needs the redis-rl module"),
            ("RL.TAKE", "numkeys is missing"),
            ("RL.TAKE 0 k", "numkeys must be an integer from 1 to 32"),
            ("RL.TAKE 3 a b", "numkeys is 3 but only 2 arguments follow it"),
            ("RL.TAKE 1 k 10 1", "1 key(s) need 3 numbers (capacity refill period_ms per key), found 2"),
            ("RL.TAKE 1 k 10 1 1000 COST", "option COST needs a value"),
            ("RL.TAKE 1 k 10 1 1000 COST 1 cost 2", "option COST is given more than once"),
            ("RL.TAKE 1 k 10 1 1000 WANT 2", "unknown option 'WANT' (options: COST, FORCE)"),
            ("RL.LEASE 1 k 10 1 1000", "RL.LEASE needs WANT n"),
            ("RL.REFUND 1 k 10 1 1000", "RL.REFUND needs TOKENS n"),
            ("RL.WINDOW 1 w 10 1000 EXACT FIXED", "choose one of SLIDING, EXACT and FIXED"),
            ("RL.WINDOWPEEK 1 w 10 1000 REFUND 5", "nothing to REFUND"),
            ("RL.RELEASE 1 k", "RL.RELEASE needs ID id"),
        ] {
            let e = call(line).unwrap_err();
            assert!(e.starts_with("ERR ") && e.contains(why), "{line}: {e}");
        }
    }

    #[test]
    fn the_scripts_are_the_typed_calls_own() {
        assert_eq!(Script::Bucket.source(), LUA_SCRIPT.as_str());
        assert_eq!(Script::Bucket.sha(), redis::Script::new(&LUA_SCRIPT).get_hash());
        assert_ne!(Script::Window.sha(), Script::Inflight.sha());
    }
}
