//! The rate-limit layer's response body: the service's body, holding the
//! request's in-flight slots until it is done (its last frame, an error,
//! or dropped: the client gone), when each hold is counted toward its
//! policy's release rate and the slots are given back.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::Permit;
use http_body::{Body, Frame, SizeHint};

use crate::http::headers::InflightHeaders;
use crate::http::release::Holding;

pin_project_lite::pin_project! {
    /// A response body of [`RateLimit`](super::RateLimit): the service's
    /// body and the slots of the request's in-flight limits, held until
    /// the body is done or dropped.
    pub struct HeldBody<B> {
        #[pin]
        inner: B,
        held: Holding,
    }
}

impl<B> HeldBody<B> {
    pub(crate) fn new(inner: B) -> HeldBody<B> {
        HeldBody { inner, held: Holding::default() }
    }

    /// `inner`, holding `held` since `since` (when the service was called).
    pub(crate) fn holding(inner: B, held: Vec<(Permit, Arc<InflightHeaders>)>, since: Instant) -> HeldBody<B> {
        HeldBody { inner, held: Holding::new(held, since) }
    }

    /// The service's body (or the layer's own answer).
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The slots still held (none once the body is done).
    pub fn permits(&self) -> impl Iterator<Item = &Permit> {
        self.held.permits()
    }
}

/// A body of text holding nothing: what a layer inside another answers
/// with its own refusals.
impl<B: From<String>> From<String> for HeldBody<B> {
    fn from(text: String) -> HeldBody<B> {
        HeldBody::new(B::from(text))
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for HeldBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBody").field("inner", &self.inner).field("permits", &self.permits().count()).finish()
    }
}

impl<B: Body> Body for HeldBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            // The response is over: give the slots back.
            this.held.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
