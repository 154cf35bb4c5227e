//! What a refused or unserviceable request is answered: an
//! `application/problem+json` body (RFC 9457) with the draft's problem
//! types by default, or the caller's own.

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};

use crate::Source;

/// One refusing rule of a request, rate or in flight.
pub(crate) struct Refusal {
    /// As the headers name it.
    pub(crate) name: String,
    pub(crate) source: Source,
    pub(crate) retry_after: Option<Duration>,
    /// An in-flight rule made `unavailable`: the server is saturated.
    pub(crate) unavailable: bool,
}

/// A refusal, for [`RateLimitLayer::refusal`](super::RateLimitLayer::refusal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// 429, or 503 when every refusing rule refused only because Redis
    /// cannot answer (fail-closed) or is an in-flight rule made
    /// [`unavailable`](crate::InflightRule::unavailable): the draft's
    /// temporary reduced capacity.
    pub status: StatusCode,
    /// The refusing rules, as the headers name them (`label.rule`).
    pub violated: Vec<String>,
    /// The longest wait of the refusing rules; `None` when the request can
    /// never succeed (its cost is above a capacity).
    pub retry_after: Option<Duration>,
}

impl Refused {
    pub(crate) fn new(refusals: &[Refusal]) -> Refused {
        let outage = refusals.iter().all(|r| r.source == Source::FailClosed || r.unavailable);
        let never = refusals.iter().any(|r| r.retry_after.is_none());
        Refused {
            status: if outage { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::TOO_MANY_REQUESTS },
            violated: refusals.iter().map(|r| r.name.clone()).collect(),
            retry_after: if never { None } else { refusals.iter().filter_map(|r| r.retry_after).max() },
        }
    }

    /// The default answer: the draft's `quota-exceeded` (429) or
    /// `temporary-reduced-capacity` (503) problem, naming the rules.
    pub fn problem(&self) -> Response<String> {
        let (kind, title) = if self.status == StatusCode::SERVICE_UNAVAILABLE {
            ("temporary-reduced-capacity", "Request cannot be satisfied due to temporary server capacity constraints")
        } else {
            ("quota-exceeded", "Request cannot be satisfied as assigned quota has been exceeded")
        };
        // Rule names are checked names: nothing to escape.
        let violated: Vec<String> = self.violated.iter().map(|v| format!("\"{v}\"")).collect();
        let body = format!(
            "{{\"type\":\"https://iana.org/assignments/http-problem-types#{kind}\",\"title\":\"{title}\",\"status\":{},\"violated-policies\":[{}]}}\n",
            self.status.as_u16(),
            violated.join(",")
        );
        problem_response(self.status, body)
    }
}

/// A request the layer cannot decide: a client error (no API key) or the
/// server's configuration. The text is fixed: it never repeats what the
/// client sent (an API key is a secret).
pub(crate) fn problem(status: StatusCode, title: &str, detail: &str) -> Response<String> {
    let body = format!(
        "{{\"type\":\"about:blank\",\"title\":\"{title}\",\"status\":{},\"detail\":\"{detail}\"}}\n",
        status.as_u16()
    );
    problem_response(status, body)
}

fn problem_response(status: StatusCode, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(name: &str, source: Source, retry_after: Option<Duration>) -> Refusal {
        Refusal { name: name.to_owned(), source, retry_after, unavailable: false }
    }

    #[test]
    fn the_default_body_is_the_drafts_problem() {
        let r = Refused::new(&[refusal("key.per_second", Source::Redis, Some(Duration::from_millis(300)))]);
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        let response = r.problem();
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        assert!(response.body().contains("#quota-exceeded"), "{}", response.body());
        assert!(response.body().contains("\"violated-policies\":[\"key.per_second\"]"));
        assert!(response.body().contains("\"status\":429"));
    }

    #[test]
    fn an_outage_refusal_is_reduced_capacity() {
        let closed = || refusal("login.attempts", Source::FailClosed, Some(Duration::from_secs(2)));
        let r = Refused::new(&[closed()]);
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.problem().body().contains("#temporary-reduced-capacity"));
        let both = Refused::new(&[closed(), refusal("ip.s", Source::Redis, Some(Duration::from_secs(5)))]);
        assert_eq!(both.status, StatusCode::TOO_MANY_REQUESTS, "a real refusal among them");
        assert_eq!(both.retry_after, Some(Duration::from_secs(5)));
        assert_eq!(Refused::new(&[refusal("a", Source::Redis, None)]).retry_after, None);
        let saturated = Refusal { unavailable: true, ..refusal("reports.concurrent", Source::Redis, None) };
        assert_eq!(Refused::new(&[saturated]).status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
