//! A corrupt share table is reported as what it is, naming the key, the
//! field and the value: by the store, by the balancer (not as "region
//! unreachable" or "write failed"), and by a gateway, which says what it
//! enforces instead and never enforces a share above the whole.

mod binary;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use binary::{base_args, RulesFile, Running, FAST};
use rl_balancer::store::{self, DEFAULT_KEY};
use rl_gateway::global::{GatewayConfig, RegionShares};
use rl_gateway::global::{GlobalLimit, RegionalShares};
use rl_gateway::global::{RuleShares, Share, ShareTable, WHOLE};
use rl_gateway::live::RuleSetSpec;
use testkit::{PlainServer, Server};

/// A share table whose default share of `api` is `default` ppm, as JSON.
fn default_share(default: u64) -> String {
    format!(r#"{{"rules":{{"api":{{"default":{default},"subjects":{{}}}}}}}}"#)
}

/// Corruptions no balancer writes: (field, value, what the report must say).
fn corruptions() -> Vec<(&'static str, String, &'static str)> {
    vec![
        ("epoch", "abc".into(), "not an integer"),
        ("version", "abc".into(), "not an integer"),
        ("written_at", "soon".into(), "not an integer"),
        ("table", "{oops".into(), "not JSON"),
        ("table", default_share(99_999_999), "above the whole"),
    ]
}

fn hset(con: &mut redis::Connection, field: &str, value: &str) {
    let _: () = redis::cmd("HSET").arg(DEFAULT_KEY).arg(field).arg(value).query(con).unwrap();
}

fn assert_says(said: &str, parts: &[&str]) {
    for part in parts {
        assert!(said.contains(part), "{part:?} missing in: {said}");
    }
}

fn good_table(acme: u32) -> ShareTable {
    let mut t = ShareTable::default();
    let mut r = RuleShares { default: 200_000, ..Default::default() };
    r.subjects.insert("acme".into(), Share::steady(acme));
    t.rules.insert("api".into(), r);
    t
}

#[tokio::test]
async fn the_store_names_the_corrupt_field_and_its_value() {
    for (field, value, what) in corruptions() {
        let server = PlainServer::start();
        let mut con = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
        store::claim(&mut con, DEFAULT_KEY, 1).await.unwrap();
        store::write(&mut con, DEFAULT_KEY, 1, &good_table(300_000)).await.unwrap();
        hset(&mut server.con(), field, &value);
        let shown = if field == "table" { "" } else { value.as_str() };
        let parts = [DEFAULT_KEY, field, shown, what, "corrupt"];
        match store::sync(&mut con, DEFAULT_KEY, &[]).await {
            // A gateway does not need the epoch: it reads the table still.
            Ok(read) if field == "epoch" => assert_says(&read.epoch.unwrap_err().to_string(), &parts),
            other => assert_says(&other.unwrap_err().to_string(), &parts),
        }
        if field == "epoch" || field == "version" {
            // The balancer's claim and write check the fields they move.
            let e = store::write(&mut con, DEFAULT_KEY, 1, &good_table(400_000)).await.unwrap_err();
            assert_says(&e.to_string(), &parts);
            let stored: String = redis::cmd("HGET").arg(DEFAULT_KEY).arg(field).query(&mut server.con()).unwrap();
            assert_eq!(stored, value, "a refused write changes nothing");
        }
        if field == "epoch" {
            let e = store::claim(&mut con, DEFAULT_KEY, 2).await.unwrap_err();
            assert_says(&e.to_string(), &parts);
        }
    }
}

#[test]
fn the_balancer_reports_a_corrupt_table_as_corrupt() {
    let rules = RulesFile::new(&["eu", "us", "ap"]);
    for (field, value, what) in corruptions() {
        let servers: Vec<Server> = (0..3).map(|_| Server::start(&[])).collect();
        hset(&mut servers[2].con(), field, &value);
        let regions: Vec<(&str, String)> =
            ["eu", "us", "ap"].into_iter().zip(servers.iter().map(|s| s.url())).collect();
        let mut args = base_args(&rules, &regions);
        args.extend(FAST.iter().map(|s| s.to_string()));
        let mut running = Running::start(&args);
        let log = running.wait_log(Duration::from_secs(10), |l| {
            l.lines().filter(|l| l.contains(" round ")).count() >= 3 && l.contains("corrupt")
        });
        let said = binary::lines_with(&log, "corrupt").join("\n");
        let shown = if field == "table" { "" } else { value.as_str() };
        assert_says(&said, &["region=ap", DEFAULT_KEY, field, shown, what]);
        for wrong in ["region unreachable", "write failed"] {
            assert!(!log.contains(wrong), "{field}={value}: {wrong:?} in\n{log}");
        }
        let stored: String = redis::cmd("HGET").arg(DEFAULT_KEY).arg(field).query(&mut servers[2].con()).unwrap();
        assert_eq!(stored, value, "the corrupt region is left alone");
        assert!(running.is_running());
    }
}

/// A gateway's log, captured.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn a_gateway_never_enforces_a_share_above_the_whole() {
    let spec = RuleSetSpec::from_toml(
        "[[rules]]\nid = \"api\"\nreason = \"t\"\nlimits = [{ name = \"s\", rate = 100, per = \"1s\" }]\nglobal = { regions = [\"eu\", \"us\"] }\n",
    )
    .unwrap();
    let api = spec.rules[0].global.clone().unwrap();
    let limit = GlobalLimit { capacity: 100, refill: 100, period_ms: 1000 };
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = Server::start(&[]);
    let mut con = server.con();
    // Never read a good table: the fixed split (50 of 100), never 100 times the limit.
    hset(&mut con, "table", &default_share(99_999_999));
    hset(&mut con, "written_at", "1");
    let fresh = RegionShares::new(GatewayConfig::new("eu", server.url())).unwrap();
    let e = fresh.refresh_now().await.unwrap_err().to_string();
    assert_says(&e, &[DEFAULT_KEY, "99999999", "above the whole", &WHOLE.to_string()]);
    assert_eq!(fresh.share("api", &api, "acme").0.share, 500_000);
    assert_eq!(fresh.regional("api", &api, "acme", &[limit]), Some(vec![(50, 50)]));
    assert_says(fresh.status().last_error.as_deref().unwrap_or(""), &["99999999", "above the whole"]);
    assert_says(&log.text(), &["share table corrupt", "99999999", "region=eu", "enforcing the fixed split"]);

    // A good table read, then corrupted: the last good one stays in force.
    let mut acon = redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL").arg(DEFAULT_KEY).query_async(&mut acon).await.unwrap();
    store::claim(&mut acon, DEFAULT_KEY, 1).await.unwrap();
    store::write(&mut acon, DEFAULT_KEY, 1, &good_table(300_000)).await.unwrap();
    let gateway = RegionShares::new(GatewayConfig::new("eu", server.url())).unwrap();
    gateway.refresh_now().await.unwrap();
    hset(&mut con, "table", &default_share(99_999_999));
    assert!(gateway.refresh_now().await.is_err());
    assert_eq!(gateway.share("api", &api, "acme").0.share, 300_000);
    assert_eq!(gateway.share("api", &api, "other").0.share, 200_000);
    assert_eq!(gateway.regional("api", &api, "acme", &[limit]), Some(vec![(30, 30)]));
    assert_says(&log.text(), &["enforcing the last table read (version 1"]);
}

#[test]
fn a_share_above_the_whole_is_never_enforced() {
    let bucket = rl_gateway::global::GlobalBucket { capacity: 100, refill: 100, period_ms: 1000 };
    assert_eq!(bucket.regional(99_999_999, 99_999_999, Duration::ZERO), None);
    assert_eq!(bucket.regional(WHOLE + 1, 0, Duration::from_secs(10)), None);
    assert!(bucket.regional(WHOLE, WHOLE, Duration::ZERO).is_some());
}
