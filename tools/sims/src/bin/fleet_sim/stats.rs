//! What the gateways count: requests and decisions by class, window and
//! source, and latencies.

use std::time::{Duration, Instant};

use rl_gateway::Source;

use crate::traffic::Traffic;

/// What decided a request; `Error` is a failed call of the per-request mode.
pub const SOURCES: [&str; 7] = ["Redis", "lease", "deny cache", "fallback", "fail-closed", "error", "pacing"];

pub fn source_index(source: Option<Source>) -> usize {
    match source {
        Some(Source::Redis) => 0,
        Some(Source::Lease) => 1,
        Some(Source::DenyCache) => 2,
        Some(Source::Fallback) => 3,
        Some(Source::FailClosed) => 4,
        None => 5,
        Some(Source::Pacing) => 6,
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub requests: u64,
    pub admitted: u64,
    /// Admitted by the local fallback (its bound is checked apart).
    pub fallback_admitted: u64,
    pub by_source: [u64; 7],
}

impl Tally {
    pub fn add(&mut self, o: &Tally) {
        self.requests += o.requests;
        self.admitted += o.admitted;
        self.fallback_admitted += o.fallback_admitted;
        for (a, b) in self.by_source.iter_mut().zip(o.by_source) {
            *a += b;
        }
    }

    pub fn decided_in_memory(&self) -> u64 {
        self.by_source[1] + self.by_source[2]
    }
}

/// Latencies of a decision in ns, in buckets a quarter of a power of two wide.
#[derive(Clone)]
pub struct Latencies(Vec<u64>);

impl Latencies {
    pub fn new() -> Latencies {
        Latencies(vec![0; 4 * 40])
    }

    pub fn bucket(ns: u64) -> usize {
        let v = ns + 1;
        let e = 63 - v.leading_zeros() as usize;
        let m = if e >= 2 { (v >> (e - 2)) & 3 } else { (v << (2 - e)) & 3 } as usize;
        (4 * e + m).min(4 * 40 - 1)
    }

    /// The upper edge of a bucket, in ns.
    pub fn upper(bucket: usize) -> u64 {
        let (e, m) = (bucket / 4, (bucket % 4) as u64);
        ((4 + m + 1) << e) / 4 - 1
    }

    pub fn record(&mut self, d: Duration) {
        self.0[Self::bucket(d.as_nanos() as u64)] += 1;
    }

    pub fn add(&mut self, o: &Latencies) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a += b;
        }
    }

    /// The latency below which `q` of the requests were decided (bucket
    /// edge), in µs.
    pub fn quantile(&self, q: f64) -> f64 {
        let total: u64 = self.0.iter().sum();
        let mut seen = 0;
        for (i, n) in self.0.iter().enumerate() {
            seen += n;
            if seen as f64 >= q * total as f64 {
                return Self::upper(i) as f64 / 1000.0;
            }
        }
        0.0
    }
}

/// What a lane (or, merged, the fleet) saw in a phase.
#[derive(Clone)]
pub struct Stats {
    /// Per class row, per window.
    pub tallies: Vec<[Tally; 4]>,
    /// Admitted per quiet subject by Redis (not the fallback), before any
    /// outage.
    pub quiet_admitted: Vec<u64>,
    pub latencies: Latencies,
    /// Requests that fell due but were not sent before the phase ended.
    pub behind: u64,
    /// Per gateway, its first decision by Redis after the restart.
    pub back_on_redis: Vec<Option<Instant>>,
}

impl Stats {
    pub fn new(traffic: &Traffic) -> Stats {
        Stats {
            tallies: vec![[Tally::default(); 4]; traffic.classes.len()],
            quiet_admitted: vec![0; traffic.quiet.len()],
            latencies: Latencies::new(),
            behind: 0,
            back_on_redis: vec![None; traffic.settings.gateways as usize],
        }
    }

    pub fn merge(&mut self, o: Stats) {
        for (a, b) in self.tallies.iter_mut().zip(&o.tallies) {
            for w in 0..4 {
                a[w].add(&b[w]);
            }
        }
        for (a, b) in self.quiet_admitted.iter_mut().zip(&o.quiet_admitted) {
            *a += b;
        }
        self.latencies.add(&o.latencies);
        self.behind += o.behind;
        for (a, b) in self.back_on_redis.iter_mut().zip(o.back_on_redis) {
            *a = match (*a, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
        }
    }

    /// Every class and window together.
    pub fn total(&self) -> Tally {
        let mut t = Tally::default();
        self.tallies.iter().flatten().for_each(|x| t.add(x));
        t
    }
}
