//! A region's share table and usage counts in its own Redis, in one hash
//! (`rl:shares` by default) and one usage hash (`rl:shares:usage`):
//!
//! | field | value |
//! |---|---|
//! | `epoch` | the highest balancer epoch claimed here (an integer up to [`MAX_EPOCH`], compared exactly); writes below it are refused |
//! | `version` | moves on every change of the table |
//! | `table` | the [`ShareTable`] as JSON |
//! | `written_at` | the server's ms clock at the last write (a heartbeat too): the table's age |
//! | `changed_at` | the server's ms clock at the last change: where raised capacities ramp from |
//!
//! Ages come from the region's own server clock (`TIME` read with the
//! table), so no clock of another machine enters them. rl-balancer writes
//! the table (its own scripts); this is what a gateway reads and writes, and
//! the rule for a stored integer that both follow.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::RedisResult;

use crate::global::regional::SHARES_KEY;
use crate::global::table::ShareTable;

/// The table's hash (and the channel announcing a new version).
pub const DEFAULT_KEY: &str = SHARES_KEY;

/// The highest epoch a balancer claims or accepts as stored.
pub const MAX_EPOCH: u64 = i64::MAX as u64;

/// What is wrong with a stored integer field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Not decimal digits (a sign, a point, an exponent, a space, text).
    NotAnInteger,
    /// Digits, but above [`MAX_EPOCH`].
    AboveCeiling,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::NotAnInteger => write!(f, "not an integer from 0 to {MAX_EPOCH}"),
            Problem::AboveCeiling => write!(f, "above the ceiling {MAX_EPOCH}"),
        }
    }
}

/// A stored integer (epoch, version, clock stamp): decimal digits, no sign,
/// no leading zero, at most [`MAX_EPOCH`]. The same rule as the balancer's scripts check (`stored_ok`, rl-balancer's `epoch::LUA`).
pub fn parse_stored(s: &str) -> Result<u64, Problem> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits || (s.len() > 1 && s.starts_with('0')) {
        return Err(Problem::NotAnInteger);
    }
    match s.parse::<u64>() {
        Ok(n) if n <= MAX_EPOCH => Ok(n),
        _ => Err(Problem::AboveCeiling),
    }
}

/// The usage hash of a table key.
pub fn usage_key(key: &str) -> String {
    format!("{key}:usage")
}

/// A field of the share table's hash holding what no balancer writes:
/// the key, the field, its value and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corrupt {
    /// The share table's hash.
    pub key: String,
    /// The field (`epoch`, `version`, `table`, `written_at`, `changed_at`).
    pub field: String,
    /// The value as stored.
    pub value: String,
    /// What is wrong with it, with its verb ("is not an integer from 0 to ...").
    pub problem: String,
}

impl Corrupt {
    /// `value` of `field` in `key`, and what is wrong with it.
    pub fn new(key: &str, field: &str, value: &[u8], problem: impl std::fmt::Display) -> Corrupt {
        Corrupt {
            key: key.to_string(),
            field: field.to_string(),
            value: String::from_utf8_lossy(value).into_owned(),
            problem: problem.to_string(),
        }
    }

    /// The value for a message: its first 64 characters, escaped.
    pub fn shown(&self) -> String {
        let mut shown: String = self.value.chars().take(64).collect();
        if shown.len() < self.value.len() {
            shown.push_str("...");
        }
        format!("{shown:?}")
    }
}

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "share table corrupt: field {} of {} = {} {}", self.field, self.key, self.shown(), self.problem)
    }
}

/// Why a call to the store did not do what was asked.
#[derive(Debug)]
pub enum StoreError {
    /// A newer balancer claimed this region: stop, do not retry.
    Stale(String),
    /// The table's hash holds a field no balancer writes: nothing was
    /// written; the region needs an operator.
    Corrupt(Corrupt),
    /// Redis did not answer or answered an error: a write may have landed.
    Redis(redis::RedisError),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Stale(e) => write!(f, "fenced off: {e}"),
            StoreError::Corrupt(c) => write!(f, "{c}"),
            StoreError::Redis(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        StoreError::Redis(e)
    }
}

/// A region's table as read, with its ages on the region's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Read {
    /// The table's version (0: never written).
    pub version: u64,
    /// The epoch in force (0: never claimed). A gateway does not need it:
    /// a corrupt one is answered here, not as a failed read.
    pub epoch: Result<u64, Corrupt>,
    /// The table (empty if never written).
    pub table: ShareTable,
    /// Since the last write (a balancer's heartbeat).
    pub age: Duration,
    /// Since the last change.
    pub since_change: Duration,
}

/// Reads a region's table; `increments` (rule, subject, admitted) are
/// added to its usage in the same round trip: a gateway's whole sync. A
/// field no balancer writes (a version or clock that is not an integer, a
/// table that is not a share table or has a share above the whole) is
/// [`StoreError::Corrupt`], naming it.
pub async fn sync(
    con: &mut impl ConnectionLike,
    key: &str,
    increments: &[(&str, &str, u64)],
) -> Result<Read, StoreError> {
    let usage = usage_key(key);
    let mut pipe = redis::pipe();
    for (rule, subject, n) in increments {
        pipe.hincr(&usage, usage_field(rule, subject), *n).ignore();
    }
    pipe.cmd("HMGET").arg(key).arg(&["version", "epoch", "table", "written_at", "changed_at"]).cmd("TIME");
    let (fields, time): (Vec<Option<Vec<u8>>>, (u64, u64)) = pipe.query_async(con).await?;
    let now_ms = time.0 * 1000 + time.1 / 1000;
    let integer = |i: usize, name: &str| match fields[i].as_deref() {
        None => Ok(0),
        Some(v) => parse_stored(&String::from_utf8_lossy(v)).map_err(|p| Corrupt::new(key, name, v, format!("is {p}"))),
    };
    let table = match fields[2].as_deref() {
        None => ShareTable::default(),
        Some(json) => parse_table(key, json)?,
    };
    let since = |at: u64| Duration::from_millis(if at == 0 { u64::MAX / 2 } else { now_ms.saturating_sub(at) });
    Ok(Read {
        version: integer(0, "version").map_err(StoreError::Corrupt)?,
        epoch: integer(1, "epoch"),
        table,
        age: since(integer(3, "written_at").map_err(StoreError::Corrupt)?),
        since_change: since(integer(4, "changed_at").map_err(StoreError::Corrupt)?),
    })
}

/// The `table` field: a share table whose every share is within the whole.
fn parse_table(key: &str, json: &[u8]) -> Result<ShareTable, StoreError> {
    let corrupt = |problem: String| StoreError::Corrupt(Corrupt::new(key, "table", json, problem));
    let table: ShareTable = serde_json::from_slice(json).map_err(|e| {
        corrupt(match e.classify() {
            serde_json::error::Category::Data => format!("is not a share table ({e})"),
            _ => format!("is not JSON ({e})"),
        })
    })?;
    table.check().map_err(corrupt)?;
    Ok(table)
}

/// The usage field of a (rule, subject): rule ids have no `|`.
fn usage_field(rule: &str, subject: &str) -> String {
    format!("{rule}|{subject}")
}

/// The hash where a region's gateways confirm the table version they
/// enforce: one field per gateway, its value the version (as the gateway
/// writes it, a plain `HSET`) or `"<version> <server ms>"` once the
/// balancer has seen it (stamped when first seen: ages are on the
/// region's clock and never older than the write).
pub fn applied_key(key: &str) -> String {
    format!("{key}:applied")
}

/// A gateway confirms that it enforces the table of `version` (0: none
/// read yet, the fixed split): a plain `HSET`, which a gateway's ACL user
/// may run on this one key.
pub async fn report_applied(con: &mut impl ConnectionLike, key: &str, gateway: &str, version: u64) -> RedisResult<()> {
    redis::cmd("HSET").arg(applied_key(key)).arg(gateway).arg(version).query_async(con).await
}

/// A gateway stopping cleanly withdraws its confirmation: raises no
/// longer wait for it (a killed one's is forgotten after the expiry).
pub async fn leave(con: &mut impl ConnectionLike, key: &str, gateway: &str) -> RedisResult<()> {
    redis::cmd("HDEL").arg(applied_key(key)).arg(gateway).query_async(con).await
}
