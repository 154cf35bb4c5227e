//! The seed's traffic shape (rl_sims::kit::shape, `make sim`'s) at a
//! fleet's size: at N gateways there are N / 300 times as many subjects of
//! each class, each with the same plan and traffic: more customers, not
//! bigger ones.

use rl_core::BucketParams;
use rl_sims::kit::rng::Rng;
pub use rl_sims::kit::shape::Class;

/// What the model needs of a class beyond the shape.
pub trait Modelled {
    /// Its name in the report, with its plan.
    fn name(self) -> &'static str;
    /// Its plan as the shards' buckets take it.
    fn params(self) -> BucketParams;
}

impl Modelled for Class {
    fn name(self) -> &'static str {
        match self {
            Class::Pressing => "hot, pressing its limit (10,000/s plan)",
            Class::Hot => "hot, within its limit (100,000/s plan)",
            Class::Quiet => "quiet (10/s plan)",
            Class::Abuser => "abuser (10/s plan)",
            Class::Login => "logins (30/min plan)",
        }
    }

    fn params(self) -> BucketParams {
        let (capacity, refill, period) = self.plan();
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
