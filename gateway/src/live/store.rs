//! Rules kept in Redis itself, so no extra service is needed.
//!
//! One hash (`rl:rules` by default) holds everything a gateway loads, so a
//! single HGETALL reads a consistent whole:
//!
//! | field | value |
//! |---|---|
//! | `version` | the version in force; every change moves it forward by at least one |
//! | `id` | the id of the change in force: new with every change |
//! | `lineage` | the id of this line of versions: the first change's `id` |
//! | `rules` | the rule set (the file's rules and settings) as JSON |
//! | `published_at` | Unix milliseconds of the last change |
//! | `override:<id>` | one emergency override as JSON: a rule with a subject or ip, an expiry and a reason |
//!
//! Every change runs one script that checks the version it was prepared
//! against, writes, moves the version and publishes `VERSION ID` on
//! the channel of the same name. Overrides live beside the rule set, not in
//! it: publishing a new rule file keeps them, and adding one does not
//! republish the file.
//!
//! A gateway takes the store's set whenever its `id` or version differs
//! from the one in force: a server that lost the hash (a restart without
//! persistence) starts a new lineage at version 1, a failover to a replica
//! that missed a change can give another change the same version, and
//! both are taken. Beside the hash,
//! `<key>:history` keeps the last published sets (for `rlctl history`,
//! `diff` and `rollback`), and `<key>:gateways` what each gateway runs
//! (for `rlctl status`).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use crate::{Connection, ConnectionStatus, Error, Result, Target, Tls};

use crate::live::compile::{parse_network, refused};
use crate::live::fleet::{new_lineage, GatewayReport, Origin};
use crate::live::history::{HistoryEntry, HISTORY_LEN};
use crate::live::snapshot::Snapshot;
use crate::live::spec::{stored_kind_changes, MatchSpec, RuleSetSpec, RuleSpec, MAX_RULES_BYTES, MAX_VERSION};

/// The hash (and pub/sub channel) used unless told otherwise.
pub const DEFAULT_KEY: &str = "rl:rules";

/// Longest an override may last: it is an emergency measure, so a
/// forgotten clamp cannot quietly limit a customer for months. Lasting
/// limits belong in the rule file.
pub const MAX_OVERRIDE: Duration = Duration::from_secs(30 * 86_400);

const OVERRIDE_FIELD: &str = "override:";

/// Checks the version, applies set/del operations, moves the version and
/// announces it, all at once. Lua numbers are doubles: versions are read
/// only when they are whole numbers up to 2^53 - 1, where doubles are
/// exact, and returned as the strings they came as.
const COMMIT: &str = r"
local MAX = 9007199254740991
local function version(text)
  local v = tonumber(text)
  if type(text) ~= 'string' or not string.match(text, '^%d+$') or v > MAX then return nil end
  return v
end
local raw = redis.call('HGET', KEYS[1], 'version') or '0'
local current = version(raw)
if current == nil then
  return redis.error_reply('ERR field version holds ' .. raw .. ': not a whole number up to 2^53 - 1')
end
if current ~= version(ARGV[1]) then
  return redis.error_reply('CHANGED the rules moved to version ' .. raw)
end
local after = version(ARGV[2])
if after == nil or after <= current then
  return redis.error_reply('ERR version ' .. ARGV[2] .. ' is not above ' .. raw .. ' and at most 2^53 - 1')
end
local lineage = redis.call('HGET', KEYS[1], 'lineage')
if not lineage then
  lineage = ARGV[4]
  redis.call('HSET', KEYS[1], 'lineage', lineage)
end
redis.call('HSET', KEYS[1], 'id', ARGV[4])
for i = 6, #ARGV, 3 do
  if ARGV[i] == 'set' then
    redis.call('HSET', KEYS[1], ARGV[i + 1], ARGV[i + 2])
  elseif ARGV[i] == 'history' then
    redis.call('LPUSH', KEYS[2], ARGV[2] .. ' ' .. lineage .. ' ' .. ARGV[i + 1] .. '\n' .. ARGV[i + 2])
    redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
  else
    redis.call('HDEL', KEYS[1], ARGV[i + 1])
  end
end
redis.call('HSET', KEYS[1], 'version', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[2] .. ' ' .. ARGV[4])
return ARGV[2]
";

/// What the store holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The version in force in the store (0: nothing published).
    pub version: u64,
    /// The id of the change in force (`None`: nothing published, or
    /// written before ids).
    pub publication: Option<String>,
    /// The lineage its versions count in (`None` as for `publication`).
    pub lineage: Option<String>,
    /// The rule set, once one was published.
    pub rules: Option<RuleSetSpec>,
    /// Every override that parses, expired ones included, by id.
    pub overrides: Vec<RuleSpec>,
    /// The override fields that do not parse (written past rlctl), each
    /// named with why: a gateway refuses the version while one is there.
    pub invalid: Vec<String>,
    /// When the last change was made.
    pub published_at: Option<SystemTime>,
}

impl Stored {
    /// Reads the hash's fields; the version, the rule set and the size
    /// must be right, an override that does not parse is set apart in
    /// `invalid`.
    pub(crate) fn from_fields(fields: &HashMap<String, String>) -> Result<Stored> {
        let version = parse_version(fields.get("version").map(String::as_str))?;
        let size: usize =
            fields.iter().filter(|(f, _)| *f == "rules" || f.starts_with(OVERRIDE_FIELD)).map(|(_, v)| v.len()).sum();
        if size > MAX_RULES_BYTES {
            return Err(Error::Rules(format!(
                "the stored rules and overrides are {size} bytes: at most {MAX_RULES_BYTES} (1 MiB)"
            )));
        }
        let rules = match fields.get("rules") {
            Some(json) => Some(RuleSetSpec::from_json(json).map_err(|e| Error::Rules(format!("field 'rules': {e}")))?),
            None => None,
        };
        let (mut overrides, mut invalid) = (Vec::new(), Vec::new());
        for (field, json) in fields {
            let Some(id) = field.strip_prefix(OVERRIDE_FIELD) else { continue };
            match RuleSpec::from_json(json) {
                Ok(rule) if rule.id == id => overrides.push(rule),
                Ok(rule) => invalid.push(format!("field '{field}' holds override '{}', not '{id}'", rule.id)),
                Err(e) => invalid.push(format!("field '{field}': {e}")),
            }
        }
        overrides.sort_by(|a, b| a.id.cmp(&b.id));
        invalid.sort();
        let published_at = fields
            .get("published_at")
            .and_then(|ms| ms.parse::<u64>().ok())
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
        let (publication, lineage) = (fields.get("id").cloned(), fields.get("lineage").cloned());
        Ok(Stored { version, publication, lineage, rules, overrides, invalid, published_at })
    }

    /// An error naming every override that does not parse, if any: what
    /// a gateway refuses the version for, and what blocks a change.
    pub(crate) fn check_overrides(&self) -> Result<()> {
        if self.invalid.is_empty() {
            return Ok(());
        }
        Err(Error::Rules(format!(
            "stored overrides rejected: {} (remove with rlctl override remove --id ID)",
            self.invalid.join("; ")
        )))
    }
}

/// Refuses a stored set and overrides above [`MAX_RULES_BYTES`] together.
fn check_size(rules_json: &str, overrides: &[RuleSpec]) -> Result<()> {
    let of_overrides: usize = overrides.iter().map(|o| o.to_json().len()).sum();
    let size = rules_json.len() + of_overrides;
    if size > MAX_RULES_BYTES {
        return Err(Error::Rules(format!(
            "the rules would be {size} bytes stored (the set {}, the overrides {of_overrides}): at most {MAX_RULES_BYTES} (1 MiB)",
            rules_json.len()
        )));
    }
    Ok(())
}

fn parse_version(text: Option<&str>) -> Result<u64> {
    match text {
        None => Ok(0),
        Some(v) => v.parse().ok().filter(|&v| v <= MAX_VERSION).ok_or_else(|| {
            Error::Rules(format!("field 'version' is not a whole number up to {MAX_VERSION} (2^53 - 1): {v:?}"))
        }),
    }
}

/// The version after `version`: an error at the largest.
fn next_version(version: u64) -> Result<u64> {
    version.checked_add(1).filter(|&v| v <= MAX_VERSION).ok_or_else(|| {
        Error::Rules(format!(
            "the rules are at version {version}, the largest a version may be (2^53 - 1): nothing can come after it"
        ))
    })
}

/// The rules hash in one Redis server: read by gateways, changed by
/// `rlctl`.
#[derive(Clone)]
pub struct RulesStore {
    con: Connection,
    key: String,
    url: String,
}

impl RulesStore {
    /// The rules under `key` on the server at `url` (a standalone server:
    /// the limiter's own or any other; or a `redis+sentinel://` URL: the
    /// master its sentinels name, followed across a failover). Connects on
    /// first use and reconnects by itself (rl-client's connection, which
    /// also leaves a demoted primary); each call waits at most `timeout`.
    /// Call it inside a tokio runtime.
    pub fn new(url: &str, key: &str, timeout: Duration) -> Result<RulesStore> {
        RulesStore::with_tls(url, key, &Tls::default(), timeout)
    }

    /// [`RulesStore::new`] with TLS settings for a `rediss://` (or
    /// `rediss+sentinel://`) URL.
    pub fn with_tls(url: &str, key: &str, tls: &Tls, timeout: Duration) -> Result<RulesStore> {
        if key.is_empty() {
            return Err(Error::invalid("the rules key must not be empty"));
        }
        let con = Connection::open_with_tls(&Target::from_url(url)?, tls, timeout, timeout)?;
        Ok(RulesStore { con, key: key.to_owned(), url: url.to_owned() })
    }

    /// The connection (for a subscription to the channel on the same server).
    pub fn connection(&self) -> &Connection {
        &self.con
    }

    /// Which server the store talks to.
    pub fn status(&self) -> ConnectionStatus {
        self.con.status()
    }

    /// The hash's key, also the channel new versions are announced on.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The server's URL, as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The version in force in the store: one HGET, what a gateway polls.
    pub async fn version(&self) -> Result<u64> {
        let v: Option<String> =
            redis::cmd("HGET").arg(&self.key).arg("version").query_async(&mut self.con.clone()).await?;
        parse_version(v.as_deref())
    }

    /// The version in force and its origin: one HMGET, what a gateway polls.
    pub(crate) async fn head(&self) -> Result<(u64, Origin)> {
        let (v, publication, lineage): (Option<String>, Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&self.key)
            .arg("version")
            .arg("id")
            .arg("lineage")
            .query_async(&mut self.con.clone())
            .await?;
        Ok((parse_version(v.as_deref())?, Origin { publication, lineage }))
    }

    /// Everything the hash holds, parsed.
    pub async fn read(&self) -> Result<Stored> {
        Stored::from_fields(&self.fields().await?)
    }

    pub(crate) async fn fields(&self) -> Result<HashMap<String, String>> {
        Ok(redis::cmd("HGETALL").arg(&self.key).query_async(&mut self.con.clone()).await?)
    }

    /// Publishes `rules` as the next version (or as its own `version`,
    /// which must be above the one in force), after checking it with the
    /// overrides in force. Returns the version published.
    pub async fn publish(&self, rules: &RuleSetSpec) -> Result<u64> {
        self.retrying(|stored| {
            stored.check_overrides()?;
            let version = match rules.version {
                Some(v) if v > stored.version => v,
                Some(v) => {
                    return Err(Error::Rules(format!(
                        "rule set rejected: version {v} is not above version {} in force: leave version out to take the next",
                        stored.version
                    )))
                }
                None => next_version(stored.version)?,
            };
            // Checked for the backend the set declares.
            Snapshot::compile(rules, &stored.overrides, version)?;
            let changes = stored.rules.as_ref().map(|old| stored_kind_changes(old, rules)).unwrap_or_default();
            if !changes.is_empty() {
                return Err(Error::Rules(format!("rule set rejected: {}", changes.join("; "))));
            }
            // The version lives in its own field: the stored set has none.
            let body = RuleSetSpec { version: None, ..rules.clone() }.to_json();
            check_size(&body, &stored.overrides)?;
            Ok((version, vec![Op::Set("rules".to_owned(), body.clone()), Op::History(body)]))
        })
        .await
    }

    /// Adds (or replaces) an emergency override: a rule matching one
    /// subject or one ip, with a reason and an expiry within
    /// [`MAX_OVERRIDE`], checked with the rule set in force for the
    /// backend it declares. An override for the same match (the exact
    /// subject, or the same network however written) under another id is
    /// replaced; an id already used for another match is refused. Returns
    /// the new version.
    pub async fn set_override(&self, rule: &RuleSpec) -> Result<u64> {
        let now = SystemTime::now();
        let expires = rule.expires.as_deref().map(humantime::parse_rfc3339);
        let rejected = |why: String| Error::Rules(format!("override rejected: override '{}': {why}", rule.id));
        match expires {
            Some(Ok(at)) if at <= now => return Err(rejected("expires is in the past".to_owned())),
            Some(Ok(at)) if at.duration_since(now).unwrap_or_default() > MAX_OVERRIDE => {
                return Err(rejected(
                    "expires must be within 30 days; lasting limits belong in the rule file".to_owned(),
                ))
            }
            // Missing or malformed: the snapshot's checks name it below.
            _ => {}
        }
        let wanted = target(&rule.scope);
        self.retrying(|stored| {
            let Some(rules) = &stored.rules else {
                return Err(Error::Rules("nothing is published yet: publish a rule file first".to_owned()));
            };
            stored.check_overrides()?;
            if let Some(other) = stored.overrides.iter().find(|o| o.id == rule.id && target(&o.scope) != wanted) {
                return Err(rejected(format!(
                    "the id is already the override of {}: remove that one, or give this one another --id",
                    shown(&other.scope)
                )));
            }
            // The same id keeps the same keys: a limit changing kind on them
            // would answer WRONGTYPE until they expire, as publish refuses.
            if let Some(old) = stored.overrides.iter().find(|o| o.id == rule.id) {
                let alone = |r: &RuleSpec| RuleSetSpec { rules: vec![r.clone()], ..rules.clone() };
                let changes = stored_kind_changes(&alone(old), &alone(rule));
                if !changes.is_empty() {
                    return Err(rejected(format!(
                        "it replaces the override with the same id: {} (or remove the old one first)",
                        changes.join("; ")
                    )));
                }
            }
            let replaced: Vec<&RuleSpec> =
                stored.overrides.iter().filter(|o| o.id != rule.id && target(&o.scope) == wanted).collect();
            let mut overrides: Vec<RuleSpec> =
                stored.overrides.iter().filter(|o| o.id != rule.id && target(&o.scope) != wanted).cloned().collect();
            overrides.push(rule.clone());
            let version = next_version(stored.version)?;
            Snapshot::build(rules, &overrides, version, false, None).map_err(|f| refused("override", &f))?;
            check_size(&rules.to_json(), &overrides)?;
            let mut ops: Vec<Op> = replaced.iter().map(|o| Op::Del(format!("{OVERRIDE_FIELD}{}", o.id))).collect();
            ops.push(Op::Set(format!("{OVERRIDE_FIELD}{}", rule.id), rule.to_json()));
            Ok((version, ops))
        })
        .await
    }

    /// Removes the override of exactly `scope` (a subject, or a network
    /// however written), whatever its id (ids of older rlctl versions
    /// too). Returns its id and the new version.
    pub async fn remove_override_for(&self, scope: &MatchSpec) -> Result<(String, u64)> {
        let wanted = target(scope);
        for _ in 0..5 {
            let stored = Stored::from_fields(&self.fields().await?)?;
            let ids: Vec<&str> =
                stored.overrides.iter().filter(|o| target(&o.scope) == wanted).map(|o| o.id.as_str()).collect();
            if ids.is_empty() {
                return Err(Error::Rules(format!("no override for {}", shown(scope))));
            }
            let ops: Vec<Op> = ids.iter().map(|id| Op::Del(format!("{OVERRIDE_FIELD}{id}"))).collect();
            match self.commit(stored.version, next_version(stored.version)?, &ops).await {
                Err(e) if is_changed(&e) => continue,
                other => return Ok((ids.join(", "), other?)),
            }
        }
        Err(Error::Rules("the rules kept changing; try again".to_owned()))
    }

    /// Removes the override `id`. Returns the new version.
    pub async fn remove_override(&self, id: &str) -> Result<u64> {
        let field = format!("{OVERRIDE_FIELD}{id}");
        // Not parsed: removing an override can never make the set invalid,
        // and a broken one must still be removable.
        for _ in 0..5 {
            let fields = self.fields().await?;
            if !fields.contains_key(&field) {
                return Err(Error::Rules(format!("no override '{id}'")));
            }
            let version = parse_version(fields.get("version").map(String::as_str))?;
            match self.commit(version, next_version(version)?, &[Op::Del(field.clone())]).await {
                Err(e) if is_changed(&e) => continue,
                other => return other,
            }
        }
        Err(Error::Rules("the rules kept changing; try again".to_owned()))
    }

    /// Reads, prepares with `prepare`, and commits if nobody changed the
    /// rules meanwhile; else reads again (a few times).
    async fn retrying(&self, prepare: impl Fn(&Stored) -> Result<(u64, Vec<Op>)>) -> Result<u64> {
        for _ in 0..5 {
            let stored = self.read().await?;
            let (version, mut ops) = prepare(&stored)?;
            let now_ms = unix_ms(SystemTime::now());
            ops.push(Op::Set("published_at".to_owned(), now_ms.to_string()));
            match self.commit(stored.version, version, &ops).await {
                Err(e) if is_changed(&e) => continue,
                other => return other,
            }
        }
        Err(Error::Rules("the rules kept changing; try again".to_owned()))
    }

    /// Runs the commit script; one that met a replica (a failover under
    /// way: it did not run) runs once more, on the primary found again.
    async fn commit(&self, expected: u64, version: u64, ops: &[Op]) -> Result<u64> {
        let script = redis::Script::new(COMMIT);
        let mut call = script.key(&self.key);
        call.key(self.history_key());
        call.arg(expected).arg(version).arg(&self.key).arg(new_lineage()).arg(HISTORY_LEN);
        let now_ms = unix_ms(SystemTime::now());
        for op in ops {
            match op {
                Op::Set(field, value) => call.arg("set").arg(field).arg(value),
                Op::Del(field) => call.arg("del").arg(field).arg(""),
                Op::History(set) => call.arg("history").arg(now_ms).arg(set),
            };
        }
        match call.invoke_async(&mut self.con.clone()).await {
            Err(e) if crate::is_wrong_server(&e) => Ok(call.invoke_async(&mut self.con.clone()).await?),
            answer => Ok(answer?),
        }
    }

    /// The list of past rule sets, newest first.
    fn history_key(&self) -> String {
        format!("{}:history", self.key)
    }

    /// The hash of what each gateway runs.
    fn reports_key(&self) -> String {
        format!("{}:gateways", self.key)
    }

    /// The rule sets published, newest first (at most [`HISTORY_LEN`]);
    /// an entry that does not parse is skipped.
    pub async fn history(&self) -> Result<Vec<HistoryEntry>> {
        let raw: Vec<String> =
            redis::cmd("LRANGE").arg(self.history_key()).arg(0).arg(-1).query_async(&mut self.con.clone()).await?;
        Ok(raw.iter().filter_map(|r| HistoryEntry::parse(r)).collect())
    }

    /// Publishes the set of `version` from the history again, as the next
    /// version, with every check of [`publish`](Self::publish). Returns
    /// the new version.
    pub async fn rollback(&self, version: u64) -> Result<u64> {
        let history = self.history().await?;
        let Some(entry) = history.iter().find(|e| e.version == version) else {
            let kept: Vec<String> = history.iter().map(|e| e.version.to_string()).collect();
            return Err(Error::Rules(format!(
                "version {version} is not in the history (kept: {})",
                if kept.is_empty() { "none".to_owned() } else { kept.join(", ") }
            )));
        };
        self.publish(&entry.rules).await
    }

    /// Writes what this gateway runs under `name` (one field per gateway).
    pub async fn report(&self, name: &str, report: &GatewayReport) -> Result<()> {
        let _: () = redis::cmd("HSET")
            .arg(self.reports_key())
            .arg(name)
            .arg(report.to_json())
            .query_async(&mut self.con.clone())
            .await?;
        Ok(())
    }

    /// What every gateway last reported, by name; a report that does not
    /// parse is left out.
    pub async fn reports(&self) -> Result<Vec<(String, GatewayReport)>> {
        let raw: HashMap<String, String> =
            redis::cmd("HGETALL").arg(self.reports_key()).query_async(&mut self.con.clone()).await?;
        let mut out: Vec<(String, GatewayReport)> =
            raw.into_iter().filter_map(|(name, json)| Some((name, GatewayReport::from_json(&json)?))).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Removes the reports of gateways gone for good.
    pub async fn forget_reports(&self, names: &[String]) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let _: () = redis::cmd("HDEL").arg(self.reports_key()).arg(names).query_async(&mut self.con.clone()).await?;
        Ok(())
    }

    /// Deletes `keys` (a subject's keys) and tells every gateway on the
    /// rules channel to drop what it remembers of `subject`. Returns the
    /// keys deleted and the watchers that heard it.
    pub async fn unlock(&self, subject: &str, keys: &[String]) -> Result<(u64, u64)> {
        let deleted: u64 =
            if keys.is_empty() { 0 } else { redis::cmd("DEL").arg(keys).query_async(&mut self.con.clone()).await? };
        let heard: u64 = redis::cmd("PUBLISH")
            .arg(&self.key)
            .arg(format!("{UNLOCK}{subject}"))
            .query_async(&mut self.con.clone())
            .await?;
        Ok((deleted, heard))
    }
}

/// The rules channel's message telling gateways to forget a subject:
/// this, then the subject as it is.
pub(crate) const UNLOCK: &str = "unlock ";

pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

enum Op {
    Set(String, String),
    Del(String),
    /// The published set, kept in the history.
    History(String),
}

fn is_changed(e: &Error) -> bool {
    matches!(e, Error::Redis(r) if r.code() == Some("CHANGED"))
}

/// What an override matches, exactly: `subject` or `ip`, a NUL, and the
/// subject as written or the network as parsed (`10.1.2.3` and
/// `10.1.2.3/32` are one network).
fn target(scope: &MatchSpec) -> String {
    match (&scope.subject, &scope.ip) {
        (Some(subject), None) => format!("subject\0{subject}"),
        (None, Some(ip)) => format!("ip\0{}", parse_network(ip).map_or_else(|| ip.clone(), |net| net.to_string())),
        _ => format!("other\0{scope:?}"),
    }
}

/// What an override matches, for messages.
fn shown(scope: &MatchSpec) -> String {
    let target = target(scope);
    let (kind, what) = target.split_once('\0').unwrap_or_default();
    match kind {
        "subject" => format!("subject {what:?}"),
        "ip" => format!("ip {what}"),
        _ => what.to_owned(),
    }
}

/// An override's id from what it matches: `ovr-`, the subject or network
/// with anything but letters, digits, `_`, `-`, `.` made `_` (at most 40
/// characters, to read), `-`, and 16 hex digits of the XXH3-64 hash of
/// exactly what it matches (subject or network), so two subjects never
/// share an id by their spelling. A hash collision is refused when added.
pub fn override_id(scope: &MatchSpec) -> String {
    let target = target(scope);
    let what = target.split_once('\0').map_or("", |(_, what)| what);
    let plain: String = what
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') { c } else { '_' })
        .take(40)
        .collect();
    format!("ovr-{plain}-{:016x}", xxhash_rust::xxh3::xxh3_64(target.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse_and_name_what_is_broken() {
        let mut fields = HashMap::from([
            ("version".to_owned(), "7".to_owned()),
            ("published_at".to_owned(), "1700000000000".to_owned()),
            ("rules".to_owned(), r#"{"rules":[]}"#.to_owned()),
            ("override:b".to_owned(), r#"{"id":"b","limits":[],"reason":"r"}"#.to_owned()),
            ("override:a".to_owned(), r#"{"id":"a","limits":[],"reason":"r"}"#.to_owned()),
        ]);
        let s = Stored::from_fields(&fields).unwrap();
        assert_eq!(s.version, 7);
        assert_eq!(s.overrides.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(s.published_at, Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
        // A broken override is set apart and named, not fatal to reading.
        fields.insert("override:c".to_owned(), "{".to_owned());
        fields.insert("override:d".to_owned(), r#"{"id":"e","limits":[],"reason":"r"}"#.to_owned());
        let s = Stored::from_fields(&fields).unwrap();
        assert_eq!(s.overrides.len(), 2);
        assert!(s.invalid[0].starts_with("field 'override:c': "), "{:?}", s.invalid);
        assert_eq!(s.invalid[1], "field 'override:d' holds override 'e', not 'd'");
        let e = s.check_overrides().unwrap_err().to_string();
        assert!(e.starts_with("stored overrides rejected: field 'override:c'"), "{e}");
        fields.remove("override:c");
        fields.remove("override:d");
        for bad in ["x", "-1", "9007199254740992", "18446744073709551615", "18446744073709551616"] {
            fields.insert("version".to_owned(), bad.to_owned());
            assert!(Stored::from_fields(&fields).unwrap_err().to_string().contains("field 'version'"), "{bad}");
        }
        fields.insert("version".to_owned(), "9007199254740991".to_owned());
        assert_eq!(Stored::from_fields(&fields).unwrap().version, MAX_VERSION);
    }

    #[test]
    fn the_next_version_stops_at_the_largest() {
        assert_eq!(next_version(6).unwrap(), 7);
        assert_eq!(next_version(MAX_VERSION - 1).unwrap(), MAX_VERSION);
        assert!(next_version(MAX_VERSION).unwrap_err().to_string().contains("the largest"));
        assert!(next_version(u64::MAX).is_err(), "no overflow");
    }

    fn subject(s: &str) -> MatchSpec {
        MatchSpec { subject: Some(s.to_owned()), ..MatchSpec::default() }
    }

    fn ip(text: &str) -> MatchSpec {
        MatchSpec { ip: Some(text.to_owned()), ..MatchSpec::default() }
    }

    #[test]
    fn override_ids_are_readable_and_unique_per_exact_match() {
        let id = override_id(&subject("key_8f3"));
        assert!(id.starts_with("ovr-key_8f3-") && id.len() == "ovr-key_8f3-".len() + 16, "{id}");
        // XXH3-64 of "subject\0key_8f3": the same on every build, so ids
        // written today are found tomorrow.
        assert_eq!(id, format!("ovr-key_8f3-{:016x}", xxhash_rust::xxh3::xxh3_64(b"subject\0key_8f3")));
        // Spelled alike once made plain: distinct ids (the old ids collided).
        assert_ne!(override_id(&subject("key:1")), override_id(&subject("key 1")));
        let long = "x".repeat(60);
        let (prod, staging) = (format!("{long}-prod"), format!("{long}-staging"));
        assert_ne!(override_id(&subject(&prod)), override_id(&subject(&staging)));
        assert!(override_id(&subject(&"x".repeat(600))).len() <= 64, "a valid rule id");
        // One network however written; a subject spelled like a network is another match.
        assert_eq!(override_id(&ip("10.1.2.3")), override_id(&ip("10.1.2.3/32")));
        assert_eq!(override_id(&ip("::ffff:10.0.0.0/104")), override_id(&ip("10.0.0.0/8")));
        assert!(override_id(&ip("2001:db8::/48")).starts_with("ovr-2001_db8___48-"));
        assert_ne!(override_id(&ip("10.0.0.0/8")), override_id(&subject("10.0.0.0/8")));
        assert_eq!(target(&ip("10.1.2.3")), target(&ip("10.1.2.3/32")));
    }

    #[test]
    fn oversized_stores_are_refused_with_their_size() {
        // A set that parses, of exactly the bound.
        let big = format!(r#"{{"key_prefix":"{}"}}"#, "x".repeat(MAX_RULES_BYTES - 17));
        assert_eq!(big.len(), MAX_RULES_BYTES);
        let fields = HashMap::from([("rules".to_owned(), big.clone()), ("version".to_owned(), "1".to_owned())]);
        assert!(Stored::from_fields(&fields).is_ok(), "exactly the bound");
        let mut fields = fields;
        fields.insert("override:a".to_owned(), "{}".to_owned());
        let e = Stored::from_fields(&fields).unwrap_err().to_string();
        assert!(e.contains(&format!("{} bytes: at most 1048576", MAX_RULES_BYTES + 2)), "{e}");
        let e = check_size(&big, &[RuleSpec::default()]).unwrap_err().to_string();
        assert!(e.contains("at most 1048576 (1 MiB)") && e.contains(&format!("the set {MAX_RULES_BYTES}")), "{e}");
    }
}
