//! The operator's HTTP endpoint (`--metrics`): `/metrics` (Prometheus
//! text), `/ready` (200 while Redis answers the relay's probe, else 503),
//! `/live` (200 while the process serves), and with the RLS front
//! `/healthcheck` (envoyproxy/ratelimit's: 200 `OK` while ready, else 500).
//! Bounded like the RESP front: a few connections at once, a small
//! request, a short wait for it (its whole head within 2 s of the accept).
//! Slow clients cannot shut out the probes: a connection is accepted at
//! once, and when [`MAX_CONNECTIONS`] are open (or [`MAX_SLOW_PER_ADDRESS`]
//! of its address are still sending their request) the oldest such one is
//! dropped for it; a probe or a scrape sends its request whole at once, so
//! it is answered while trickled requests take each other's place.
//! The debug port (`--debug-listen`) is served the same way, its pages
//! those of `debug_endpoint.rs`.

use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::logging::Throttled;
use crate::rls::Rls;
use crate::Relay;

/// Scrapes and probes at once; past it a new one takes the place of the
/// oldest still sending its request, or waits for an answer to be taken.
pub const MAX_CONNECTIONS: usize = 16;
/// Connections of one address still sending their request; past it a new
/// one takes the place of that address's oldest, so one address cannot
/// displace another's.
pub const MAX_SLOW_PER_ADDRESS: usize = 4;
const MAX_REQUEST: usize = 8 << 10;
/// A request's whole head within this of the accept (a total, not per
/// byte); its answer taken within as long again.
const READ_FOR: Duration = Duration::from_secs(2);

/// An open connection.
struct Conn {
    id: u64,
    ip: IpAddr,
    accepted: Instant,
    /// Still sending its request.
    reading: bool,
    task: AbortHandle,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Open(Mutex<Vec<Conn>>);

impl Open {
    fn conns(&self) -> MutexGuard<'_, Vec<Conn>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection a new one from `ip` takes the place of (taken out of
    /// the list), and why: the oldest still reading from `ip` when it has
    /// [`MAX_SLOW_PER_ADDRESS`] of those, else, all slots taken, the
    /// oldest still reading.
    fn make_room(&self, ip: IpAddr) -> Option<(Conn, &'static str)> {
        let mut conns = self.conns();
        let slow_here = conns.iter().filter(|c| c.reading && c.ip == ip).count();
        let (why, here_only) = if slow_here >= MAX_SLOW_PER_ADDRESS {
            ("4 of its address still sending theirs", true)
        } else if conns.len() >= MAX_CONNECTIONS {
            ("all 16 connections taken", false)
        } else {
            return None;
        };
        let at = conns.iter().position(|c| c.reading && (!here_only || c.ip == ip))?;
        Some((conns.remove(at), why))
    }

    /// The connection's request is whole: it is not dropped for another.
    fn answering(&self, id: u64) {
        if let Some(c) = self.conns().iter_mut().find(|c| c.id == id) {
            c.reading = false;
        }
    }
}

/// Takes a connection out of the list when its task ends (or is dropped,
/// polled or not).
struct Leave(Arc<Open>, u64);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.conns().retain(|c| c.id != self.1);
    }
}

/// Which pages a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pages {
    /// `--metrics`, `--prometheus-listen`: /metrics, /ready, /live, /healthcheck.
    Operator,
    /// `--debug-listen`: /rlconfig.
    Debug,
}

pub async fn serve(relay: Arc<Relay>, listener: TcpListener, rls: Option<Arc<Rls>>, pages: Pages) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let open = Arc::new(Open::default());
    let accept_errors = Throttled::new(Duration::from_secs(10));
    let dropped = Throttled::new(Duration::from_secs(10));
    let slow = Arc::new(Throttled::new(Duration::from_secs(10)));
    for id in 0u64.. {
        let (socket, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                accept_errors.log(|| format!("--metrics: accepting failed: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let accepted = Instant::now();
        if let Some((old, why)) = open.make_room(peer.ip()) {
            old.task.abort();
            relay.counters.http_dropped.fetch_add(1, Relaxed);
            let ms = old.accepted.elapsed().as_millis();
            dropped.log(|| {
                format!(
                    "--metrics: dropped a connection from {} still sending its request after {ms} ms: {why}",
                    old.ip
                )
            });
        }
        // Free, or freed as the dropped one's task ends, or once an answer
        // is taken (within 2 s).
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (relay, rls, slow, opened) = (relay.clone(), rls.clone(), slow.clone(), open.clone());
        let leave = Leave(open.clone(), id);
        // Listed before its task can end (and unlist itself).
        let mut conns = open.conns();
        let task = tokio::spawn(async move {
            let _leave = leave;
            let _slot = slot;
            let answering = || opened.answering(id);
            answer(&relay, rls.as_deref(), pages, socket, peer.ip(), accepted, &slow, answering).await;
        });
        conns.push(Conn { id, ip: peer.ip(), accepted, reading: true, task: task.abort_handle() });
    }
}

/// Reads the request (its head within [`READ_FOR`] of `accepted`), calls
/// `answering` once it is whole, and writes the answer (taken within
/// [`READ_FOR`] again); what is too slow is closed, counted and logged.
#[allow(clippy::too_many_arguments)]
async fn answer(
    relay: &Relay,
    rls: Option<&Rls>,
    pages: Pages,
    mut socket: TcpStream,
    peer: IpAddr,
    accepted: Instant,
    slow: &Throttled,
    answering: impl FnOnce(),
) {
    let too_slow = |what: &str| {
        relay.counters.http_timeouts.fetch_add(1, Relaxed);
        slow.log(|| format!("--metrics: closed a connection from {peer}: {what} within 2 s"));
    };
    let path = match tokio::time::timeout_at(accepted + READ_FOR, request_path(&mut socket)).await {
        Ok(Some(path)) => path,
        Ok(None) => return,
        Err(_) => return too_slow("no whole request"),
    };
    answering();
    let metrics = || match rls {
        Some(rls) => relay.metrics() + &rls.metrics(),
        None => relay.metrics(),
    };
    let (status, kind, body) = match path.as_str() {
        _ if pages == Pages::Debug => {
            let (status, body) = crate::debug_endpoint::page(rls, &path);
            (status, "text/plain", body)
        }
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", metrics()),
        // envoyproxy/ratelimit's health check: 200 OK while ready, else 500.
        "/healthcheck" if rls.is_some_and(Rls::ready) => ("200 OK", "text/plain", "OK".into()),
        "/healthcheck" if rls.is_some() => ("500 Internal Server Error", "text/plain", String::new()),
        // Which backend carries the calls out, said with the status.
        "/ready" if relay.health.ready() => {
            ("200 OK", "text/plain", format!("ready (redis backend: {})\n", relay.backend().name()))
        }
        "/ready" => (
            "503 Service Unavailable",
            "text/plain",
            format!("not ready: {} (redis backend: {})\n", relay.health.why_not_ready(), relay.backend().name()),
        ),
        "/live" => ("200 OK", "text/plain", "live\n".into()),
        _ => ("404 Not Found", "text/plain", "not found: /metrics, /ready or /live\n".into()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        socket.write_all(head.as_bytes()).await?;
        socket.write_all(body.as_bytes()).await?;
        socket.shutdown().await
    };
    if tokio::time::timeout(READ_FOR, write).await.is_err() {
        too_slow("the answer not taken");
    }
}

/// The path of `GET path HTTP/1.x`, once the request's head has arrived.
async fn request_path(socket: &mut TcpStream) -> Option<String> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = socket.read(&mut buf).await.ok().filter(|&n| n > 0)?;
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next()?;
    let mut words = std::str::from_utf8(line).ok()?.split(' ');
    let (_method, target) = (words.next()?, words.next()?);
    Some(target.split('?').next().unwrap_or(target).to_string())
}
