//! A tower [`Layer`] that limits requests in flight (feature `tower`).
//!
//! Each request of a subject takes a slot in every rule of an
//! [`InflightPolicy`] and holds it for the life of its response: until the
//! response body has been sent (or dropped, the client gone), not merely
//! until the handler returned. NoPermit requests are answered with the
//! rule's status (`429 Too Many Requests`, or `503 Service Unavailable`
//! for a rule made [`unavailable`](crate::InflightRule::unavailable)), the
//! headers and `Retry-After` when a slot's deadline is known. Requests the
//! key extractor returns `None` for pass unlimited; a bad subject is `400`.
//! Redis being down never fails a request: fail-open rules limit locally.
//!
//! Headers: `RateLimit-Policy: "concurrent";q=20` for every rule (no `w`:
//! a concurrency limit has no window), `RateLimit: "concurrent";r=5` (slots
//! left in the binding rule), `X-RateLimit-Limit`, `X-RateLimit-Remaining`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use http::{Request, Response};
//! use rl_gateway::{Config, InflightPolicy, InflightRule, Limiter};
//! use rl_gateway::http::InflightLayer;
//! use tower::{service_fn, ServiceBuilder};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(Config::standalone("redis://127.0.0.1:6379/"))?;
//! let policy = InflightPolicy::builder("reports")
//!     .rule(InflightRule::new("concurrent", 20, Duration::from_secs(30)))
//!     .build()?;
//! let by_api_key = |req: &Request<String>| {
//!     req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned)
//! };
//! let service = ServiceBuilder::new()
//!     .layer(InflightLayer::new(limiter, Arc::new(policy), by_api_key))
//!     .service(service_fn(|_req: Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(String::from("report")))
//!     }));
//! # let _ = service; Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use rl_core::ratelimit_header::{push_limit_member, push_policy_member};
use tower::{Layer, Service};

use crate::{subject_fault, InflightPolicy, InflightRule, Limiter, NoPermit, Permit};

use crate::http::headers::{InflightHeaders, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING};
use crate::http::release::Holding;

/// Wraps services with [`InflightLimit`]. `K` names a request's subject:
/// `Fn(&Request<B>) -> Option<String>`.
#[derive(Clone)]
pub struct InflightLayer<K> {
    limiter: Limiter,
    /// The policy, and how fast its slots were seen to free.
    headers: Arc<InflightHeaders>,
    key: K,
}

impl<K> InflightLayer<K> {
    /// Limits requests in flight by `policy`, keyed by `key(&request)`.
    pub fn new(limiter: Limiter, policy: Arc<InflightPolicy>, key: K) -> InflightLayer<K> {
        InflightLayer { limiter, headers: Arc::new(InflightHeaders::new(policy, None)), key }
    }
}

impl<S, K: Clone> Layer<S> for InflightLayer<K> {
    type Service = InflightLimit<S, K>;

    fn layer(&self, inner: S) -> InflightLimit<S, K> {
        InflightLimit { inner, limiter: self.limiter.clone(), headers: self.headers.clone(), key: self.key.clone() }
    }
}

/// The in-flight limiting service made by [`InflightLayer`].
#[derive(Clone)]
pub struct InflightLimit<S, K> {
    inner: S,
    limiter: Limiter,
    headers: Arc<InflightHeaders>,
    key: K,
}

pin_project_lite::pin_project! {
    /// A response body that holds the request's [`Permit`] until it is done
    /// (its last frame, an error, or dropped), or the text of a refusal.
    pub struct PermitBody<B> {
        #[pin]
        inner: Option<B>,
        text: Option<String>,
        held: Holding,
    }
}

impl<B> PermitBody<B> {
    fn from_text(text: String) -> PermitBody<B> {
        PermitBody { inner: None, text: Some(text), held: Holding::default() }
    }

    /// The permit still held (None once the body is done, or on a refusal).
    pub fn permit(&self) -> Option<&Permit> {
        self.held.permits().next()
    }
}

impl<B> Body for PermitBody<B>
where
    B: Body,
    B::Data: From<String>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(this.text.take().map(|t| Ok(Frame::data(t.into()))));
        };
        let polled = inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            // The response is over: give the slot back.
            this.held.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().map_or(self.text.is_none(), |b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, &self.text) {
            (Some(b), _) => b.size_hint(),
            (None, text) => SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64)),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for InflightLimit<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    K: Fn(&Request<ReqBody>) -> Option<String>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<PermitBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let subject = (self.key)(&req);
        // The service that was polled ready serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (limiter, headers) = (self.limiter.clone(), self.headers.clone());
        Box::pin(async move {
            let policy = headers.policy();
            let unlimited =
                |r: Response<ResBody>| r.map(|b| PermitBody { inner: Some(b), text: None, held: Holding::default() });
            let Some(subject) = subject else { return inner.call(req).await.map(unlimited) };
            let permit = match limiter.acquire(policy, &subject).await {
                Ok(Ok(permit)) => permit,
                Ok(Err(refused)) => return Ok(refusal(&headers, &refused)),
                Err(e) if subject_fault(&subject).is_some() => {
                    return Ok(text(StatusCode::BAD_REQUEST, format!("400 Bad Request: {e}\n")))
                }
                Err(e) => {
                    return Ok(text(StatusCode::INTERNAL_SERVER_ERROR, format!("500 Internal Server Error: {e}\n")))
                }
            };
            let (rule, limit, in_flight) = (permit.rule(), permit.limit(), permit.in_flight());
            let held = Holding::new(vec![(permit, headers.clone())], Instant::now());
            let mut response = inner.call(req).await?;
            insert_headers(response.headers_mut(), headers.policy(), rule, limit, in_flight);
            Ok(response.map(|b| PermitBody { inner: Some(b), text: None, held }))
        })
    }
}

/// The status a refusal by `rule` answers: 429, or 503 for a rule made
/// [`unavailable`](crate::InflightRule::unavailable).
fn status(rule: Option<&InflightRule>) -> StatusCode {
    match rule {
        Some(rule) if rule.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::TOO_MANY_REQUESTS,
    }
}

fn refusal<B>(headers: &InflightHeaders, r: &NoPermit) -> Response<PermitBody<B>> {
    let policy = headers.policy();
    let rule = policy.rule(r.rule);
    let status = status(rule);
    // When a slot is likely free again, from the holds seen; the earliest
    // deadline before any was seen.
    let retry_after = headers.releases().retry_after(r);
    let when = match retry_after {
        Some(d) => format!("a slot frees within {:.3} s", d.as_secs_f64()),
        None => "this request weighs more than the rule ever allows".to_string(),
    };
    let body = format!(
        "{status}: {} of {} requests in flight for rule \"{}\" of policy \"{}\"; {when}\n",
        r.in_flight,
        r.limit,
        rule.map_or("?", |r| r.name()),
        policy.prefix()
    );
    let mut response = text(status, body);
    insert_headers(response.headers_mut(), policy, r.rule, r.limit, r.in_flight);
    if let Some(retry) = retry_after {
        // Whole seconds, rounded up, one at least.
        let secs = retry.as_millis().div_ceil(1000).max(1) as u64;
        response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// The rate-limit headers of an in-flight decision: `limit` and what is in
/// flight in the binding rule.
fn insert_headers(headers: &mut HeaderMap, policy: &InflightPolicy, binding: usize, limit: u64, in_flight: u64) {
    let mut rules = String::new();
    for r in policy.rules() {
        if !rules.is_empty() {
            rules.push_str(", ");
        }
        push_policy_member(&mut rules, r.name(), r.limit(), None, None);
    }
    let name = policy.rule(binding).map_or("", |r| r.name());
    let left = limit.saturating_sub(in_flight);
    let mut binding_member = String::new();
    push_limit_member(&mut binding_member, name, left, None);
    let fields = [
        (RATELIMIT_POLICY, rules),
        (RATELIMIT, binding_member),
        (X_RATELIMIT_LIMIT, limit.to_string()),
        (X_RATELIMIT_REMAINING, left.to_string()),
    ];
    for (header, value) in fields {
        // Rule names are plain ASCII (checked when the policy was built).
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(header, value);
        }
    }
}

fn text<B>(status: StatusCode, body: String) -> Response<PermitBody<B>> {
    let mut response = Response::new(PermitBody::from_text(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_rule_refuses_with_its_status() {
        let p = InflightPolicy::builder("p")
            .rule(InflightRule::new("long", 5, Duration::from_secs(60)))
            .rule(InflightRule::new("short", 5, Duration::from_secs(2)).unavailable().fail_closed())
            .build()
            .unwrap();
        assert_eq!(status(p.rule(0)), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(status(p.rule(1)), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status(None), StatusCode::TOO_MANY_REQUESTS);
    }
}
