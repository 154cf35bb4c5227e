//! The RLS front's listener: HTTP/2 gRPC with the relay's bounds (at most
//! `--max-clients` connections, each of at most [`MAX_STREAMS`] calls at
//! once, a message of at most `--max-request-bytes`, headers of at most
//! [`MAX_HEADER_BYTES`]), the rate limit service and the standard health
//! service (`grpc.health.v1.Health`: `""` and `ratelimit` SERVING while
//! the front is ready).

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic_health::ServingStatus;

use super::service::Service;
use super::Rls;
use crate::log::{line, Throttled};

/// Calls at once on one connection.
pub const MAX_STREAMS: u32 = 256;
/// A call's headers, together.
pub const MAX_HEADER_BYTES: u32 = 16 << 10;

/// A connection and its slot among `--max-clients`, counted while open.
struct Bounded {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    rls: Arc<Rls>,
}

impl Drop for Bounded {
    fn drop(&mut self) {
        self.rls.stats.connections.fetch_sub(1, Relaxed);
    }
}

impl Connected for Bounded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Bounded {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// How long a new connection has to send HTTP/2's client preface: one that
/// sends nothing would hold its slot among `--max-clients` for good (the
/// keepalive pings begin only after the handshake).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`: what a client sends first.
const PREFACE_LEN: usize = 24;

/// Whether the peer sends a preface's worth of bytes (read by hyper after:
/// only peeked here); false if it closes first.
async fn sends_preface(stream: &TcpStream) -> bool {
    let mut buf = [0u8; PREFACE_LEN];
    loop {
        match stream.peek(&mut buf).await {
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
    listener: TcpListener,
    slots: Arc<Semaphore>,
    rls: Arc<Rls>,
) -> impl futures_util::Stream<Item = Result<Bounded, io::Error>> {
    let max = rls.relay().limits.max_clients.max(1);
    accepted(listener, slots, rls)
        .map(|conn| async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, sends_preface(&conn.stream)).await {
                Ok(true) => Some(Ok(conn)),
                // Closed by the peer (a port probe): nothing to count.
                Ok(false) => None,
                Err(_) => {
                    conn.rls.stats.handshake_timeouts.fetch_add(1, Relaxed);
                    None
                }
            }
        })
        .buffer_unordered(max)
        .filter_map(std::future::ready)
}

/// Connections as they are accepted, each holding a slot. Failed accepts
/// back off.
fn accepted(listener: TcpListener, slots: Arc<Semaphore>, rls: Arc<Rls>) -> impl futures_util::Stream<Item = Bounded> {
    let errors = Throttled::new(Duration::from_secs(10));
    futures_util::stream::unfold((listener, slots, errors), move |(listener, slots, errors)| {
        let rls = rls.clone();
        async move {
            loop {
                let slot = slots.clone().acquire_owned().await.ok()?;
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        rls.stats.connections.fetch_add(1, Relaxed);
                        return Some((Bounded { stream, _slot: slot, rls }, (listener, slots, errors)));
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

/// Serves the RLS front on `listener` until the process ends.
pub async fn serve(rls: Arc<Rls>, listener: TcpListener) -> Result<(), String> {
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
    tokio::spawn(super::watch::watch(rls.clone()));
    let service = RateLimitServiceServer::new(Service(rls.clone()))
        .max_decoding_message_size(limits.max_request_bytes)
        .max_encoding_message_size(limits.max_request_bytes.max(1 << 20));
    let slots = Arc::new(Semaphore::new(limits.max_clients));
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let token = if rls.options.token.is_some() { "callers send the token" } else { "no caller token" };
    line(format_args!("RLS listening on {local}, {token}, config {}", rls.options.config_path.display()));
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS)
        .concurrency_limit_per_connection(MAX_STREAMS as usize)
        .http2_max_header_list_size(MAX_HEADER_BYTES)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(health)
        .add_service(service)
        .serve_with_incoming(incoming(listener, slots, rls.clone()))
        .await
        .map_err(|e| format!("--rls-listen {local}: {e}"))
}
