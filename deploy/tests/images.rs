//! make images's images, run with podman and talked to (`make test-images`
//! builds them, then runs this): RL.TAKE from redis-rl and redis-rl-valkey,
//! each as a non-root user with the memory policy of docs/operations.md;
//! ShouldRateLimit, /healthcheck and the image's HEALTHCHECK from rl-relay
//! started as envoyproxy/ratelimit's image is, with upstream's environment
//! and a config folder mounted. Every image carries its OCI labels.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use support::{repo_file, run, version};
use testkit::free_port;

/// A container started with `podman run -d`, removed when dropped.
struct Container {
    name: String,
}

impl Container {
    fn run(image: &str, options: &[&str], args: &[&str]) -> Container {
        let name = format!("rl-smoke-{image}-{}", free_port());
        let image = format!("{image}:{}", version());
        let mut words = vec!["run", "-d", "--rm", "--network", "host", "--name", &name];
        words.extend(options);
        words.push(&image);
        words.extend(args);
        let (ok, said) = run("podman", &words);
        assert!(ok, "podman {words:?}: {said}: run make test-images (it builds the images)");
        Container { name }
    }

    fn exec(&self, args: &[&str]) -> String {
        let mut words = vec!["exec", &self.name];
        words.extend(args);
        let (ok, said) = run("podman", &words);
        assert!(ok, "podman {words:?}: {said}");
        said.trim().to_string()
    }

    fn logs(&self) -> String {
        run("podman", &["logs", &self.name]).1
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = run("podman", &["rm", "-f", "-t", "1", &self.name]);
    }
}

/// Waits (90 s at most: a loaded machine) until `ready` holds.
fn eventually(what: &str, container: &Container, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not within 90 s; logs:\n{}", container.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The image's OCI labels: version, source (the workspace's repository) and licence.
fn check_labels(image: &str) {
    let (ok, said) =
        run("podman", &["image", "inspect", "--format", "{{json .Labels}}", &format!("{image}:{}", version())]);
    assert!(ok, "{said}");
    let labels: serde_json::Value = serde_json::from_str(said.trim()).unwrap();
    let repository = repo_file("Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("repository = "))
        .map(|r| r.trim_matches('"').to_string())
        .unwrap();
    assert_eq!(labels["org.opencontainers.image.version"], version().as_str(), "{image}");
    assert_eq!(labels["org.opencontainers.image.source"], repository.as_str(), "{image}");
    assert_eq!(labels["org.opencontainers.image.licenses"], "MIT", "{image}");
}

/// Starts `image` (a server image) on a free port once it answers PING.
fn server(image: &str) -> (Container, u16) {
    let port = free_port();
    let container = Container::run(image, &[], &["--port", &port.to_string()]);
    let url = format!("redis://127.0.0.1:{port}/");
    eventually(&format!("{image} answering PING"), &container, || {
        redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    });
    (container, port)
}

#[test]
#[ignore = "make test-images: needs make images"]
fn the_server_images_answer_rl_take_as_a_non_root_user() {
    for (image, server_field) in [("redis-rl", "redis_version:"), ("redis-rl-valkey", "valkey_version:")] {
        check_labels(image);
        let (container, port) = server(image);
        let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap().get_connection().unwrap();
        let info: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
        assert!(info.contains(server_field), "{image}: {info}");
        assert_eq!(&testkit::call(&mut con, "RL.TAKE", "1 k 10 1 1000")[..2], [1, 9], "{image}");
        assert_eq!(&testkit::call(&mut con, "RL.TAKE", "1 k 10 1 1000")[..2], [1, 8], "{image}");
        for (name, want) in [("maxmemory-policy", "volatile-ttl"), ("maxmemory-samples", "10"), ("dir", "/data")] {
            let got: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(&mut con).unwrap();
            assert_eq!(got[1], want, "{image}: {name}");
        }
        assert_ne!(container.exec(&["id", "-u"]), "0", "{image} runs as root");
    }
}

/// GET `path` on 127.0.0.1:`port`: the status code, or None if nothing answers.
fn get(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split(' ').nth(1)?.parse().ok()
}

#[test]
#[ignore = "make test-images: needs make images"]
fn the_relay_image_answers_envoy_as_envoyproxy_ratelimits_would() {
    check_labels("rl-relay");
    let (_redis, redis_port) = server("redis-rl");
    // Upstream's layout: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, mounted
    // read-only, readable by the image's non-root user.
    let config = tempfile::tempdir().unwrap();
    std::fs::write(
        config.path().join("config.yaml"),
        "domain: smoke\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n",
    )
    .unwrap();
    for path in [config.path().to_path_buf(), config.path().join("config.yaml")] {
        let (ok, said) = run("chmod", &["a+rX", path.to_str().unwrap()]);
        assert!(ok, "{said}");
    }
    let (http_port, grpc_port) = (free_port(), free_port());
    let env = [
        format!("REDIS_URL=127.0.0.1:{redis_port}"),
        "REDIS_SOCKET_TYPE=tcp".into(),
        "USE_STATSD=false".into(),
        "RUNTIME_ROOT=/data".into(),
        "RUNTIME_SUBDIRECTORY=ratelimit".into(),
        format!("PORT={http_port}"),
        format!("GRPC_PORT={grpc_port}"),
    ];
    let mount = format!("{}:/data/ratelimit/config:ro", config.path().display());
    let mut options: Vec<&str> = vec!["-v", &mount];
    for e in &env {
        options.extend(["-e", e.as_str()]);
    }
    let relay = Container::run("rl-relay", &options, &[]);
    eventually("/healthcheck answering 200", &relay, || get(http_port, "/healthcheck") == Some(200));
    assert_eq!(relay.exec(&["id", "-u"]), "10001", "the relay image's user");
    // The image's own HEALTHCHECK, as the engine runs it.
    let (ok, said) = run("podman", &["healthcheck", "run", &relay.name]);
    assert!(ok, "podman healthcheck run: {said}");

    let codes = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}")).await.unwrap();
        let mut codes = Vec::new();
        for _ in 0..3 {
            let request = RateLimitRequest {
                domain: "smoke".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry { key: "user".into(), value: "alice".into() }],
                    ..RateLimitDescriptor::default()
                }],
                hits_addend: 0,
            };
            codes.push(client.should_rate_limit(request).await.unwrap().into_inner().overall_code);
        }
        codes
    });
    assert_eq!(codes, [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32], "logs:\n{}", relay.logs());

    // A SIGTERM (what Kubernetes and `podman stop` send) ends it, though the
    // relay is the container's PID 1, for which the kernel ignores a signal
    // the process does not handle: without that, every stop waits out the
    // grace period and ends in SIGKILL.
    let (ok, said) = run("podman", &["kill", "--signal", "TERM", &relay.name]);
    assert!(ok, "{said}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while run("podman", &["container", "exists", &relay.name]).0 {
        let state = run("podman", &["inspect", "--format", "{{.State.Status}}", &relay.name]).1;
        if state.trim() != "running" {
            break;
        }
        assert!(Instant::now() < deadline, "SIGTERM did not end the relay's container within 20 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}
