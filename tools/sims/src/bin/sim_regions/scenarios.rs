//! The five scenarios of issue 16, each on three fresh regions.

use std::sync::Arc;
use std::time::Duration;

use rl_gateway::global::GlobalSpec;
use testkit::Server;
use tokio::task::JoinHandle;

use crate::checks::{self, Check};
use crate::gateways::{self, Fleet};
use crate::rules::{FLOOR, RATE};
use crate::servers::{self, Running};
use crate::timing::Timing;
use crate::traffic::{Demand, Recorder, Recording};
use crate::Settings;

/// A finished scenario: its recording, figures and checks.
pub struct Outcome {
    pub name: &'static str,
    pub title: &'static str,
    pub story: String,
    pub recording: Recording,
    pub figures: Vec<(String, String)>,
    pub checks: Vec<Check>,
}

/// Three regions with their gateways, the demand and the recording.
struct World {
    servers: Vec<Server>,
    fleets: Vec<Option<Fleet>>,
    demand: Arc<Demand>,
    rec: Arc<Recorder>,
    sampler: JoinHandle<()>,
    probes: Arc<std::sync::Mutex<[Option<Arc<rl_gateway::global::RegionShares>>; 3]>>,
    gateways: usize,
}

fn split(total: f64, percent: [f64; 3]) -> [f64; 3] {
    percent.map(|p| total * p / 100.0)
}

impl World {
    async fn start(settings: &Settings, timing: &Timing, busy: [f64; 3], length: Duration) -> World {
        let servers = servers::start();
        let demand = Arc::new(Demand::new(busy, settings.quiet_each, settings.quiet_subjects));
        let rec = Arc::new(Recorder::new(length));
        let probes: Arc<std::sync::Mutex<[Option<_>; 3]>> = Arc::default();
        let global: GlobalSpec = rl_gateway::live::global_rules(&crate::rules::rules()).remove(0).1;
        let sampler = {
            let (rec, probes) = (rec.clone(), probes.clone());
            tokio::spawn(async move {
                loop {
                    let shares = {
                        let p = probes.lock().unwrap();
                        [0, 1, 2].map(|r| {
                            p[r].as_ref().map(|s: &Arc<rl_gateway::global::RegionShares>| {
                                s.share("api", &global, "acme").0.share
                            })
                        })
                    };
                    rec.shares.lock().unwrap().push((rec.now(), shares));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        let mut world = World {
            servers,
            fleets: vec![None, None, None],
            demand,
            rec,
            sampler,
            probes,
            gateways: settings.gateways,
        };
        for r in 0..3 {
            world.start_fleet(r, timing).await;
        }
        world
    }

    async fn start_fleet(&mut self, r: usize, timing: &Timing) {
        let fleet =
            gateways::start(r, &self.servers[r].url(), self.gateways, timing, self.demand.clone(), self.rec.clone())
                .await;
        self.probes.lock().unwrap()[r] = Some(fleet.probe.clone());
        self.fleets[r] = Some(fleet);
    }

    fn kill_region(&mut self, r: usize) {
        if let Some(f) = self.fleets[r].take() {
            f.kill();
        }
        self.probes.lock().unwrap()[r] = None;
        self.servers[r].kill();
    }

    fn finish(mut self) -> Recording {
        self.sampler.abort();
        for f in self.fleets.iter_mut().filter_map(Option::take) {
            f.kill();
        }
        self.rec.freeze()
    }
}

async fn sleep(secs: f64) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

fn pct(share: Option<u32>) -> String {
    share.map_or("-".into(), |s| format!("{:.1}%", s as f64 / 1e4))
}

/// 1. Steady, skewed traffic: the busy customer 70/20/10, quiet customers everywhere.
pub async fn steady(s: &Settings, t: &Timing) -> Outcome {
    let w = World::start(s, t, split(s.busy_rate, [70.0, 20.0, 10.0]), Duration::from_secs(20)).await;
    let b = Running::start(&w.servers, t, &[]);
    w.rec.event("balancer started; the busy customer asks 70/20/10");
    sleep(16.0).await;
    let rec = w.rec.clone();
    b.kill();
    let recording = w.finish();
    let got = checks::rate_between(&recording, 5.0, 16.0);
    let last = recording.shares.last().map(|s| s.1).unwrap_or_default();
    let _ = rec;
    Outcome {
        name: "steady",
        title: "1. Steady, skewed traffic",
        story: format!(
            "The busy customer asks {:.0} requests a second, 70% in eu, 20% in us, 10% in ap; {} quiet customers ask {} a second each in every region. Measured from 5 s (after the first rounds) to 16 s.",
            s.busy_rate, s.quiet_subjects, s.quiet_each
        ),
        figures: vec![
            ("busy customer admitted, per second (5-16 s)".into(), format!("{got:.0} of {RATE} ({:.1}%)", got / RATE as f64 * 100.0)),
            ("admitted per second by region (eu/us/ap)".into(), checks::region_rates(&recording, 5.0, 16.0)),
            ("shares in force at the end (eu/us/ap)".into(), last.map(pct).join(" / ")),
        ],
        checks: vec![
            checks::never_over(&recording),
            checks::at_least("the busy customer gets at least 95% of its limit (5-16 s)", got, 0.95 * RATE as f64),
        ],
        recording,
    }
}

/// 2. The busy customer's traffic moves from eu to ap at once.
pub async fn moves(s: &Settings, t: &Timing) -> Outcome {
    let w = World::start(s, t, split(s.busy_rate, [70.0, 20.0, 10.0]), Duration::from_secs(22)).await;
    let b = Running::start(&w.servers, t, &[]);
    w.rec.event("balancer started; the busy customer asks 70/20/10");
    sleep(8.0).await;
    w.demand.set_busy(split(s.busy_rate, [10.0, 20.0, 70.0]));
    w.rec.event("traffic moves: 10/20/70");
    sleep(10.0).await;
    b.kill();
    let recording = w.finish();
    let moved = recording.event_at("traffic moves").expect("recorded");
    let back = checks::time_to(&recording, moved, 0.9 * RATE as f64, 0.5);
    // Two intervals, plus the half-second window that measures it.
    let goal = 2.0 * t.interval.as_secs_f64() + 0.5;
    let mut c = vec![checks::never_over(&recording)];
    c.push(Check::new(
        "back at 90% of the limit within two intervals of the move",
        back.is_some_and(|b| b <= goal),
        back.map_or("never".into(), |b| {
            format!("after {b:.1} s (goal: {goal:.1} s, to the end of the first 0.5 s window at 90%)")
        }),
    ));
    Outcome {
        name: "move",
        title: "2. Traffic moves",
        story: format!(
            "The busy customer asks {:.0} a second, 70/20/10; at 8 s its traffic moves to 10/20/70 at once.",
            s.busy_rate
        ),
        figures: vec![
            (
                "time from the move to the end of the first 0.5 s at 90% of the limit".into(),
                back.map_or("never".into(), |b| format!("{b:.1} s ({:.1} intervals)", b / t.interval.as_secs_f64())),
            ),
            (
                "admitted per second in the first second after the move".into(),
                format!("{:.0}", checks::rate_between(&recording, moved, moved + 1.0)),
            ),
        ],
        checks: c,
        recording,
    }
}

/// 3. The balancer is killed; shares age into the fixed split; it returns.
pub async fn balancer_killed(s: &Settings, t: &Timing) -> Outcome {
    let length = 8.0 + t.stale_after.as_secs_f64() + t.settle.as_secs_f64() + 3.0 + 10.0;
    let w = World::start(s, t, split(s.busy_rate, [70.0, 20.0, 10.0]), Duration::from_secs_f64(length + 2.0)).await;
    let b = Running::start(&w.servers, t, &[]);
    w.rec.event("balancer started; the busy customer asks 70/20/10");
    sleep(8.0).await;
    b.kill();
    w.rec.event("balancer killed");
    sleep(t.stale_after.as_secs_f64() + t.settle.as_secs_f64() + 3.0).await;
    let fixed = w.rec.shares.lock().unwrap().last().map(|s| s.1).unwrap_or_default();
    let b = Running::start(&w.servers, t, &[]);
    w.rec.event("balancer restarted");
    sleep(10.0).await;
    let after = w.rec.shares.lock().unwrap().last().map(|s| s.1).unwrap_or_default();
    b.kill();
    let recording = w.finish();
    let killed = recording.event_at("balancer killed").unwrap();
    let restarted = recording.event_at("balancer restarted").unwrap();
    // From half a second after the kill (a write in flight may still land
    // and be read) until stale_after: the last table, unchanged.
    let kept = checks::shares_between(&recording, killed + 0.5, killed + t.stale_after.as_secs_f64() - 0.5);
    let before = kept.first().copied().unwrap_or_default();
    let third = 333_333;
    Outcome {
        name: "balancer-killed",
        title: "3. Balancer killed",
        story: format!(
            "70/20/10 as in scenario 1; the balancer is killed at 8 s, restarted {:.0} s later (past the {:.0} s stale_after and {:.0} s settle).",
            t.stale_after.as_secs_f64() + t.settle.as_secs_f64() + 3.0, t.stale_after.as_secs_f64(), t.settle.as_secs_f64()
        ),
        figures: vec![
            ("shares in force after the kill (eu/us/ap)".into(), before.map(pct).join(" / ")),
            ("shares before the restart".into(), fixed.map(pct).join(" / ")),
            ("shares 10 s after the restart".into(), after.map(pct).join(" / ")),
            ("admitted per second while stale (fixed split)".into(), format!("{:.0}", checks::rate_between(&recording, restarted - 2.0, restarted))),
            ("admitted per second after the restart (+3 s to +10 s)".into(), format!("{:.0}", checks::rate_between(&recording, restarted + 3.0, restarted + 10.0))),
        ],
        checks: vec![
            checks::never_over(&recording),
            Check::new("the last shares stay for stale_after", kept.iter().all(|s| *s == before), format!("{} samples", kept.len())),
            Check::new("then the fixed split", fixed == [Some(third); 3], fixed.map(pct).join(" / ")),
            Check::new(
                "after the restart shares follow traffic again (eu above 40%, us above ap)",
                after[0].is_some_and(|s| s > 400_000) && after[1] > after[2],
                after.map(pct).join(" / "),
            ),
        ],
        recording,
    }
}

/// 4. ap's Redis and gateways killed; its clients fail over to eu.
pub async fn region_killed(s: &Settings, t: &Timing) -> Outcome {
    let fallback = t.stale_after + t.settle + Duration::from_secs(1);
    let length = 8.0 + fallback.as_secs_f64() + 6.0 + 8.0 + 12.0;
    let mut w = World::start(s, t, split(s.busy_rate, [45.0, 10.0, 45.0]), Duration::from_secs_f64(length + 2.0)).await;
    let b = Running::start(&w.servers, t, &[]);
    w.rec.event("balancer started; the busy customer asks 45/10/45");
    sleep(8.0).await;
    w.kill_region(2);
    w.demand.set_busy(split(s.busy_rate, [90.0, 10.0, 0.0]));
    w.rec.event("ap killed (Redis and gateways); its clients go to eu: 90/10/0");
    sleep(fallback.as_secs_f64() + 6.0).await;
    b.kill();
    let b = Running::start(&w.servers, t, &["ap"]);
    w.rec.event("a balancer with --down ap takes over");
    sleep(8.0).await;
    w.servers[2].restart();
    w.rec.event("ap's Redis restarted (empty)");
    sleep(2.5).await;
    w.start_fleet(2, t).await;
    w.demand.set_busy(split(s.busy_rate, [45.0, 10.0, 45.0]));
    w.rec.event("ap's gateways started; traffic back to 45/10/45");
    sleep(10.0).await;
    b.kill();
    let recording = w.finish();
    let killed = recording.event_at("ap killed").unwrap();
    let grace = t.grace.as_secs_f64();
    let fb = fallback.as_secs_f64();
    let down = recording.event_at("a balancer with --down").unwrap();
    let back = recording.event_at("ap's gateways started").unwrap();
    let auto_early = checks::rate_between(&recording, killed + grace + 2.0, killed + fb - 1.0);
    let auto_late = checks::rate_between(&recording, killed + fb + 2.0, down);
    let with_down = checks::rate_between(&recording, down + 3.0, down + 8.0);
    let first_ap = recording.shares.iter().find(|x| x.0 > back).and_then(|x| x.1[2]);
    // Each round lowers before it raises: a sample between the two shows a
    // share lowered by the round's move, so the whole shows after a raise,
    // the highest sum over a few rounds.
    let down_shares = checks::shares_between(&recording, down + 5.0, down + 8.0)
        .into_iter()
        .max_by_key(|s| s[0].unwrap_or(0) + s[1].unwrap_or(0));
    let end = recording.shares.last().map(|x| x.1).unwrap_or_default();
    let floor = (FLOOR * 1e6) as u32;
    Outcome {
        name: "region-killed",
        title: "4. A region killed",
        story: format!(
            "45/10/45; at 8 s ap's Redis and all its gateways are killed and ap's clients go to eu (90/10/0). The balancer first gives eu and us only what ap cannot be holding (after --grace {grace:.0} s: ap's last share until its gateways must have fallen back, {fb:.0} s, then its fixed third); then the operator asserts `--down ap` (a new balancer, which fences the old one off) and eu and us get the whole; then ap's Redis returns empty, gets 0 shares, its gateways start, and it grows from the floor."
        ),
        figures: vec![
            ("admitted per second, automatic, before ap's gateways must have fallen back".into(), format!("{auto_early:.0}")),
            ("admitted per second, automatic, after".into(), format!("{auto_late:.0}")),
            ("admitted per second with --down ap".into(), format!("{with_down:.0}")),
            ("shares 5-8 s after --down, after a raise (eu/us/ap)".into(), down_shares.map_or("-".into(), |s| s.map(pct).join(" / "))),
            ("ap's first share after it returns".into(), pct(first_ap)),
            ("shares at the end (eu/us/ap)".into(), end.map(pct).join(" / ")),
        ],
        checks: vec![
            checks::never_over(&recording),
            Check::new(
                "with --down, eu and us together hold the whole limit",
                down_shares.is_some_and(|s| s[0].unwrap_or(0) + s[1].unwrap_or(0) >= 999_000),
                down_shares.map_or("no sample".into(), |s| s.map(pct).join(" / ")),
            ),
            Check::new("ap returns at no more than the floor", first_ap.is_some_and(|s| s <= floor), pct(first_ap)),
            Check::new("and grows with its traffic", end[2].is_some_and(|s| s > floor), pct(end[2])),
        ],
        recording,
    }
}

/// 5. Two balancers at once while the traffic keeps moving.
pub async fn two_balancers(s: &Settings, t: &Timing) -> Outcome {
    let patterns = [[70.0, 20.0, 10.0], [10.0, 70.0, 20.0], [20.0, 10.0, 70.0]];
    let w = World::start(s, t, split(s.busy_rate, patterns[0]), Duration::from_secs(22)).await;
    let first = Running::start(&w.servers, t, &[]);
    w.rec.event("first balancer started; the traffic moves every 4 s");
    let mut second = None;
    for step in 0..5 {
        sleep(2.0).await;
        if step == 1 {
            second = Some(Running::start(&w.servers, t, &[]));
            w.rec.event("second balancer started");
        }
        sleep(2.0).await;
        w.demand.set_busy(split(s.busy_rate, patterns[(step + 1) % 3]));
    }
    let first_stopped = first.stopped();
    let first = first.outcome().await;
    let second = second.expect("started");
    let second_ran = !second.stopped();
    second.kill();
    let recording = w.finish();
    let fenced = matches!(first, Some(Err(rl_balancer::Stopped::Fenced(_))));
    Outcome {
        name: "two-balancers",
        title: "5. Two balancers at once",
        story: "The busy customer's traffic moves every 4 s (70/20/10, 10/70/20, 20/10/70, ...); a second balancer starts at 6 s while the first runs.".into(),
        figures: vec![
            ("first balancer".into(), (if first_stopped { "stopped" } else { "still running" }).to_string()),
            ("admitted per second (8-20 s)".into(), format!("{:.0}", checks::rate_between(&recording, 8.0, 20.0))),
        ],
        checks: vec![
            checks::never_over(&recording),
            Check::new("the older balancer is fenced off and stops", fenced, format!("{first:?}")),
            Check::new("the newer one keeps running", second_ran, String::new()),
        ],
        recording,
    }
}
