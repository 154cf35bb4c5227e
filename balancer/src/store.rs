//! A region's share table and usage counts in its own Redis, in one hash
//! (`rl:shares` by default) and one usage hash (`rl:shares:usage`):
//!
//! | field | value |
//! |---|---|
//! | `epoch` | the highest balancer epoch claimed here; writes below it are refused |
//! | `version` | moves on every change of the table |
//! | `table` | the [`ShareTable`] as JSON |
//! | `written_at` | the server's ms clock at the last write (a heartbeat too): the table's age |
//! | `changed_at` | the server's ms clock at the last change: where raised capacities ramp from |
//!
//! Ages come from the region's own server clock (`TIME` read with the
//! table), so no clock of another machine enters them.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use crate::table::ShareTable;

/// The table's hash (and the channel announcing a new version).
pub const DEFAULT_KEY: &str = rl_rules::SHARES_KEY;

/// Claim: accepted when the epoch is not below the one in force (the
/// `Fence` model).
const CLAIM: &str = r"
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
local epoch = tonumber(ARGV[1])
if epoch < current then
  return redis.error_reply('STALE epoch ' .. ARGV[1] .. ' is below ' .. current)
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1])
return current
";

/// Write: refused below the epoch in force; stamps the server's clock; a
/// changed table moves the version and is announced.
const WRITE: &str = r"
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if tonumber(ARGV[1]) < current then
  return redis.error_reply('STALE epoch ' .. ARGV[1] .. ' is below ' .. current)
end
local t = redis.call('TIME')
local now = tostring(t[1] * 1000 + math.floor(t[2] / 1000))
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if redis.call('HGET', KEYS[1], 'table') ~= ARGV[2] then
  version = version + 1
  redis.call('HSET', KEYS[1], 'version', version, 'table', ARGV[2], 'changed_at', now)
  redis.call('PUBLISH', KEYS[1], version)
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'written_at', now)
return version
";

/// Usage: read and clear at once, so no count is read twice or lost.
const TAKE_USAGE: &str = r"
local all = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return all
";

/// The usage hash of a table key.
pub fn usage_key(key: &str) -> String {
    format!("{key}:usage")
}

/// Why a write did not land.
#[derive(Debug)]
pub enum WriteError {
    /// A newer balancer claimed this region: stop, do not retry.
    Stale(String),
    /// Redis did not answer or answered an error: the write may have landed.
    Redis(redis::RedisError),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Stale(e) => write!(f, "fenced off: {e}"),
            WriteError::Redis(e) => write!(f, "{e}"),
        }
    }
}

fn classify(e: redis::RedisError) -> WriteError {
    if e.code() == Some("STALE") {
        WriteError::Stale(e.detail().unwrap_or("").to_string())
    } else {
        WriteError::Redis(e)
    }
}

/// Claims `epoch` in a region; answers the epoch that was in force.
pub async fn claim(con: &mut impl ConnectionLike, key: &str, epoch: u64) -> Result<u64, WriteError> {
    Script::new(CLAIM).key(key).arg(epoch).invoke_async(con).await.map_err(classify)
}

/// Writes a region's table as the balancer of `epoch`; answers its version.
pub async fn write(
    con: &mut impl ConnectionLike,
    key: &str,
    epoch: u64,
    table: &ShareTable,
) -> Result<u64, WriteError> {
    let json = serde_json::to_string(table).expect("a share table always serializes");
    Script::new(WRITE).key(key).arg(epoch).arg(json).invoke_async(con).await.map_err(classify)
}

/// A region's table as read, with its ages on the region's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Read {
    /// The table's version (0: never written).
    pub version: u64,
    /// The epoch in force.
    pub epoch: u64,
    /// The table (empty if never written).
    pub table: ShareTable,
    /// Since the last write (a balancer's heartbeat).
    pub age: Duration,
    /// Since the last change.
    pub since_change: Duration,
}

/// Reads a region's table; `increments` (rule, subject, admitted) are
/// added to its usage in the same round trip: a gateway's whole sync.
pub async fn sync(con: &mut impl ConnectionLike, key: &str, increments: &[(&str, &str, u64)]) -> RedisResult<Read> {
    let usage = usage_key(key);
    let mut pipe = redis::pipe();
    for (rule, subject, n) in increments {
        pipe.hincr(&usage, usage_field(rule, subject), *n).ignore();
    }
    pipe.cmd("HMGET").arg(key).arg(&["version", "epoch", "table", "written_at", "changed_at"]).cmd("TIME");
    let (fields, time): (Vec<Option<String>>, (u64, u64)) = pipe.query_async(con).await?;
    let now_ms = time.0 * 1000 + time.1 / 1000;
    let num = |i: usize| fields[i].as_deref().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let table = match fields[2].as_deref() {
        None => ShareTable::default(),
        Some(json) => serde_json::from_str(json).map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Parse, "share table is not valid JSON", e.to_string()))
        })?,
    };
    let since = |at: u64| Duration::from_millis(if at == 0 { u64::MAX / 2 } else { now_ms.saturating_sub(at) });
    Ok(Read { version: num(0), epoch: num(1), table, age: since(num(3)), since_change: since(num(4)) })
}

/// The usage field of a (rule, subject): rule ids have no `|`.
fn usage_field(rule: &str, subject: &str) -> String {
    format!("{rule}|{subject}")
}

/// Reads and clears a region's usage since the last call: (rule, subject, admitted).
pub async fn take_usage(con: &mut impl ConnectionLike, key: &str) -> RedisResult<Vec<(String, String, u64)>> {
    let flat: Vec<(String, u64)> = Script::new(TAKE_USAGE).key(usage_key(key)).invoke_async(con).await?;
    Ok(flat
        .into_iter()
        .filter_map(|(field, n)| field.split_once('|').map(|(r, s)| (r.to_string(), s.to_string(), n)))
        .collect())
}
