//! One conformance suite for both backends: every case runs against the
//! module's commands and against the Lua script on a standalone server, the
//! Lua script once more on a server without the module (as managed Redis
//! services are), and all of them on a 3-node cluster.
//!
//! Buckets refill by one token an hour unless a case is about refill, so
//! the live server clock cannot move a result between calls; in-flight
//! slots are held an hour unless a case is about their deadline.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rl_client::{Acquired, Backend, Bucket, Client, Config, Decision, Error, Inflight};
use testkit::{Cluster, PlainServer, Server};

const HOUR: u64 = 3_600_000;
const MINUTE: u64 = 60_000;

/// Where a case runs: it names its keys with its own hash tag and inspects
/// them on the node that serves them.
enum Place<'a> {
    Standalone(&'a Server),
    Plain(&'a PlainServer),
    Cluster(&'a Cluster),
}

struct Env<'a> {
    place: Place<'a>,
    tag: String,
}

impl Env<'_> {
    fn key(&self, name: &str) -> String {
        format!("conf:{{{}}}:{name}", self.tag)
    }

    fn con(&self) -> redis::Connection {
        match &self.place {
            Place::Standalone(s) => s.con(),
            Place::Plain(s) => s.con(),
            Place::Cluster(c) => c.node_for(&self.key("x")).con(),
        }
    }

    fn exists(&self, name: &str) -> bool {
        redis::cmd("EXISTS").arg(self.key(name)).query::<i64>(&mut self.con()).unwrap() == 1
    }

    fn pttl(&self, name: &str) -> i64 {
        redis::cmd("PTTL").arg(self.key(name)).query(&mut self.con()).unwrap()
    }

    fn bucket(&self, name: &str, capacity: u64, refill: u64, period_ms: u64) -> Bucket {
        Bucket::new(self.key(name), capacity, refill, Duration::from_millis(period_ms)).unwrap()
    }

    fn inflight(&self, name: &str, limit: u64, timeout_ms: u64) -> Inflight {
        Inflight::new(self.key(name), limit, Duration::from_millis(timeout_ms)).unwrap()
    }
}

/// (allowed, in flight, retry_after ms, limit, binding).
fn five(a: &Acquired) -> (bool, u64, Option<u64>, u64, usize) {
    (a.allowed, a.in_flight, a.retry_after.map(|r| r.as_millis() as u64), a.limit, a.rule)
}

fn client(config: Config, backend: Backend) -> Client {
    // A generous timeout: the machine running the tests may be busy.
    Client::new(&Config { backend, timeout: Duration::from_secs(2), connect_timeout: Duration::from_secs(2), ..config })
        .unwrap()
}

/// (allowed, remaining, retry_after ms, reset_after ms, limit, rule).
fn six(d: &Decision) -> (bool, u64, Option<u64>, u64, u64, usize) {
    let ms = |d: Duration| d.as_millis() as u64;
    (d.allowed, d.remaining, d.retry_after.map(ms), ms(d.reset_after), d.limit, d.rule)
}

fn within(value: Option<u64>, lo: u64, hi: u64) -> bool {
    value.is_some_and(|v| lo <= v && v <= hi)
}

async fn new_bucket_starts_full_and_counts_down(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 3, 1, HOUR)];
    assert_eq!(six(&c.take(&k, 1).await.unwrap()), (true, 2, Some(0), HOUR, 3, 0));
    for left in [1, 0] {
        let d = c.take(&k, 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining, d.retry_after), (true, left, Some(Duration::ZERO)));
    }
    // Empty: refused, told when one token will be back.
    let d = c.take(&k, 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining, d.limit, d.rule), (false, 0, 3, 0));
    assert!(within(d.retry_after.map(|r| r.as_millis() as u64), HOUR - MINUTE, HOUR), "{d:?}");
    assert!((3 * HOUR - MINUTE..=3 * HOUR).contains(&(d.reset_after.as_millis() as u64)), "{d:?}");
}

async fn cost_is_taken_from_every_bucket_or_none(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 10, 1, HOUR), e.bucket("b", 3, 1, HOUR)];
    let d = c.take(&k, 2).await.unwrap();
    assert_eq!((d.allowed, d.remaining, d.limit, d.rule), (true, 1, 3, 1));
    // b holds 1: refused, and a keeps its 8.
    let d = c.take(&k, 2).await.unwrap();
    assert_eq!((d.allowed, d.remaining, d.limit, d.rule), (false, 1, 3, 1));
    assert_eq!(c.peek(&k[..1], 1).await.unwrap().remaining, 7);
}

async fn cost_above_a_capacity_can_never_succeed(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 10, 1, HOUR), e.bucket("b", 3, 1, HOUR)];
    let d = c.take(&k, 4).await.unwrap();
    assert_eq!((d.allowed, d.retry_after, d.limit, d.rule), (false, None, 3, 1));
    assert!(!e.exists("a") && !e.exists("b"), "a refusal writes nothing");
}

async fn peek_writes_nothing(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 5, 1, HOUR)];
    assert_eq!(six(&c.peek(&k, 2).await.unwrap()), (true, 3, Some(0), 2 * HOUR, 5, 0));
    assert!(!e.exists("a"));
    c.take(&k, 1).await.unwrap();
    for _ in 0..2 {
        let d = c.peek(&k, 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 3));
    }
    let d = c.peek(&k, 5).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (false, 4));
}

async fn binding_names_the_tightest_rule(c: &Client, e: &Env<'_>) {
    // Per second, per minute, per hour: the hour rule is tightest.
    let k = [e.bucket("s", 100, 100, 1000), e.bucket("m", 50, 50, MINUTE), e.bucket("h", 2, 2, HOUR)];
    let d = c.take(&k, 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining, d.limit, d.rule), (true, 1, 2, 2));
    assert_eq!(d.reset_after, Duration::from_millis(HOUR / 2), "the slowest refill sets the reset");
    c.take(&k, 1).await.unwrap();
    let d = c.take(&k, 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining, d.limit, d.rule), (false, 0, 2, 2));
}

async fn ttl_is_the_time_until_full(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 10, 2, 1000)]; // a token every 500 ms
    let d = c.take(&k, 3).await.unwrap();
    assert_eq!(d.reset_after, Duration::from_millis(1500));
    let pttl = e.pttl("a");
    assert!((1..=1500).contains(&pttl), "PTTL {pttl}");
}

async fn refill_is_lazy_and_continuous(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 2, 1, 100)]; // a token every 100 ms
    assert!(c.take(&k, 2).await.unwrap().allowed);
    let d = c.take(&k, 1).await.unwrap();
    assert!(!d.allowed && within(d.retry_after.map(|r| r.as_millis() as u64), 1, 100), "{d:?}");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let d = c.take(&k, 2).await.unwrap();
    assert!(d.allowed, "two tokens back after 250 ms: {d:?}");
}

async fn parameters_may_change_between_calls(c: &Client, e: &Env<'_>) {
    c.take(&[e.bucket("a", 10, 1, HOUR)], 1).await.unwrap();
    // A lowered capacity clamps the level at once.
    let d = c.peek(&[e.bucket("a", 5, 1, HOUR)], 1).await.unwrap();
    assert_eq!((d.remaining, d.limit), (4, 5));
    // A raised one does not fill the bucket.
    let d = c.peek(&[e.bucket("a", 20, 1, HOUR)], 1).await.unwrap();
    assert_eq!((d.remaining, d.limit), (8, 20));
}

async fn a_refusal_keeps_a_drained_key_until_it_is_full_again(c: &Client, e: &Env<'_>) {
    // Drained under 10 a second: each key would be full again, and expire, in a second.
    for name in ["a", "b"] {
        assert!(c.take(&[e.bucket(name, 10, 10, 1000)], 10).await.unwrap().allowed);
    }
    // The limit is lowered to one token a minute: full again only in 600 s.
    let (a, b) = ([e.bucket("a", 10, 1, MINUTE)], [e.bucket("b", 10, 1, MINUTE)]);
    let until_full = 590_000..=600_000;
    assert!(!c.peek(&a, 1).await.unwrap().allowed);
    assert!(e.pttl("a") <= 1000, "a peek writes nothing, not even an expiry");
    // A refused take, and a refused lease, keep the key until it is full.
    let d = c.take(&a, 1).await.unwrap();
    assert!(!d.allowed && until_full.contains(&(d.reset_after.as_millis() as u64)), "{d:?}");
    let g = c.lease(&b, 5, 5).await.unwrap();
    assert_eq!(g.tokens, 0);
    for name in ["a", "b"] {
        let pttl = e.pttl(name);
        assert!(until_full.contains(&(pttl as u64)), "{name}: PTTL {pttl}");
    }
    // Past the old expiry the buckets are still drained, not back full.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(!c.take(&a, 10).await.unwrap().allowed, "a came back full");
    assert_eq!(c.lease(&b, 10, 1).await.unwrap().tokens, 0, "b came back full");
}

async fn lease_grants_what_every_bucket_can_give(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 10, 1, HOUR), e.bucket("b", 20, 1, HOUR)];
    c.take(&k, 6).await.unwrap();
    let g = c.lease(&k, 8, 1).await.unwrap();
    assert_eq!((g.tokens, g.decision.allowed, g.decision.remaining, g.decision.rule), (4, true, 0, 0));
    let g = c.lease(&k, 8, 1).await.unwrap();
    assert_eq!((g.tokens, g.decision.allowed, g.decision.limit), (0, false, 10));
    assert!(within(g.decision.retry_after.map(|r| r.as_millis() as u64), HOUR - MINUTE, HOUR));
    assert_eq!(c.peek(&k[1..], 1).await.unwrap().remaining, 9, "b gave 6 + 4");
}

async fn lease_below_its_minimum_takes_nothing(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 10, 1, HOUR)];
    c.take(&k, 6).await.unwrap();
    let g = c.lease(&k, 8, 5).await.unwrap();
    assert_eq!((g.tokens, g.decision.remaining), (0, 4));
    assert!(within(g.decision.retry_after.map(|r| r.as_millis() as u64), HOUR - MINUTE, HOUR));
    assert_eq!(c.peek(&k, 1).await.unwrap().remaining, 3, "still 4 before this peek's one");
    let g = c.lease(&k, 8, 11).await;
    assert!(matches!(g, Err(Error::Invalid(_))), "min above want is refused before sending");
    let g = c.lease(&k, 12, 11).await.unwrap();
    assert_eq!((g.tokens, g.decision.retry_after), (0, None), "more than capacity can never come");
}

async fn refund_never_goes_above_capacity(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 10, 1, HOUR), e.bucket("b", 4, 1, HOUR)];
    c.take(&k, 3).await.unwrap();
    let d = c.refund(&k, 2).await.unwrap();
    assert_eq!((d.allowed, d.remaining, d.retry_after, d.limit, d.rule), (true, 3, Some(Duration::ZERO), 4, 1));
    assert!((HOUR - MINUTE..=HOUR).contains(&(d.reset_after.as_millis() as u64)), "{d:?}");
    assert_eq!(c.peek(&k[..1], 1).await.unwrap().remaining, 8);
    let d = c.refund(&k, 100).await.unwrap();
    assert_eq!(six(&d), (true, 4, Some(0), 0, 4, 1));
    assert!(!e.exists("a") && !e.exists("b"), "a full bucket is no key");
}

async fn force_takes_into_debt(c: &Client, e: &Env<'_>) {
    let k = [e.bucket("a", 10, 1, 1000)]; // a token a second
    let d = c.take_forced(&k, 25).await.unwrap();
    assert_eq!(six(&d), (true, 0, Some(0), 25_000, 10, 0));
    // 15 tokens of debt are paid back before anything is admitted.
    let d = c.take(&k, 1).await.unwrap();
    assert!(!d.allowed && within(d.retry_after.map(|r| r.as_millis() as u64), 14_000, 16_000), "{d:?}");
    let pttl = e.pttl("a");
    assert!((20_000..=25_000).contains(&pttl), "PTTL {pttl}");
}

async fn a_key_of_another_type_is_refused(c: &Client, e: &Env<'_>) {
    redis::cmd("LPUSH").arg(e.key("a")).arg("x").query::<i64>(&mut e.con()).unwrap();
    match c.take(&[e.bucket("a", 10, 1, HOUR)], 1).await {
        Err(err @ Error::Redis(_)) => {
            assert!(err.to_string().contains("WRONGTYPE"), "{err}");
            assert!(!err.is_shard_failure(), "the shard answered");
        }
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }
}

async fn exact_at_the_edge_of_the_lua_range(c: &Client, e: &Env<'_>) {
    // capacity x period_ms just under 2^52: every token still counts.
    let capacity = (1u64 << 52) / 2000;
    let k = [e.bucket("a", capacity, 5, 2000)]; // a token every 400 ms
    let d = c.take(&k, capacity - 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining, d.limit), (true, 1, capacity));
    assert_eq!(d.reset_after, Duration::from_millis((capacity - 1) * 400));
    let d = c.take(&k, 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 0));
}

async fn inflight_holds_at_most_the_limit_and_a_release_makes_room(c: &Client, e: &Env<'_>) {
    let k = [e.inflight("a", 2, HOUR)];
    assert_eq!(five(&c.acquire(&k, Some("r1"), 1).await.unwrap()), (true, 1, Some(0), 2, 0));
    assert_eq!(five(&c.acquire(&k, Some("r2"), 1).await.unwrap()), (true, 2, Some(0), 2, 0));
    let refused = c.acquire(&k, Some("r3"), 1).await.unwrap();
    assert_eq!((refused.allowed, refused.in_flight, refused.id.as_str()), (false, 2, "r3"));
    assert!(within(refused.retry_after.map(|r| r.as_millis() as u64), HOUR - MINUTE, HOUR), "{refused:?}");
    assert!((HOUR - MINUTE..=HOUR).contains(&(e.pttl("a") as u64)), "the key lives until its latest deadline");
    let ids = [k[0].key()];
    assert_eq!(c.release(&ids, "r1").await.unwrap(), 1);
    assert_eq!(c.release(&ids, "r1").await.unwrap(), 0, "a second release gives nothing back");
    assert_eq!(c.release(&ids, "never-acquired").await.unwrap(), 0);
    assert_eq!(five(&c.acquire(&k, Some("r3"), 1).await.unwrap()), (true, 2, Some(0), 2, 0));
    assert!(!c.acquire(&k, Some("r4"), 1).await.unwrap().allowed, "the unknown release made no room");
    for id in ["r2", "r3"] {
        assert_eq!(c.release(&ids, id).await.unwrap(), 1);
    }
    assert!(!e.exists("a"), "an empty set is no key");
}

async fn inflight_is_all_or_nothing_across_keys(c: &Client, e: &Env<'_>) {
    let k = [e.inflight("route", 10, HOUR), e.inflight("customer", 2, HOUR)];
    assert_eq!(five(&c.acquire(&k, Some("a"), 2).await.unwrap()), (true, 2, Some(0), 2, 1));
    let d = c.acquire(&k, Some("b"), 1).await.unwrap();
    assert_eq!((d.allowed, d.in_flight, d.limit, d.rule), (false, 2, 2, 1));
    // The route kept only a's two: RL.INFLIGHT of one more says 3.
    assert_eq!(five(&c.inflight(&k[..1], None, 1).await.unwrap()), (true, 3, Some(0), 10, 0));
    let d = c.acquire(&k, Some("big"), 3).await.unwrap();
    assert_eq!((d.allowed, d.retry_after, d.rule), (false, None, 1), "above a limit: never");
    assert_eq!(c.release(&[k[0].key(), k[1].key()], "a").await.unwrap(), 2);
}

async fn inflight_an_id_renews_its_own_slot(c: &Client, e: &Env<'_>) {
    let k = [e.inflight("a", 2, 1000)];
    assert!(c.acquire(&k, Some("upload"), 1).await.unwrap().allowed);
    assert!(c.acquire(&k, Some("other"), 1).await.unwrap().allowed);
    // Renewed with an hour: the same slot, not a second one.
    let renewed = c.acquire(&[e.inflight("a", 2, HOUR)], Some("upload"), 1).await.unwrap();
    assert_eq!(five(&renewed), (true, 2, Some(0), 2, 0));
    assert!(!c.acquire(&k, Some("upload"), 2).await.unwrap().allowed, "a heavier renewal must fit");
    assert!(e.pttl("a") as u64 > HOUR - MINUTE, "the key lives until the renewed deadline");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // "other" expired; the renewed slot is still held.
    assert_eq!(c.inflight(&k, None, 1).await.unwrap().in_flight, 2);
    assert_eq!(c.release(&[k[0].key()], "other").await.unwrap(), 0, "expired: nothing to give back");
    assert_eq!(c.release(&[k[0].key()], "upload").await.unwrap(), 1);
}

async fn inflight_peek_writes_nothing(c: &Client, e: &Env<'_>) {
    let k = [e.inflight("a", 3, HOUR)];
    let d = c.inflight(&k, None, 2).await.unwrap();
    assert_eq!((five(&d), d.id.as_str()), ((true, 2, Some(0), 3, 0), ""));
    assert!(!e.exists("a"));
    c.acquire(&k, Some("x"), 1).await.unwrap();
    // Its own slot does not count against an id.
    assert!(c.inflight(&k, Some("x"), 3).await.unwrap().allowed);
    assert!(!c.inflight(&k, Some("y"), 3).await.unwrap().allowed);
    assert_eq!(c.inflight(&k, None, 1).await.unwrap().in_flight, 2);
}

async fn inflight_a_lost_release_heals_at_the_deadline(c: &Client, e: &Env<'_>) {
    let k = [e.inflight("a", 1, 300)];
    assert!(c.acquire(&k, Some("crashed"), 1).await.unwrap().allowed);
    let d = c.acquire(&k, Some("next"), 1).await.unwrap();
    assert!(!d.allowed && within(d.retry_after.map(|r| r.as_millis() as u64), 1, 300), "{d:?}");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(c.acquire(&k, Some("next"), 1).await.unwrap().allowed, "the crashed holder's slot healed");
    assert_eq!(c.release(&[k[0].key()], "crashed").await.unwrap(), 0);
}

async fn inflight_ids_are_made_when_none_is_given(c: &Client, e: &Env<'_>) {
    let k = [e.inflight("a", 5, HOUR)];
    let (a, b) = (c.acquire(&k, None, 1).await.unwrap(), c.acquire(&k, None, 1).await.unwrap());
    for d in [&a, &b] {
        assert!(d.id.len() == 32 && d.id.bytes().all(|b| b.is_ascii_hexdigit()), "{d:?}");
    }
    assert_ne!(a.id, b.id);
    assert_eq!(b.in_flight, 2);
    assert_eq!(c.release(&[k[0].key()], &a.id).await.unwrap(), 1);
}

async fn inflight_on_a_key_of_another_type_is_refused(c: &Client, e: &Env<'_>) {
    redis::cmd("LPUSH").arg(e.key("a")).arg("x").query::<i64>(&mut e.con()).unwrap();
    let k = [e.inflight("b", 5, HOUR), e.inflight("a", 5, HOUR)];
    for call in [c.acquire(&k, Some("r"), 1).await.map(|_| 0), c.release(&[k[0].key(), k[1].key()], "r").await] {
        let err = call.unwrap_err();
        assert!(err.to_string().contains("WRONGTYPE") && !err.is_shard_failure(), "{err}");
    }
    assert!(!e.exists("b"), "nothing written to the other key");
}

type Case = for<'a> fn(&'a Client, &'a Env<'a>) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        const CASES: &[(&str, Case)] = &[$((stringify!($case), |c, e| Box::pin($case(c, e)))),*];

        mod module {
            $(#[tokio::test]
            async fn $case() {
                super::standalone(rl_client::Backend::Module, |c, e| Box::pin(super::$case(c, e))).await;
            })*
        }

        mod lua {
            $(#[tokio::test]
            async fn $case() {
                super::standalone(rl_client::Backend::Lua, |c, e| Box::pin(super::$case(c, e))).await;
            })*
        }

        mod lua_without_module {
            $(#[tokio::test]
            async fn $case() {
                super::without_module(|c, e| Box::pin(super::$case(c, e))).await;
            })*
        }
    };
}

conformance!(
    new_bucket_starts_full_and_counts_down,
    cost_is_taken_from_every_bucket_or_none,
    cost_above_a_capacity_can_never_succeed,
    peek_writes_nothing,
    binding_names_the_tightest_rule,
    ttl_is_the_time_until_full,
    refill_is_lazy_and_continuous,
    parameters_may_change_between_calls,
    a_refusal_keeps_a_drained_key_until_it_is_full_again,
    lease_grants_what_every_bucket_can_give,
    lease_below_its_minimum_takes_nothing,
    refund_never_goes_above_capacity,
    force_takes_into_debt,
    a_key_of_another_type_is_refused,
    exact_at_the_edge_of_the_lua_range,
    inflight_holds_at_most_the_limit_and_a_release_makes_room,
    inflight_is_all_or_nothing_across_keys,
    inflight_an_id_renews_its_own_slot,
    inflight_peek_writes_nothing,
    inflight_a_lost_release_heals_at_the_deadline,
    inflight_ids_are_made_when_none_is_given,
    inflight_on_a_key_of_another_type_is_refused,
);

async fn standalone(backend: Backend, case: Case) {
    let server = Server::start(&[]);
    let c = client(Config::standalone(server.url()), backend);
    let env = Env { place: Place::Standalone(&server), tag: "t".into() };
    case(&c, &env).await;
    if backend == Backend::Lua {
        let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut server.con()).unwrap();
        assert!(!stats.contains("cmdstat_rl."), "the Lua backend called a module command:\n{stats}");
    }
}

async fn without_module(case: Case) {
    let server = PlainServer::start();
    let info: redis::Value = redis::cmd("COMMAND").arg("INFO").arg("RL.TAKE").query(&mut server.con()).unwrap();
    assert_eq!(info, redis::Value::Array(vec![redis::Value::Nil]), "a server without the module");
    let c = client(Config::standalone(server.url()), Backend::Lua);
    case(&c, &Env { place: Place::Plain(&server), tag: "t".into() }).await;
}

/// Every case on both backends against one 3-node cluster: calls are routed
/// to the node of their slot, and each case's keys land wherever its tag
/// hashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_on_a_cluster_with_both_backends() {
    let cluster = Cluster::start(3);
    let mut nodes_used = std::collections::HashSet::new();
    for backend in [Backend::Module, Backend::Lua] {
        let c = client(Config::cluster(cluster.urls()), backend);
        for (name, case) in CASES {
            let env = Env { place: Place::Cluster(&cluster), tag: format!("{backend:?}-{name}") };
            nodes_used.insert(cluster.node_for(&env.key("x")).port);
            case(&c, &env).await;
        }
    }
    assert_eq!(nodes_used.len(), 3, "the cases' keys should spread over every node");
}
