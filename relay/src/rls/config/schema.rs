//! A config file's YAML read into its typed form, refusing what
//! envoyproxy/ratelimit refuses, in its order: first every map key of the
//! whole file by name ([`check_names`]: a key that is not a string, a name
//! that is no key of the format, a list item that is not a map, a value
//! that is neither a string, an integer nor a boolean), then the types and
//! the places of the keys ([`read_file`]). Two refusals are ours (RL reads
//! on without a word): a valid key in the wrong place (`shadow_mode`
//! inside `rate_limit` is silently ignored there), and a key given twice in
//! one map.

use super::yaml::{Node, Scalar, Value};
use super::{Algorithm, FailureMode, Problem};

/// Every key name of the format: envoyproxy/ratelimit's sixteen, then ours.
pub const KEYS: [&str; 19] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "algorithm",
    "burst",
    "failure_mode",
];

const ROOT_KEYS: [&str; 2] = ["domain", "descriptors"];
const DESCRIPTOR_KEYS: [&str; 10] = [
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
const RATE_LIMIT_KEYS: [&str; 8] =
    ["unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "failure_mode"];
const REPLACES_KEYS: [&str; 1] = ["name"];

/// One file, typed.
#[derive(Debug, Default)]
pub struct FileDef {
    pub domain: String,
    pub domain_line: usize,
    pub descriptors: Vec<DescriptorDef>,
}

#[derive(Debug, Default)]
pub struct DescriptorDef {
    /// Where it is: `descriptors[0].descriptors[2]`, and its line.
    pub path: String,
    pub line: usize,
    pub key: String,
    pub value: String,
    pub rate_limit: Option<RateLimitDef>,
    pub descriptors: Vec<DescriptorDef>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    pub metadata: Option<super::metadata::Metadata>,
}

#[derive(Debug, Default)]
pub struct RateLimitDef {
    pub line: usize,
    /// The unit as written (empty when absent), and its line.
    pub unit: String,
    pub unit_line: usize,
    pub requests_per_unit: u32,
    pub unlimited: bool,
    pub name: String,
    /// The names replaced, each with its line.
    pub replaces: Vec<(String, usize)>,
    pub algorithm: Option<(Algorithm, usize)>,
    pub burst: Option<(u32, usize)>,
    pub failure_mode: FailureMode,
}

fn problem(line: usize, path: &str, reason: impl Into<String>) -> Problem {
    Problem { line, path: path.to_string(), reason: reason.into() }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// envoyproxy/ratelimit's name check over the whole file (its
/// `validateYamlKeys`): every map at every depth, `metadata` not looked
/// into. The root must be a map.
pub fn check_names(root: &Node) -> Result<(), Problem> {
    if !matches!(root.value, Value::Map(_)) {
        return Err(problem(
            root.line,
            "",
            format!("error loading config file: the file holds {}, not a map of domain and descriptors", root.tag()),
        ));
    }
    walk_names(root, "")
}

fn walk_names(map: &Node, path: &str) -> Result<(), Problem> {
    let Value::Map(entries) = &map.value else { return Ok(()) };
    for (key, value) in entries {
        let name = match &key.value {
            Value::Scalar(text, Scalar::Str) => text.as_str(),
            _ => {
                return Err(problem(
                    key.line,
                    path,
                    format!("config error, key is not of type string: {}", key.shown()),
                ))
            }
        };
        let here = join(path, name);
        if !KEYS.contains(&name) {
            return Err(problem(key.line, &here, format!("config error, unknown key '{}'", super::cut(name))));
        }
        if name == "metadata" {
            continue;
        }
        match &value.value {
            Value::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    let item_path = format!("{here}[{i}]");
                    if !matches!(item.value, Value::Map(_)) {
                        return Err(problem(
                            item.line,
                            &item_path,
                            format!("config error, yaml file contains list of type other than map: {}", item.shown()),
                        ));
                    }
                    walk_names(item, &item_path)?;
                }
            }
            Value::Map(_) => walk_names(value, &here)?,
            Value::Scalar(_, Scalar::Float) => {
                return Err(problem(
                    value.line,
                    &here,
                    format!("error checking config: {} is not a string, an integer or a boolean", value.shown()),
                ))
            }
            Value::Scalar(..) => {}
        }
    }
    Ok(())
}

/// The entries of a map whose keys all belong at this level (`allowed`),
/// each once; `level` names the level in the message.
fn entries<'a>(
    node: &'a Node,
    path: &str,
    allowed: &[&str],
    level: &str,
) -> Result<Vec<(&'a str, &'a Node, String)>, Problem> {
    let Value::Map(pairs) = &node.value else { return Ok(Vec::new()) };
    let mut out: Vec<(&str, &Node, String)> = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        let Value::Scalar(name, _) = &key.value else { continue };
        let here = join(path, name);
        if !allowed.contains(&name.as_str()) {
            return Err(problem(key.line, &here, format!("config error, key '{name}' {}", misplaced(name, level))));
        }
        if out.iter().any(|(n, ..)| *n == name) {
            return Err(problem(key.line, &here, format!("config error, key '{name}' is given twice")));
        }
        out.push((name, value, here));
    }
    Ok(out)
}

/// Where a key that sits in the wrong place belongs.
fn misplaced(name: &str, level: &str) -> String {
    let home = if ROOT_KEYS.contains(&name) && name != "descriptors" {
        "at the top of the file"
    } else if DESCRIPTOR_KEYS.contains(&name) {
        "in a descriptor"
    } else if RATE_LIMIT_KEYS.contains(&name) {
        "in a rate_limit"
    } else {
        "elsewhere"
    };
    format!("belongs {home}, not {level} (envoyproxy/ratelimit ignores it here; rl-relay refuses it)")
}

/// A string field: a scalar's text, as yaml.v2 gives it (null: "").
fn string(node: &Node, path: &str) -> Result<String, Problem> {
    match &node.value {
        Value::Scalar(_, Scalar::Null) => Ok(String::new()),
        Value::Scalar(text, _) => Ok(text.clone()),
        _ => Err(problem(node.line, path, format!("must be a string, got {}", node.shown()))),
    }
}

fn boolean(node: &Node, path: &str) -> Result<bool, Problem> {
    match &node.value {
        Value::Scalar(_, Scalar::Null) => Ok(false),
        Value::Scalar(_, Scalar::Bool(b)) => Ok(*b),
        _ => Err(problem(node.line, path, format!("must be true or false, got '{}'", node.shown()))),
    }
}

fn uint32(node: &Node, path: &str) -> Result<u32, Problem> {
    match &node.value {
        Value::Scalar(_, Scalar::Null) => Ok(0),
        Value::Scalar(_, Scalar::Int(n)) if (0..=i64::from(u32::MAX)).contains(n) => Ok(*n as u32),
        _ => Err(problem(node.line, path, format!("must be an integer from 0 to 4294967295, got '{}'", node.shown()))),
    }
}

/// A list of maps (or null: none).
fn list<'a>(node: &'a Node, path: &str) -> Result<&'a [Node], Problem> {
    match &node.value {
        Value::Scalar(_, Scalar::Null) => Ok(&[]),
        Value::Seq(items) => Ok(items),
        _ => Err(problem(node.line, path, format!("must be a list, got {}", node.shown()))),
    }
}

fn map<'a>(node: &'a Node, path: &str) -> Result<Option<&'a Node>, Problem> {
    match &node.value {
        Value::Scalar(_, Scalar::Null) => Ok(None),
        Value::Map(_) => Ok(Some(node)),
        _ => Err(problem(node.line, path, format!("must be a map, got {}", node.shown()))),
    }
}

/// The file typed, after [`check_names`].
pub fn read_file(root: &Node) -> Result<FileDef, Problem> {
    let mut file = FileDef { domain_line: root.line, ..FileDef::default() };
    for (name, value, path) in entries(root, "", &ROOT_KEYS, "at the top of the file")? {
        match name {
            "domain" => {
                file.domain = string(value, &path)?;
                file.domain_line = value.line;
            }
            _ => {
                for (i, item) in list(value, &path)?.iter().enumerate() {
                    file.descriptors.push(read_descriptor(item, &format!("descriptors[{i}]"))?);
                }
            }
        }
    }
    Ok(file)
}

fn read_descriptor(node: &Node, path: &str) -> Result<DescriptorDef, Problem> {
    let mut d = DescriptorDef { path: path.to_string(), line: node.line, ..DescriptorDef::default() };
    for (name, value, here) in entries(node, path, &DESCRIPTOR_KEYS, "in a descriptor")? {
        match name {
            "key" => d.key = string(value, &here)?,
            "value" => d.value = string(value, &here)?,
            "rate_limit" => {
                d.rate_limit = map(value, &here)?.map(|m| read_rate_limit(m, &here)).transpose()?;
            }
            "descriptors" => {
                for (i, item) in list(value, &here)?.iter().enumerate() {
                    d.descriptors.push(read_descriptor(item, &format!("{here}[{i}]"))?);
                }
            }
            "shadow_mode" => d.shadow_mode = boolean(value, &here)?,
            "quota_mode" => d.quota_mode = boolean(value, &here)?,
            "detailed_metric" => d.detailed_metric = boolean(value, &here)?,
            "value_to_metric" => d.value_to_metric = boolean(value, &here)?,
            "share_threshold" => d.share_threshold = boolean(value, &here)?,
            _ => {
                check_metadata(value, &here)?;
                d.metadata = super::metadata::metadata(value);
            }
        }
    }
    Ok(d)
}

fn read_rate_limit(node: &Node, path: &str) -> Result<RateLimitDef, Problem> {
    let mut r = RateLimitDef { line: node.line, unit_line: node.line, ..RateLimitDef::default() };
    for (name, value, here) in entries(node, path, &RATE_LIMIT_KEYS, "in a rate_limit")? {
        match name {
            "unit" => {
                r.unit = string(value, &here)?;
                r.unit_line = value.line;
            }
            "requests_per_unit" => r.requests_per_unit = uint32(value, &here)?,
            "unlimited" => r.unlimited = boolean(value, &here)?,
            "name" => r.name = string(value, &here)?,
            "replaces" => {
                for (i, item) in list(value, &here)?.iter().enumerate() {
                    let item_path = format!("{here}[{i}]");
                    let mut replaced = String::new();
                    for (_, value, name_path) in entries(item, &item_path, &REPLACES_KEYS, "in a replaces entry")? {
                        replaced = string(value, &name_path)?;
                    }
                    r.replaces.push((replaced, item.line));
                }
            }
            "algorithm" => {
                let text = string(value, &here)?;
                let algorithm = Algorithm::parse(&text).ok_or_else(|| {
                    problem(
                        value.line,
                        &here,
                        format!(
                            "unknown algorithm '{}' (fixed_window, the default; token_bucket; sliding_window; \
                             exact_window; concurrency)",
                            super::cut(&text)
                        ),
                    )
                })?;
                r.algorithm = Some((algorithm, value.line));
            }
            "burst" => {
                let burst = uint32(value, &here)?;
                if burst == 0 {
                    return Err(problem(value.line, &here, "burst must be at least 1"));
                }
                r.burst = Some((burst, value.line));
            }
            _ => {
                r.failure_mode = match string(value, &here)?.as_str() {
                    "allow" => FailureMode::Allow,
                    "deny" => FailureMode::Deny,
                    other => {
                        return Err(problem(
                            value.line,
                            &here,
                            format!("unknown failure_mode '{}' (allow, the default, or deny)", super::cut(other)),
                        ))
                    }
                }
            }
        }
    }
    Ok(r)
}

/// `metadata` must become a protobuf Struct: a map with string keys, at
/// every depth (envoyproxy/ratelimit's "error parsing metadata").
fn check_metadata(node: &Node, path: &str) -> Result<(), Problem> {
    fn walk(node: &Node, path: &str) -> Result<(), Problem> {
        match &node.value {
            Value::Map(pairs) => {
                for (key, value) in pairs {
                    let Value::Scalar(name, Scalar::Str) = &key.value else {
                        return Err(problem(
                            key.line,
                            path,
                            format!("error parsing metadata: key {} is not a string", key.shown()),
                        ));
                    };
                    walk(value, &join(path, name))?;
                }
                Ok(())
            }
            Value::Seq(items) => items.iter().enumerate().try_for_each(|(i, item)| walk(item, &format!("{path}[{i}]"))),
            Value::Scalar(..) => Ok(()),
        }
    }
    match &node.value {
        Value::Scalar(_, Scalar::Null) | Value::Map(_) => walk(node, path),
        _ => Err(problem(node.line, path, format!("error parsing metadata: must be a map, got {}", node.shown()))),
    }
}
