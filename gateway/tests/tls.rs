//! The limiter over TLS: `rediss://` with the test's CA, deciding from
//! Redis on both backends (the module, and the Lua scripts a managed
//! Redis runs).

mod common;

use common::{config, limiter_calls};
use rl_client::Tls;
use rl_gateway::{Backend, Config, Event, Limiter, Policy, Rule, Source};
use testkit::Server;

on_both_backends!(the_limiter_decides_from_redis_over_tls);

async fn the_limiter_decides_from_redis_over_tls(backend: Backend) {
    let s = Server::start_tls(testkit::Tls::Server, &[]);
    let tls = Tls { ca_file: Some(s.tls().unwrap().ca.clone()), ..Tls::default() };
    let l = Limiter::new(Config { tls, ..config(s.url(), backend) }).unwrap();
    let p = Policy::builder("api").rule(Rule::per_hour("hourly", 3)).build().unwrap();
    for left in (0..3).rev() {
        let d = l.check(&p, "u").await.unwrap();
        assert_eq!((d.allowed, d.remaining, d.source), (true, left, Source::Redis));
    }
    let d = l.check(&p, "u").await.unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Redis));
    assert_eq!(limiter_calls(&s, backend), 4, "one call to Redis per request");
    assert_eq!(l.counters().get(Event::Error), 0);
}
