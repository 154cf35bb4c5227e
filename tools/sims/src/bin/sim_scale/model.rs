//! The discrete-event model: virtual time in nanoseconds, one event queue.
//!
//! Real code: every gateway's decisions are rl-core's lease and refusal
//! code, rl-client's breaker per shard and the fallback's share, driven as
//! rl-client's limiter drives them (gateway.rs); every
//! relay's are `rl_relay::pool::Pools`, the relay's own (the same rl-core
//! lease, with relays for gateways in its sizing); every shard is rl-core's
//! `acquire`, the module's algorithm, on the shard's virtual clock.
//! Modelled: the network (each hop 0.1-0.25 ms one way, uniform: a round
//! trip of 0.2-0.5 ms), a shard's service time per call (one thread, calls
//! served in arrival order), arrivals (Poisson), no cost at the relay.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use bytes::Bytes;
use rl_core::{acquire, BucketParams, BucketState, BucketUpdate, Reply};
use rl_gateway::internal::Ticket;
use rl_relay::pool::{Need, Plan, Pools, Settings};
use rl_sims::kit::rng::Rng;

use crate::gateway::{Check, Gateway, Op, Purpose, Rule, OPEN_FOR_MS};
use crate::traffic::{Class, Population};

const ONE: Need = Need { want: 1, min: 1 };

/// What one run models.
#[derive(Clone, Debug)]
pub struct Setup {
    pub gateways: u32,
    pub shards: u32,
    /// Gateways per relay; none: gateways call the shards.
    pub per_relay: Option<u32>,
    pub seconds: f64,
    /// A shard's server time per call (ns).
    pub service_ns: u64,
    /// Relay 0 dies at this second and is back (empty) after the second value.
    pub relay_crash: Option<(f64, f64)>,
    /// The shard of subject 0 fails over at this second, for the second value:
    /// calls to it fail until then.
    pub failover: Option<(f64, f64)>,
    /// Whether the gateways' breakers may open (false: a comparison run
    /// whose breakers never open, every call sent).
    pub breakers: bool,
    pub seed: u64,
}

/// What a relay is asked for by a gateway's call.
fn need(op: Op) -> Need {
    match op {
        Op::Take => ONE,
        Op::Lease { want, min } => Need { want, min },
    }
}

/// A gateway's call: for a request, or a background top-up; `ticket`: its
/// shard's breaker admitted it.
#[derive(Clone, Copy, Debug)]
struct Call {
    g: u32,
    s: u32,
    op: Op,
    purpose: Purpose,
    ticket: Ticket,
}

impl Call {
    fn top_up(&self) -> bool {
        matches!(self.purpose, Purpose::TopUp)
    }
}

#[derive(Clone, Copy, Debug)]
enum Back {
    Gateway(Call),
    RelayLease { r: u32, asked: u64, waiting: Option<Call> },
    ViaRelay { r: u32, call: Call },
}

#[derive(Clone, Copy, Debug)]
enum Event {
    Shard {
        s: u32,
        op: Op,
        back: Back,
    },
    Relay {
        r: u32,
        call: Call,
    },
    RelayLeased {
        r: u32,
        s: u32,
        asked: u64,
        waiting: Option<Call>,
        reply: Reply,
    },
    RelayForwarded {
        r: u32,
        call: Call,
        reply: Reply,
    },
    Gateway {
        call: Call,
        reply: Reply,
    },
    /// A call failed (the shard is failing over): the request's fallback.
    Failed {
        call: Call,
    },
}

/// Per class: what happened to its requests.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub requests: u64,
    pub admitted: u64,
    /// Requests answered from a gateway's memory (lease or refusal).
    pub in_memory: u64,
    /// Requests decided by the local fallback (a failed call, or a call
    /// the breaker refused), and those of them it admitted.
    pub fallback: u64,
    pub fallback_admitted: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub tally: Vec<Tally>,
    /// Shard calls by class of subject (requests' and top-ups').
    pub shard_calls: Vec<u64>,
    /// Gateway to relay calls.
    pub relay_calls: u64,
    /// Admitted per subject (by Redis, leases and relays; not the fallback).
    pub admitted: Vec<u64>,
    /// Tokens the shards granted per subject (RL.TAKE and RL.LEASE), and
    /// what gateways and relays still held of them when the run ended.
    pub granted: Vec<u64>,
    pub held_at_end: Vec<u64>,
    /// Admitted per subject in the run's second half (the steady rate).
    pub admitted_second_half: Vec<u64>,
    /// Calls per shard.
    pub per_shard: Vec<u64>,
    /// Tokens relay 0 held when it died.
    pub crash_lost: u64,
    /// Calls that failed (the shard failing over).
    pub failed_calls: u64,
    /// Checks the gateways' breakers sent to the fallback without a call,
    /// and top-ups they dropped.
    pub avoided: u64,
    /// Breakers the gateways made (one per gateway and shard it called).
    pub breakers: u64,
    /// Admitted per subject by every path, the fallback's included, from
    /// the failover's start until its last breaker can have closed again.
    pub episode_admitted: Vec<u64>,
    /// Where that episode starts and ends (virtual ns from the run's start).
    pub episode: (u64, u64),
    /// Subjects on the shard that fails over.
    pub on_failed_shard: Vec<u32>,
}

struct Heap {
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Event>>,
    free: Vec<usize>,
    seq: u64,
}

impl Heap {
    fn push(&mut self, at: u64, e: Event) {
        let slot = match self.free.pop() {
            Some(i) => {
                self.events[i] = Some(e);
                i
            }
            None => {
                self.events.push(Some(e));
                self.events.len() - 1
            }
        };
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, slot)));
    }

    fn peek(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse((at, _, _))| *at)
    }

    fn pop(&mut self) -> (u64, Event) {
        let Reverse((at, _, slot)) = self.queue.pop().expect("peeked");
        self.free.push(slot);
        (at, self.events[slot].take().expect("queued"))
    }
}

struct Model<'a> {
    setup: &'a Setup,
    pop: &'a Population,
    keys: Vec<[Bytes; 1]>,
    params: Vec<[BucketParams; 1]>,
    shard_of: Vec<u32>,
    gateways: Vec<Gateway>,
    relays: Vec<Pools>,
    buckets: Vec<Option<BucketState>>,
    busy_until: Vec<u64>,
    heap: Heap,
    rng: Rng,
    out: Outcome,
    relay_down: (u64, u64),
    failover: (u64, u64),
    episode: (u64, u64),
    /// When the run's second half starts.
    second_half: u64,
}

/// Subject `s`'s rule; logins are fail-closed, as in make sim.
fn rule<'a>(params: &'a [[BucketParams; 1]], pop: &Population, s: u32) -> Rule<'a> {
    Rule { params: &params[s as usize], fail_closed: Class::ALL[pop.class_of(s)].fail_closed() }
}

fn ms(ns: u64) -> u64 {
    ns / 1_000_000
}

impl Model<'_> {
    fn hop(&mut self) -> u64 {
        100_000 + self.rng.below(150_001)
    }

    fn relay_of(&self, g: u32) -> Option<u32> {
        self.setup.per_relay.map(|n| g / n)
    }

    /// A gateway sends `call`: to its relay, or (none, or it is down) to the shard.
    fn send(&mut self, call: Call, now: u64) {
        let at = now + self.hop();
        match self.relay_of(call.g) {
            Some(r) if !(r == 0 && now >= self.relay_down.0 && now < self.relay_down.1) => {
                self.out.relay_calls += 1;
                self.heap.push(at, Event::Relay { r, call });
            }
            _ => self.heap.push(at, Event::Shard { s: call.s, op: call.op, back: Back::Gateway(call) }),
        }
    }

    fn arrival(&mut self, now: u64) {
        let s = self.pop.pick(&mut self.rng);
        let g = self.rng.below(u64::from(self.setup.gateways)) as u32;
        let class = self.pop.class_of(s);
        self.out.tally[class].requests += 1;
        let shard = self.shard_of[s as usize];
        let rule = rule(&self.params, self.pop, s);
        match self.gateways[g as usize].check(s, shard, &rule, ms(now)) {
            Check::Memory { admitted, top_up } => {
                self.decided(s, admitted, true, now);
                if let Some((want, ticket)) = top_up {
                    self.send(Call { g, s, op: Op::Lease { want, min: 1 }, purpose: Purpose::TopUp, ticket }, now);
                }
            }
            Check::Fallback { admitted } => self.fallback(s, admitted, now),
            Check::Call { op, purpose, ticket } => self.send(Call { g, s, op, purpose, ticket }, now),
        }
    }

    fn decided(&mut self, s: u32, admitted: bool, in_memory: bool, now: u64) {
        let t = &mut self.out.tally[self.pop.class_of(s)];
        t.admitted += u64::from(admitted);
        t.in_memory += u64::from(in_memory);
        self.out.admitted[s as usize] += u64::from(admitted);
        if now >= self.second_half {
            self.out.admitted_second_half[s as usize] += u64::from(admitted);
        }
        self.in_episode(s, admitted, now);
    }

    /// A request the local fallback decided.
    fn fallback(&mut self, s: u32, admitted: bool, now: u64) {
        let t = &mut self.out.tally[self.pop.class_of(s)];
        t.fallback += 1;
        t.fallback_admitted += u64::from(admitted);
        self.in_episode(s, admitted, now);
    }

    fn in_episode(&mut self, s: u32, admitted: bool, now: u64) {
        if now >= self.episode.0 && now < self.episode.1 {
            self.out.episode_admitted[s as usize] += u64::from(admitted);
        }
    }

    fn shard(&mut self, now: u64, s: u32, op: Op, back: Back) {
        let shard = self.shard_of[s as usize] as usize;
        if now >= self.failover.0 && now < self.failover.1 && shard == self.shard_of[0] as usize {
            // Failing over: the call times out, at the client's 50 ms; through
            // a relay, at its connection's to the relay (half of that).
            self.out.failed_calls += 1;
            match back {
                Back::Gateway(call) => self.heap.push(now + 50_000_000, Event::Failed { call }),
                Back::ViaRelay { call, .. } => self.heap.push(now + 25_000_000, Event::Failed { call }),
                Back::RelayLease { r, waiting, .. } => {
                    self.relays[r as usize].failed(&self.keys[s as usize]);
                    if let Some(call) = waiting {
                        self.heap.push(now + 25_000_000, Event::Failed { call });
                    }
                }
            }
            return;
        }
        let done = now.max(self.busy_until[shard]) + self.setup.service_ns;
        self.busy_until[shard] = done;
        self.out.per_shard[shard] += 1;
        self.out.shard_calls[self.pop.class_of(s)] += 1;
        let need = need(op);
        let params = &self.params[s as usize];
        let state = &mut self.buckets[s as usize];
        let outcome = acquire(params, std::slice::from_ref(state), need.want, need.min, ms(done));
        if let Some(update) = outcome.updates.first() {
            *state = match update {
                BucketUpdate::Store { state, .. } => Some(*state),
                BucketUpdate::Remove => None,
            };
        }
        let reply = outcome.decision;
        self.out.granted[s as usize] += reply.granted;
        let at = done + self.hop();
        match back {
            Back::Gateway(call) => self.heap.push(at, Event::Gateway { call, reply }),
            Back::RelayLease { r, asked, waiting } => {
                self.heap.push(at, Event::RelayLeased { r, s, asked, waiting, reply })
            }
            Back::ViaRelay { r, call } => self.heap.push(at, Event::RelayForwarded { r, call, reply }),
        }
    }

    fn relay(&mut self, now: u64, r: u32, call: Call) {
        let s = call.s as usize;
        let need = need(call.op);
        let plan = self.relays[r as usize].plan(&self.keys[s], &self.params[s], need, ms(now));
        let at = now + self.hop();
        match plan {
            Plan::Answer { reply, top_up } => {
                self.heap.push(at, Event::Gateway { call, reply });
                if let Some(want) = top_up {
                    let back = Back::RelayLease { r, asked: want, waiting: None };
                    self.heap.push(at, Event::Shard { s: call.s, op: Op::Lease { want, min: 1 }, back });
                }
            }
            Plan::Lease { want, min } => {
                let back = Back::RelayLease { r, asked: want, waiting: Some(call) };
                self.heap.push(at, Event::Shard { s: call.s, op: Op::Lease { want, min }, back });
            }
            Plan::Forward => {
                self.heap.push(at, Event::Shard { s: call.s, op: call.op, back: Back::ViaRelay { r, call } })
            }
        }
    }

    fn gateway(&mut self, now: u64, call: Call, reply: Reply) {
        let params = &self.params[call.s as usize];
        let gateway = &mut self.gateways[call.g as usize];
        gateway.report(self.shard_of[call.s as usize], call.ticket, true, ms(now));
        let admitted = gateway.answered(call.s, params, call.op, call.purpose, reply, ms(now));
        if !call.top_up() {
            self.decided(call.s, admitted, false, now);
        }
    }

    fn failed(&mut self, now: u64, call: Call) {
        let (s, shard) = (call.s, self.shard_of[call.s as usize]);
        let rule = rule(&self.params, self.pop, s);
        match self.gateways[call.g as usize].failed(s, shard, &rule, call.purpose, call.ticket, ms(now)) {
            Some((admitted, true)) => self.fallback(s, admitted, now),
            Some((admitted, false)) => self.decided(s, admitted, true, now),
            None => {}
        }
    }
}

/// Runs `setup` on `pop`.
pub fn run(setup: &Setup, pop: &Population) -> Outcome {
    let n = pop.subjects();
    let keys: Vec<[Bytes; 1]> = (0..n).map(|s| [Bytes::from(format!("rl:{{s{s}}}:r"))]).collect();
    let params: Vec<[BucketParams; 1]> = (0..n).map(|s| [pop.params(s)]).collect();
    let mut rng = Rng::new(setup.seed);
    // Subjects land on shards as slots do: by hash, uniformly.
    let shard_of: Vec<u32> = (0..n).map(|_| rng.below(u64::from(setup.shards)) as u32).collect();
    // rl-client's defaults: a lease is 1 s of the share, kept 2 s.
    let (window_ms, ttl_ms) = (1000, 2000);
    let relays = setup.per_relay.map_or(0, |p| setup.gateways.div_ceil(p));
    let relay = Settings { window_ms, ttl_ms, relays: relays.max(1), max_subjects: 100_000, ..Settings::default() };
    let ns = |s: f64| (s * 1e9) as u64;
    let mut m = Model {
        setup,
        pop,
        keys,
        params,
        shard_of,
        gateways: (0..setup.gateways)
            .map(|_| Gateway::new(setup.gateways, window_ms, ttl_ms, setup.breakers))
            .collect(),
        relays: (0..relays).map(|_| Pools::new(relay)).collect(),
        buckets: vec![None; n as usize],
        busy_until: vec![0; setup.shards as usize],
        heap: Heap { queue: BinaryHeap::new(), events: Vec::new(), free: Vec::new(), seq: 0 },
        rng,
        out: Outcome {
            tally: vec![Tally::default(); Class::ALL.len()],
            shard_calls: vec![0; Class::ALL.len()],
            admitted: vec![0; n as usize],
            granted: vec![0; n as usize],
            held_at_end: vec![0; n as usize],
            admitted_second_half: vec![0; n as usize],
            per_shard: vec![0; setup.shards as usize],
            episode_admitted: vec![0; n as usize],
            ..Outcome::default()
        },
        relay_down: setup.relay_crash.map_or((u64::MAX, u64::MAX), |(at, down)| (ns(at), ns(at + down))),
        failover: setup.failover.map_or((u64::MAX, u64::MAX), |(at, down)| (ns(at), ns(at + down))),
        episode: (u64::MAX, u64::MAX),
        second_half: u64::MAX,
    };
    // Virtual time starts at a round epoch: the buckets' clock in ms.
    let start = 1_700_000_000_000_000_000u64;
    let end = start + ns(setup.seconds);
    m.second_half = start + ns(setup.seconds / 2.0);
    m.relay_down = (m.relay_down.0.saturating_add(start), m.relay_down.1.saturating_add(start));
    m.failover = (m.failover.0.saturating_add(start), m.failover.1.saturating_add(start));
    // A breaker opened by the last failure closes at most OPEN_FOR_MS after
    // it (its probe answered), the failure seen at most a timeout late.
    m.episode = (m.failover.0, m.failover.1.saturating_add((OPEN_FOR_MS + 50) * 1_000_000).min(end));
    if setup.failover.is_some() {
        m.out.episode = (m.episode.0 - start, m.episode.1 - start);
        m.out.on_failed_shard = (0..n).filter(|&s| m.shard_of[s as usize] == m.shard_of[0]).collect();
    }
    let rate = pop.rate();
    let mut next_arrival = start;
    let mut crashed = false;
    loop {
        let event_at = m.heap.peek().unwrap_or(u64::MAX);
        let now = next_arrival.min(event_at);
        if now >= end {
            break;
        }
        if !crashed && now >= m.relay_down.0 {
            crashed = true;
            m.out.crash_lost = m.relays[0].iter().map(|(_, p)| p.held(ms(now))).sum();
            m.relays[0] = Pools::new(relay);
        }
        if next_arrival <= event_at {
            m.arrival(now);
            let gap = -(1.0 - m.rng.unit()).ln() / rate * 1e9;
            next_arrival += gap.max(1.0) as u64;
            continue;
        }
        match m.heap.pop().1 {
            Event::Shard { s, op, back } => m.shard(now, s, op, back),
            Event::Relay { r, call } => m.relay(now, r, call),
            Event::RelayLeased { r, s, asked, waiting, reply } => {
                let keys = &m.keys[s as usize];
                let paid = m.relays[r as usize].settle(keys, asked, reply, waiting.map(|c| need(c.op)), ms(now));
                if let (Some(call), Some(paid)) = (waiting, paid) {
                    let at = now + m.hop();
                    m.heap.push(at, Event::Gateway { call, reply: paid });
                }
            }
            Event::RelayForwarded { r, call, reply } => {
                let s = call.s as usize;
                m.relays[r as usize].forwarded(&m.keys[s], &m.params[s], need(call.op), reply, ms(now));
                let at = now + m.hop();
                m.heap.push(at, Event::Gateway { call, reply });
            }
            Event::Gateway { call, reply } => m.gateway(now, call, reply),
            Event::Failed { call } => m.failed(now, call),
        }
    }
    let subject_of: std::collections::HashMap<&[Bytes], u32> =
        m.keys.iter().enumerate().map(|(s, k)| (&k[..], s as u32)).collect();
    for relay in &m.relays {
        for (keys, pool) in relay.iter() {
            m.out.held_at_end[subject_of[&keys[..]] as usize] += pool.held(ms(end));
        }
    }
    for g in &m.gateways {
        for (s, held) in g.held(ms(end)) {
            m.out.held_at_end[s as usize] += held;
        }
        m.out.avoided += g.avoided;
        m.out.breakers += g.breakers() as u64;
    }
    m.out
}
