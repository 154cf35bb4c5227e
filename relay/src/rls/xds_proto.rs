//! The config an xDS server sends (CONFIG_TYPE=GRPC_XDS_SOTW): the
//! messages of envoyproxy/ratelimit's
//! `api/ratelimit/config/ratelimit/v3/rls_conf.proto` (package
//! `ratelimit.config.ratelimit.v3`, field numbers as there; envoy-types
//! does not carry them), and each one written as the YAML file it stands
//! for, so the loader that reads the config files reads it too, with the
//! same checks and messages (upstream does the same:
//! `ConfigXdsProtoToYaml`, then its file loader).

use std::fmt::Write;

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};

use super::config::Unit;

/// The type of the resources asked for and accepted.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The config of one domain.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub domain: String,
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<Struct>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// `RateLimitUnit`: UNKNOWN 0, SECOND 1, MINUTE 2, HOUR 3, DAY 4,
    /// MONTH 5, YEAR 6, WEEK 7 (the numbers of [`Unit::proto`]).
    #[prost(int32, tag = "1")]
    pub unit: i32,
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    #[prost(string, tag = "1")]
    pub name: String,
}

impl RateLimitConfig {
    /// The YAML file this config stands for: every string quoted, every
    /// key on its own line (a refusal names the path inside it). A field
    /// at its default is left out, as upstream's YAML would have it.
    pub fn to_yaml(&self) -> String {
        let mut out = format!("domain: {}\n", quoted(&self.domain));
        descriptors(&mut out, &self.descriptors, 0);
        out
    }
}

fn descriptors(out: &mut String, list: &[RateLimitDescriptor], depth: usize) {
    if list.is_empty() {
        return;
    }
    let pad = "  ".repeat(depth * 2);
    let _ = writeln!(out, "{pad}descriptors:");
    for d in list {
        let _ = writeln!(out, "{pad}  - key: {}", quoted(&d.key));
        let pad = format!("{pad}    ");
        if !d.value.is_empty() {
            let _ = writeln!(out, "{pad}value: {}", quoted(&d.value));
        }
        if let Some(r) = &d.rate_limit {
            let _ = writeln!(out, "{pad}rate_limit:");
            let unit = match Unit::ALL.into_iter().find(|u| u.proto() == r.unit) {
                Some(u) => u.name().to_string(),
                // Go's name of an enum value: UNKNOWN, else its number.
                None if r.unit == 0 => "UNKNOWN".into(),
                None => r.unit.to_string(),
            };
            let _ = writeln!(out, "{pad}  unit: {}", quoted(&unit));
            let _ = writeln!(out, "{pad}  requests_per_unit: {}", r.requests_per_unit);
            if r.unlimited {
                let _ = writeln!(out, "{pad}  unlimited: true");
            }
            if !r.name.is_empty() {
                let _ = writeln!(out, "{pad}  name: {}", quoted(&r.name));
            }
            if !r.replaces.is_empty() {
                let _ = writeln!(out, "{pad}  replaces:");
                for replaced in &r.replaces {
                    let _ = writeln!(out, "{pad}    - name: {}", quoted(&replaced.name));
                }
            }
        }
        for (set, name) in
            [(d.shadow_mode, "shadow_mode"), (d.detailed_metric, "detailed_metric"), (d.quota_mode, "quota_mode")]
        {
            if set {
                let _ = writeln!(out, "{pad}{name}: true");
            }
        }
        if let Some(metadata) = d.metadata.as_ref().filter(|m| !m.fields.is_empty()) {
            let _ = writeln!(out, "{pad}metadata: {}", flow_struct(metadata));
        }
        descriptors(out, &d.descriptors, depth + 1);
    }
}

/// A string as a YAML double-quoted scalar: always a string, whatever it
/// holds (`true`, `5`, `*`, `: `), every character kept.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            // Control characters, and those YAML reads as line breaks or a
            // byte order mark, escaped.
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A `Struct` in YAML's flow style (keys in order, for a text that does
/// not change from one reading to the next).
fn flow_struct(s: &Struct) -> String {
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    let fields: Vec<String> =
        keys.into_iter().map(|k| format!("{}: {}", quoted(k), flow_value(&s.fields[k]))).collect();
    format!("{{{}}}", fields.join(", "))
}

fn flow_value(v: &Value) -> String {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => "null".into(),
        Some(Kind::BoolValue(b)) => b.to_string(),
        Some(Kind::NumberValue(n)) if n.is_nan() => ".nan".into(),
        Some(Kind::NumberValue(n)) if n.is_infinite() => (if *n > 0.0 { ".inf" } else { "-.inf" }).into(),
        // A whole number as an integer (below 2^53, where f64 is exact).
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9.0e15 => format!("{}", *n as i64),
        // With a dot and a signed exponent, as YAML 1.1 reads a float.
        Some(Kind::NumberValue(n)) => match format!("{n:?}").split_once('e') {
            Some((m, e)) => format!(
                "{m}{}e{}{e}",
                if m.contains('.') { "" } else { ".0" },
                if e.starts_with('-') { "" } else { "+" }
            ),
            None => format!("{n:?}"),
        },
        Some(Kind::StringValue(s)) => quoted(s),
        Some(Kind::StructValue(s)) => flow_struct(s),
        Some(Kind::ListValue(l)) => format!("[{}]", l.values.iter().map(flow_value).collect::<Vec<_>>().join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::config::RlsConfig;
    use envoy_types::pb::google::protobuf::ListValue;

    fn limit(unit: i32, n: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy { unit, requests_per_unit: n, ..Default::default() })
    }

    fn load(configs: &[RateLimitConfig]) -> Result<RlsConfig, crate::rls::config::ConfigError> {
        let texts: Vec<(String, String)> = configs.iter().map(|c| (c.name.clone(), c.to_yaml())).collect();
        RlsConfig::from_texts(texts.iter().map(|(n, t)| (n.as_str(), t.as_str())), false)
    }

    #[test]
    fn a_config_reads_as_its_yaml_file_would() {
        let metadata = Struct {
            fields: [
                ("tier".to_string(), Value { kind: Some(Kind::StringValue("gold \"x\"\n".into())) }),
                ("n".to_string(), Value { kind: Some(Kind::NumberValue(3.0)) }),
                ("r".to_string(), Value { kind: Some(Kind::NumberValue(0.25)) }),
                ("big".to_string(), Value { kind: Some(Kind::NumberValue(1e300)) }),
                ("small".to_string(), Value { kind: Some(Kind::NumberValue(-2.5e-7)) }),
                (
                    "l".to_string(),
                    Value {
                        kind: Some(Kind::ListValue(ListValue {
                            values: vec![
                                Value { kind: Some(Kind::BoolValue(true)) },
                                Value { kind: Some(Kind::NullValue(0)) },
                            ],
                        })),
                    },
                ),
            ]
            .into(),
        };
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "user".into(),
                value: "true".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: 7,
                    requests_per_unit: 5,
                    name: "weekly".into(),
                    replaces: vec![RateLimitReplace { name: "other: x".into() }],
                    ..Default::default()
                }),
                descriptors: vec![RateLimitDescriptor {
                    key: "path".into(),
                    rate_limit: limit(1, 2),
                    shadow_mode: true,
                    ..Default::default()
                }],
                quota_mode: true,
                metadata: Some(metadata.clone()),
                ..Default::default()
            }],
        };
        let yaml = config.to_yaml();
        let loaded = load(&[config]).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        let user = &loaded.domains["edge"].children["user"].values["true"];
        let l = user.limit.as_ref().unwrap();
        assert_eq!((l.requests_per_unit, l.unit, l.name.as_str()), (5, Some(Unit::Week), "weekly"));
        assert_eq!(l.replaces, ["other: x"]);
        assert!(l.quota_mode);
        assert_eq!(l.metadata.as_ref().unwrap().0, metadata, "{yaml}");
        let path = user.children["path"].default.as_ref().unwrap().limit.as_ref().unwrap();
        assert_eq!((path.requests_per_unit, path.unit, path.shadow_mode), (2, Some(Unit::Second), true));
    }

    #[test]
    fn a_bad_config_is_refused_with_the_loaders_words() {
        let bad = |descriptors: Vec<RateLimitDescriptor>| {
            let e = load(&[RateLimitConfig { name: "c".into(), domain: "d".into(), descriptors }]).unwrap_err();
            e.problem.map(|p| format!("{}: {}", p.path, p.reason)).unwrap_or(e.reason)
        };
        let unknown = bad(vec![RateLimitDescriptor { key: "k".into(), rate_limit: limit(0, 5), ..Default::default() }]);
        assert!(unknown.contains("descriptors[0].rate_limit") && unknown.contains("UNKNOWN"), "{unknown}");
        let nine = bad(vec![RateLimitDescriptor { key: "k".into(), rate_limit: limit(9, 5), ..Default::default() }]);
        assert!(nine.contains("'9'"), "{nine}");
        // Unlimited needs no unit, as upstream reads it.
        let unlimited = RateLimitPolicy { unlimited: true, ..Default::default() };
        let free = RateLimitDescriptor { key: "k".into(), rate_limit: Some(unlimited), ..Default::default() };
        load(&[RateLimitConfig { name: "c".into(), domain: "d".into(), descriptors: vec![free] }]).unwrap();
        let empty = bad(vec![RateLimitDescriptor { key: String::new(), ..Default::default() }]);
        assert!(empty.contains("empty key"), "{empty}");
        let twice = load(&[
            RateLimitConfig { name: "a".into(), domain: "d".into(), descriptors: vec![] },
            RateLimitConfig { name: "b".into(), domain: "d".into(), descriptors: vec![] },
        ])
        .unwrap_err();
        assert!(twice.to_string().contains("duplicate domain"), "{twice}");
        let no_domain = load(&[RateLimitConfig { name: "a".into(), ..Default::default() }]).unwrap_err();
        assert!(no_domain.to_string().contains("empty domain"), "{no_domain}");
    }

    #[test]
    fn strings_stay_strings() {
        for text in ["", "5", "true", "~", "null", "*", "a: b", "- x", "#c", "'q'", "é\u{2028}\t\u{7f}", "\\"] {
            let yaml = format!("domain: {}\n", quoted(text));
            let root = crate::rls::config::yaml::parse(&yaml).unwrap();
            let crate::rls::config::yaml::Value::Map(pairs) = &root.value else { panic!("{yaml}") };
            match &pairs[0].1.value {
                crate::rls::config::yaml::Value::Scalar(s, crate::rls::config::yaml::Scalar::Str) => {
                    assert_eq!(s, text)
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }
}
