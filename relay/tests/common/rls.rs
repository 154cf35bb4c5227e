//! The relay with its RLS front as a child process, and a gRPC client of
//! it (the generated client of envoy-types).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use testkit::free_port;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::{Relay, Start};

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

pub struct RlsRelay {
    pub relay: Relay,
    pub rls_port: u16,
    pub metrics_port: u16,
}

impl RlsRelay {
    /// A relay in front of `redis` (a cluster's nodes with `cluster`)
    /// serving RLS on `config`, with `extra` options.
    pub fn start(redis: &[String], cluster: bool, config: &Path, extra: &[&str]) -> RlsRelay {
        RlsRelay::start_limited(redis, cluster, config, extra, None)
    }

    /// The same, its memory limited to `max_memory_mib` (`ulimit -d`).
    pub fn start_limited(
        redis: &[String],
        cluster: bool,
        config: &Path,
        extra: &[&str],
        max_memory_mib: Option<u64>,
    ) -> RlsRelay {
        let (rls_port, metrics_port) = (free_port(), free_port());
        let mut args: Vec<String> = Vec::new();
        for url in redis {
            args.extend(["--redis".into(), url.clone()]);
        }
        if cluster {
            args.push("--cluster".into());
        }
        args.extend([
            "--rls-listen".into(),
            format!("127.0.0.1:{rls_port}"),
            "--rls-config".into(),
            config.display().to_string(),
            "--metrics".into(),
            format!("127.0.0.1:{metrics_port}"),
        ]);
        if !extra.contains(&"--timeout-ms") {
            args.extend(["--timeout-ms".into(), "1000".into()]);
        }
        if !extra.contains(&"--rls-timeout-ms") {
            args.extend(["--rls-timeout-ms".into(), "2000".into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut relay = Relay::spawn(Start { args, max_memory_mib, ..Start::default() });
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", rls_port)).is_err() {
            assert!(Instant::now() < deadline, "the RLS front did not listen: {}", relay.log());
            assert!(relay.alive(), "rl-relay exited: {}", relay.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        RlsRelay { relay, rls_port, metrics_port }
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.rls_port)).await.unwrap()
    }

    /// GET `path` on the metrics endpoint: the status code and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let code = text.split(' ').nth(1).unwrap().parse().unwrap();
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (code, body)
    }

    /// One sample of /metrics (the line's value), 0 if absent.
    pub fn metric(&self, line_start: &str) -> f64 {
        let (_, body) = self.get("/metrics");
        body.lines()
            .find(|l| l.starts_with(line_start) && l[line_start.len()..].starts_with(' '))
            .map_or(0.0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
    }
}

/// A descriptor of `entries`.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect(),
        ..RateLimitDescriptor::default()
    }
}

pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

pub async fn ask(client: &mut RateLimitServiceClient<Channel>, request: RateLimitRequest) -> RateLimitResponse {
    client.should_rate_limit(request).await.unwrap().into_inner()
}

/// (requests_per_unit, unit number, name) of a status's limit.
pub fn limit_of(status: &DescriptorStatus) -> Option<(u32, i32, String)> {
    status.current_limit.as_ref().map(|l| (l.requests_per_unit, l.unit, l.name.clone()))
}

/// A header of an answer.
pub fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response.response_headers_to_add.iter().find(|h| h.key.eq_ignore_ascii_case(name)).map(|h| h.value.as_str())
}

/// A config file in a temp dir (the dir is returned to keep it alive).
pub fn config_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// Calls of `command` the server has counted (INFO commandstats).
pub fn calls(con: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let prefix = format!("cmdstat_{}:calls=", command.to_ascii_lowercase());
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// The gRPC health service's status for `service`.
pub async fn health(relay: &RlsRelay, service: &str) -> i32 {
    let channel = Channel::from_shared(format!("http://127.0.0.1:{}", relay.rls_port)).unwrap();
    let mut client = HealthClient::new(channel.connect().await.unwrap());
    let r = client.check(HealthCheckRequest { service: service.into() }).await.unwrap();
    r.into_inner().status
}

/// Waits (20 s at most) until the gRPC health service says `status` for "".
pub async fn wait_health(relay: &RlsRelay, status: ServingStatus) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while health(relay, "").await != status as i32 {
        assert!(Instant::now() < deadline, "gRPC health never said {status:?}: {}", relay.relay.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A relay started with `env` and no argument, and its ports.
pub struct Bare {
    pub relay: Relay,
    pub grpc: u16,
    pub health: u16,
}

/// GET `path` on `port`: the status code (0 if nothing answers) and body.
pub fn get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return (0, String::new()) };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// `vars` with the ports and the config folder (`root`/ratelimit/config)
/// as Envoy Gateway sets them, on loopback (USE_STATSD=false unless
/// `vars` say otherwise).
pub fn start_bare(root: &Path, vars: &[(&'static str, String)]) -> Bare {
    start_bare_with(root, vars, &[])
}

/// The same with `args` (`--envoyproxy-env` and flags that win over the
/// environment: a longer `--rls-timeout-ms` for a busy machine).
pub fn start_bare_with(root: &Path, vars: &[(&'static str, String)], args: &[&str]) -> Bare {
    let (grpc, health) = (free_port(), free_port());
    let mut env = vec![
        ("GRPC_HOST", "127.0.0.1".to_string()),
        ("GRPC_PORT", grpc.to_string()),
        ("HOST", "127.0.0.1".to_string()),
        ("PORT", health.to_string()),
        // Not upstream's 6070: tests start relays side by side.
        ("DEBUG_PORT", free_port().to_string()),
        ("RUNTIME_ROOT", root.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("USE_STATSD", "false".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
    ];
    env.extend(vars.iter().cloned());
    let args = args.iter().map(|a| a.to_string()).collect();
    let relay = Relay::spawn(Start { env, args, bare: true, ..Start::default() });
    Bare { relay, grpc, health }
}

pub fn config_folder(text: Option<&str>) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let folder = root.path().join("ratelimit/config");
    if let Some(text) = text {
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("config.yaml"), text).unwrap();
    }
    root
}

impl Bare {
    /// Waits for the gRPC port, the relay alive.
    pub fn listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.grpc)).is_err() {
            assert!(self.relay.alive(), "rl-relay exited: {}", self.relay.log());
            assert!(Instant::now() < deadline, "the Envoy front did not listen: {}", self.relay.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub async fn client(&mut self) -> RateLimitServiceClient<tonic::transport::Channel> {
        self.listening();
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc)).await.unwrap()
    }

    /// GET `path` on PORT: the status code.
    pub fn get(&self, path: &str) -> u16 {
        get(self.health, path).0
    }

    /// Waits (20 s at most) for `/healthcheck` to answer `code`.
    pub fn health_becomes(&self, code: u16) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.get("/healthcheck") != code {
            assert!(Instant::now() < deadline, "/healthcheck never answered {code}: {}", self.relay.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
