//! The RLS front through a real gRPC client (envoy-types' generated one)
//! against the relay as a child process and real servers with the module.

mod common;

use std::path::PathBuf;

use common::rls::*;
use testkit::Server;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(format!("{}/tests/rls_config/{name}", env!("CARGO_MANIFEST_DIR")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_lookups_over_grpc() {
    let server = Server::start(&[]);
    let relay = RlsRelay::start(&[server.url()], false, &fixture("basic_config.yaml"), &[]);
    let mut client = relay.client().await;
    let r = ask(&mut client, request("foo_domain", &[&[("key1", "value1")]])).await;
    assert_eq!((r.overall_code, r.statuses.len(), r.statuses[0].code), (OK, 1, OK));
    assert_eq!(r.statuses[0].current_limit, None);
    let r = ask(
        &mut client,
        request(
            "test-domain",
            &[
                &[("key1", "value1"), ("subkey1", "something")],
                &[("key2", "value3")],
                &[("key4", "foo")],
                &[("key6", "x")],
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(limit_of(&r.statuses[0]), Some((5, 1, String::new())));
    assert!((2..=4).contains(&r.statuses[0].limit_remaining), "{:?}", r.statuses[0]);
    assert_eq!(limit_of(&r.statuses[1]), None);
    assert_eq!(limit_of(&r.statuses[2]), Some((1, 4, "key4_rate_limit".into())));
    assert_eq!(r.statuses[3].limit_remaining, u32::MAX);
    eprintln!("{:?}", r.response_headers_to_add);
    let r = ask(&mut client, request("test-domain", &[&[("key4", "foo")]])).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER_LIMIT, OVER_LIMIT));
    eprintln!("{:?}", r);
    eprintln!("{}", relay.get("/metrics").1);
}
