//! The seed's traffic shape (`make sim`'s, client/examples/fleet_sim), per
//! 300 gateways: one hot subject pressing a 10,000/s plan and three on
//! 100,000/s plans, each sent 25,000 requests a second; 5,000 quiet subjects
//! at 2 a second on 10/s plans; an abuser at 10,000 a second on a 10/s plan;
//! 100 login subjects at 2 a second on 30 a minute. At N gateways there are
//! N / 300 times as many subjects of each class, each with the same plan
//! and traffic: more customers, not bigger ones.

use rl_core::BucketParams;

use crate::model::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Pressing,
    Hot,
    Quiet,
    Abuser,
    Login,
}

impl Class {
    pub const ALL: [Class; 5] = [Class::Pressing, Class::Hot, Class::Quiet, Class::Abuser, Class::Login];

    pub fn name(self) -> &'static str {
        match self {
            Class::Pressing => "hot, pressing its limit (10,000/s plan)",
            Class::Hot => "hot, within its limit (100,000/s plan)",
            Class::Quiet => "quiet (10/s plan)",
            Class::Abuser => "abuser (10/s plan)",
            Class::Login => "logins (30/min plan)",
        }
    }

    /// Subjects per 300 gateways.
    pub fn per_300(self) -> u64 {
        [1, 3, 5000, 1, 100][self as usize]
    }

    /// Requests a second to one subject.
    pub fn rate(self) -> f64 {
        [25_000.0, 25_000.0, 2.0, 10_000.0, 2.0][self as usize]
    }

    pub fn params(self) -> BucketParams {
        let (capacity, refill, period) =
            [(10_000, 10_000, 1000), (100_000, 100_000, 1000), (10, 10, 1000), (10, 10, 1000), (30, 30, 60_000)]
                [self as usize];
        BucketParams::new(capacity, refill, period).expect("valid plans")
    }
}

/// The subjects a run simulates: `counts[c]` of each class.
pub struct Population {
    counts: Vec<u32>,
    first: Vec<u32>,
    cumulative: Vec<f64>,
    rate: f64,
}

impl Population {
    pub fn new(counts: [u32; 5]) -> Population {
        let mut first = Vec::new();
        let mut next = 0;
        for c in counts {
            first.push(next);
            next += c;
        }
        let weights: Vec<f64> = Class::ALL.iter().map(|c| f64::from(counts[*c as usize]) * c.rate()).collect();
        let rate: f64 = weights.iter().sum();
        let cumulative = weights.iter().scan(0.0, |acc, w| {
            *acc += w / rate;
            Some(*acc)
        });
        Population { counts: counts.to_vec(), first, cumulative: cumulative.collect(), rate }
    }

    /// Every subject of a fleet of `gateways` (its traffic, whole).
    pub fn whole(gateways: u32) -> Population {
        let k = u64::from(gateways) as f64 / 300.0;
        Population::new(Class::ALL.map(|c| ((c.per_300() as f64 * k).round() as u32).max(1)))
    }

    pub fn subjects(&self) -> u32 {
        self.counts.iter().sum()
    }

    pub fn count(&self, c: Class) -> u32 {
        self.counts[c as usize]
    }

    /// Requests a second, all subjects.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn class_of(&self, s: u32) -> usize {
        self.first.iter().rposition(|&f| s >= f).unwrap_or(0)
    }

    pub fn params(&self, s: u32) -> BucketParams {
        Class::ALL[self.class_of(s)].params()
    }

    /// A request's subject: a class by its share of the traffic, then one of
    /// its subjects uniformly.
    pub fn pick(&self, rng: &mut Rng) -> u32 {
        let u = rng.unit();
        let c = self.cumulative.iter().position(|&x| u < x).unwrap_or(self.counts.len() - 1);
        self.first[c] + rng.below(u64::from(self.counts[c])) as u32
    }
}
