//! The Lua backend's windows against the module's: the same traffic of
//! timed takes, peeks and refunds on SLIDING, FIXED and EXACT windows (one
//! to three per call, short windows that roll during the run), on a server
//! without the module (Lua) and on one with it (module). Every timed take's
//! reply on both is compared, field by field, with rl-core's model decided
//! at the clock reading that call answered with (`TIME`): exact on a busy
//! machine, whatever the time between calls. Refunds are modelled as the
//! module does them; the takes after them check the counts they left.

use std::time::Duration;

use rl_client::{Backend, Client, Config, Decision, Error, Window, WindowMode};
use rl_core::combine::Update;
use rl_core::exact_log::{self, Log};
use rl_core::window::{self, WindowParams, WindowState};
use testkit::{PlainServer, Server};

/// A small seeded generator: the traffic is the same on every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// rl-core's view of one call's windows: states (counters or logs).
#[derive(Default, Clone)]
struct Model {
    counters: Vec<Option<WindowState>>,
    logs: Vec<Option<Log>>,
}

impl Model {
    fn new(n: usize) -> Model {
        Model { counters: vec![None; n], logs: vec![None; n] }
    }

    /// The reply rl-core gives at `now`, the states updated if admitted.
    fn take(&mut self, params: &[WindowParams], mode: WindowMode, cost: u64, now: u64) -> rl_core::Reply {
        if mode == WindowMode::Exact {
            let logs: Vec<Option<&Log>> = self.logs.iter().map(Option::as_ref).collect();
            let outcome = exact_log::decide(params, &logs, cost, now);
            for (i, u) in outcome.updates.iter().enumerate() {
                if let Update::Store { state, .. } = u {
                    self.logs[i].get_or_insert_with(Log::default).apply(state).unwrap();
                }
            }
            outcome.decision
        } else {
            let outcome = window::decide(params, mode, &self.counters, cost, now);
            for (i, u) in outcome.updates.iter().enumerate() {
                if let Update::Store { state, .. } = u {
                    self.counters[i] = Some(*state);
                }
            }
            outcome.decision
        }
    }

    /// REFUND of `cost` counted by the call decided at `at` (EXACT windows
    /// here are long enough that `now` cannot have left them behind).
    fn refund(&mut self, params: &[WindowParams], mode: WindowMode, cost: u64, at: u64, now: u64) {
        for (i, p) in params.iter().enumerate() {
            if mode == WindowMode::Exact {
                if let Some(log) = self.logs[i].as_mut() {
                    log.refund(cost, at, p.window_ms(), now);
                    if log.is_empty() {
                        self.logs[i] = None;
                    }
                }
            } else if let Some(s) = self.counters[i] {
                if let Some(after) = window::refund(p, mode, &s, cost, at) {
                    let empty = after.current == 0 && after.previous == 0;
                    self.counters[i] = (!empty).then_some(after);
                }
            }
        }
    }
}

/// One group of windows: the calls' windows, rl-core's parameters, its
/// model, and its recent admitted calls (clock reading, cost) to refund.
type Group = (Vec<Window>, Vec<WindowParams>, Model, Vec<(u64, u64)>);

fn as_fields(d: &Decision) -> (bool, u64, Option<u64>, u64, u64, usize) {
    let retry = d.retry_after.map(|r| r.as_millis() as u64);
    (d.allowed, d.remaining, retry, d.reset_after.as_millis() as u64, d.limit, d.rule)
}

fn core_fields(r: &rl_core::Reply) -> (bool, u64, Option<u64>, u64, u64, usize) {
    (r.allowed(), r.remaining, u64::try_from(r.retry_after_ms).ok(), r.reset_after_ms, r.limit, r.binding)
}

fn client(url: &str, backend: Backend) -> Client {
    Client::new(&Config { backend, timeout: Duration::from_secs(5), ..Config::standalone(url) }).unwrap()
}

/// Runs the seeded traffic of `mode` on `c`; every timed take checked
/// against the model at its own clock reading. Answers how many takes were
/// admitted and refused, so the caller sees the traffic exercised both.
async fn run(c: &Client, tag: &str, mode: WindowMode, seed: u64) -> (u32, u32) {
    let mut rng = Lcg(seed);
    let (mut admitted, mut refused) = (0, 0);
    // Four groups of windows, each its own keys and model.
    let mut groups: Vec<Group> = (0..4)
        .map(|g| {
            let n = 1 + (g % 3) as usize;
            let (windows, params): (Vec<Window>, Vec<WindowParams>) = (0..n)
                .map(|k| {
                    let limit = 1 + rng.below(6);
                    // Groups 0 and 1: 10 to 90 ms, so windows roll many times,
                    // SLIDING weighs the previous window at every point of
                    // the current one and EXACT entries leave at every ms.
                    // Groups 2 and 3: a minute (EXACT refunds go there: a
                    // recent call still counts whatever the machine's pace).
                    let ms = if g < 2 { 10 + 20 * rng.below(5) } else { 60_000 };
                    let key = format!("{{{tag}{mode:?}{g}}}:{k}");
                    (
                        Window::new(key, limit, Duration::from_millis(ms)).unwrap(),
                        WindowParams::new(limit, ms, 10_000).unwrap(),
                    )
                })
                .unzip();
            (windows, params, Model::new(n), Vec::new())
        })
        .collect();
    for step in 0..1500 {
        let g = rng.below(4) as usize;
        let (windows, params, model, calls) = &mut groups[g];
        let cost = 1 + rng.below(3);
        let refundable = mode != WindowMode::Exact || g >= 2;
        match rng.below(10) {
            0 if refundable && !calls.is_empty() => {
                // Give back a recent admitted call's count.
                let (at, cost) = calls.remove(rng.below(calls.len() as u64) as usize);
                let d = c.window_refund(windows, cost, mode, at).await.unwrap();
                assert!(d.allowed, "{mode:?} step {step}: a refund's reply says allowed");
                model.refund(params, mode, cost, at, at);
            }
            1 => {
                // A peek writes nothing: the next take shows it.
                c.window_peek(windows, cost, mode).await.unwrap();
            }
            _ => {
                let (d, now) = c.window_timed(windows, cost, mode).await.unwrap();
                let want = model.take(params, mode, cost, now);
                assert_eq!(as_fields(&d), core_fields(&want), "{mode:?} step {step} group {g} cost {cost} at {now}");
                if d.allowed {
                    admitted += 1;
                    calls.push((now, cost));
                    if calls.len() > 8 {
                        calls.remove(0);
                    }
                } else {
                    refused += 1;
                }
            }
        }
        if rng.below(3) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.below(6))).await;
        }
    }
    (admitted, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_windows_decide_and_count_as_the_module_does() {
    let plain = PlainServer::start();
    let module = Server::start(&[]);
    let lua = client(&plain.url(), Backend::Lua);
    let native = client(&module.url(), Backend::Module);
    for (seed, mode) in [(11, WindowMode::Sliding), (12, WindowMode::Fixed), (13, WindowMode::Exact)] {
        let (a, r) = run(&lua, "lua", mode, seed).await;
        assert!(a > 200 && r > 200, "{mode:?} on Lua: {a} admitted, {r} refused: the traffic must do both");
        let (a, r) = run(&native, "mod", mode, seed).await;
        assert!(a > 200 && r > 200, "{mode:?} on the module: {a} admitted, {r} refused");
    }
}

#[tokio::test]
async fn lua_windows_keep_what_the_module_keeps() {
    let plain = PlainServer::start();
    let c = client(&plain.url(), Backend::Lua);
    let hour = Duration::from_secs(3600);
    let mut con = plain.con();
    for mode in WindowMode::ALL {
        let w = [Window::new(format!("{{k}}:{mode:?}"), 5, hour).unwrap()];
        let (d, at) = c.window_timed(&w, 3, mode).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 2), "{mode:?}");
        // The key expires when its count no longer counts: within two hours.
        let ttl: i64 = redis::cmd("PTTL").arg(w[0].key()).query(&mut con).unwrap();
        assert!(ttl > 0 && ttl <= 2 * 3_600_000, "{mode:?}: ttl {ttl}");
        // A refusal writes nothing; a refund gives back the call's count,
        // never more, and a key left with nothing is removed.
        assert!(!c.window(&w, 3, mode).await.unwrap().allowed, "{mode:?}");
        assert_eq!(c.window_refund(&w, 10, mode, at).await.unwrap().remaining, 5, "{mode:?}: never above the limit");
        let exists: i64 = redis::cmd("EXISTS").arg(w[0].key()).query(&mut con).unwrap();
        assert_eq!(exists, 0, "{mode:?}: nothing counted, no key");
        assert_eq!(c.window(&w, 5, mode).await.unwrap().remaining, 0, "{mode:?}");
        // A refund of a call from another window gives nothing back.
        let d = c.window_refund(&w, 5, mode, at - 2 * 3_600_000).await.unwrap();
        assert_eq!(d.remaining, 0, "{mode:?}: an old call no longer counts");
    }
}

#[tokio::test]
async fn lua_windows_refuse_what_they_cannot_count_exactly() {
    let plain = PlainServer::start();
    let c = client(&plain.url(), Backend::Lua);
    let day = Duration::from_secs(86_400);
    // limit x window_ms above 2^52: the doubles of Lua would round.
    let huge = [Window::new("{h}:a", 1_000_000_000, day).unwrap()];
    let e = c.window(&huge, 1, WindowMode::Sliding).await.unwrap_err();
    assert!(e.to_string().contains("must be at most 2^52 for the Lua backend"), "{e}");
    // An EXACT log above 10,000: read and written whole by the script.
    let big = [Window::new("{h}:b", 10_001, day).unwrap()];
    let e = c.window(&big, 1, WindowMode::Exact).await.unwrap_err();
    assert!(e.to_string().contains("limit of key 1 must be an integer from 1 to 10000"), "{e}");
    // A key of another kind is named.
    let bucket = rl_client::Bucket::new("{h}:bucket", 5, 1, day).unwrap();
    c.take(&[bucket], 1).await.unwrap();
    let w = [Window::new("{h}:bucket", 5, day).unwrap()];
    let e = c.window(&w, 1, WindowMode::Fixed).await.unwrap_err();
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    let exact = [Window::new("{h}:x", 5, day).unwrap()];
    c.window(&exact, 1, WindowMode::Exact).await.unwrap();
    let e = c.window(&exact, 1, WindowMode::Sliding).await.unwrap_err();
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    // Pipelines stay module only (EVALSHA cannot be reloaded inside one).
    let params = [rl_core::BucketParams::new(5, 5, 1000).unwrap()];
    let e = c.take_command(Some(WindowMode::Fixed), &["{h}:p".to_string()], &params, 1).unwrap_err();
    assert!(matches!(e, Error::Unsupported("a pipelined RL.WINDOW")), "{e}");
}
