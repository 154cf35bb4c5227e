//! What the gateways are asked (the busy customer's demand per region, the
//! quiet customers') and what they admitted, in 100 ms buckets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Regions, in the order of the rule's weights.
pub const REGIONS: [&str; 3] = ["eu", "us", "ap"];
/// The width of a bucket of the recording.
pub const BUCKET: Duration = Duration::from_millis(100);

/// Requests a second asked of each region.
pub struct Demand {
    /// The busy customer's, per region.
    busy: Mutex<[f64; 3]>,
    /// Each quiet customer's, per region.
    pub quiet_each: f64,
    /// How many quiet customers.
    pub quiet_subjects: usize,
}

impl Demand {
    pub fn new(busy: [f64; 3], quiet_each: f64, quiet_subjects: usize) -> Demand {
        Demand { busy: Mutex::new(busy), quiet_each, quiet_subjects }
    }

    pub fn busy(&self) -> [f64; 3] {
        *self.busy.lock().unwrap()
    }

    pub fn set_busy(&self, busy: [f64; 3]) {
        *self.busy.lock().unwrap() = busy;
    }
}

/// One scenario's recording: per 100 ms bucket and region, the busy
/// customer's requests admitted and asked, the quiet customers'; the busy
/// customer's share in force at a gateway of each region, sampled; events.
pub struct Recorder {
    pub start: Instant,
    busy_admitted: Vec<[AtomicU64; 3]>,
    busy_asked: Vec<[AtomicU64; 3]>,
    quiet_admitted: Vec<[AtomicU64; 3]>,
    quiet_refused: AtomicU64,
    /// The busy customer's refusals by where they came from.
    pub refused_by: [AtomicU64; 4],
    errors: AtomicU64,
    /// The longest request, in µs: admissions happen at the server somewhere
    /// within it, so the bound's windows are widened by it.
    max_latency_us: AtomicU64,
    pub shares: Mutex<Vec<(f64, [Option<u32>; 3])>>,
    pub events: Mutex<Vec<(f64, String)>>,
}

impl Recorder {
    pub fn new(length: Duration) -> Recorder {
        let n = (length.as_millis() / BUCKET.as_millis()) as usize + 50;
        let zeros = || (0..n).map(|_| Default::default()).collect::<Vec<[AtomicU64; 3]>>();
        Recorder {
            start: Instant::now(),
            busy_admitted: zeros(),
            busy_asked: zeros(),
            quiet_admitted: zeros(),
            quiet_refused: AtomicU64::new(0),
            refused_by: Default::default(),
            errors: AtomicU64::new(0),
            max_latency_us: AtomicU64::new(0),
            shares: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
        }
    }

    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn bucket(&self, at: Instant) -> Option<usize> {
        let i = (at.duration_since(self.start).as_millis() / BUCKET.as_millis()) as usize;
        (i < self.busy_admitted.len()).then_some(i)
    }

    /// A request of the busy customer (`busy`) or a quiet one, sent at
    /// `sent`, answered now: `Some(allowed)`, or `None` for an error.
    pub fn answer(&self, region: usize, busy: bool, sent: Instant, allowed: Option<bool>) {
        let now = Instant::now();
        self.max_latency_us.fetch_max(now.duration_since(sent).as_micros() as u64, Ordering::Relaxed);
        let Some(i) = self.bucket(now) else { return };
        match (busy, allowed) {
            (_, None) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            (true, Some(a)) => {
                self.busy_asked[i][region].fetch_add(1, Ordering::Relaxed);
                if a {
                    self.busy_admitted[i][region].fetch_add(1, Ordering::Relaxed);
                }
            }
            (false, Some(true)) => {
                self.quiet_admitted[i][region].fetch_add(1, Ordering::Relaxed);
            }
            (false, Some(false)) => {
                self.quiet_refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn event(&self, what: impl Into<String>) {
        let what = what.into();
        eprintln!("  {:6.1} s  {what}", self.now());
        self.events.lock().unwrap().push((self.now(), what));
    }

    /// The recording up to now, frozen.
    pub fn freeze(&self) -> Recording {
        let buckets = self.bucket(Instant::now()).unwrap_or(self.busy_admitted.len());
        let read = |v: &Vec<[AtomicU64; 3]>| -> Vec<[u64; 3]> {
            v[..buckets].iter().map(|b| [0, 1, 2].map(|r| b[r].load(Ordering::Relaxed))).collect()
        };
        Recording {
            busy_admitted: read(&self.busy_admitted),
            busy_asked: read(&self.busy_asked),
            quiet_admitted: read(&self.quiet_admitted),
            quiet_refused: self.quiet_refused.load(Ordering::Relaxed),
            refused_by: self.refused_by.each_ref().map(|a| a.load(Ordering::Relaxed)),
            errors: self.errors.load(Ordering::Relaxed),
            max_latency: Duration::from_micros(self.max_latency_us.load(Ordering::Relaxed)),
            shares: self.shares.lock().unwrap().clone(),
            events: self.events.lock().unwrap().clone(),
        }
    }
}

/// A finished recording.
pub struct Recording {
    pub busy_admitted: Vec<[u64; 3]>,
    pub busy_asked: Vec<[u64; 3]>,
    pub quiet_admitted: Vec<[u64; 3]>,
    pub quiet_refused: u64,
    /// By Redis, the deny cache, the outage fallback, fail-closed.
    pub refused_by: [u64; 4],
    pub errors: u64,
    pub max_latency: Duration,
    pub shares: Vec<(f64, [Option<u32>; 3])>,
    pub events: Vec<(f64, String)>,
}

impl Recording {
    /// The busy customer's admitted requests in every bucket, all regions.
    pub fn busy_total(&self) -> Vec<u64> {
        self.busy_admitted.iter().map(|b| b.iter().sum()).collect()
    }

    /// When an event whose text starts with `prefix` happened, in seconds.
    pub fn event_at(&self, prefix: &str) -> Option<f64> {
        self.events.iter().find(|e| e.1.starts_with(prefix)).map(|e| e.0)
    }
}
