//! The RESP front: gateways connect to the relay as to Redis. Its reader
//! (`reader`), allow-list (`allow`), fence around the RLS front's keys
//! (`fence`), per-connection state and authentication (`session`), bounds
//! on failed authentications (`auth_guard`) and reply writer (`encode`) are
//! its own; the pools, limits, credentials and readiness are the relay's,
//! for every front.

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

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::logging::Throttled;
use crate::Relay;

/// Waits between failed accepts (out of descriptors: EMFILE), doubling.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// What the RESP front's connections share, besides the relay.
#[derive(Debug)]
pub struct Front {
    pub fence: fence::Fence,
    pub auth_guard: auth_guard::AuthGuard,
}

/// Accepts clients on `listener` until the process ends, keeping them off
/// the keys `fence` guards.
pub async fn serve(relay: Arc<Relay>, listener: TcpListener, fence: fence::Fence) {
    let front = Arc::new(Front { fence, auth_guard: auth_guard::AuthGuard::default() });
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
            tokio::spawn(refuse(socket));
            continue;
        }
        counters.connected_clients.fetch_add(1, Relaxed);
        next_id += 1;
        let client = Client(relay.clone());
        let id = next_id;
        let front = front.clone();
        tokio::spawn(async move {
            let client = client;
            connection::run(client.0.clone(), front, socket, id).await;
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

/// Redis's answer past `maxclients`, then the connection is closed.
async fn refuse(mut socket: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_millis(200), async {
        let _ = socket.write_all(b"-ERR max number of clients reached\r\n").await;
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
