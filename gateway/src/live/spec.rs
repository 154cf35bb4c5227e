//! The rule file format (TOML or JSON, one schema), as written by people
//! and stored in Redis. Only the shape is checked here (unknown fields,
//! types); what the values mean is checked when a snapshot is compiled.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::global::GlobalSpec;
use crate::{Backend, Error, FailMode, Result};
use rl_core::WindowMode;

/// The largest version: 2^53 - 1. Versions are compared in the rules
/// store's Lua script, whose numbers are doubles, exact only up to there.
pub const MAX_VERSION: u64 = (1 << 53) - 1;

/// The largest version a rule file (or `install`) may name: 2^52. What the
/// store assigns goes on to [`MAX_VERSION`], so a written version always
/// leaves 2^52 - 1 changes after it and cannot freeze the rules.
pub const MAX_WRITTEN_VERSION: u64 = 1 << 52;

/// The largest rule file, and the largest stored set (the set and its
/// overrides together): 1 MiB. Rule sets are written by people; a bigger
/// one is a mistake, and every gateway would parse it on every version.
pub const MAX_RULES_BYTES: usize = 1 << 20;

/// A whole rule set as written: what `rlctl publish` sends and a gateway
/// loads.
///
/// ```toml
/// version = 3            # optional: without it the next version is assigned
/// key_prefix = "rl"      # bucket keys are rl:<rule id>:{subject}:<limit>
/// ipv6_prefix = 64       # an IPv6 client is its /64
///
/// [[rules]]
/// id = "default"
/// reason = "every caller without a rule of its own"
/// limits = [{ name = "per_second", rate = 100, per = "1s", burst = 200 }]
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSetSpec {
    /// Must move forward, up to [`MAX_VERSION`]; absent, the store (or a
    /// reloaded file) assigns the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// First part of every bucket key. Default `rl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// An IPv4 client without a subject is limited per this prefix. Default 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_prefix: Option<u8>,
    /// An IPv6 client without a subject is limited per this prefix, so a
    /// host cannot dodge its limit by rotating addresses. Default 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_prefix: Option<u8>,
    /// The backend the fleet's gateways run: `module` (default) or `lua`.
    /// With `lua`, publishing refuses what the Lua backend cannot count
    /// (an EXACT window above 10,000, a limit x period above 2^52), and so
    /// does adding an override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<FleetBackend>,
    /// An override on an IPv4 network shorter than this prefix is broad
    /// and needs `broad = true` (rlctl: `--broad`). Default 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broad_ipv4_prefix: Option<u8>,
    /// The same for IPv6. Default 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broad_ipv6_prefix: Option<u8>,
    /// The rules, in any order: the most specific match wins.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
}

/// The backend a rule set is published for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FleetBackend {
    /// The redis-rl module: every kind of limit.
    #[default]
    Module,
    /// rl-client's Lua scripts: a limit x period up to 2^52, an EXACT
    /// window up to 10,000.
    Lua,
}

impl FleetBackend {
    /// The client's backend of the same name.
    pub fn backend(self) -> Backend {
        match self {
            FleetBackend::Module => Backend::Module,
            FleetBackend::Lua => Backend::Lua,
        }
    }
}

/// One rule as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Unique in the set; part of the rule's bucket keys.
    pub id: String,
    /// Which requests the rule is for; empty: every request (the default rule).
    #[serde(default, rename = "match", skip_serializing_if = "MatchSpec::is_empty")]
    pub scope: MatchSpec,
    /// One or more limits, all of which must admit a request.
    pub limits: Vec<LimitSpec>,
    /// `enforce` (default) or `shadow`: evaluated and reported, never enforced.
    #[serde(default, skip_serializing_if = "is_default")]
    pub mode: Mode,
    /// `open` (default): limit locally while Redis cannot answer; `closed`: refuse.
    #[serde(default, skip_serializing_if = "is_default")]
    pub fail: FailMode,
    /// True: every request the rule matches shares one set of buckets
    /// (a whole IP block, an endpoint's total); false (default): each
    /// subject has its own.
    #[serde(default, skip_serializing_if = "is_default")]
    pub shared: bool,
    /// Which requests the rule limits by their address, when the tower
    /// layer's decider (`LiveDecide`) reaches it through one: `keyless`
    /// (default) or `all` (requests with an API key too).
    #[serde(default, skip_serializing_if = "is_default")]
    pub ip_tier: IpTier,
    /// When the rule stops applying: a UTC time, `2026-10-28T09:00:00Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// An override only: true allows a network broader than the set's
    /// `broad_ipv4_prefix` / `broad_ipv6_prefix` (`0.0.0.0/0` outranks
    /// every rule for every IPv4 client).
    #[serde(default, skip_serializing_if = "is_default")]
    pub broad: bool,
    /// Why the rule exists (a ticket, an incident): required.
    pub reason: String,
    /// A global limit across regions: each region enforces its share of
    /// the rule's limits with its own Redis (see [`GlobalSpec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<GlobalSpec>,
}

/// The global rules of a set, as the quota balancer reads them: (rule id,
/// its split). Unchecked: compile the set first ([`Snapshot::compile`](crate::live::Snapshot::compile)).
pub fn global_rules(spec: &RuleSetSpec) -> Vec<(String, GlobalSpec)> {
    spec.rules.iter().filter_map(|r| r.global.clone().map(|g| (r.id.clone(), g))).collect()
}

/// The limits of `new` that keep the keys of a limit of `old` (same key
/// prefix, rule id and limit name) but store something else there: each
/// named, for a publish to refuse. Keys of the old kind would answer
/// WRONGTYPE to every request of the subject until they expire.
pub fn stored_kind_changes(old: &RuleSetSpec, new: &RuleSetSpec) -> Vec<String> {
    let prefix = |s: &RuleSetSpec| s.key_prefix.clone().unwrap_or_else(|| "rl".to_owned());
    if prefix(old) != prefix(new) {
        return Vec::new();
    }
    let mut changes = Vec::new();
    for rule in &new.rules {
        let Some(before) = old.rules.iter().find(|r| r.id == rule.id) else { continue };
        for limit in &rule.limits {
            let Some(was) = before.limits.iter().find(|l| l.name == limit.name) else { continue };
            if was.kind.stored_as() != limit.kind.stored_as() {
                changes.push(format!(
                    "rule '{}' limit '{}' changes from {} to {} on the same keys (their count would answer WRONGTYPE until it expires): give the limit a new name",
                    rule.id,
                    limit.name,
                    was.kind.name(),
                    limit.kind.name()
                ));
            }
        }
    }
    changes
}

/// Which requests a rule matches. Allowed: nothing (the default rule),
/// `subject` alone, `ip` alone, or `plan` and/or `endpoint`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    /// One subject: an API key, a user, a tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// An address or a network: `203.0.113.0/24`, `2001:db8::/48`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// A plan tier, as the gateway names it: `free`, `pro`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// An endpoint, as the gateway names it (its route): `POST /payments`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

impl MatchSpec {
    fn is_empty(&self) -> bool {
        *self == MatchSpec::default()
    }
}

/// One limit of a rule as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    /// Unique in the rule; the last part of its keys and its name in headers.
    pub name: String,
    /// `bucket` (default), `window`, `exact`, `quota` or `inflight`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub kind: LimitKind,
    /// A bucket's refill: `rate` tokens every `per`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// A bucket's capacity; default `rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// A window's or quota's limit: at most `limit` every `per`; an
    /// in-flight limit's: at most `limit` at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The period: `1s`, `15m`, `1h`, `1d`, `500ms`. Every kind but
    /// `inflight` needs it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub per: String,
    /// An in-flight limit's timeout: a slot not released by then is
    /// dropped by the server (`30s`); above the endpoint's p99.9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// How a limit counts: a token bucket, a window of one mode, or the
/// requests in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitKind {
    /// Token bucket (`rate`, `per`, `burst`): RL.TAKE, with leases.
    #[default]
    Bucket,
    /// Sliding-window counter (`limit`, `per`): RL.WINDOW SLIDING.
    Window,
    /// Exact sliding log (`limit` up to the server's `max-log-limit`): RL.WINDOW EXACT.
    Exact,
    /// Fixed window aligned to the Unix epoch (`limit`, `per`; a day
    /// resets at UTC midnight): RL.WINDOW FIXED.
    Quota,
    /// Requests in flight (`limit` at once, each slot held at most
    /// `timeout`): RL.ACQUIRE / RL.RELEASE, through
    /// [`LiveRules::acquire`](crate::live::LiveRules::acquire).
    Inflight,
}

impl LimitKind {
    /// Every kind.
    pub const ALL: [LimitKind; 5] =
        [LimitKind::Bucket, LimitKind::Window, LimitKind::Exact, LimitKind::Quota, LimitKind::Inflight];

    /// The kind's name in rule files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LimitKind::Bucket => "bucket",
            LimitKind::Window => "window",
            LimitKind::Exact => "exact",
            LimitKind::Quota => "quota",
            LimitKind::Inflight => "inflight",
        }
    }

    /// What its keys hold in Redis. Kinds that hold the same may replace
    /// one another on the same keys (SLIDING and FIXED share one count);
    /// any other change meets keys of the old kind, which answer WRONGTYPE
    /// until they expire.
    pub fn stored_as(self) -> &'static str {
        match self {
            LimitKind::Bucket => "a token bucket",
            LimitKind::Window | LimitKind::Quota => "a window count",
            LimitKind::Exact => "an exact log",
            LimitKind::Inflight => "an in-flight set",
        }
    }

    /// How RL.WINDOW counts a limit of this kind; `None` for a bucket or
    /// an in-flight limit.
    pub fn window_mode(self) -> Option<WindowMode> {
        match self {
            LimitKind::Bucket | LimitKind::Inflight => None,
            LimitKind::Window => Some(WindowMode::Sliding),
            LimitKind::Exact => Some(WindowMode::Exact),
            LimitKind::Quota => Some(WindowMode::Fixed),
        }
    }
}

/// Which requests a rule limits by their client address (the tower
/// layer's view of a request by IP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpTier {
    /// Requests without an API key: a keyed request is limited by its
    /// key's rules only (two keys behind one NAT do not share a bucket).
    #[default]
    Keyless,
    /// Every request from the address, with a key or not: the keys behind
    /// one address share its buckets.
    All,
}

/// Whether a rule is enforced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refuses what its limits refuse.
    #[default]
    Enforce,
    /// Evaluated and reported (which subject it would have refused, how
    /// often), never enforced.
    Shadow,
}

/// A rule file's text, at most [`MAX_RULES_BYTES`]; an error names the file.
pub(crate) fn read(path: &Path) -> Result<String> {
    let cannot = |e: std::io::Error| Error::Rules(format!("cannot read {}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(cannot)?;
    // Read one byte past the bound: a file growing meanwhile is caught too.
    let mut bytes = Vec::new();
    file.take(MAX_RULES_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() > MAX_RULES_BYTES {
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(bytes.len() as u64);
        return Err(Error::Rules(format!(
            "{} is {size} bytes: a rule file is at most {MAX_RULES_BYTES} bytes (1 MiB)",
            path.display()
        )));
    }
    String::from_utf8(bytes).map_err(|e| Error::Rules(format!("cannot read {}: not UTF-8 ({e})", path.display())))
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl RuleSetSpec {
    /// Reads a rule file: `.json` as JSON, anything else as TOML.
    pub fn from_file(path: impl AsRef<Path>) -> Result<RuleSetSpec> {
        let path = path.as_ref();
        RuleSetSpec::from_text(path, &read(path)?)
    }

    /// Parses `text`, read from `path`: `.json` as JSON, anything else as
    /// TOML; an error names the file.
    pub(crate) fn from_text(path: &Path, text: &str) -> Result<RuleSetSpec> {
        let json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let parsed = if json { RuleSetSpec::from_json(text) } else { RuleSetSpec::from_toml(text) };
        parsed.map_err(|e| match e {
            Error::Rules(why) => Error::Rules(format!("{}: {why}", path.display())),
            other => other,
        })
    }

    /// Parses TOML; an error names the line, column and field.
    pub fn from_toml(text: &str) -> Result<RuleSetSpec> {
        toml::from_str(text).map_err(|e| Error::Rules(e.to_string().trim_end().to_owned()))
    }

    /// Parses JSON; an error names the line, column and field.
    pub fn from_json(text: &str) -> Result<RuleSetSpec> {
        serde_json::from_str(text).map_err(|e| Error::Rules(e.to_string()))
    }

    /// The compact JSON form stored in Redis.
    pub fn to_json(&self) -> String {
        // Plain strings, integers and enums: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl RuleSpec {
    /// Parses one rule (an override as stored in Redis).
    pub fn from_json(text: &str) -> Result<RuleSpec> {
        serde_json::from_str(text).map_err(|e| Error::Rules(e.to_string()))
    }

    /// The compact JSON form stored in Redis.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl LimitSpec {
    /// Reads the command line's short form: `NAME=COUNT/PER`, then
    /// optionally `,burst=N` (a bucket) or `,window`, `,exact`, `,quota`,
    /// or `,inflight` (then PER is the timeout): `per_second=10/1s,burst=20`,
    /// `daily=1000/1d,quota`, `concurrent=20/30s,inflight`.
    pub fn parse_short(text: &str) -> Result<LimitSpec> {
        let bad = |why: &str| {
            Error::Rules(format!(
                "limit {text:?}: {why}; expected NAME=COUNT/PER[,burst=N|,window|,exact|,quota|,inflight], like per_second=10/1s,burst=20"
            ))
        };
        let (name, rest) = text.split_once('=').ok_or_else(|| bad("no '='"))?;
        let mut parts = rest.split(',');
        let (count, per) =
            parts.next().unwrap_or("").split_once('/').ok_or_else(|| bad("no '/' between count and period"))?;
        let count: u64 = count.trim().parse().map_err(|_| bad("the count is not a whole number"))?;
        let mut spec = LimitSpec { name: name.trim().to_owned(), per: per.trim().to_owned(), ..LimitSpec::default() };
        for option in parts.map(str::trim) {
            if let Some(kind) = LimitKind::ALL.into_iter().find(|k| k.name() == option) {
                spec.kind = kind;
            } else {
                let burst = option.strip_prefix("burst=").ok_or_else(|| bad(&format!("unknown option {option:?}")))?;
                spec.burst = Some(burst.trim().parse().map_err(|_| bad("burst is not a whole number"))?);
            }
        }
        if spec.kind == LimitKind::Bucket {
            spec.rate = Some(count);
        } else {
            spec.limit = Some(count);
        }
        if spec.kind == LimitKind::Inflight {
            spec.timeout = Some(std::mem::take(&mut spec.per));
        }
        Ok(spec)
    }
}

/// The short form [`LimitSpec::parse_short`] reads: `per_second=20/1s,burst=40`,
/// `concurrent=20/30s,inflight`.
impl std::fmt::Display for LimitSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.rate.or(self.limit).unwrap_or(0);
        let per = match self.kind {
            LimitKind::Inflight => self.timeout.as_deref().unwrap_or_default(),
            _ => &self.per,
        };
        write!(f, "{}={count}/{per}", self.name)?;
        match (self.kind, self.burst) {
            (LimitKind::Bucket, Some(burst)) => write!(f, ",burst={burst}"),
            (LimitKind::Bucket, None) => Ok(()),
            (kind, _) => write!(f, ",{}", kind.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"
        version = 4
        ipv6_prefix = 56

        [[rules]]
        id = "default"
        reason = "everyone"
        limits = [
          { name = "per_second", rate = 100, per = "1s", burst = 200 },
          { name = "daily", kind = "quota", limit = 100000, per = "1d" },
          { name = "concurrent", kind = "inflight", limit = 20, timeout = "30s" },
        ]

        [[rules]]
        id = "search-pro"
        match = { plan = "pro", endpoint = "GET /search" }
        mode = "shadow"
        fail = "closed"
        reason = "trying a lower search limit"
        limits = [{ name = "s", rate = 5, per = "1s" }]
    "#;

    #[test]
    fn toml_and_json_read_the_same_set() {
        let spec = RuleSetSpec::from_toml(TOML).unwrap();
        assert_eq!(spec.version, Some(4));
        assert_eq!(spec.ipv6_prefix, Some(56));
        assert_eq!(spec.rules[0].limits[1].kind, LimitKind::Quota);
        let inflight = &spec.rules[0].limits[2];
        assert_eq!(
            (inflight.kind, inflight.limit, inflight.timeout.as_deref()),
            (LimitKind::Inflight, Some(20), Some("30s"))
        );
        assert_eq!(spec.rules[1].scope.endpoint.as_deref(), Some("GET /search"));
        assert_eq!((spec.rules[1].mode, spec.rules[1].fail), (Mode::Shadow, FailMode::Closed));
        let json = spec.to_json();
        assert!(!json.contains("\"mode\":\"enforce\""), "defaults are left out: {json}");
        assert!(json.contains(r#"{"name":"concurrent","kind":"inflight","limit":20,"timeout":"30s"}"#), "{json}");
        assert_eq!(RuleSetSpec::from_json(&json).unwrap(), spec);
    }

    #[test]
    fn typos_are_named_with_their_place() {
        let e = RuleSetSpec::from_toml(
            "[[rules]]\nid = \"a\"\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 1, per = \"1s\", burts = 2 }]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field `burts`") && e.contains("line 4"), "{e}");
        let e = RuleSetSpec::from_json(r#"{"rules":[{"id":"a","reason":"r","limits":[],"mode":"shadows"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant `shadows`, expected `enforce` or `shadow`"), "{e}");
        let e = RuleSetSpec::from_toml("[[rules]]\nid = \"a\"\nlimits = []\n").unwrap_err().to_string();
        assert!(e.contains("missing field `reason`"), "{e}");
    }

    #[test]
    fn short_limits_read_every_kind() {
        let s = LimitSpec::parse_short("per_second=10/1s,burst=20").unwrap();
        assert_eq!(
            (s.name.as_str(), s.rate, s.burst, s.per.as_str(), s.kind),
            ("per_second", Some(10), Some(20), "1s", LimitKind::Bucket)
        );
        let q = LimitSpec::parse_short("daily=1000/1d,quota").unwrap();
        assert_eq!((q.limit, q.rate, q.kind), (Some(1000), None, LimitKind::Quota));
        let c = LimitSpec::parse_short("concurrent=20/30s,inflight").unwrap();
        assert_eq!(
            (c.limit, c.timeout.as_deref(), c.per.as_str(), c.kind),
            (Some(20), Some("30s"), "", LimitKind::Inflight)
        );
        for short in [
            "per_second=10/1s,burst=20",
            "s=5/1m",
            "daily=1000/1d,quota",
            "w=3/1h,window",
            "e=3/15m,exact",
            "concurrent=20/30s,inflight",
        ] {
            assert_eq!(LimitSpec::parse_short(short).unwrap().to_string(), short);
        }
        for bad in ["s10/1s", "s=10", "s=ten/1s", "s=10/1s,fast", "s=10/1s,burst=x"] {
            let e = LimitSpec::parse_short(bad).unwrap_err().to_string();
            assert!(e.contains("expected NAME=COUNT/PER"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_global_field_reads_and_writes_back() {
        let toml = "[[rules]]\nid = \"api\"\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 1, per = \"1s\" }]\nglobal = { regions = [\"eu\", \"us\"], floor = 0.25 }\n";
        let spec = RuleSetSpec::from_toml(toml).unwrap();
        let global = spec.rules[0].global.clone().unwrap();
        assert_eq!((global.floor_ppm(), global.weights(), global.region_index("us")), (250_000, vec![1, 1], Some(1)));
        let json = spec.to_json();
        assert!(json.contains(r#""global":{"regions":["eu","us"],"floor":0.25}"#), "{json}");
        assert_eq!(RuleSetSpec::from_json(&json).unwrap(), spec);
        assert!(!RuleSetSpec::default().to_json().contains("global"));
    }
}
