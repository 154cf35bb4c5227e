//! `ShouldRateLimit`: a request read (and bounded), its descriptors
//! matched, their limits decided together (`decide.rs`), the answer built:
//! a status per descriptor in request order, the overall code, headers,
//! statistics.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as ProtoUnit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use rl_core::{BucketParams, WindowMode};
use tonic::{Request, Response, Status};

use super::config::matching::{Found, Lookup};
use super::config::{Algorithm, Unit};
use super::decide::{Counter, Item, LimitAnswer, Source};
use super::headers::{self, Limited};
use super::keys::counter_key;
use super::windows::Window;
use super::Rls;
use crate::pool::MAX_POOLED_KEY_BYTES;

/// Most descriptors in one request, and entries in one descriptor.
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 32;
/// Longest domain.
pub const MAX_DOMAIN_BYTES: usize = 256;
/// Longest id of a concurrency slot (the module's `ID`).
pub const MAX_SLOT_ID_BYTES: usize = 64;

/// The gRPC service, on the RLS front's state.
#[derive(Clone)]
pub struct Service(pub Arc<Rls>);

/// What one descriptor of the request came to before deciding.
pub(super) enum Resolved {
    /// OK, nothing to decide (no limit, replaced, a negative hit of 0).
    Free,
    Unlimited,
    Limited {
        found: Found,
        item: usize,
    },
}

fn invalid(rls: &Rls, message: String) -> Status {
    rls.stats.service_error.fetch_add(1, Relaxed);
    Status::invalid_argument(message)
}

/// Whole seconds, rounded up.
fn duration(ms: u64) -> ProtoDuration {
    ProtoDuration { seconds: ms.div_ceil(1000) as i64, nanos: 0 }
}

fn proto_unit(unit: Unit) -> i32 {
    match unit {
        Unit::Second => ProtoUnit::Second as i32,
        Unit::Minute => ProtoUnit::Minute as i32,
        Unit::Hour => ProtoUnit::Hour as i32,
        Unit::Day => ProtoUnit::Day as i32,
        Unit::Week => ProtoUnit::Week as i32,
        Unit::Month => ProtoUnit::Month as i32,
        Unit::Year => ProtoUnit::Year as i32,
    }
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let rls = &self.0;
        if !rls.authorized(request.metadata()) {
            rls.stats.service_error.fetch_add(1, Relaxed);
            return Err(Status::unauthenticated("rl-relay: the RLS front wants its token (--rls-token-file)"));
        }
        let answer = rls.answer(request.into_inner()).await;
        rls.stats.responded(started.elapsed());
        answer.map(Response::new)
    }
}

impl Rls {
    /// The answer to one request (an error for a request that breaks the
    /// protocol's rules or the front's bounds).
    pub async fn answer(self: &Arc<Self>, request: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let domain = request.domain.as_str();
        if domain.is_empty() {
            return Err(invalid(self, "rate limit domain must not be empty".into()));
        }
        if request.descriptors.is_empty() {
            return Err(invalid(self, "rate limit descriptor list must not be empty".into()));
        }
        if domain.len() > MAX_DOMAIN_BYTES {
            return Err(invalid(self, format!("domain of {} bytes: at most {MAX_DOMAIN_BYTES}", domain.len())));
        }
        if request.descriptors.len() > MAX_DESCRIPTORS {
            return Err(invalid(
                self,
                format!("{} descriptors in one request: at most {MAX_DESCRIPTORS}", request.descriptors.len()),
            ));
        }
        let config = self.config();
        let mut resolved = Vec::with_capacity(request.descriptors.len());
        let mut items: Vec<Item> = Vec::new();
        let mut replaced: HashSet<String> = HashSet::new();
        let mut founds = Vec::with_capacity(request.descriptors.len());
        for (i, d) in request.descriptors.iter().enumerate() {
            if d.entries.len() > MAX_ENTRIES {
                return Err(invalid(
                    self,
                    format!("descriptor {i}: {} entries: at most {MAX_ENTRIES}", d.entries.len()),
                ));
            }
            let bytes: usize = d.entries.iter().map(|e| e.key.len() + e.value.len()).sum();
            if bytes > MAX_POOLED_KEY_BYTES {
                return Err(invalid(
                    self,
                    format!("descriptor {i}: its keys and values hold {bytes} bytes: at most {MAX_POOLED_KEY_BYTES}"),
                ));
            }
            let override_limit = match &d.limit {
                None => None,
                Some(o) => match Unit::from_override(o.unit) {
                    Some(unit) => Some((o.requests_per_unit, unit)),
                    None => {
                        return Err(invalid(
                            self,
                            format!(
                                "descriptor {i}: limit override unit {} is not a unit (SECOND 1, MINUTE 2, HOUR 3, DAY \
                                 4, MONTH 5, YEAR 6)",
                                o.unit
                            ),
                        ))
                    }
                },
            };
            let entries: Vec<(&str, &str)> = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
            let lookup = config.lookup(domain, &entries, override_limit);
            if let Lookup::Found(found) = &lookup {
                replaced.extend(found.limit.replaces.iter().cloned());
            }
            founds.push(lookup);
        }
        for (i, lookup) in founds.into_iter().enumerate() {
            let d = &request.descriptors[i];
            let found = match lookup {
                Lookup::UnknownDomain => {
                    self.stats.not_found(domain);
                    resolved.push(Resolved::Free);
                    continue;
                }
                Lookup::NoLimit => {
                    self.stats.unmatched.fetch_add(1, Relaxed);
                    resolved.push(Resolved::Free);
                    continue;
                }
                Lookup::Found(found) => found,
            };
            if !found.limit.name.is_empty() && replaced.contains(&found.limit.name) {
                resolved.push(Resolved::Free);
                continue;
            }
            if found.limit.unlimited {
                resolved.push(Resolved::Unlimited);
                continue;
            }
            // A negative hit gives back (below); counted apart, not in the
            // limit's statistics.
            let refund = d.is_negative_hits;
            if refund {
                self.stats.negative_hits.fetch_add(1, Relaxed);
            }
            // A descriptor's own hits_addend reports usage (Envoy Gateway's
            // cost, AI Gateway's tokens at stream end): counted in full; 0
            // only looks. The request's asks to pass: all or nothing.
            let (cost, usage) = match &d.hits_addend {
                Some(n) => (n.value, n.value > 0 && !refund),
                None => (u64::from(request.hits_addend.max(1)), false),
            };
            if refund && cost == 0 {
                resolved.push(Resolved::Free);
                continue;
            }
            let limit = &found.limit;
            let unit = limit.unit.expect("a limited limit has a unit");
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .enumerate()
                .map(|(j, e)| {
                    let shared = found.shared.get(j).and_then(|p| p.as_deref());
                    (e.key.as_str(), shared.unwrap_or(e.value.as_str()))
                })
                .collect();
            // A concurrency limit's last entry names the request's slot (its
            // id), not the counter: the config puts it on a nested
            // descriptor, so there is an entry before it.
            let slots = limit.algorithm == Algorithm::Concurrency;
            let (entries, slot) = match entries.split_last() {
                Some((_, subject)) if slots => (subject, d.entries[entries.len() - 1].value.clone()),
                _ => (&entries[..], String::new()),
            };
            if slots && !(1..=MAX_SLOT_ID_BYTES).contains(&slot.len()) {
                return Err(invalid(
                    self,
                    format!(
                        "descriptor {i}: its last entry names a concurrency slot (the request id): {} bytes, must be \
                         1 to {MAX_SLOT_ID_BYTES}",
                        slot.len()
                    ),
                ));
            }
            let usage = usage && !slots;
            let key = counter_key(&self.options.prefix, domain, entries, limit.algorithm, unit);
            let rpu = u64::from(limit.requests_per_unit);
            let window = |leased| Window { limit: rpu, window_ms: unit.ms(), leased };
            let counter = match limit.algorithm {
                _ if rpu == 0 => Counter::Closed { window_ms: unit.ms() },
                Algorithm::FixedWindow => Counter::Window { mode: WindowMode::Fixed, window: window(true) },
                Algorithm::SlidingWindow => Counter::Window { mode: WindowMode::Sliding, window: window(false) },
                Algorithm::ExactWindow => Counter::Window { mode: WindowMode::Exact, window: window(false) },
                Algorithm::Concurrency => Counter::Slots { limit: rpu, timeout_ms: unit.ms() },
                Algorithm::TokenBucket => {
                    let capacity = limit.burst.map_or(rpu, u64::from);
                    match BucketParams::new(capacity, rpu, unit.ms()) {
                        Ok(p) => Counter::Bucket(p),
                        Err(_) => Counter::Closed { window_ms: unit.ms() },
                    }
                }
            };
            items.push(Item {
                key,
                counter,
                cost,
                usage,
                refund,
                slot,
                shadow: limit.shadow_mode || self.quota_mode(limit),
                failure: limit.failure_mode,
            });
            resolved.push(Resolved::Limited { found, item: items.len() - 1 });
        }
        let outcomes = self.decide(items.clone()).await;
        Ok(self.upstream_finish(&request, &resolved, &outcomes, self.respond(&resolved, &items, &outcomes)))
    }

    /// The limits' outcomes within the deadline; past it (Redis slow), the
    /// failure modes answer, and the decision finishes in the background
    /// (what it takes then is under, never over).
    async fn decide(self: &Arc<Self>, items: Vec<Item>) -> Vec<LimitAnswer> {
        if items.is_empty() {
            return Vec::new();
        }
        let engine = self.engine.clone();
        let shared = Arc::new(items);
        let late = Arc::new(AtomicBool::new(false));
        let mut decision = {
            let (shared, late) = (shared.clone(), late.clone());
            Box::pin(async move { engine.decide(&shared, &late).await })
        };
        // A decision memory makes (a lease, the deny cache) is ready at its
        // first poll: answered here, without a task and its wake-up on
        // another thread. One that waits for Redis goes on in a task of its
        // own, so that past the deadline it still finishes.
        let waker = futures_util::task::noop_waker();
        let first = decision.as_mut().poll(&mut std::task::Context::from_waker(&waker));
        let task = match first {
            std::task::Poll::Ready(outcomes) => Ok(Ok(outcomes)),
            std::task::Poll::Pending => tokio::time::timeout(self.options.timeout, tokio::spawn(decision)).await,
        };
        match task {
            Ok(Ok(outcomes)) => {
                if outcomes.iter().any(|o| matches!(o.source, Source::Fallback | Source::FailureDenied)) {
                    self.stats.redis_error.fetch_add(1, Relaxed);
                }
                outcomes
            }
            _ => {
                late.store(true, Relaxed);
                self.stats.timeouts.fetch_add(1, Relaxed);
                self.stats.redis_error.fetch_add(1, Relaxed);
                shared
                    .iter()
                    .map(|item| {
                        if item.shadow {
                            let reply = rl_core::Reply {
                                granted: 0,
                                remaining: 0,
                                retry_after_ms: 0,
                                reset_after_ms: 0,
                                limit: 0,
                                binding: 0,
                            };
                            LimitAnswer { over: false, reply, source: Source::Unanswered }
                        } else {
                            self.engine.failed(item)
                        }
                    })
                    .collect()
            }
        }
    }

    fn respond(&self, resolved: &[Resolved], items: &[Item], outcomes: &[LimitAnswer]) -> RateLimitResponse {
        let refused = items.iter().zip(outcomes).any(|(item, o)| o.over && !item.shadow);
        let mut statuses = Vec::with_capacity(resolved.len());
        let mut limited: Vec<Limited> = Vec::new();
        for r in resolved {
            let status = match r {
                Resolved::Free => DescriptorStatus { code: Code::Ok as i32, ..DescriptorStatus::default() },
                Resolved::Unlimited => {
                    DescriptorStatus { code: Code::Ok as i32, limit_remaining: u32::MAX, ..DescriptorStatus::default() }
                }
                Resolved::Limited { found, item } => {
                    let (item, outcome) = (&items[*item], &outcomes[*item]);
                    let limit = &found.limit;
                    let unit = limit.unit.expect("a limited limit has a unit");
                    let remaining = if outcome.over { 0 } else { outcome.reply.remaining };
                    let wait_ms = match (outcome.over, outcome.reply.retry_after_ms) {
                        (true, r) if r > 0 => r as u64,
                        _ => outcome.reply.reset_after_ms,
                    };
                    let reset_ms = if wait_ms > 0 { wait_ms } else { unit.ms() - now_ms() % unit.ms() };
                    // Counted as its code says, as envoyproxy/ratelimit counts
                    // every descriptor of a request; one another limit
                    // refused first has no count to be near a limit by.
                    let rpu = u64::from(limit.requests_per_unit);
                    let known = match outcome.source {
                        Source::Unanswered => None,
                        Source::NotAsked => Some(None),
                        _ => Some(Some(remaining)),
                    };
                    if let Some(remaining) = known.filter(|_| !item.refund) {
                        self.stats.record(&found.stats_key, rpu, item.cost, remaining, outcome.over, item.shadow);
                    }
                    if !item.shadow {
                        limited.push(Limited {
                            name: &limit.name,
                            requests_per_unit: limit.requests_per_unit,
                            unit_seconds: unit.seconds(),
                            remaining,
                            over: outcome.over,
                            wait_ms: reset_ms,
                            reset_ms,
                        });
                    }
                    DescriptorStatus {
                        code: if outcome.over && !item.shadow { Code::OverLimit } else { Code::Ok } as i32,
                        current_limit: Some(RateLimit {
                            name: limit.name.clone(),
                            requests_per_unit: limit.requests_per_unit,
                            unit: proto_unit(unit),
                        }),
                        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                        duration_until_reset: Some(duration(reset_ms)),
                        quota: None,
                    }
                }
            };
            statuses.push(status);
        }
        let mut overall = if refused { Code::OverLimit } else { Code::Ok };
        if refused && self.options.global_shadow {
            self.stats.global_shadow_mode.fetch_add(1, Relaxed);
            overall = Code::Ok;
        }
        RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add: headers::headers(self.options.headers, &limited, overall == Code::OverLimit),
            ..RateLimitResponse::default()
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
