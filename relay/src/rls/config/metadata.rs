//! A descriptor's `metadata` (envoyproxy/ratelimit's), read from its YAML
//! into the protobuf `Struct` the answer's `dynamic_metadata` carries
//! (`upstream_answer.rs` merges them).

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

use super::yaml::{Node, Scalar, Value as Yaml};

/// A descriptor's `metadata`, as the answer carries it.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Metadata(pub Struct);

// A config's metadata compares as its YAML did (a NaN aside).
impl Eq for Metadata {}

/// The `metadata` map of a descriptor, read (already checked by the
/// schema: a map with string keys at every depth).
pub fn metadata(node: &Node) -> Option<Metadata> {
    match to_value(node).kind {
        Some(Kind::StructValue(s)) if !s.fields.is_empty() => Some(Metadata(s)),
        _ => None,
    }
}

fn to_value(node: &Node) -> Value {
    let kind = match &node.value {
        Yaml::Map(pairs) => Kind::StructValue(Struct {
            fields: pairs
                .iter()
                .filter_map(|(k, v)| match &k.value {
                    Yaml::Scalar(name, _) => Some((name.clone(), to_value(v))),
                    _ => None,
                })
                .collect(),
        }),
        Yaml::Seq(items) => Kind::ListValue(ListValue { values: items.iter().map(to_value).collect() }),
        Yaml::Scalar(_, Scalar::Null) => Kind::NullValue(0),
        Yaml::Scalar(_, Scalar::Bool(b)) => Kind::BoolValue(*b),
        Yaml::Scalar(_, Scalar::Int(i)) => Kind::NumberValue(*i as f64),
        Yaml::Scalar(text, Scalar::Float) => match text.parse::<f64>() {
            Ok(f) => Kind::NumberValue(f),
            Err(_) => Kind::StringValue(text.clone()),
        },
        Yaml::Scalar(text, Scalar::Str) => Kind::StringValue(text.clone()),
    };
    Value { kind: Some(kind) }
}
