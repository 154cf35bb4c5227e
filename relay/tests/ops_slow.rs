//! The operator endpoint (`--metrics`) under slow clients: 64 clients that
//! trickle a request a byte every half second (and come back when closed)
//! do not shut out `/healthcheck`, `/ready` and `/metrics`, and a few slow
//! requests from another address are not dropped for them.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::rls::{config_file, RlsRelay};
use testkit::Server;

const CONFIG: &str = "\
domain: api
descriptors:
  - key: wide
    rate_limit: { unit: hour, requests_per_unit: 1000 }
";

/// A TCP connection to `port` on 127.0.0.1, 3 s to answer.
fn connect(port: u16) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    Ok(s)
}

/// The same from another loopback address (std cannot bind before it
/// connects: tokio's socket can, on a runtime of its own).
fn connect_from(from: Ipv4Addr, port: u16) -> std::io::Result<TcpStream> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(IpAddr::V4(from), 0))?;
        socket.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?.into_std()
    })?;
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    Ok(stream)
}

/// Clients that each send `GET /metrics ...` a byte every 500 ms, and
/// connect again when the relay closes them, until stopped (or 60 s).
struct Tricklers {
    stop: Arc<AtomicBool>,
    connects: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Tricklers {
    fn start(count: usize, port: u16) -> Tricklers {
        let stop = Arc::new(AtomicBool::new(false));
        let connects = Arc::new(AtomicU64::new(0));
        let threads = (0..count)
            .map(|_| {
                let (stop, connects) = (stop.clone(), connects.clone());
                std::thread::spawn(move || {
                    let until = Instant::now() + Duration::from_secs(60);
                    let request = b"GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Pad: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
                    while !stop.load(Relaxed) && Instant::now() < until {
                        let Ok(mut s) = connect(port) else {
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        };
                        connects.fetch_add(1, Relaxed);
                        for byte in request.iter() {
                            if stop.load(Relaxed) || s.write_all(&[*byte]).is_err() {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                })
            })
            .collect();
        Tricklers { stop, connects, threads }
    }

    fn stop(self) {
        self.stop.store(true, Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

/// `GET path` from 127.0.0.1 (3 s to answer): the status code (0 for
/// none) and the body.
fn timed_get_body(port: u16, path: &str) -> (u16, String) {
    let answer = (|| {
        let mut s = connect(port).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n").ok()?;
        let mut response = String::new();
        s.read_to_string(&mut response).ok()?;
        let status = response.split(' ').nth(1)?.parse().ok()?;
        Some((status, response.split_once("\r\n\r\n")?.1.to_string()))
    })();
    answer.unwrap_or_default()
}

/// `GET path`: the status code, and how long it took.
fn timed_get(port: u16, path: &str) -> (u16, Duration) {
    let started = Instant::now();
    (timed_get_body(port, path).0, started.elapsed())
}

/// `rl_relay_http_dropped_total`, 0 while the endpoint does not answer.
fn dropped(relay: &RlsRelay) -> u64 {
    let (status, metrics) = timed_get_body(relay.metrics_port, "/metrics");
    if status != 200 {
        return 0;
    }
    metrics.lines().find_map(|l| l.strip_prefix("rl_relay_http_dropped_total ")?.parse().ok()).unwrap_or(0)
}

#[test]
fn health_is_answered_while_64_clients_trickle_their_requests() {
    let server = Server::start(&[]);
    let (_dir, config) = config_file(CONFIG);
    let relay = RlsRelay::start(&[server.url()], false, &config, &[]);
    let port = relay.metrics_port;
    let deadline = Instant::now() + Duration::from_secs(10);
    while relay.get("/healthcheck").0 != 200 {
        assert!(Instant::now() < deadline, "never ready: {}", relay.relay.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let tricklers = Tricklers::start(64, port);
    let started = Instant::now();
    while tricklers.connects.load(Relaxed) < 64 {
        assert!(started.elapsed() < Duration::from_secs(10), "the tricklers did not connect");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Health, readiness and a scrape, five times each: each within 3 s
    // (the connection's head is whole at once; a trickler's never is).
    let mut slow = Vec::new();
    for round in 0..5 {
        for path in ["/healthcheck", "/ready", "/metrics"] {
            let (status, took) = timed_get(port, path);
            if status != 200 || took > Duration::from_secs(3) {
                slow.push(format!("round {round} {path}: {status} in {took:?}"));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(slow.is_empty(), "answered late or not at all: {slow:?}");
    // 64 tricklers, at most 4 of one address held: 60 dropped at least.
    let before = dropped(&relay);
    assert!(before >= 60, "rl_relay_http_dropped_total {before}");
    // Three slow requests from another address, begun mid-flood, are not
    // what the tricklers displace: each address's own oldest is. They are
    // answered once whole, after 16 more tricklers were dropped.
    let mut early: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = connect_from(Ipv4Addr::new(127, 0, 0, 2), port).unwrap();
            s.write_all(b"GET /ready HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    let started = Instant::now();
    while dropped(&relay) < before + 16 {
        assert!(started.elapsed() < Duration::from_secs(10), "the tricklers stopped coming back");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (i, s) in early.iter_mut().enumerate() {
        s.write_all(b"Host: early\r\n\r\n").unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap_or_else(|e| panic!("early request {i}: {e}"));
        assert!(response.starts_with("HTTP/1.1 200 "), "early request {i}: {response:?}");
    }
    tricklers.stop();
    assert!(relay.relay.log().contains("--metrics: dropped a connection"), "{}", relay.relay.log());
}
