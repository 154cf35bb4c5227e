//! Rule sets installed and refused are `tracing` events (target
//! `rl_rules`), as the client's outage events are.

mod common;

use std::sync::{Arc, Mutex};

use common::config;
use rl_gateway::live::{LiveRules, RuleSetSpec};
use rl_gateway::{Backend, Limiter};
use testkit::Server;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Every event's level, target and fields, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(Level, String, String)>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl Subscriber for Captured {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let m = event.metadata();
        self.0.lock().unwrap().push((*m.level(), m.target().to_owned(), fields.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// One rule of `rate` a second (0 is refused by the checks).
fn rule_set(rate: u64) -> RuleSetSpec {
    let text = format!("[[rules]]\nid = \"default\"\nreason = \"everyone\"\nlimits = [{{ name = \"s\", rate = {rate}, per = \"1s\" }}]\n");
    RuleSetSpec::from_toml(&text).unwrap()
}

#[tokio::test]
async fn installed_and_refused_rule_sets_are_tracing_events() {
    let s = Server::start(&[]);
    let limiter = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let rules = LiveRules::new(limiter, &rule_set(10)).unwrap();
    let captured = Captured::default();
    // install is synchronous: its events go to this thread's subscriber.
    let _guard = tracing::subscriber::set_default(captured.clone());
    rules.install(&rule_set(10), &[], 2, "test-good").unwrap();
    assert!(rules.install(&rule_set(0), &[], 3, "test-bad").is_err());

    let events = captured.0.lock().unwrap().clone();
    let installed: Vec<_> = events.iter().filter(|(_, _, f)| f.contains("rule set installed")).collect();
    assert_eq!(installed.len(), 1, "{events:?}");
    let (level, target, fields) = installed[0];
    assert_eq!((*level, target.as_str()), (Level::INFO, "rl_rules"));
    assert!(fields.contains("version=2") && fields.contains("source=\"test-good\""), "{fields}");

    let refused: Vec<_> = events.iter().filter(|(_, _, f)| f.contains("rule set refused")).collect();
    assert_eq!(refused.len(), 1, "{events:?}");
    let (level, target, fields) = refused[0];
    assert_eq!((*level, target.as_str()), (Level::ERROR, "rl_rules"));
    assert!(fields.contains("in_force=2") && fields.contains("version 3 from test-bad"), "{fields}");
    assert!(fields.contains("rate must be from 1"), "the reason is in the event: {fields}");
}

/// A limit the server refuses at run time (an EXACT window above its
/// max-log-limit, installed without asking it) is the server's refusal,
/// counted as such (`server_refusals`) and said so by the HTTP layer, never
/// "Redis cannot answer" while Redis answers every call (issue 34).
#[tokio::test]
async fn a_limit_the_server_refuses_is_not_called_an_outage() {
    use http::Request;
    use tower::{service_fn, Layer, ServiceExt};

    let s = Server::start(&[]);
    let limiter = Limiter::new(config(s.url(), Backend::Module)).unwrap();
    let text = "[[rules]]\nid = \"default\"\nreason = \"everyone\"\n\
                limits = [{ name = \"e\", kind = \"exact\", limit = 20000, per = \"1m\" }]\n";
    let rules = LiveRules::new(limiter.clone(), &RuleSetSpec::from_toml(text).unwrap()).unwrap();
    let hello = service_fn(|_req: Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new("hello".to_string()))
    });
    let svc = rl_gateway::http::RateLimitLayer::new(rl_gateway::live::LiveDecide::new(rules))
        .key_header("x-api-key")
        .layer(hello);
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.clone());
    let request = Request::builder().uri("/").header("x-api-key", "k1").body(String::new()).unwrap();
    let _ = svc.oneshot(request).await.unwrap();
    drop(_guard);
    assert_eq!(limiter.counters().get(rl_gateway::Event::ServerRefused), 1, "{:?}", limiter.counters().snapshot());
    let events = captured.0.lock().unwrap().clone();
    let said: Vec<_> = events.iter().filter(|(_, target, _)| target == "rl_http").collect();
    assert!(said.iter().all(|(_, _, f)| !f.contains("Redis cannot answer")), "{said:?}");
    assert!(said.iter().any(|(l, _, f)| *l == Level::ERROR && f.contains("refuses")), "{said:?}");
}
