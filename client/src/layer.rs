//! A tower [`Layer`] that rate-limits HTTP requests (feature `tower`).
//!
//! A key extractor names the subject of each request (an API key, a user,
//! an IP prefix); requests it returns `None` for pass unlimited. Allowed
//! requests go on and their responses get the rate-limit headers; refused
//! ones are answered `429 Too Many Requests` with the headers,
//! `Retry-After`, and a plain-text body that names the rule. A subject the
//! policy refuses (braces, empty) is answered `400`; a policy the backend
//! cannot run (windows on the Lua backend) `500`, a configuration error.
//! Redis being down never fails a request: the limiter's fallback decides.
//!
//! ```no_run
//! use std::sync::Arc;
//! use http::{Request, Response};
//! use rl_client::{Config, Limiter, Policy, RateLimitLayer, Rule};
//! use tower::{service_fn, ServiceBuilder};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(Config::standalone("redis://127.0.0.1:6379/"))?;
//! let policy = Arc::new(Policy::builder("api").rule(Rule::per_second("per_second", 100)).build()?);
//! let by_api_key = |req: &Request<String>| {
//!     req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned)
//! };
//! let service = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(limiter, policy, by_api_key))
//!     .service(service_fn(|_req: Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(String::from("hello")))
//!     }));
//! # let _ = service; Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::decision::Decision;
use crate::headers;
use crate::limiter::Limiter;
use crate::policy::{check_subject, Policy};

/// Wraps services with [`RateLimit`]. `K` names a request's subject:
/// `Fn(&Request<B>) -> Option<String>`.
#[derive(Clone)]
pub struct RateLimitLayer<K> {
    limiter: Limiter,
    policy: Arc<Policy>,
    key: K,
}

impl<K> RateLimitLayer<K> {
    /// Limits requests by `policy`, keyed by `key(&request)`.
    pub fn new(limiter: Limiter, policy: Arc<Policy>, key: K) -> RateLimitLayer<K> {
        RateLimitLayer { limiter, policy, key }
    }
}

impl<S, K: Clone> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimit<S, K>;

    fn layer(&self, inner: S) -> RateLimit<S, K> {
        RateLimit { inner, limiter: self.limiter.clone(), policy: self.policy.clone(), key: self.key.clone() }
    }
}

/// The rate-limiting service made by [`RateLimitLayer`].
#[derive(Clone)]
pub struct RateLimit<S, K> {
    inner: S,
    limiter: Limiter,
    policy: Arc<Policy>,
    key: K,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    K: Fn(&Request<ReqBody>) -> Option<String>,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let subject = (self.key)(&req);
        // The service that was polled ready serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (limiter, policy) = (self.limiter.clone(), self.policy.clone());
        Box::pin(async move {
            let Some(subject) = subject else { return inner.call(req).await };
            let decision = match limiter.check(&policy, &subject).await {
                Ok(d) => d,
                // The subject is the client's; anything else refused (a
                // policy this backend cannot run) is the server's configuration.
                Err(e) if check_subject(&subject).is_err() => {
                    return Ok(text(StatusCode::BAD_REQUEST, format!("400 Bad Request: {e}\n")))
                }
                Err(e) => {
                    return Ok(text(StatusCode::INTERNAL_SERVER_ERROR, format!("500 Internal Server Error: {e}\n")))
                }
            };
            let now = limiter.clock().wall();
            if !decision.allowed {
                let mut response = text(StatusCode::TOO_MANY_REQUESTS, refusal_body(&policy, &decision));
                headers::insert(response.headers_mut(), &policy, &decision, now);
                return Ok(response);
            }
            let mut response = inner.call(req).await?;
            headers::insert(response.headers_mut(), &policy, &decision, now);
            Ok(response)
        })
    }
}

fn refusal_body(policy: &Policy, d: &Decision) -> String {
    let rule = policy.rule(d.rule).map_or("?", |r| r.name());
    let when = match d.retry_after {
        Some(r) => format!("retry in {:.3} s", r.as_secs_f64()),
        None => "this request costs more than the rule ever allows".to_string(),
    };
    format!("429 Too Many Requests: rule \"{rule}\" of policy \"{}\"; {when}\n", policy.prefix())
}

fn text<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}
