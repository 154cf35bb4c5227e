//! The RLS front's configuration: envoyproxy/ratelimit's YAML format,
//! whole, read from one file or a directory of them, plus our extensions
//! per `rate_limit` (`algorithm`, `burst`, `failure_mode`). Refused files
//! are refused with the file, the line, the path inside the file and the
//! reason (envoyproxy/ratelimit's words where it has some).
//!
//! Reading is in three steps, as in envoyproxy/ratelimit: the YAML
//! (`yaml.rs`), the keys and types (`schema.rs`), then the descriptor
//! trees (here), where empty domains and keys, duplicates, units and
//! `replaces` are checked. Matching a request is `matching.rs`.

mod lua_fit;
pub mod matching;
pub mod metadata;
pub mod schema;
pub mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use schema::{DescriptorDef, FileDef, RateLimitDef};

/// Longest text of a file's value quoted in a message.
const QUOTED: usize = 64;

/// The largest config file, never read past (a ConfigMap holds at most 1
/// MiB in all).
pub const MAX_FILE_BYTES: usize = 4 << 20;
/// The largest config folder, its files together.
pub const MAX_TOTAL_BYTES: usize = 16 << 20;
/// The most `.yaml` and `.yml` files a config folder holds, and the most
/// directories it is walked through (a link loop ends there too).
pub const MAX_FILES: usize = 1000;

/// `text` cut for a message.
pub fn cut(text: &str) -> String {
    match text.char_indices().nth(QUOTED) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// The units of envoyproxy/ratelimit (`RateLimitResponse.RateLimit.Unit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 7] = [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Month, Unit::Year];

    /// Its length: a month is 30 days and a year 365, as in
    /// envoyproxy/ratelimit (`UnitToDivider`); windows are aligned to the
    /// Unix epoch, so a week starts on a Thursday.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    pub fn ms(self) -> u64 {
        self.seconds() * 1000
    }

    /// The proto's upper-case name.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// A unit written in any case, as envoyproxy/ratelimit reads it.
    pub fn parse(text: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.name().eq_ignore_ascii_case(text))
    }

    /// The response's `RateLimit.Unit` number.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// A request's limit override unit (`envoy.type.v3.RateLimitUnit`,
    /// which has no WEEK); None for UNKNOWN (0) and anything else.
    pub fn from_override(number: i32) -> Option<Unit> {
        [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Month, Unit::Year]
            .into_iter()
            .find(|u| u.proto() == number)
    }
}

/// How a limit counts (ours: envoyproxy/ratelimit has fixed windows only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// A counter per window aligned to the unit (RL.WINDOW ... FIXED): as
    /// envoyproxy/ratelimit counts.
    #[default]
    FixedWindow,
    /// A token bucket of `burst` (default `requests_per_unit`) refilled by
    /// `requests_per_unit` a unit (RL.TAKE).
    TokenBucket,
    /// The two-counter sliding window (RL.WINDOW ... SLIDING).
    SlidingWindow,
    /// A log of the requests of the last unit (RL.WINDOW ... EXACT).
    ExactWindow,
    /// At most `requests_per_unit` in flight, a slot healing after one unit
    /// (RL.ACQUIRE / RL.RELEASE); the descriptor's last entry names the slot.
    Concurrency,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::ExactWindow => "exact_window",
            Algorithm::Concurrency => "concurrency",
        }
    }

    pub fn parse(text: &str) -> Option<Algorithm> {
        [
            Algorithm::FixedWindow,
            Algorithm::TokenBucket,
            Algorithm::SlidingWindow,
            Algorithm::ExactWindow,
            Algorithm::Concurrency,
        ]
        .into_iter()
        .find(|a| a.name() == text)
    }
}

/// What a limit does while Redis cannot answer (ours).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FailureMode {
    /// Decided by the relay alone, at its share of the limit.
    #[default]
    Allow,
    /// Refused (OVER_LIMIT).
    Deny,
}

/// The largest limit of an exact window: the module's ceiling on a log
/// (its `max-log-limit`, 10,000 unless configured, is checked by Redis).
pub const MAX_EXACT_LIMIT: u32 = 1_000_000;

/// A limit as configured (or a request's override).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    pub requests_per_unit: u32,
    /// None only for an unlimited limit with no (or an invalid) unit.
    pub unit: Option<Unit>,
    pub name: String,
    pub unlimited: bool,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    pub algorithm: Algorithm,
    /// A token bucket's capacity (default `requests_per_unit`).
    pub burst: Option<u32>,
    pub failure_mode: FailureMode,
    /// Its stats key as configured: `domain.key1_value1.subkey1`.
    pub full_key: String,
    /// envoyproxy/ratelimit's `quota_mode` and `metadata` of its descriptor
    /// (`metadata.rs`, merged by `upstream_answer.rs`).
    pub quota_mode: bool,
    pub metadata: Option<metadata::Metadata>,
    /// Where it is written (a request's override: nowhere).
    pub origin: Origin,
}

/// Where a limit is written: its file, line and path in the file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    pub file: String,
    pub line: usize,
    /// `descriptors[0].rate_limit`.
    pub path: String,
}

impl Limit {
    /// A request's override: no name, never shadow, fixed window.
    pub fn override_of(requests_per_unit: u32, unit: Unit, full_key: String) -> Limit {
        Limit {
            requests_per_unit,
            unit: Some(unit),
            name: String::new(),
            unlimited: false,
            replaces: Vec::new(),
            shadow_mode: false,
            detailed_metric: false,
            algorithm: Algorithm::FixedWindow,
            burst: None,
            failure_mode: FailureMode::Allow,
            full_key,
            quota_mode: false,
            metadata: None,
            origin: Origin::default(),
        }
    }
}

/// One node of a domain's descriptor tree.
#[derive(Clone, Debug, Default)]
pub struct Descriptor {
    pub limit: Option<Arc<Limit>>,
    /// Children by key.
    pub children: HashMap<String, Children>,
    pub value_to_metric: bool,
    pub share_threshold: bool,
}

/// The children of one key. A request's entry is matched on its key, then
/// its value: never on the two joined as envoyproxy/ratelimit joins them
/// (`key_value`), where the entry (`a`, `b`) found the descriptor of key
/// `a_b` before the one of key `a`.
#[derive(Clone, Debug, Default)]
pub struct Children {
    /// By value (a wildcard pattern under its text).
    pub values: HashMap<String, Descriptor>,
    /// The values holding a `*`, in file order, each split on `*`.
    pub wildcards: Vec<(String, Vec<String>)>,
    /// The descriptor of the key without a value: for any other value.
    pub default: Option<Descriptor>,
}

/// The whole configuration: a descriptor tree per domain.
#[derive(Clone, Debug, Default)]
pub struct RlsConfig {
    pub domains: HashMap<String, Descriptor>,
    /// The files it was read from, as named in messages.
    pub files: Vec<String>,
    /// Each domain's first file.
    pub domain_files: HashMap<String, String>,
}

/// Why a file was refused: where and what, without the file's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub line: usize,
    /// The path inside the file (`descriptors[0].rate_limit.unit`); empty
    /// for the file as a whole.
    pub path: String,
    pub reason: String,
}

/// A refused configuration: the file, and the problem in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    /// None for a problem that is not inside one file (none to read).
    pub problem: Option<Problem>,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problem {
            Some(p) if p.path.is_empty() => write!(f, "{}:{}: {}", self.file, p.line, p.reason),
            Some(p) => write!(f, "{}:{}: {}: {}", self.file, p.line, p.path, p.reason),
            None => write!(f, "{}: {}", self.file, self.reason),
        }
    }
}

impl std::error::Error for ConfigError {}

fn refused(file: &str, problem: Problem) -> ConfigError {
    ConfigError { file: file.to_string(), reason: problem.reason.clone(), problem: Some(problem) }
}

impl RlsConfig {
    /// Reads `files` (name, text) in order. `merge`: files naming the same
    /// domain add to one tree (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG);
    /// otherwise a domain in two files is refused.
    pub fn from_texts<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
        merge: bool,
    ) -> Result<RlsConfig, ConfigError> {
        let mut config = RlsConfig::default();
        let mut spent = yaml::Spent::default();
        for (name, text) in files {
            let def = read(text, &mut spent).map_err(|p| refused(name, p))?;
            config.add(name, def, merge).map_err(|p| refused(name, p))?;
            config.files.push(name.to_string());
        }
        Ok(config)
    }

    /// Reads `path`: one file, or every `.yaml` and `.yml` file under a
    /// directory (its subdirectories too; names starting with a dot are
    /// skipped, as the `..data` links of a Kubernetes ConfigMap), in name
    /// order. Files are named relative to the directory in messages. Each
    /// file is read up to [`MAX_FILE_BYTES`], the folder up to
    /// [`MAX_TOTAL_BYTES`]: past either, refused before it is parsed.
    pub fn load(path: &Path, merge: bool) -> Result<RlsConfig, ConfigError> {
        let files = config_files(path)?;
        let mut texts = Vec::with_capacity(files.len());
        let mut total = 0;
        for (name, file) in &files {
            let error = |reason: String| ConfigError { file: name.clone(), problem: None, reason };
            let text = crate::files::read_bounded(file, MAX_FILE_BYTES, "a config file (4 MiB)").map_err(error)?;
            total += text.len();
            if total > MAX_TOTAL_BYTES {
                return Err(error(format!(
                    "the config folder {} is {total} bytes up to this file, above the bound of {MAX_TOTAL_BYTES} \
                     (16 MiB) on its files together",
                    path.display()
                )));
            }
            texts.push((name.clone(), text));
        }
        RlsConfig::from_texts(texts.iter().map(|(n, t)| (n.as_str(), t.as_str())), merge)
    }

    /// Adds one file's domain.
    fn add(&mut self, name: &str, def: FileDef, merge: bool) -> Result<(), Problem> {
        if def.domain.is_empty() {
            return Err(Problem {
                line: def.domain_line,
                path: "domain".into(),
                reason: "config file cannot have empty domain".into(),
            });
        }
        if let Some(first) = self.domain_files.get(&def.domain).filter(|_| !merge) {
            return Err(Problem {
                line: def.domain_line,
                path: "domain".into(),
                reason: format!(
                    "duplicate domain '{}' in config file (also in {first}: merge the files, or start with \
                     --rls-merge-domains)",
                    cut(&def.domain)
                ),
            });
        }
        self.domain_files.entry(def.domain.clone()).or_insert_with(|| name.to_string());
        let root = self.domains.entry(def.domain.clone()).or_default();
        load_descriptors(root, name, &format!("{}.", def.domain), &def.descriptors)
    }
}

/// A file's text, read and typed, within what the config's other files
/// left of the bounds.
fn read(text: &str, spent: &mut yaml::Spent) -> Result<FileDef, Problem> {
    let root = yaml::parse_within(text, spent).map_err(|e| {
        let line = e.strip_prefix("line ").and_then(|r| r.split(':').next()).and_then(|n| n.parse().ok()).unwrap_or(1);
        let reason = e.split_once(": ").map_or(e.as_str(), |(_, r)| r);
        Problem { line, path: String::new(), reason: format!("error loading config file: {reason}") }
    })?;
    schema::check_names(&root)?;
    schema::read_file(&root)
}

/// envoyproxy/ratelimit's `loadDescriptors`: one level of a tree, then
/// each child's, depth first; `parent_key` is the stats key so far
/// (`domain.` and each ancestor's composite key and a dot).
fn load_descriptors(
    node: &mut Descriptor,
    file: &str,
    parent_key: &str,
    defs: &[DescriptorDef],
) -> Result<(), Problem> {
    for def in defs {
        let at = |reason: String| Problem { line: def.line, path: def.path.clone(), reason };
        if def.key.is_empty() {
            return Err(at("descriptor has empty key".into()));
        }
        if def.key.contains('*') {
            return Err(at(format!(
                "a key cannot hold '*', got '{}' (a wildcard is for values: value: 'foo*')",
                cut(&def.key)
            )));
        }
        // The composite key names the limit's statistics: two descriptors
        // of one name are refused, as envoyproxy/ratelimit refuses them,
        // also when they are (`a`, `b`) and (`a_b`).
        let composite = if def.value.is_empty() { def.key.clone() } else { format!("{}_{}", def.key, def.value) };
        let full_key = format!("{parent_key}{composite}");
        if let Some((key, value)) = joined_to(node, &composite) {
            let also = if (key.as_str(), value.as_str()) == (def.key.as_str(), def.value.as_str()) {
                String::new()
            } else if value.is_empty() {
                format!(" (as key '{}')", cut(&key))
            } else {
                format!(" (as key '{}' with value '{}')", cut(&key), cut(&value))
            };
            return Err(at(format!("duplicate descriptor composite key '{}'{also}", cut(&full_key))));
        }
        let limit = match &def.rate_limit {
            Some(r) => Some(Arc::new(limit(def, r, &full_key, file)?)),
            None => None,
        };
        if def.share_threshold && !composite.contains('*') {
            return Err(at(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{}'",
                cut(&composite)
            )));
        }
        let mut child = Descriptor {
            limit,
            value_to_metric: def.value_to_metric,
            share_threshold: def.share_threshold,
            ..Descriptor::default()
        };
        load_descriptors(&mut child, file, &format!("{full_key}."), &def.descriptors)?;
        let children = node.children.entry(def.key.clone()).or_default();
        if def.value.is_empty() {
            children.default = Some(child);
        } else {
            if def.value.contains('*') {
                let parts = def.value.split('*').map(str::to_string).collect();
                children.wildcards.push((def.value.clone(), parts));
            }
            children.values.insert(def.value.clone(), child);
        }
    }
    Ok(())
}

/// The (key, value) of a child of `node` whose composite key (`key`, or
/// `key_value`) is `composite`, if any: the key alone, or split at one of
/// its `_`.
fn joined_to(node: &Descriptor, composite: &str) -> Option<(String, String)> {
    if node.children.get(composite).is_some_and(|c| c.default.is_some()) {
        return Some((composite.to_string(), String::new()));
    }
    composite.match_indices('_').find_map(|(at, _)| {
        let (key, value) = (&composite[..at], &composite[at + 1..]);
        node.children.get(key)?.values.get(value).map(|_| (key.to_string(), value.to_string()))
    })
}

/// A descriptor's `rate_limit`, checked in envoyproxy/ratelimit's order
/// (the unit, then `replaces`), then our extensions.
fn limit(def: &DescriptorDef, r: &RateLimitDef, full_key: &str, file: &str) -> Result<Limit, Problem> {
    let path = format!("{}.rate_limit", def.path);
    let at = |line: usize, field: &str, reason: String| Problem {
        line,
        path: if field.is_empty() { path.clone() } else { format!("{path}.{field}") },
        reason,
    };
    let unit = Unit::parse(&r.unit);
    if r.unlimited && unit.is_some() {
        return Err(at(r.unit_line, "unit", "should not specify rate limit unit when unlimited".into()));
    }
    if !r.unlimited && unit.is_none() {
        return Err(at(r.unit_line, "unit", format!("invalid rate limit unit '{}'", cut(&r.unit))));
    }
    for (i, (replaced, line)) in r.replaces.iter().enumerate() {
        let field = format!("replaces[{i}]");
        if replaced.is_empty() {
            return Err(at(*line, &field, "should not have an empty replaces entry".into()));
        }
        if *replaced == r.name {
            return Err(at(*line, &field, "replaces should not contain name of same descriptor".into()));
        }
    }
    let algorithm = r.algorithm.map(|(a, _)| a).unwrap_or_default();
    if r.unlimited {
        if let Some((_, line)) = r.algorithm {
            return Err(at(line, "algorithm", "should not specify an algorithm when unlimited".into()));
        }
    }
    if let Some((_, line)) = r.burst {
        if algorithm != Algorithm::TokenBucket {
            return Err(at(line, "burst", format!("burst is for algorithm: token_bucket, not {}", algorithm.name())));
        }
    }
    if algorithm == Algorithm::Concurrency && !def.path.contains("].descriptors[") {
        let reason = "algorithm: concurrency names a request's slot by the descriptor's last entry (its request id): \
                      put it on a nested descriptor (key: request_id under the subject's)";
        return Err(at(r.algorithm.map_or(r.line, |(_, l)| l), "algorithm", reason.into()));
    }
    if algorithm == Algorithm::ExactWindow && r.requests_per_unit > MAX_EXACT_LIMIT {
        return Err(at(
            r.line,
            "requests_per_unit",
            format!(
                "an exact_window holds at most {MAX_EXACT_LIMIT} requests (and at most the module's max-log-limit, \
                 10000 unless configured), got {}",
                r.requests_per_unit
            ),
        ));
    }
    Ok(Limit {
        requests_per_unit: r.requests_per_unit,
        unit,
        name: r.name.clone(),
        unlimited: r.unlimited,
        replaces: r.replaces.iter().map(|(n, _)| n.clone()).collect(),
        shadow_mode: def.shadow_mode,
        detailed_metric: def.detailed_metric,
        algorithm,
        burst: r.burst.map(|(b, _)| b),
        failure_mode: r.failure_mode,
        full_key: full_key.to_string(),
        quota_mode: def.quota_mode,
        metadata: def.metadata.clone(),
        origin: Origin { file: file.to_string(), line: r.line, path },
    })
}

/// The files `path` names, each with its name for messages.
pub fn config_files(path: &Path) -> Result<Vec<(String, PathBuf)>, ConfigError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| ConfigError {
        file: shown.clone(),
        problem: None,
        reason: format!("cannot be read: {e}"),
    })?;
    if !meta.is_dir() {
        return Ok(vec![(shown, path.to_path_buf())]);
    }
    let mut found = walk(path)?;
    found.sort();
    Ok(found)
}

/// The config files under `root`, walked without recursion (a chain of
/// directories is no deeper on the stack), refusing a folder of more than
/// [`MAX_FILES`] files or directories.
fn walk(root: &Path) -> Result<Vec<(String, PathBuf)>, ConfigError> {
    let too_many = |what: &str| ConfigError {
        file: root.display().to_string(),
        problem: None,
        reason: format!("holds more than {MAX_FILES} {what}, the bound on a config folder"),
    };
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    let mut walked = 0;
    while let Some(dir) = dirs.pop() {
        walked += 1;
        if walked > MAX_FILES {
            return Err(too_many("directories (a link loop?)"));
        }
        let unreadable = |e: std::io::Error| ConfigError {
            file: dir.display().to_string(),
            problem: None,
            reason: format!("cannot be read: {e}"),
        };
        for entry in std::fs::read_dir(&dir).map_err(unreadable)? {
            let entry = entry.map_err(unreadable)?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            // Followed, as a ConfigMap's files are links.
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if meta.is_dir() {
                dirs.push(path);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                if found.len() == MAX_FILES {
                    return Err(too_many(".yaml and .yml files"));
                }
                let shown = path.strip_prefix(root).unwrap_or(&path).display().to_string();
                found.push((shown, path));
            }
        }
    }
    Ok(found)
}
