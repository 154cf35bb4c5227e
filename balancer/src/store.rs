//! A region's share table and usage counts in its own Redis, in one hash
//! (`rl:shares` by default) and one usage hash (`rl:shares:usage`):
//!
//! | field | value |
//! |---|---|
//! | `epoch` | the highest balancer epoch claimed here (an integer up to [`epoch::MAX_EPOCH`], compared exactly); writes below it are refused |
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

use crate::epoch::{self, parse_stored};
use crate::table::ShareTable;

/// The table's hash (and the channel announcing a new version).
pub const DEFAULT_KEY: &str = rl_gateway::live::SHARES_KEY;

/// Claim: accepted when the epoch is not below the one in force (the
/// `Fence` model), compared as decimal strings; with `take-over`, whatever
/// is stored is replaced. Answers `{'ok', previous}`, `{'stale', current}`
/// or `{'corrupt', field, value}`.
const CLAIM: &str = r"
local current = redis.call('HGET', KEYS[1], 'epoch') or '0'
if not stored_ok(ARGV[1]) then
  return redis.error_reply('ERR not an epoch: ' .. ARGV[1])
end
if ARGV[2] ~= 'take-over' then
  if not stored_ok(current) then return {'corrupt', 'epoch', current} end
  if below(ARGV[1], current) then return {'stale', current} end
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1])
return {'ok', current}
";

/// Write: refused below the epoch in force; stamps the server's clock; a
/// changed table moves the version (exactly, with HINCRBY) and is
/// announced. Every check comes before the first write, so a refused
/// write changes nothing. Answers `{'ok', version}`, `{'stale', current}`
/// or `{'corrupt', field, value}`.
const WRITE: &str = r"
local current = redis.call('HGET', KEYS[1], 'epoch') or '0'
if not stored_ok(current) then return {'corrupt', 'epoch', current} end
if below(ARGV[1], current) then return {'stale', current} end
local version = redis.call('HGET', KEYS[1], 'version') or '0'
if not stored_ok(version) then return {'corrupt', 'version', version} end
local t = redis.call('TIME')
local now = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
if redis.call('HGET', KEYS[1], 'table') ~= ARGV[2] then
  redis.call('HINCRBY', KEYS[1], 'version', 1)
  version = redis.call('HGET', KEYS[1], 'version')
  redis.call('HSET', KEYS[1], 'table', ARGV[2], 'changed_at', now)
  redis.call('PUBLISH', KEYS[1], version)
end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'written_at', now)
return {'ok', version}
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
    fn new(key: &str, field: &str, value: &[u8], problem: impl std::fmt::Display) -> Corrupt {
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

/// A script's answer: `ok` with its value, else stale or corrupt.
fn outcome(key: &str, ours: u64, reply: Vec<Vec<u8>>) -> Result<String, StoreError> {
    let text = |i: usize| reply.get(i).map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
    match text(0).as_str() {
        "ok" => Ok(text(1)),
        "stale" => Err(StoreError::Stale(format!("epoch {ours} is below {}", text(1)))),
        "corrupt" => {
            let value = reply.get(2).map_or(&[][..], |v| v.as_slice());
            let problem = match parse_stored(&String::from_utf8_lossy(value)) {
                Err(p) => format!("is {p}"),
                Ok(_) => "is refused by the script".to_string(),
            };
            Err(StoreError::Corrupt(Corrupt::new(key, &text(1), value, problem)))
        }
        other => Err(StoreError::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected answer of a share table script",
            other.to_string(),
        )))),
    }
}

fn script(body: &str) -> Script {
    Script::new(&format!("{}{body}", epoch::LUA))
}

/// Claims `epoch` in a region; answers the epoch that was in force.
pub async fn claim(con: &mut impl ConnectionLike, key: &str, epoch: u64) -> Result<u64, StoreError> {
    let previous = claim_as(con, key, epoch, "").await?;
    parse_stored(&previous)
        .map_err(|p| StoreError::Corrupt(Corrupt::new(key, "epoch", previous.as_bytes(), format!("is {p}"))))
}

/// An operator's deliberate claim: `epoch` replaces whatever is stored,
/// higher, corrupt or above the ceiling. Answers what was stored ("0":
/// nothing).
pub async fn take_over(con: &mut impl ConnectionLike, key: &str, epoch: u64) -> Result<String, StoreError> {
    claim_as(con, key, epoch, "take-over").await
}

async fn claim_as(con: &mut impl ConnectionLike, key: &str, epoch: u64, mode: &str) -> Result<String, StoreError> {
    let reply = script(CLAIM).key(key).arg(epoch).arg(mode).invoke_async(con).await?;
    outcome(key, epoch, reply)
}

/// The epoch in force in a region (0: never claimed).
pub async fn epoch(con: &mut impl ConnectionLike, key: &str) -> Result<u64, StoreError> {
    let stored: Option<Vec<u8>> = redis::cmd("HGET").arg(key).arg("epoch").query_async(con).await?;
    let Some(v) = stored else { return Ok(0) };
    parse_stored(&String::from_utf8_lossy(&v))
        .map_err(|p| StoreError::Corrupt(Corrupt::new(key, "epoch", &v, format!("is {p}"))))
}

/// Writes a region's table as the balancer of `epoch`; answers its version.
pub async fn write(
    con: &mut impl ConnectionLike,
    key: &str,
    epoch: u64,
    table: &ShareTable,
) -> Result<u64, StoreError> {
    let json = serde_json::to_string(table).expect("a share table always serializes");
    let reply = script(WRITE).key(key).arg(epoch).arg(json).invoke_async(con).await?;
    let version = outcome(key, epoch, reply)?;
    parse_stored(&version)
        .map_err(|p| StoreError::Corrupt(Corrupt::new(key, "version", version.as_bytes(), format!("is {p}"))))
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

/// Reads and clears a region's usage since the last call: (rule, subject, admitted).
pub async fn take_usage(con: &mut impl ConnectionLike, key: &str) -> RedisResult<Vec<(String, String, u64)>> {
    let flat: Vec<(String, u64)> = Script::new(TAKE_USAGE).key(usage_key(key)).invoke_async(con).await?;
    Ok(flat
        .into_iter()
        .filter_map(|(field, n)| field.split_once('|').map(|(r, s)| (r.to_string(), s.to_string(), n)))
        .collect())
}

/// The hash where a region's gateways confirm the table version they
/// enforce: one field per gateway, its value the version (as the gateway
/// writes it, a plain `HSET`) or `"<version> <server ms>"` once the
/// balancer has seen it (stamped when first seen: ages are on the
/// region's clock and never older than the write).
pub fn applied_key(key: &str) -> String {
    format!("{key}:applied")
}

/// Every gateway's confirmation with its age: a value written since the
/// last read is stamped now (age 0); a stamped one older than ARGV[1] ms,
/// or one no gateway writes, is deleted (the hash stays as small as the
/// fleet). Answers `{id, version, age, ...}`.
const CONFIRMATIONS: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local id, value = all[i], all[i + 1]
  local version, at = string.match(value, '^(%d+) (%d+)$')
  local age = nil
  if version then
    age = math.max(now - tonumber(at), 0)
  else
    version = string.match(value, '^(%d+)$')
    if version then
      age = 0
      redis.call('HSET', KEYS[1], id, version .. ' ' .. now)
    end
  end
  if age == nil or #version > 18 or age > expiry then
    redis.call('HDEL', KEYS[1], id)
  else
    table.insert(out, id)
    table.insert(out, version)
    table.insert(out, tostring(age))
  end
end
return out
";

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

/// The gateways' confirmations in a region: (gateway, version it
/// enforces, age on the region's clock), those older than `expiry`
/// deleted and left out.
pub async fn confirmations(
    con: &mut impl ConnectionLike,
    key: &str,
    expiry: Duration,
) -> RedisResult<Vec<crate::confirm::Applied>> {
    let expiry_ms = u64::try_from(expiry.as_millis()).unwrap_or(u64::MAX / 2).min(1 << 50);
    let flat: Vec<(String, u64, u64)> =
        Script::new(CONFIRMATIONS).key(applied_key(key)).arg(expiry_ms).invoke_async(con).await?;
    Ok(flat
        .into_iter()
        .map(|(gateway, version, age_ms)| crate::confirm::Applied {
            gateway,
            version,
            age: Duration::from_millis(age_ms),
        })
        .collect())
}
