//! rl-relay started as envoyproxy/ratelimit is (`/bin/ratelimit`, no
//! argument, its environment variables), against a real Redis with the
//! module and a real gRPC client.

mod common;

use common::rls::{ask, calls, config_folder, get, request, start_bare as start, Bare, OK, OVER_LIMIT};
use common::{Relay, Start};
use testkit::{free_port, PlainServer, Server};

const CONFIG: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_with_upstreams_environment_and_no_argument_it_serves_envoy() {
    let redis = Server::start(&[]);
    let _: () = redis::cmd("CONFIG").arg("SET").arg("requirepass").arg("s3cret-pw").query(&mut redis.con()).unwrap();
    let root = config_folder(Some(CONFIG));
    let prometheus = free_port();
    let mut bare = start(
        root.path(),
        &[
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("REDIS_AUTH", "s3cret-pw".into()),
            ("USE_PROMETHEUS", "true".into()),
            ("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}")),
        ],
    );
    let mut client = bare.client().await;
    bare.health_becomes(200);
    let codes: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code);
        }
        codes
    };
    assert_eq!(codes, [OK, OK, OVER_LIMIT], "{}", bare.relay.log());
    // Decided by Redis, not the local fallback.
    let mut con =
        redis::Client::open(format!("redis://:s3cret-pw@127.0.0.1:{}/", redis.port)).unwrap().get_connection().unwrap();
    assert!(calls(&mut con, "rl.window") >= 1, "{}", bare.relay.log());
    // Upstream's default: no response headers.
    let answer = ask(&mut client, request("edge", &[&[("user", "bob")]])).await;
    assert!(answer.response_headers_to_add.is_empty(), "{:?}", answer.response_headers_to_add);
    // USE_PROMETHEUS: the endpoint on PROMETHEUS_ADDR too, upstream's names.
    let (code, body) = get(prometheus, "/metrics");
    assert_eq!(code, 200);
    assert!(body.contains("ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"user\"} 1"), "{body}");
    // The password is in no argument of the process, nor in its log.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", bare.relay.pid())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("s3cret"));
    assert!(!bare.relay.log().contains("s3cret"), "{}", bare.relay.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variable_not_served_is_named_and_one_served_wrongly_refuses_the_start() {
    let redis = Server::start(&[]);
    let root = config_folder(Some(CONFIG));
    let url = ("REDIS_URL", format!("127.0.0.1:{}", redis.port));
    let mut bare =
        start(root.path(), &[url.clone(), ("TRACING_ENABLED", "true".into()), ("REDIS_PERSECOND", "true".into())]);
    bare.listening();
    let log = bare.relay.log();
    let warning = log.lines().find(|l| l.contains("not served")).unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(warning.contains("TRACING_ENABLED") && warning.contains("REDIS_PERSECOND"), "{warning}");
    assert!(!warning.contains("USE_STATSD") && !warning.contains("LOG_LEVEL"), "{warning}");

    let mut refused = start(root.path(), &[url, ("BACKEND_TYPE", "memcache".into())]);
    assert_eq!(refused.relay.exit_code(), Some(2), "{}", refused.relay.log());
    assert!(refused.relay.log().contains("BACKEND_TYPE=memcache is not served"), "{}", refused.relay.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_wins_over_its_variable() {
    let redis = Server::start(&[]);
    let root = config_folder(Some(CONFIG));
    let grpc = free_port();
    let relay = Relay::spawn(Start {
        args: vec!["--envoyproxy-env".into(), "--rls-listen".into(), format!("127.0.0.1:{grpc}")],
        env: vec![
            ("GRPC_HOST", "127.0.0.1".into()),
            ("GRPC_PORT", free_port().to_string()),
            ("HOST", "127.0.0.1".into()),
            ("PORT", free_port().to_string()),
            ("DEBUG_PORT", free_port().to_string()),
            ("RUNTIME_ROOT", root.path().display().to_string()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ],
        ..Start::default()
    });
    let mut bare = Bare { relay, grpc, health: 0 };
    let mut client = bare.client().await;
    assert_eq!(ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code, OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_without_a_config_answers_ok_and_loads_files_when_they_come() {
    let redis = Server::start(&[]);
    let root = config_folder(None);
    let url = ("REDIS_URL", format!("127.0.0.1:{}", redis.port));
    // Without the variable: refused, naming it.
    let mut refused = start(root.path(), std::slice::from_ref(&url));
    assert_eq!(refused.relay.exit_code(), Some(2), "{}", refused.relay.log());

    let mut bare = start(
        root.path(),
        &[
            url,
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true".into()),
        ],
    );
    let mut client = bare.client().await;
    for _ in 0..3 {
        assert_eq!(ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code, OK);
    }
    // No config yet, and it was asked for one to be healthy.
    assert_eq!(bare.get("/healthcheck"), 500);
    let folder = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("config.yaml"), CONFIG).unwrap();
    bare.health_becomes(200);
    let codes = [
        ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code,
        ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code,
        ask(&mut client, request("edge", &[&[("user", "ann")]])).await.overall_code,
    ];
    assert_eq!(codes, [OK, OK, OVER_LIMIT]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_without_a_domain_as_upstream_by_default() {
    let redis = Server::start(&[]);
    let root = config_folder(None);
    let bare = start(
        root.path(),
        &[("REDIS_URL", format!("127.0.0.1:{}", redis.port)), ("FORCE_START_WITHOUT_INITIAL_CONFIG", "1".into())],
    );
    bare.health_becomes(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_descriptor_value_reaches_a_header() {
    let redis = Server::start(&[]);
    let text = "domain: example8\ndescriptors:\n  - key: key1\n    value: tenant-secret-123\n    rate_limit: { unit: \
                minute, requests_per_unit: 2 }\n  - key: user\n    rate_limit: { unit: second, requests_per_unit: 5 }\n";
    let (_dir, config) = common::rls::config_file(text);
    let relay = common::rls::RlsRelay::start(&[redis.url()], false, &config, &["--rls-headers", "draft"]);
    let mut client = relay.client().await;
    for _ in 0..3 {
        let r =
            ask(&mut client, request("example8", &[&[("key1", "tenant-secret-123")], &[("user", "bob-secret")]])).await;
        assert!(!r.response_headers_to_add.is_empty());
        for h in &r.response_headers_to_add {
            for secret in ["tenant", "bob", "key1", "user"] {
                assert!(!h.key.contains(secret) && !h.value.contains(secret), "{}: {}", h.key, h.value);
            }
        }
    }
}

/// envoyproxy/ratelimit's example folder (examples/ratelimit/config/,
/// copied unchanged into tests/rls_config/example/).
fn upstream_example() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rls_config/example")
}

fn codes(r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_example_folder_starts_with_quota_mode_served_as_upstream() {
    let redis = Server::start(&[]);
    let relay = common::rls::RlsRelay::start(&[redis.url()], false, &upstream_example(), &[]);
    let mut client = relay.client().await;
    // service_1 (1 a minute) and service_2 (2 a minute), both quota_mode:
    // the answer refuses only once every quota limit of it refuses.
    let both = || request("rl", &[&[("service", "service_1")], &[("service", "service_2")]]);
    let r = ask(&mut client, both()).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![OK, OK]));
    let r = ask(&mut client, both()).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![OVER_LIMIT, OK]), "{r:?}");
    let r = ask(&mut client, both()).await;
    assert_eq!((r.overall_code, codes(&r)), (OVER_LIMIT, vec![OVER_LIMIT, OVER_LIMIT]), "{r:?}");
    // No dynamic metadata unless asked, as upstream.
    assert_eq!(r.dynamic_metadata, None);
    // A limit not in quota mode refuses as always (foo: 2 a minute).
    for expected in [OK, OK, OVER_LIMIT] {
        assert_eq!(ask(&mut client, request("rl", &[&[("foo", "f")]])).await.overall_code, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_comes_back_as_dynamic_metadata_when_asked() {
    use envoy_types::pb::google::protobuf::value::Kind;
    let redis = Server::start(&[]);
    let relay = common::rls::RlsRelay::start(&[redis.url()], false, &upstream_example(), &["--rls-dynamic-metadata"]);
    let mut client = relay.client().await;
    let r = ask(&mut client, request("rl", &[&[("service", "service_2")]])).await;
    let metadata = r.dynamic_metadata.expect("dynamic_metadata");
    let text = |k: &str| match &metadata.fields[k].kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(text("domain"), "rl");
    let Some(Kind::StructValue(passed)) = &metadata.fields["metadata"].kind else { panic!("{metadata:?}") };
    let Some(Kind::StructValue(service)) = &passed.fields["service_with_quota"].kind else { panic!("{passed:?}") };
    assert_eq!(service.fields["name"].kind, Some(Kind::StringValue("service_2".into())));
    let Some(Kind::ListValue(descriptors)) = &metadata.fields["descriptors"].kind else { panic!("{metadata:?}") };
    let Some(Kind::StructValue(first)) = &descriptors.values[0].kind else { panic!() };
    let Some(Kind::ListValue(entries)) = &first.fields["entries"].kind else { panic!() };
    assert_eq!(entries.values[0].kind, Some(Kind::StringValue("service=service_2".into())));
    // A refused descriptor's metadata is left out (service_1: 1 a minute).
    let _ = ask(&mut client, request("rl", &[&[("service", "service_1")]])).await;
    let r = ask(&mut client, request("rl", &[&[("service", "service_1")]])).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert!(!r.dynamic_metadata.unwrap().fields.contains_key("metadata"));
}

/// Started as envoyproxy/ratelimit on a Redis that cannot load modules:
/// `RL_REDIS_BACKEND=lua` beside upstream's variables (docs/envoy.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_upstream_on_a_redis_without_the_module_with_rl_redis_backend_lua() {
    let redis = PlainServer::start();
    let root = config_folder(Some(CONFIG));
    let mut bare =
        start(root.path(), &[("REDIS_URL", format!("127.0.0.1:{}", redis.port)), ("RL_REDIS_BACKEND", "lua".into())]);
    let mut client = bare.client().await;
    bare.health_becomes(200);
    let codes = [
        ask(&mut client, request("edge", &[&[("user", "a")]])).await.overall_code,
        ask(&mut client, request("edge", &[&[("user", "a")]])).await.overall_code,
        ask(&mut client, request("edge", &[&[("user", "a")]])).await.overall_code,
    ];
    assert_eq!(codes, [OK, OK, OVER_LIMIT], "{}", bare.relay.log());
    let log = bare.relay.log();
    assert!(log.contains("--redis-backend lua") && !log.contains("RL_REDIS_BACKEND"), "{log}");
    assert!(calls(&mut redis.con(), "evalsha") > 0);
}
