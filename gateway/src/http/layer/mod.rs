//! A tower [`Layer`] that rate-limits HTTP requests (feature `tower`).
//!
//! Per request it extracts the [`Facts`] (the client's IP address behind
//! trusted proxies, the API key, the route, the cost), hands them to a
//! [`Decide`] (fixed [`Policies`] here; live rules: `live::LiveDecide`, feature live), which
//! evaluates every policy that applies in one pass
//! ([`Limiter::check_batch`]: memory first, then one round trip per shard,
//! all or nothing), and then either calls
//! the service and adds the rate-limit headers of every policy to its
//! response, or answers the refusal ([`Refused`]: an
//! `application/problem+json` body by default) with the headers. Redis
//! being down never fails a request: the limiter's fallback decides, and
//! the layer says so once through `tracing`.
//!
//! Nothing passes unlimited by accident: a request without an API key is
//! refused (401) unless [`MissingKey`] says otherwise, and a request whose
//! client address cannot be found (a server that does not hand over the
//! peer address) is answered 500, loudly, rather than let through.

mod body;
mod refusal;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderName, Request, Response, StatusCode};
use tower::{Layer, Service};

pub use body::HeldBody;
pub use refusal::Refused;

use crate::{
    ip_subject, key_subject, Check, Decision, Error, Event, Limiter, NoPermit, Permit, Policy, Result, Source,
};

use crate::http::client_ip::ClientIp;
use crate::http::headers::{self, InflightHeaders, PolicyHeaders, Slots, View};
use refusal::Refusal;

/// What the layer knows of a request when it decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The client's address (behind trusted proxies), if known.
    pub ip: Option<IpAddr>,
    /// The API key as a subject ([`key_subject`]), if one was sent (or the
    /// shared `unknown` subject, see [`MissingKey::Shared`]).
    pub key: Option<String>,
    /// `METHOD /route`, as rule files name endpoints: the route template
    /// where the framework has one (axum's `MatchedPath`, with the `axum`
    /// feature, or [`RateLimitLayer::route_template`]), else the path:
    /// `GET /users/{id}`, `POST /login`.
    pub route: String,
    /// Tokens the request costs.
    pub cost: u64,
}

/// One policy's decision for a request.
#[derive(Clone)]
pub struct Checked {
    /// The policy, with its headers' fixed parts (made where it was
    /// registered: [`Policies::add`], a live rule).
    pub policy: Arc<PolicyHeaders>,
    /// Its decision; `None` when it was left undecided because another
    /// policy refused first from memory (it was not charged). An undecided
    /// policy is still announced in `RateLimit-Policy`, so the field lists
    /// the same members on every response.
    pub decision: Option<Decision>,
    /// The view of the request it was decided for, when one policy may
    /// apply to a request twice (live rules: by key and by address): its
    /// header members are then named apart (see [`headers::View`]).
    pub view: Option<headers::View>,
}

/// One in-flight policy's part in a request: the slots taken (the
/// response body holds them until it is done) or the refusal.
#[derive(Debug)]
pub struct InflightChecked {
    /// The policy, with its headers' fixed parts and its release rate.
    pub policy: Arc<InflightHeaders>,
    /// The view of the request it was taken for (see [`Checked::view`]).
    pub view: Option<View>,
    /// `Some(Ok)`: the slots, held for the response; `Some(Err)`: refused;
    /// `None`: not asked (a rate refused the request first).
    pub outcome: Option<std::result::Result<Permit, NoPermit>>,
}

/// What a [`Decide`] answered for a request: every rate policy that
/// applies, and the in-flight limits whose slots it took.
#[derive(Default)]
pub struct Decided {
    /// The rate policies, in a fixed order (their members are announced in it).
    pub checked: Vec<Checked>,
    /// The in-flight policies: asked once every rate allowed the request.
    pub inflight: Vec<InflightChecked>,
}

impl From<Vec<Checked>> for Decided {
    fn from(checked: Vec<Checked>) -> Decided {
        Decided { checked, inflight: Vec::new() }
    }
}

/// A boxed future, as [`Decide`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Decides a request's [`Facts`] against every policy that applies: all
/// of them are charged, or (on a refusal) as few as can be undone.
pub trait Decide: Clone + Send + Sync + 'static {
    /// Every policy's decision, and the in-flight slots taken. An error is
    /// the server's configuration (a rule that needs an address the
    /// request lacks).
    fn decide(&self, facts: Facts) -> BoxFuture<Result<Decided>>;

    /// The limiter deciding, for its clock.
    fn limiter(&self) -> &Limiter;
}

/// What part of a request a fixed policy limits by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum By {
    /// The client's address, grouped (`ip:` and its /32 or /64 network).
    Ip,
    /// The API key; policies by key are skipped for a request without one
    /// when [`MissingKey::UseIp`] lets it through.
    Key,
    /// The route (`METHOD /path`): everyone's calls of it together.
    Route,
    /// Everyone: one set of buckets for all requests.
    Everyone,
}

/// Fixed policies, each limiting by a part of the request.
///
/// ```no_run
/// use std::sync::Arc;
/// use rl_gateway::{Config, Limiter, Policy, Rule};
/// use rl_gateway::http::{By, Policies, RateLimitLayer};
///
/// # async fn run() -> Result<(), rl_gateway::Error> {
/// let limiter = Limiter::new(Config::standalone("redis://127.0.0.1:6379/"))?;
/// let per_ip = Policy::builder("ip").label("ip").rule(Rule::per_second("per_second", 20)).build()?;
/// let per_key = Policy::builder("key").label("key").rule(Rule::per_minute("per_minute", 600)).build()?;
/// let layer = RateLimitLayer::new(Policies::new(limiter).add(per_ip, By::Ip).add(per_key, By::Key))
///     .key_header("x-api-key");
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Policies {
    limiter: Limiter,
    /// Each policy with its headers, built once here.
    list: Arc<Vec<(Arc<PolicyHeaders>, By)>>,
    prefixes: (u8, u8),
}

impl Policies {
    /// No policies yet, on `limiter`.
    pub fn new(limiter: Limiter) -> Policies {
        Policies { limiter, list: Arc::default(), prefixes: (32, 64) }
    }

    /// Adds `policy`, limiting by `by`. Policies are evaluated in order.
    pub fn add(mut self, policy: impl Into<Arc<Policy>>, by: By) -> Policies {
        Arc::make_mut(&mut self.list).push((Arc::new(PolicyHeaders::new(policy)), by));
        self
    }

    /// How clients are grouped by address: IPv4 and IPv6 prefix lengths
    /// (default 32 and 64).
    pub fn ip_prefixes(mut self, ipv4: u8, ipv6: u8) -> Policies {
        self.prefixes = (ipv4, ipv6);
        self
    }

    fn subject(&self, by: &By, facts: &Facts) -> Result<Option<String>> {
        Ok(match by {
            By::Ip => {
                let ip = facts.ip.ok_or_else(|| Error::invalid(NO_PEER))?;
                Some(ip_subject(ip, self.prefixes.0, self.prefixes.1)?)
            }
            By::Key => facts.key.clone(),
            By::Route => key_subject(facts.route.as_bytes()),
            By::Everyone => Some("*".to_owned()),
        })
    }
}

impl Decide for Policies {
    fn decide(&self, facts: Facts) -> BoxFuture<Result<Decided>> {
        // The subjects are found before the future is made: it carries only
        // what the decision needs, so its box stays small.
        let mut subjects = Vec::with_capacity(self.list.len());
        for (policy, by) in self.list.iter() {
            match self.subject(by, &facts) {
                Ok(Some(subject)) => subjects.push((policy.clone(), subject)),
                Ok(None) => {}
                Err(e) => return Box::pin(std::future::ready(Err(e))),
            }
        }
        let (limiter, cost) = (self.limiter.clone(), facts.cost);
        Box::pin(async move {
            let checks: Vec<Check> =
                subjects.iter().map(|(policy, subject)| Check { policy: policy.policy(), subject, cost }).collect();
            let decisions = limiter.check_batch(&checks).await?;
            let checked = subjects
                .iter()
                .zip(decisions)
                .map(|((policy, _), decision)| Checked { policy: policy.clone(), decision, view: None })
                .collect::<Vec<_>>();
            Ok(checked.into())
        })
    }

    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

/// What a request without an API key gets (when a key header is set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MissingKey {
    /// Refused, 401 (the default): a service that limits by key must not
    /// let keyless requests past every key limit.
    #[default]
    Refuse,
    /// Counted under one shared subject, `unknown`: every keyless client
    /// shares one set of buckets (a public, anonymous tier).
    Shared,
    /// Limited by the client's address only: the policies by key are
    /// skipped (live rules match the request by its IP).
    UseIp,
}

/// The connection's peer address, for servers that do not put a
/// `SocketAddr` in the request's extensions: insert it yourself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

type PeerFn = Arc<dyn Fn(&Extensions) -> Option<IpAddr> + Send + Sync>;
type TemplateFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
type CostFn = Arc<dyn Fn(&Parts) -> u64 + Send + Sync>;
type RefusalFn = Arc<dyn Fn(&Refused) -> Response<String> + Send + Sync>;

const NO_PEER: &str = "the request has no peer address: serve with axum's into_make_service_with_connect_info::<SocketAddr>() and set RateLimitLayer::peer, or insert rl_gateway::http::PeerAddr";

/// Wraps services with [`RateLimit`]: per request, the facts extracted, one
/// [`Decide`] pass over every policy that applies, and the headers merged
/// into the response or the refusal (the README's HTTP section).
#[derive(Clone)]
pub struct RateLimitLayer<D> {
    decide: D,
    shared: Arc<Shared>,
}

#[derive(Clone)]
struct Shared {
    client_ip: ClientIp,
    peer: PeerFn,
    key_header: Option<HeaderName>,
    missing_key: MissingKey,
    /// Where a request's route template is; `None`: the framework's own
    /// (axum's `MatchedPath`, with the `axum` feature).
    template: Option<TemplateFn>,
    cost: CostFn,
    refusal: RefusalFn,
    fields: headers::Fields,
    outage: Arc<Outage>,
}

impl<D: Decide> RateLimitLayer<D> {
    /// Decides every request by `decide`; the client is the connection's
    /// peer (a [`PeerAddr`] or `SocketAddr` extension); no API key is read;
    /// every request costs 1; refusals are problem+json.
    pub fn new(decide: D) -> RateLimitLayer<D> {
        let peer: PeerFn = Arc::new(|ext: &Extensions| {
            ext.get::<PeerAddr>().map(|p| p.0.ip()).or_else(|| ext.get::<SocketAddr>().map(|s| s.ip()))
        });
        RateLimitLayer {
            decide,
            shared: Arc::new(Shared {
                client_ip: ClientIp::peer(),
                peer,
                key_header: None,
                missing_key: MissingKey::Refuse,
                template: None,
                cost: Arc::new(|_: &Parts| 1),
                refusal: Arc::new(Refused::problem),
                fields: headers::Fields::default(),
                outage: Arc::default(),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Shared)) -> RateLimitLayer<D> {
        change(Arc::make_mut(&mut self.shared));
        self
    }

    /// How the client's address is found behind proxies ([`ClientIp`]).
    pub fn client_ip(self, client_ip: ClientIp) -> RateLimitLayer<D> {
        self.with(|s| s.client_ip = client_ip)
    }

    /// Where the peer address is in the request's extensions: with axum,
    /// `|e| e.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())`.
    pub fn peer(self, peer: impl Fn(&Extensions) -> Option<IpAddr> + Send + Sync + 'static) -> RateLimitLayer<D> {
        self.with(|s| s.peer = Arc::new(peer))
    }

    /// Reads the API key from `header` (see [`key_subject`]: odd keys are
    /// hashed, never refused, never a way around the limit).
    pub fn key_header(self, header: &'static str) -> RateLimitLayer<D> {
        self.with(|s| s.key_header = Some(HeaderName::from_static(header)))
    }

    /// What a request without a key gets.
    pub fn missing_key(self, missing: MissingKey) -> RateLimitLayer<D> {
        self.with(|s| s.missing_key = missing)
    }

    /// Where a request's route template is (`/users/{id}`, without the
    /// method), for frameworks other than axum; `None` from it: the path.
    /// With the `axum` feature the default reads axum's `MatchedPath`,
    /// which the router puts in the request's extensions when a route
    /// matched (a layer added with `Router::layer` sees it).
    pub fn route_template(
        self,
        template: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> RateLimitLayer<D> {
        self.with(|s| s.template = Some(Arc::new(template)))
    }

    /// The cost of a request, from its method, URI and headers (at least
    /// 1 is charged).
    pub fn cost(self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> RateLimitLayer<D> {
        self.with(|s| s.cost = Arc::new(cost))
    }

    /// The answer to a refusal; the rate-limit headers and `Retry-After`
    /// are added to it.
    pub fn refusal(self, refusal: impl Fn(&Refused) -> Response<String> + Send + Sync + 'static) -> RateLimitLayer<D> {
        self.with(|s| s.refusal = Arc::new(refusal))
    }

    /// Which rate-limit fields responses carry (default: the draft's and
    /// the legacy `X-RateLimit-*`).
    pub fn header_fields(self, fields: headers::Fields) -> RateLimitLayer<D> {
        self.with(|s| s.fields = fields)
    }
}

impl<S, D: Clone> Layer<S> for RateLimitLayer<D> {
    type Service = RateLimit<S, D>;

    fn layer(&self, inner: S) -> RateLimit<S, D> {
        RateLimit { inner, decide: self.decide.clone(), shared: self.shared.clone() }
    }
}

/// The rate-limiting service made by [`RateLimitLayer`].
#[derive(Clone)]
pub struct RateLimit<S, D> {
    inner: S,
    decide: D,
    shared: Arc<Shared>,
}

/// What extraction found: facts to decide, or an answer already.
enum Extracted {
    Facts(Facts),
    Answer(Response<String>),
}

impl Shared {
    fn extract(&self, parts: &Parts) -> Extracted {
        let ip = (self.peer)(&parts.extensions).map(|peer| self.client_ip.client_ip(&parts.headers, peer));
        let key = match &self.key_header {
            None => None,
            Some(name) => match key_of(&parts.headers, name) {
                Some(key) => Some(key),
                None => match self.missing_key {
                    MissingKey::Refuse => {
                        let detail = format!("send an API key in the {name} header");
                        return Extracted::Answer(refusal::problem(
                            StatusCode::UNAUTHORIZED,
                            "API key required",
                            &detail,
                        ));
                    }
                    MissingKey::Shared => Some("unknown".to_owned()),
                    MissingKey::UseIp => None,
                },
            },
        };
        let route = match &self.template {
            Some(template) => template(parts).map(|t| format!("{} {t}", parts.method)),
            None => framework_template(parts).map(|t| format!("{} {t}", parts.method)),
        };
        let route = route.unwrap_or_else(|| format!("{} {}", parts.method, parts.uri.path()));
        Extracted::Facts(Facts { ip, key, route, cost: (self.cost)(parts).max(1) })
    }

    /// The response for decisions with a refusal among them (a rate, or an
    /// in-flight limit once every rate allowed).
    fn refused(&self, checked: &[Checked], inflight: &[Part], now: SystemTime) -> Response<String> {
        let rates = checked.iter().filter_map(|c| {
            let d = c.decision.filter(|d| !d.allowed)?;
            let name = headers::identifier(c.policy.policy(), c.view, d.rule);
            Some(Refusal { name, source: d.source, retry_after: d.retry_after, unavailable: false })
        });
        let slots = inflight.iter().filter_map(|p| {
            let slots = p.slots?;
            let retry_after = slots.refused?;
            let unavailable = p.policy.policy().rule(slots.rule).is_some_and(|r| r.is_unavailable());
            let name = p.policy.identifier(p.view, slots.rule);
            Some(Refusal { name, source: p.source, retry_after, unavailable })
        });
        let refusals: Vec<Refusal> = rates.chain(slots).collect();
        let refused = Refused::new(&refusals);
        for r in &refusals {
            tracing::debug!(target: "rl_http", rule = %r.name, "request refused");
        }
        let mut response = (self.refusal)(&refused);
        add_headers(response.headers_mut(), checked, inflight, self.fields, now);
        response
    }
}

/// The route template the framework put in the request's extensions:
/// axum's `MatchedPath` (feature `axum`).
#[cfg(feature = "axum")]
fn framework_template(parts: &Parts) -> Option<String> {
    parts.extensions.get::<axum::extract::MatchedPath>().map(|m| m.as_str().to_owned())
}

#[cfg(not(feature = "axum"))]
fn framework_template(_parts: &Parts) -> Option<String> {
    None
}

/// The key header's value as a subject; `None` when absent or empty. Every
/// line of a repeated header counts, so a second, odd line is no way out.
fn key_of(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    let mut lines = headers.get_all(name).iter();
    let first = lines.next()?;
    match lines.next() {
        None => key_subject(first.as_bytes()),
        Some(_) => {
            let joined: Vec<&[u8]> = headers.get_all(name).iter().map(|v| v.as_bytes()).collect();
            key_subject(&joined.join(&b'\n'))
        }
    }
}

/// Every policy's headers: each one's `RateLimit-Policy` members in the
/// policies' order (the same on every response, whoever refused), then
/// the numbers, refusals first (see [`headers::insert`]).
fn add_headers(map: &mut HeaderMap, checked: &[Checked], inflight: &[Part], fields: headers::Fields, now: SystemTime) {
    // The map grows once, if at all: room for the fields that may be new
    // (Retry-After only on a refusal). Failing to reserve is harmless.
    let rate_limit_fields = match fields {
        headers::Fields::DraftAndLegacy => 5,
        headers::Fields::Draft => 2,
        headers::Fields::RetryAfter => 0,
    };
    let refusal = checked.iter().any(|c| c.decision.is_some_and(|d| !d.allowed))
        || inflight.iter().any(|p| p.slots.is_some_and(|s| s.refused.is_some()));
    let _ = map.try_reserve(rate_limit_fields + usize::from(refusal));
    let mut fresh = !map.contains_key(headers::RATELIMIT_POLICY);
    if fields != headers::Fields::RetryAfter {
        for c in checked {
            headers::announce(map, &c.policy, c.view);
        }
        for p in inflight {
            headers::announce_inflight(map, &p.policy, p.view);
        }
    }
    // Refusals first, rates then in-flight limits; then the allowed ones.
    for refused in [true, false] {
        for c in checked {
            if let Some(decision) = c.decision.filter(|d| d.allowed != refused) {
                headers::insert_decision(map, &c.policy, c.view, fields, &decision, now, fresh);
                fresh = false;
            }
        }
        for p in inflight {
            if let Some(slots) = p.slots.filter(|s| s.refused.is_some() == refused) {
                headers::insert_inflight(map, &p.policy, p.view, fields, &slots, now, fresh);
                fresh = false;
            }
        }
    }
}

impl<S, D, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    D: Decide,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<HeldBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<std::result::Result<Response<HeldBody<ResBody>>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (decide, shared) = (self.decide.clone(), self.shared.clone());
        let (parts, body) = req.into_parts();
        let facts = match shared.extract(&parts) {
            Extracted::Facts(facts) => facts,
            Extracted::Answer(response) => return Box::pin(async move { Ok(answer(response)) }),
        };
        Box::pin(async move {
            let decided = match decide.decide(facts).await {
                Ok(decided) => decided,
                Err(e) => {
                    // The detail goes to the log, not to the client.
                    tracing::error!(target: "rl_http", error = %e, "rate limit cannot decide: configuration");
                    let detail = "the rate limiter is misconfigured; the server log says how";
                    let response = refusal::problem(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error", detail);
                    return Ok(answer(response));
                }
            };
            let Decided { checked, inflight } = decided;
            shared.outage.observe(&checked, decide.limiter());
            let now = decide.limiter().clock().wall();
            let parts_of_inflight: Vec<Part> = inflight.iter().map(Part::of).collect();
            let refused = checked.iter().any(|c| c.decision.is_some_and(|d| !d.allowed))
                || parts_of_inflight.iter().any(|p| p.slots.is_some_and(|s| s.refused.is_some()));
            if refused {
                // The slots taken, if any, go back as `inflight` drops.
                return Ok(answer(shared.refused(&checked, &parts_of_inflight, now)));
            }
            let held: Vec<(Permit, Arc<InflightHeaders>)> = inflight
                .into_iter()
                .filter_map(|c| match c.outcome {
                    Some(Ok(permit)) => Some((permit, c.policy)),
                    _ => None,
                })
                .collect();
            // Held from here: a service that fails, or a future dropped,
            // gives the slots back as the permits drop.
            let since = Instant::now();
            let mut response = inner.call(Request::from_parts(parts, body)).await?;
            add_headers(response.headers_mut(), &checked, &parts_of_inflight, shared.fields, now);
            Ok(response.map(|body| HeldBody::holding(body, held, since)))
        })
    }
}

/// An in-flight policy's part in a response's headers.
struct Part {
    slots: Option<Slots>,
    policy: Arc<InflightHeaders>,
    view: Option<View>,
    /// Which path refused, for a refusal.
    source: Source,
}

impl Part {
    fn of(c: &InflightChecked) -> Part {
        let (slots, source) = match &c.outcome {
            Some(Ok(permit)) => (Some(Slots::held(permit)), permit.source()),
            Some(Err(no)) => (Some(Slots::refused(no, &c.policy)), no.source),
            None => (None, Source::Redis),
        };
        Part { slots, policy: c.policy.clone(), view: c.view, source }
    }
}

/// An answer of the layer's own, as the service's body type.
fn answer<B: From<String>>(response: Response<String>) -> Response<HeldBody<B>> {
    response.map(|text| HeldBody::new(B::from(text)))
}

/// Says through `tracing` when decisions go to the local fallback and when
/// Redis answers again: once per change, and at most one message every
/// 10 s (a flapping shard does not flood the log; the count of changes
/// left unsaid is in the next message). Decisions degraded because the
/// server refused the calls themselves (the limiter's `server_refusals`
/// grew) are said to be that, never an outage.
#[derive(Default)]
struct Outage {
    degraded: AtomicBool,
    last_said_ms: AtomicU64,
    unsaid: AtomicU64,
    server_refusals: AtomicU64,
}

const OUTAGE_QUIET: Duration = Duration::from_secs(10);

impl Outage {
    fn observe(&self, checked: &[Checked], limiter: &Limiter) {
        let Some(first) = checked.iter().find_map(|c| c.decision) else { return };
        let degraded = matches!(first.source, Source::Fallback | Source::FailClosed);
        if self.degraded.swap(degraded, Ordering::Relaxed) == degraded {
            return;
        }
        let now = limiter.clock().now_ms();
        let last = self.last_said_ms.load(Ordering::Relaxed);
        let quiet = u64::try_from(OUTAGE_QUIET.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < quiet {
            self.unsaid.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.last_said_ms.store(now.max(1), Ordering::Relaxed);
        let unsaid = self.unsaid.swap(0, Ordering::Relaxed);
        let refusals = limiter.counters().get(Event::ServerRefused);
        let refused_by_server = refusals > self.server_refusals.swap(refusals, Ordering::Relaxed);
        if degraded && refused_by_server {
            tracing::error!(
                target: "rl_http",
                unsaid,
                refusals,
                "the limiter's server refuses calls of a rule (an error about the call, not an outage: a Redis without the redis-rl module, or a limit above \
                 its max-log-limit or max-inflight-limit?): those rate limits are decided by each rule's failure \
                 mode; the limiter's server_refusals counts them"
            );
        } else if degraded {
            tracing::warn!(target: "rl_http", unsaid, "Redis cannot answer: rate limits decided by the local fallback");
        } else {
            tracing::info!(target: "rl_http", unsaid, "Redis answers again: rate limits exact");
        }
    }
}
