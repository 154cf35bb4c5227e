//! The balancer's side of a region's share table (the table's fields, its
//! reading and the gateways' side are `rl_gateway::global::store`): the
//! epoch claimed, the table written, the usage taken, the gateways'
//! confirmations read. Every script checks and compares stored integers as
//! decimal strings ([`epoch::LUA`]).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};
use rl_gateway::global::ShareTable;

// The table's fields, its read, the gateways' confirmations: rl-gateway's,
// here too so that one module is the whole store for the balancer's code.
pub use rl_gateway::global::store::*;

use crate::epoch;

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

/// Reads and clears a region's usage since the last call: (rule, subject, admitted).
pub async fn take_usage(con: &mut impl ConnectionLike, key: &str) -> RedisResult<Vec<(String, String, u64)>> {
    let flat: Vec<(String, u64)> = Script::new(TAKE_USAGE).key(usage_key(key)).invoke_async(con).await?;
    Ok(flat
        .into_iter()
        .filter_map(|(field, n)| field.split_once('|').map(|(r, s)| (r.to_string(), s.to_string(), n)))
        .collect())
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
