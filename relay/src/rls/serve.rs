//! The RLS front's listener: HTTP/2 gRPC with the relay's bounds (at most
//! `--max-clients` connections, each of at most [`MAX_STREAMS`] calls at
//! once, a message of at most `--max-request-bytes`, headers of at most
//! [`MAX_HEADER_BYTES`]), the rate limit service and the standard health
//! service (`grpc.health.v1.Health`: `""` and `ratelimit` SERVING while
//! the front is ready).
//!
//! A slot belongs to a caller who completes a call: a connection that has
//! not completed one (carrying the token, with `--rls-token-file`) within
//! `--auth-timeout-ms` of its accept is closed, and a call whose body has
//! not all arrived within `--auth-timeout-ms` of its headers is answered
//! DEADLINE_EXCEEDED, so neither a preface alone, nor headers without a
//! body, nor calls without the token hold a slot. Health checks carry no
//! token: answered on any connection, and a token-less connection that
//! only checked health is kept past its deadline on a budget of its own
//! ([`HEALTH_CONNECTIONS`], apart from `--max-clients`), where it is served
//! health checks only. With `--rls-tls-cert`, over TLS (`crate::tls`).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use futures_util::StreamExt;
use http_body::{Body as _, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant, Sleep};
use tokio_util::either::Either;
use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::transport::server::Connected;
use tonic::Status;
use tonic_health::ServingStatus;

use super::service::Service as RlsService;
use super::socket::{Listener, Socket};
use super::Rls;
use crate::logging::{line, Throttled};

/// Calls at once on one connection.
pub const MAX_STREAMS: u32 = 256;
/// A call's headers, together.
pub const MAX_HEADER_BYTES: u32 = 16 << 10;
/// Token-less connections kept past their deadline for health checks
/// (Envoy's gRPC health checker keeps one open per Envoy; a kubelet probe
/// closes its own), apart from `--max-clients`: enough for a few checkers,
/// within the 32 descriptors the relay keeps for itself (main.rs).
pub const HEALTH_CONNECTIONS: usize = 8;

/// What the front's connections share: its state, the health budget, the
/// deadline and the rate-limited lines of what is closed.
struct Front {
    rls: Arc<Rls>,
    health: Arc<Semaphore>,
    /// `--auth-timeout-ms`: for a connection's first complete call, and for
    /// a call's body.
    deadline: Duration,
    closed: Throttled,
    slow_bodies: Throttled,
    san_refused: Throttled,
    tls_failures: Throttled,
}

/// What one connection has done, noted by its calls (they find it in
/// tonic's connect info) and judged at its deadline.
#[derive(Debug, Default)]
struct Conduct {
    /// A call completed carrying the token (any call, when none is set).
    trusted: AtomicBool,
    /// A health check completed without the token.
    checked_health: AtomicBool,
    /// A call other than a health check started without the token.
    called_without_token: AtomicBool,
    /// Kept past the deadline on the health budget: health checks only.
    health_only: AtomicBool,
    /// Its client certificate is valid for `--rls-tls-client-san` (set at
    /// the TLS handshake).
    san_allowed: std::sync::OnceLock<bool>,
    /// Its refusal for the SAN is counted.
    san_counted: AtomicBool,
}

/// tonic's connect info of a connection: its conduct.
#[derive(Clone, Debug)]
pub struct ConnInfo(Arc<Conduct>);

/// A connection and its slot among `--max-clients` (or the health
/// budget's), counted while open, closed at its deadline unless its
/// conduct earned it the slot.
struct Bounded {
    stream: Socket,
    slot: OwnedSemaphorePermit,
    front: Arc<Front>,
    conduct: Arc<Conduct>,
    /// Until the connection is judged.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Judged to go: every read fails from then on.
    closed: bool,
}

impl Drop for Bounded {
    fn drop(&mut self) {
        let stats = &self.front.rls.stats;
        let gauge = if self.conduct.health_only.load(Relaxed) { &stats.health_connections } else { &stats.connections };
        gauge.fetch_sub(1, Relaxed);
    }
}

impl Bounded {
    /// At the deadline: whether the connection keeps a slot (else it is
    /// counted and logged, and closed by the caller).
    fn judge(&mut self) -> bool {
        let conduct = &self.conduct;
        if conduct.trusted.load(Relaxed) {
            return true;
        }
        let front = &self.front;
        let stats = &front.rls.stats;
        let why = if front.rls.options.token.is_none() {
            "no complete call"
        } else if !conduct.checked_health.load(Relaxed) || conduct.called_without_token.load(Relaxed) {
            "no complete call carrying the token"
        } else if let Ok(slot) = front.health.clone().try_acquire_owned() {
            // Its --max-clients slot freed for callers.
            self.slot = slot;
            conduct.health_only.store(true, Relaxed);
            stats.connections.fetch_sub(1, Relaxed);
            stats.health_connections.fetch_add(1, Relaxed);
            return true;
        } else {
            "health checks only, and the connections kept for those are all taken"
        };
        stats.auth_timeouts.fetch_add(1, Relaxed);
        let peer = super::socket::peer(&self.stream);
        front.closed.log(|| {
            format!(
                "RLS front: closed a connection from {peer}: {why} within {} ms of its accept (--auth-timeout-ms)",
                front.deadline.as_millis()
            )
        });
        false
    }
}

impl Connected for Bounded {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo(self.conduct.clone())
    }
}

impl Bounded {
    /// Judges the connection once its deadline has passed: an error once it
    /// is to go. Every read and write asks (a peer that reads nothing
    /// stalls hyper's reads behind its writes), so the deadline's timer
    /// wakes whichever waits.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.deadline.is_some() && self.conduct.trusted.load(Relaxed) {
            self.deadline = None;
        }
        if let Some(deadline) = &mut self.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                self.deadline = None;
                self.closed = !self.judge();
            }
        }
        match self.closed {
            true => Err(io::Error::new(io::ErrorKind::TimedOut, "closed at --auth-timeout-ms")),
            false => Ok(()),
        }
    }
}

impl AsyncRead for Bounded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.poll_deadline(cx)?;
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_deadline(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_deadline(cx)?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_deadline(cx)?;
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// How long a new connection has to send HTTP/2's client preface (or
/// `--auth-timeout-ms`, if shorter): one that sends nothing would hold its
/// slot among `--max-clients` (hyper reads nothing before it).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`: what a client sends first.
const PREFACE_LEN: usize = 24;

/// Whether the peer sends a preface's worth of bytes (read by hyper after:
/// only peeked here); false if it closes first.
async fn sends_preface(stream: &Socket) -> bool {
    let mut buf = [0u8; PREFACE_LEN];
    loop {
        match super::socket::peek(stream, &mut buf).await {
            Ok(n) if n >= PREFACE_LEN => return true,
            Ok(0) | Err(_) => return false,
            // Part of it: wait for the rest.
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Connections accepted while a slot is free, served once they send the
/// HTTP/2 preface (within [`HANDSHAKE_TIMEOUT`], else closed and counted;
/// one the peer closes first is dropped);
/// past `--max-clients` the next waits in the listener's backlog.
fn incoming(
    listener: Listener,
    slots: Arc<Semaphore>,
    front: Arc<Front>,
) -> impl futures_util::Stream<Item = Result<Conn, io::Error>> {
    let max = front.rls.relay().limits.max_clients.max(1);
    let handshake = HANDSHAKE_TIMEOUT.min(front.deadline);
    accepted(listener, slots, front)
        .map(move |conn| async move {
            let deadline = tokio::time::Instant::now() + handshake;
            match tokio::time::timeout_at(deadline, sends_preface(&conn.stream)).await {
                Ok(true) => {}
                // Closed by the peer (a port probe): nothing to count.
                Ok(false) => return None,
                Err(_) => {
                    conn.front.rls.stats.handshake_timeouts.fetch_add(1, Relaxed);
                    return None;
                }
            }
            let Some(tls) = conn.front.rls.options.tls.clone() else { return Some(Ok(Conn(Either::Left(conn)))) };
            let front = conn.front.clone();
            match tokio::time::timeout_at(deadline, tls.acceptor().accept(conn)).await {
                Ok(Ok(stream)) => {
                    let (conn, session) = stream.get_ref();
                    let allowed = tls.client_allowed(session.peer_certificates());
                    let _ = conn.conduct.san_allowed.set(allowed);
                    Some(Ok(Conn(Either::Right(Box::new(stream)))))
                }
                Ok(Err(e)) => {
                    front.rls.stats.tls_handshake_failures.fetch_add(1, Relaxed);
                    front.tls_failures.log(|| format!("RLS front: a TLS handshake failed: {e}"));
                    None
                }
                Err(_) => {
                    front.rls.stats.handshake_timeouts.fetch_add(1, Relaxed);
                    None
                }
            }
        })
        .buffer_unordered(max)
        .filter_map(std::future::ready)
}

/// A connection served: plain text, or over TLS (`--rls-tls-cert`); read
/// and written through tokio-util's `Either`.
struct Conn(Either<Bounded, Box<tokio_rustls::server::TlsStream<Bounded>>>);

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        match &self.0 {
            Either::Left(conn) => conn.connect_info(),
            Either::Right(stream) => stream.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// Connections as they are accepted, each holding a slot, their deadline
/// running. Failed accepts back off.
fn accepted(listener: Listener, slots: Arc<Semaphore>, front: Arc<Front>) -> impl futures_util::Stream<Item = Bounded> {
    let errors = Throttled::new(Duration::from_secs(10));
    let listener = Open { listener, rls: front.rls.clone() };
    futures_util::stream::unfold((listener, slots, errors), move |(listener, slots, errors)| {
        let front = front.clone();
        async move {
            loop {
                let slot = slots.clone().acquire_owned().await.ok()?;
                match listener.listener.accept().await {
                    Ok(stream) => {
                        front.rls.stats.connections.fetch_add(1, Relaxed);
                        let conn = Bounded {
                            stream,
                            slot,
                            deadline: Some(Box::pin(tokio::time::sleep(front.deadline))),
                            front,
                            conduct: Arc::default(),
                            closed: false,
                        };
                        return Some((conn, (listener, slots, errors)));
                    }
                    Err(e) => {
                        errors.log(|| format!("--rls-listen: accepting failed: {e}"));
                        drop(slot);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    })
}

/// The front's listener; closed when tonic drops the stream of accepted
/// connections (at the stop), which tells `Rls::listener_closed`.
struct Open {
    listener: Listener,
    rls: Arc<Rls>,
}

impl Drop for Open {
    fn drop(&mut self) {
        // notify_one keeps the permit if no one waits yet.
        self.rls.listener_closed.notify_one();
    }
}

/// One of the front's gRPC services behind its gate: each call's token
/// noted on its connection when its body is whole, the body bounded in
/// time, and a connection kept for health checks served nothing else.
#[derive(Clone)]
struct Gated<S> {
    inner: S,
    front: Arc<Front>,
}

impl<S: NamedService> NamedService for Gated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Gated<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + NamedService,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let health = S::NAME == "grpc.health.v1.Health";
        let Some(ConnInfo(conduct)) = request.extensions().get::<ConnInfo>().cloned() else {
            return Box::pin(self.inner.call(request));
        };
        if let Some(refused) = self.front.refused_by_san(&conduct) {
            return Box::pin(std::future::ready(Ok(refused.into_http())));
        }
        if conduct.health_only.load(Relaxed) && !health {
            let refused = Status::unauthenticated(
                "rl-relay: this connection sent no call with the token within --auth-timeout-ms: it is kept for \
                 health checks only",
            );
            return Box::pin(std::future::ready(Ok(refused.into_http())));
        }
        let authorization = request.headers().get("authorization").and_then(|v| v.to_str().ok());
        let with_token = self.front.rls.authorized_by(authorization);
        if !with_token && !health {
            conduct.called_without_token.store(true, Relaxed);
        }
        let (parts, body) = request.into_parts();
        let call = Call { conduct, with_token, health };
        let body = if body.is_end_stream() {
            call.complete();
            body
        } else {
            let due = Instant::now() + self.front.deadline;
            Body::new(Deadlined { body, due, timer: None, call: Some(call), front: self.front.clone() })
        };
        Box::pin(self.inner.call(http::Request::from_parts(parts, body)))
    }
}

impl Front {
    /// With `--rls-tls-client-san`: the refusal of a call on a connection
    /// whose client certificate is not valid for it (the connection
    /// counted and logged at its first call).
    fn refused_by_san(&self, conduct: &Conduct) -> Option<Status> {
        let tls = self.rls.options.tls.as_ref()?;
        let san = tls.client_san.as_ref()?;
        if conduct.san_allowed.get() == Some(&true) {
            return None;
        }
        if !conduct.san_counted.swap(true, Relaxed) {
            self.rls.stats.san_refused.fetch_add(1, Relaxed);
            self.san_refused.log(|| {
                format!("RLS front: refused a client whose certificate is not valid for {san} (--rls-tls-client-san)")
            });
        }
        Some(Status::unauthenticated(format!(
            "rl-relay: the client certificate is not valid for {san} (--rls-tls-client-san)"
        )))
    }
}

/// A call in progress, for its connection's conduct.
struct Call {
    conduct: Arc<Conduct>,
    with_token: bool,
    health: bool,
}

impl Call {
    /// Its body is whole: what it earns its connection.
    fn complete(self) {
        if self.with_token {
            self.conduct.trusted.store(true, Relaxed);
        } else if self.health {
            self.conduct.checked_health.store(true, Relaxed);
        }
    }
}

/// A call's body, due whole (to its end of stream) within the deadline of
/// its headers; past it, the call fails DEADLINE_EXCEEDED, counted.
struct Deadlined {
    body: Body,
    due: Instant,
    /// Set the first time the body is not all there (most calls' whole
    /// body comes with their headers: no timer for them).
    timer: Option<Pin<Box<Sleep>>>,
    /// Until the body is whole or has failed.
    call: Option<Call>,
    front: Arc<Front>,
}

impl http_body::Body for Deadlined {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if this.call.is_none() {
            return polled;
        }
        match polled {
            Poll::Ready(None) => {
                if let Some(call) = this.call.take() {
                    call.complete();
                }
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.call = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => {
                let due = this.due;
                let timer = this.timer.get_or_insert_with(|| Box::pin(sleep_until(due)));
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.call = None;
                let front = &this.front;
                front.rls.stats.body_timeouts.fetch_add(1, Relaxed);
                let ms = front.deadline.as_millis();
                front.slow_bodies.log(|| {
                    format!("RLS front: ended a call whose body did not arrive within {ms} ms (--auth-timeout-ms)")
                });
                Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                    "rl-relay: the call's body did not arrive within {ms} ms of its headers (--auth-timeout-ms)"
                )))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.call.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Serves the RLS front on `listener` until `stop` completes; then accepts
/// no more connections, and returns once the calls in flight are answered
/// (hyper's graceful shutdown: GOAWAY to every connection).
pub async fn serve(rls: Arc<Rls>, listener: Listener, stop: impl Future<Output = ()> + Send) -> Result<(), String> {
    let limits = rls.relay().limits;
    let (reporter, health) = tonic_health::server::health_reporter();
    let ready = rls.clone();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let status = if ready.ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
            if last != Some(status) {
                for name in ["", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"] {
                    reporter.set_service_status(name, status).await;
                }
                last = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    match &rls.options.xds {
        Some(xds) => tokio::spawn(super::xds::run(rls.clone(), xds.clone())),
        None => tokio::spawn(super::watch::watch(rls.clone())),
    };
    tokio::spawn(super::statsd::flush_forever(rls.clone()));
    if rls.relay().backend().asked() == crate::upstream::Backend::Auto {
        tokio::spawn(super::watch::once_decided(rls.clone()));
    }
    let service = RateLimitServiceServer::new(RlsService(rls.clone()))
        .max_decoding_message_size(limits.max_request_bytes)
        .max_encoding_message_size(limits.max_request_bytes.max(1 << 20));
    let slots = Arc::new(Semaphore::new(limits.max_clients));
    let front = Arc::new(Front {
        rls: rls.clone(),
        health: Arc::new(Semaphore::new(HEALTH_CONNECTIONS)),
        deadline: limits.auth_timeout,
        closed: Throttled::new(Duration::from_secs(10)),
        slow_bodies: Throttled::new(Duration::from_secs(10)),
        san_refused: Throttled::new(Duration::from_secs(10)),
        tls_failures: Throttled::new(Duration::from_secs(10)),
    });
    if let Some(tls) = &rls.options.tls {
        let rls = rls.clone();
        tokio::spawn(tls.clone().watch(move || {
            rls.stats.tls_reload_errors.fetch_add(1, Relaxed);
        }));
    }
    let local = listener.describe();
    let token = if rls.options.token.is_some() { "callers send the token" } else { "no caller token" };
    let config = match &rls.options.xds {
        Some(xds) => format!("config over xDS from {}", xds.url),
        None => format!("config {}", rls.options.config_path.display()),
    };
    line(format_args!("RLS listening on {local}, {token}, {config}"));
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS)
        .concurrency_limit_per_connection(MAX_STREAMS as usize)
        .http2_max_header_list_size(MAX_HEADER_BYTES)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(Gated { inner: health, front: front.clone() })
        .add_service(Gated { inner: service, front: front.clone() })
        .serve_with_incoming_shutdown(incoming(listener, slots, front), stop)
        .await
        .map_err(|e| format!("--rls-listen {local}: {e}"))
}
