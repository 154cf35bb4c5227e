//! An in-flight refusal reports the true count of slots held, on both
//! backends, as RL.INSPECT would: a limit lowered below what is held (20
//! held, now a limit of 5) shows 20, not the limit.

mod common;

use std::time::Duration;

use common::config;
use rl_client::{Backend, Client, Inflight};
use testkit::Server;

async fn a_refusal_reports_every_slot_held(backend: Backend) {
    let s = Server::start(&[]);
    let client = Client::new(&config(s.url(), backend)).unwrap();
    let hour = Duration::from_secs(3600);
    let wide = [Inflight::new("slots:{u}", 20, hour).unwrap()];
    for _ in 0..20 {
        assert!(client.acquire(&wide, None, 1).await.unwrap().allowed);
    }
    let narrow = [Inflight::new("slots:{u}", 5, hour).unwrap()];
    let refused = client.acquire(&narrow, None, 1).await.unwrap();
    assert_eq!((refused.allowed, refused.in_flight, refused.limit), (false, 20, 5), "acquire: {refused:?}");
    let peek = client.inflight(&narrow, None, 1).await.unwrap();
    assert_eq!((peek.allowed, peek.in_flight), (false, 20), "inflight: {peek:?}");
}

on_both_backends!(a_refusal_reports_every_slot_held);
