//! The RESP front: gateways connect to the relay as to Redis. Its reader
//! (`reader`), allow-list (`allow`), fence around the RLS front's keys
//! (`fence`), per-connection state and authentication (`session`), bounds
//! on failed authentications (`auth_guard`) and reply writer (`encode`) are
//! its own, and its TLS (`--resp-tls-*`, with `crate::tls`); the pools,
//! limits, credentials and readiness are the relay's, for every front.

pub mod allow;
pub mod auth_guard;
mod connection;
pub mod encode;
pub mod fence;
pub mod reader;
pub mod session;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{timeout_at, Instant};
use tokio_rustls::server::TlsStream;

use crate::logging::Throttled;
use crate::tls::Tls;
use crate::Relay;

/// Waits between failed accepts (out of descriptors: EMFILE), doubling.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// The first byte of a TLS client's first record (a handshake); a Redis
/// client's is `*` or a letter.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What a plaintext client is told on a TLS port.
const PLAINTEXT_REFUSED: &[u8] = b"-ERR relay: this port speaks TLS only (--resp-tls-cert): connect with rediss://\r\n";

/// What the RESP front's connections share, besides the relay.
#[derive(Debug)]
pub struct Front {
    pub fence: fence::Fence,
    pub auth_guard: auth_guard::AuthGuard,
    /// Failed TLS handshakes and plaintext clients, logged at most every 10 s.
    tls_failures: Throttled,
}

/// Accepts clients on `listener` until the process ends, keeping them off
/// the keys `fence` guards; over TLS when `tls` is given (`--resp-tls-cert`).
pub async fn serve(relay: Arc<Relay>, listener: TcpListener, fence: fence::Fence, tls: Option<Arc<Tls>>) {
    let front = Arc::new(Front {
        fence,
        auth_guard: auth_guard::AuthGuard::default(),
        tls_failures: Throttled::new(Duration::from_secs(10)),
    });
    if let Some(tls) = &tls {
        let relay = relay.clone();
        tokio::spawn(tls.clone().watch(move || {
            relay.counters.tls_reload_errors.fetch_add(1, Relaxed);
        }));
    }
    let accept_errors = Throttled::new(Duration::from_secs(10));
    let mut backoff = ACCEPT_BACKOFF.0;
    let mut next_id = 0u64;
    loop {
        let socket = match listener.accept().await {
            Ok((socket, _)) => socket,
            Err(e) => {
                // A busy loop here spun a core at the descriptor limit.
                accept_errors.log(|| format!("accepting a client failed: {e}; retrying in {backoff:?}"));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                continue;
            }
        };
        backoff = ACCEPT_BACKOFF.0;
        let counters = &relay.counters;
        // Only this loop adds clients, so the count cannot overshoot.
        if counters.connected_clients.load(Relaxed) >= relay.limits.max_clients as u64 {
            counters.rejected_clients.fetch_add(1, Relaxed);
            tokio::spawn(refuse_max_clients(socket, tls.clone()));
            continue;
        }
        counters.connected_clients.fetch_add(1, Relaxed);
        next_id += 1;
        let client = Client(relay.clone());
        let id = next_id;
        let front = front.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let client = client;
            let relay = client.0.clone();
            let _ = socket.set_nodelay(true);
            let peer = socket.peer_addr().map_or_else(|_| "?".to_string(), |a| a.ip().to_string());
            match tls {
                None => {
                    let (read, write) = socket.into_split();
                    connection::run(relay, front, read, write, peer, id).await;
                }
                Some(tls) => {
                    let Some(stream) = handshake(&relay, &front, &tls, socket, &peer).await else { return };
                    let (read, write) = tokio::io::split(stream);
                    connection::run(relay, front, read, write, peer, id).await;
                }
            }
        });
    }
}

/// A client counted while its connection lives (however it ends).
struct Client(Arc<Relay>);

impl Drop for Client {
    fn drop(&mut self) {
        self.0.counters.connected_clients.fetch_sub(1, Relaxed);
    }
}

/// The TLS handshake of a client on a TLS front, within
/// [`crate::rls::serve::HANDSHAKE_TIMEOUT`] and `--auth-timeout-ms` of
/// its accept (else its slot could be held by a connection that never
/// finishes it). A plaintext client is told this port speaks TLS; that and
/// a failed handshake are counted and logged. None: the connection is done.
async fn handshake(
    relay: &Relay,
    front: &Front,
    tls: &Tls,
    socket: TcpStream,
    peer: &str,
) -> Option<TlsStream<TcpStream>> {
    let deadline = Instant::now() + crate::rls::serve::HANDSHAKE_TIMEOUT.min(relay.limits.auth_timeout);
    let counters = &relay.counters;
    let failed = |why: String| {
        counters.tls_handshake_failures.fetch_add(1, Relaxed);
        front.tls_failures.log(|| format!("RESP front: a TLS handshake with {peer} failed: {why}"));
    };
    let mut first = [0u8; 1];
    match timeout_at(deadline, socket.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {}
        // Closed before a byte (a port probe): nothing to count.
        Ok(_) => return None,
        Err(_) => {
            failed("nothing sent within the handshake timeout".into());
            return None;
        }
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        counters.tls_plaintext_refused.fetch_add(1, Relaxed);
        front.tls_failures.log(|| {
            format!("RESP front: refused a plaintext client from {peer}: this port speaks TLS only (rediss://)")
        });
        refuse(socket, PLAINTEXT_REFUSED).await;
        return None;
    }
    match timeout_at(deadline, tls.acceptor().accept(socket)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            failed(e.to_string());
            None
        }
        Err(_) => {
            failed("not completed within the handshake timeout".into());
            None
        }
    }
}

/// Redis's answer past `maxclients` (over TLS on a TLS front), then the
/// connection is closed.
async fn refuse_max_clients(socket: TcpStream, tls: Option<Arc<Tls>>) {
    const FULL: &[u8] = b"-ERR max number of clients reached\r\n";
    match tls {
        None => refuse(socket, FULL).await,
        Some(tls) => {
            if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(1), tls.acceptor().accept(socket)).await {
                refuse(stream, FULL).await;
            }
        }
    }
}

/// Writes `error` and closes the connection.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(mut socket: S, error: &[u8]) {
    let _ = tokio::time::timeout(Duration::from_millis(200), async {
        let _ = socket.write_all(error).await;
        let _ = socket.shutdown().await;
        // What the client sent meanwhile is read, so closing does not
        // reset the connection before it reads the error.
        let mut buf = [0u8; 1024];
        while let Ok(n) = socket.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}
