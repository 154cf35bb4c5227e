//! The operator's HTTP endpoint (`--metrics`): `/metrics` (Prometheus
//! text), `/ready` (200 while Redis answers the relay's probe, else 503),
//! `/live` (200 while the process serves), and with the RLS front
//! `/healthcheck` (envoyproxy/ratelimit's: 200 `OK` while ready, else 500). Bounded like the RESP front: a
//! few connections at once, a small request, a short wait for it.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::log::Throttled;
use crate::rls::Rls;
use crate::Relay;

/// Scrapes and probes at once; more wait in the listener's backlog.
pub const MAX_CONNECTIONS: usize = 16;
const MAX_REQUEST: usize = 8 << 10;
const READ_FOR: Duration = Duration::from_secs(2);

pub async fn serve(relay: Arc<Relay>, listener: TcpListener, rls: Option<Arc<Rls>>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let accept_errors = Throttled::new(Duration::from_secs(10));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok((socket, _)) => {
                let relay = relay.clone();
                let rls = rls.clone();
                tokio::spawn(async move {
                    answer(&relay, rls.as_deref(), socket).await;
                    drop(slot);
                });
            }
            Err(e) => {
                accept_errors.log(|| format!("--metrics: accepting failed: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(relay: &Relay, rls: Option<&Rls>, mut socket: TcpStream) {
    let Some(path) = request_path(&mut socket).await else { return };
    let metrics = || match rls {
        Some(rls) => relay.metrics() + &rls.metrics(),
        None => relay.metrics(),
    };
    let (status, kind, body) = match path.as_str() {
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", metrics()),
        // envoyproxy/ratelimit's health check: 200 OK while ready, else 500.
        "/healthcheck" if rls.is_some_and(Rls::ready) => ("200 OK", "text/plain", "OK".into()),
        "/healthcheck" if rls.is_some() => ("500 Internal Server Error", "text/plain", String::new()),
        "/ready" if relay.health.ready() => ("200 OK", "text/plain", "ready\n".into()),
        "/ready" => ("503 Service Unavailable", "text/plain", "not ready: Redis does not answer\n".into()),
        "/live" => ("200 OK", "text/plain", "live\n".into()),
        _ => ("404 Not Found", "text/plain", "not found: /metrics, /ready or /live\n".into()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = socket.write_all(head.as_bytes()).await;
    let _ = socket.write_all(body.as_bytes()).await;
    let _ = socket.shutdown().await;
}

/// The path of `GET path HTTP/1.x`, once the request's head has arrived.
async fn request_path(socket: &mut TcpStream) -> Option<String> {
    let mut head = Vec::with_capacity(1024);
    let read = async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
            let n = socket.read(&mut buf).await.ok().filter(|&n| n > 0)?;
            head.extend_from_slice(&buf[..n]);
        }
        Some(())
    };
    tokio::time::timeout(READ_FOR, read).await.ok()??;
    let line = head.split(|&b| b == b'\r').next()?;
    let mut words = std::str::from_utf8(line).ok()?.split(' ');
    let (_method, target) = (words.next()?, words.next()?);
    Some(target.split('?').next().unwrap_or(target).to_string())
}
