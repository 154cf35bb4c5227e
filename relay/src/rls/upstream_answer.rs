//! What envoyproxy/ratelimit adds to an answer once its limits are decided
//! (its `service/ratelimit.go`): quota mode and dynamic metadata.
//!
//! - **Quota mode** (`quota_mode: true` on a descriptor, or every
//!   descriptor with `--rls-quota-mode`, its QUOTA_MODE): such a limit
//!   keeps its OVER_LIMIT status, but the answer is OVER_LIMIT only when a
//!   limit not in quota mode refuses, or when every quota limit of the
//!   request does. Its limits are decided as shadow limits are (they never
//!   refuse the request for the others, so the others' counts stand when
//!   they refuse, as upstream counts them).
//! - **Dynamic metadata** (`--rls-dynamic-metadata`, its
//!   RESPONSE_DYNAMIC_METADATA): the request (`domain`, `descriptors` with
//!   their `entries` as `key=value`, `limit` and `hitsAddend`, the
//!   request's `hitsAddend`), and `metadata`: the config's `metadata` of
//!   every limited descriptor that was not refused, merged (maps merged
//!   key by key, the first descriptor's value kept on a conflict).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

use super::config::metadata::Metadata;
use super::config::{Descriptor, Limit, RlsConfig};
use super::decide::LimitAnswer;
use super::service::Resolved;
use super::Rls;

/// Whether a descriptor of `config` is in quota mode (looked at once per
/// config: a request pays for quota mode only where a config has it).
pub fn quota_anywhere(config: &RlsConfig) -> bool {
    fn walk(d: &Descriptor) -> bool {
        d.limit.as_ref().is_some_and(|l| l.quota_mode)
            || d.children.values().any(|c| c.values.values().chain(c.default.as_ref()).any(walk))
    }
    config.domains.values().any(walk)
}

impl Rls {
    /// Whether `limit` is in quota mode (its own, or `--rls-quota-mode`).
    pub(super) fn quota_mode(&self, limit: &Limit) -> bool {
        limit.quota_mode || self.options.quota_mode
    }

    /// [`finish`] on an answer `respond` built, when quota mode or
    /// dynamic metadata apply (else the answer as it is).
    pub(super) fn upstream_finish(
        &self,
        request: &RateLimitRequest,
        resolved: &[Resolved],
        outcomes: &[LimitAnswer],
        response: RateLimitResponse,
    ) -> RateLimitResponse {
        let quota = self.options.quota_mode || self.quota_in_config.load(std::sync::atomic::Ordering::Relaxed);
        if !applies(quota, self.options.dynamic_metadata) {
            return response;
        }
        let decided: Vec<Decided> = resolved
            .iter()
            .map(|r| match r {
                Resolved::Free => Decided { limit: None, over: false, unlimited: false },
                Resolved::Unlimited => Decided { limit: None, over: false, unlimited: true },
                Resolved::Limited { found, item } => {
                    Decided { limit: Some(&found.limit), over: outcomes[*item].over, unlimited: false }
                }
            })
            .collect();
        let o = &self.options;
        finish(request, &decided, o.quota_mode, o.global_shadow, o.dynamic_metadata, response)
    }
}

/// One descriptor of the request as the answer's side sees it: its limit
/// (None: no limit, unlimited, replaced, or a negative hit) and whether
/// that limit refused.
pub struct Decided<'a> {
    pub limit: Option<&'a Limit>,
    pub over: bool,
    /// Unlimited: counted neither as passed nor as refused.
    pub unlimited: bool,
}

/// Whether anything here changes the answer to a request under this
/// config: checked first, so that the usual answer costs nothing more.
pub fn applies(quota_anywhere: bool, dynamic_metadata: bool) -> bool {
    quota_anywhere || dynamic_metadata
}

/// Quota mode and dynamic metadata applied to `response` (its statuses in
/// the request's order). `global_quota`: every limit in quota mode;
/// `global_shadow`: an OVER_LIMIT answer is sent as OK.
pub fn finish(
    request: &RateLimitRequest,
    decided: &[Decided],
    global_quota: bool,
    global_shadow: bool,
    dynamic_metadata: bool,
    mut response: RateLimitResponse,
) -> RateLimitResponse {
    let (mut failed_rate, mut failed_quota, mut total_quota) = (0, 0, 0);
    let mut passed = Vec::new();
    for (i, d) in decided.iter().enumerate() {
        if d.unlimited {
            continue;
        }
        let quota = d.limit.is_some_and(|l| global_quota || l.quota_mode);
        let shadow = d.limit.is_some_and(|l| l.shadow_mode);
        if d.over && !shadow {
            if quota {
                failed_quota += 1;
                // Decided as a shadow limit: its status says what it said.
                if let Some(status) = response.statuses.get_mut(i) {
                    status.code = Code::OverLimit as i32;
                }
            } else {
                failed_rate += 1;
            }
        } else {
            passed.push(i);
        }
        total_quota += u32::from(quota);
    }
    if total_quota > 0 {
        let over = failed_rate > 0 || total_quota == failed_quota;
        response.overall_code = if over && !global_shadow { Code::OverLimit } else { Code::Ok } as i32;
    }
    if dynamic_metadata {
        response.dynamic_metadata = Some(request_metadata(request, decided, &passed));
    }
    response
}

fn string(text: impl Into<String>) -> Value {
    Value { kind: Some(Kind::StringValue(text.into())) }
}

fn number(n: f64) -> Value {
    Value { kind: Some(Kind::NumberValue(n)) }
}

/// upstream's `ratelimitToMetadata`.
fn request_metadata(request: &RateLimitRequest, decided: &[Decided], passed: &[usize]) -> Struct {
    let mut fields = std::collections::HashMap::new();
    fields.insert("domain".to_string(), string(request.domain.clone()));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut f = std::collections::HashMap::new();
            let entries = d.entries.iter().map(|e| string(format!("{}={}", e.key, e.value))).collect();
            f.insert("entries".to_string(), Value { kind: Some(Kind::ListValue(ListValue { values: entries })) });
            if let Some(limit) = &d.limit {
                let unit = envoy_types::pb::envoy::r#type::v3::RateLimitUnit::try_from(limit.unit)
                    .map_or_else(|_| limit.unit.to_string(), |u| u.as_str_name().to_string());
                f.insert(
                    "limit".to_string(),
                    string(format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit)),
                );
            }
            if let Some(n) = &d.hits_addend {
                f.insert("hitsAddend".to_string(), number(n.value as f64));
            }
            Value { kind: Some(Kind::StructValue(Struct { fields: f })) }
        })
        .collect();
    fields.insert("descriptors".to_string(), Value { kind: Some(Kind::ListValue(ListValue { values: descriptors })) });
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".to_string(), number(f64::from(request.hits_addend)));
    }
    let mut merged = Struct::default();
    for &i in passed {
        if let Some(Metadata(m)) = decided.get(i).and_then(|d| d.limit).and_then(|l| l.metadata.as_ref()) {
            merge(&mut merged, m);
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_string(), Value { kind: Some(Kind::StructValue(merged)) });
    }
    Struct { fields }
}

/// upstream's `mergeMetadata`: maps merged key by key, the value already
/// there kept on any other conflict.
fn merge(into: &mut Struct, from: &Struct) {
    for (key, value) in &from.fields {
        match (into.fields.get_mut(key), &value.kind) {
            (None, _) => {
                into.fields.insert(key.clone(), value.clone());
            }
            (Some(Value { kind: Some(Kind::StructValue(here)) }), Some(Kind::StructValue(there))) => merge(here, there),
            (Some(_), _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(pairs: &[(&str, Value)]) -> Struct {
        Struct { fields: pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() }
    }

    #[test]
    fn merged_as_upstream_merges() {
        let nested = |k: &str, v: &str| Value { kind: Some(Kind::StructValue(s(&[(k, string(v))]))) };
        let mut into = s(&[("svc", nested("name", "a")), ("x", string("first"))]);
        merge(&mut into, &s(&[("svc", nested("zone", "z")), ("x", string("second")), ("y", string("new"))]));
        let Some(Kind::StructValue(svc)) = &into.fields["svc"].kind else { panic!() };
        assert_eq!(svc.fields.len(), 2);
        assert_eq!(into.fields["x"], string("first"));
        assert_eq!(into.fields["y"], string("new"));
    }
}
