//! `rediss://`: typed calls to a redis-server that speaks TLS only, with
//! the CA and certificates the test made (testkit's `Server::start_tls`):
//! mTLS, a wrong CA, a plaintext URL to the TLS port, bad files, the
//! insecure switch, a cluster and Sentinel over TLS.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_client::{Bucket, Client, Config, Error, Target, Tls};
use testkit::{Cluster, SentinelSet, Server, MASTER};

const MINUTE: Duration = Duration::from_secs(60);

/// Generous timeouts: the machine may be busy.
fn config(url: String, tls: Tls) -> Config {
    Config { tls, timeout: Duration::from_secs(2), connect_timeout: Duration::from_secs(2), ..Config::standalone(url) }
}

fn trusting(ca: &std::path::Path) -> Tls {
    Tls { ca_file: Some(ca.to_path_buf()), ..Tls::default() }
}

fn with_client_cert(server: &Server) -> Tls {
    let files = server.tls().unwrap();
    Tls { cert_file: Some(files.client_cert.clone()), key_file: Some(files.client_key.clone()), ..trusting(&files.ca) }
}

/// Three of a capacity-3 bucket, then a refusal: decided by the module
/// over the connection (the key holds the state).
async fn three_then_refused(client: &Client, server_key_count: impl Fn() -> i64, key: &str) {
    let bucket = [Bucket::new(key, 3, 3, MINUTE).unwrap()];
    for left in [2, 1, 0] {
        let d = client.take(&bucket, 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, left));
    }
    assert!(!client.take(&bucket, 1).await.unwrap().allowed);
    assert_eq!(server_key_count(), 1, "the bucket's state is on the server");
}

fn exists(server: &Server, key: &str) -> i64 {
    redis::cmd("EXISTS").arg(key).query(&mut server.con()).unwrap()
}

/// The text of the error every call gets.
async fn refusal(client: &Client) -> String {
    let bucket = [Bucket::new("refused", 3, 3, MINUTE).unwrap()];
    match client.take(&bucket, 1).await {
        Ok(d) => panic!("the call should fail, got {d:?}"),
        Err(e) => {
            eprintln!("refused: {e}");
            e.to_string()
        }
    }
}

#[tokio::test]
async fn typed_calls_over_tls_with_the_ca_file() {
    let s = Server::start_tls(testkit::Tls::Server, &[]);
    assert!(s.url().starts_with("rediss://"));
    let c = Client::new(&config(s.url(), trusting(&s.tls().unwrap().ca))).unwrap();
    three_then_refused(&c, || exists(&s, "{tls}:a"), "{tls}:a").await;
    let status = c.connection().status();
    assert_eq!(status.server.as_deref(), Some(format!("127.0.0.1:{}", s.port).as_str()));
}

/// With no CA file, the system roots: `SSL_CERT_FILE` names the test's CA
/// for a child process (this binary, running the ignored test below), so
/// that no other test's environment changes.
#[test]
fn without_a_ca_file_the_system_roots_and_ssl_cert_file_are_trusted() {
    let s = Server::start_tls(testkit::Tls::Server, &[]);
    // Whether the child passed, and what it printed.
    let run = |ca: &std::path::Path| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "trusts_ssl_cert_file", "--nocapture"])
            .env("SSL_CERT_FILE", ca)
            .env("RL_TEST_TLS_URL", s.url())
            .output()
            .unwrap();
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    let (passed, text) = run(&s.tls().unwrap().ca);
    assert!(passed && text.contains("1 passed"), "{text}");
    // The same child with another CA in SSL_CERT_FILE fails: it is read.
    let (passed, text) = run(&testkit::tls::unrelated_ca(s.dir(), "other-ca.crt"));
    assert!(!passed && text.contains("not trusted by the system roots"), "{text}");
}

/// Run by the test above, in a process of its own with `SSL_CERT_FILE`.
#[tokio::test]
#[ignore = "run by without_a_ca_file_the_system_roots_and_ssl_cert_file_are_trusted"]
async fn trusts_ssl_cert_file() {
    let url = std::env::var("RL_TEST_TLS_URL").expect("RL_TEST_TLS_URL: run by its parent test");
    let c = Client::new(&config(url, Tls::default())).unwrap();
    let bucket = [Bucket::new("{tls}:system", 3, 3, MINUTE).unwrap()];
    match c.take(&bucket, 1).await {
        Ok(d) => assert!(d.allowed),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn the_insecure_fragment_skips_verification() {
    // Nothing trusts the test's CA: only `#insecure` lets the call through.
    let s = Server::start_tls(testkit::Tls::Server, &[]);
    let c = Client::new(&config(format!("{}#insecure", s.url()), Tls::default())).unwrap();
    three_then_refused(&c, || exists(&s, "{tls}:insecure"), "{tls}:insecure").await;
}

#[tokio::test]
async fn the_insecure_setting_skips_verification() {
    let s = Server::start_tls(testkit::Tls::Server, &[]);
    let wrong = testkit::tls::unrelated_ca(s.dir(), "other-ca.crt");
    let tls = Tls { insecure: true, ..trusting(&wrong) };
    let c = Client::new(&config(s.url(), tls)).unwrap();
    three_then_refused(&c, || exists(&s, "{tls}:setting"), "{tls}:setting").await;
}

#[tokio::test]
async fn mutual_tls_takes_the_client_certificate_and_needs_it() {
    let s = Server::start_tls(testkit::Tls::Mutual, &[]);
    let c = Client::new(&config(s.url(), with_client_cert(&s))).unwrap();
    three_then_refused(&c, || exists(&s, "{tls}:mutual"), "{tls}:mutual").await;

    let without = Client::new(&config(s.url(), trusting(&s.tls().unwrap().ca))).unwrap();
    let e = refusal(&without).await;
    assert!(e.contains(&format!("127.0.0.1:{}", s.port)), "{e}");
    assert!(e.contains("client certificate") || e.contains("CertificateRequired"), "{e}");
}

#[tokio::test]
async fn a_wrong_ca_is_refused_and_named() {
    let s = Server::start_tls(testkit::Tls::Server, &[]);
    let wrong = testkit::tls::unrelated_ca(s.dir(), "other-ca.crt");
    let c = Client::new(&config(s.url(), trusting(&wrong))).unwrap();
    let e = refusal(&c).await;
    assert!(e.contains(&format!("not trusted by the CA file {}", wrong.display())), "{e}");
    assert!(e.contains(&format!("127.0.0.1:{}", s.port)), "{e}");
    assert_eq!(exists(&s, "refused"), 0);
}

#[tokio::test]
async fn a_plaintext_url_to_a_tls_port_fails_in_time_and_says_tls() {
    let s = Server::start_tls(testkit::Tls::Server, &[]);
    let plain = format!("redis://127.0.0.1:{}/", s.port);
    let c = Client::new(&config(plain, Tls::default())).unwrap();
    let started = Instant::now();
    let e = refusal(&c).await;
    // Within the connect timeout (2 s), with room for a busy machine, and
    // never the call's own timeout: the server closed the connection.
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert!(e.contains("rediss://"), "{e}");
}

#[tokio::test]
async fn bad_tls_settings_are_config_errors_at_new() {
    let s = Server::start_tls(testkit::Tls::Server, &[]);
    let missing = PathBuf::from("/nonexistent/rl-ca.pem");
    for (tls, url, why) in [
        (trusting(&missing), s.url(), "ca_file /nonexistent/rl-ca.pem".to_string()),
        (
            Tls { cert_file: Some(s.tls().unwrap().client_cert.clone()), ..trusting(&s.tls().unwrap().ca) },
            s.url(),
            "cert_file and key_file go together".to_string(),
        ),
        (
            Tls { key_file: Some(s.tls().unwrap().ca.clone()), ..with_client_cert(&s) },
            s.url(),
            format!("key_file {}", s.tls().unwrap().ca.display()),
        ),
        (
            trusting(&s.tls().unwrap().ca),
            format!("redis://127.0.0.1:{}/", s.port),
            "no URL of the target is rediss://".into(),
        ),
    ] {
        match Client::new(&config(url, tls)) {
            Err(Error::Invalid(e)) => assert!(e.contains(&why), "{e}"),
            Err(e) => panic!("{why}: not a config error: {e}"),
            Ok(_) => panic!("{why}: accepted"),
        }
    }
}

#[tokio::test]
async fn a_cluster_over_tls() {
    let cluster = Cluster::start_tls(3, testkit::Tls::Mutual);
    let files = cluster.tls().unwrap();
    assert!(cluster.urls().iter().all(|u| u.starts_with("rediss://")));
    let tls = Tls {
        ca_file: Some(files.ca.clone()),
        cert_file: Some(files.client_cert.clone()),
        key_file: Some(files.client_key.clone()),
        insecure: false,
    };
    let config = Config {
        tls,
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..Config::cluster(cluster.urls()[..1].to_vec())
    };
    let c = Client::new(&config).unwrap();
    // Keys on every node: the client found the others over TLS too.
    let keys: Vec<String> = (0..12).map(|i| format!("tls:{i}")).collect();
    let nodes: std::collections::HashSet<u16> = keys.iter().map(|k| cluster.node_for(k).port).collect();
    assert_eq!(nodes.len(), 3, "the keys spread over the three nodes");
    for key in &keys {
        three_then_refused(&c, || exists(cluster.node_for(key), key), key).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_master_over_tls_followed_through_a_failover() {
    // Sentinels, primary and replica speak TLS only and want client
    // certificates: the lookup, the master's ROLE check, the calls and
    // the switch watcher all go over TLS.
    let set = Arc::new(SentinelSet::start_tls(1, testkit::Tls::Mutual));
    assert!(set.urls().iter().all(|u| u.starts_with("rediss://")));
    let config = Config {
        tls: with_client_cert(&set.servers[0]),
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        // As a tool's one --redis URL: rediss+sentinel://.
        ..Config::for_target(
            Target::from_url(&format!("rediss+sentinel://{}/{MASTER}", set.addresses().join(","))).unwrap(),
        )
    };
    let c = Client::new(&config).unwrap();
    let old = set.primary().port;
    three_then_refused(&c, || exists(set.primary(), "{tls}:sentinel"), "{tls}:sentinel").await;
    assert_eq!(c.connection().status().server, Some(format!("127.0.0.1:{old}")));

    let new = tokio::task::spawn_blocking({
        let set = set.clone();
        move || set.failover().port
    })
    .await
    .unwrap();
    assert_ne!(new, old);
    // Calls reach the new primary within a generous deadline.
    let bucket = [Bucket::new("{tls}:after", 100, 100, MINUTE).unwrap()];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answered = c.take(&bucket, 1).await.is_ok();
        if answered && c.connection().status().server == Some(format!("127.0.0.1:{new}")) {
            break;
        }
        assert!(Instant::now() < deadline, "not followed: {:?}\n{}", c.connection().status(), set.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let promoted = set.servers.iter().find(|s| s.port == new).unwrap();
    assert_eq!(exists(promoted, "{tls}:after"), 1);
}
