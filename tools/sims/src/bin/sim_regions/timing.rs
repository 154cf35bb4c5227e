//! Compressed time: every duration of the design divided by ten, except
//! the cross-region delay, which stays real.

use std::time::Duration;

pub struct Timing {
    /// Bound of every balancer call to a region (design: 2 s).
    pub timeout: Duration,
    /// The balancer's interval (design: 10 s).
    pub interval: Duration,
    /// How often gateways read their region's table (design: 1 s).
    pub gateway_refresh: Duration,
    /// How long a gateway's read may take (design: 1 s).
    pub gateway_timeout: Duration,
    /// Gateways keep the last shares this long (design: 5 min).
    pub stale_after: Duration,
    /// Then min(last, fixed) this long, then the fixed split (design: 10 s).
    /// Not compressed ten times: it must outlast the spread of one round's
    /// writes (two calls and the barrier), and the calls carry the
    /// uncompressed cross-region delay.
    pub settle: Duration,
    /// A region unreachable this long gives up what it cannot hold (design: 60 s).
    pub grace: Duration,
    /// Injected before every balancer call to a region, ms (design: measured 70-150 ms).
    pub delay: (Duration, Duration),
}

impl Timing {
    pub fn compressed() -> Timing {
        Timing {
            timeout: Duration::from_millis(500),
            interval: Duration::from_secs(1),
            gateway_refresh: Duration::from_millis(100),
            gateway_timeout: Duration::from_millis(200),
            stale_after: Duration::from_secs(30),
            settle: Duration::from_secs(2),
            grace: Duration::from_secs(6),
            delay: (Duration::from_millis(70), Duration::from_millis(150)),
        }
    }

    /// The balancer's configuration for these regions.
    pub fn balancer(&self, regions: Vec<(String, String)>) -> rl_balancer::Config {
        let names: Vec<String> = regions.iter().map(|r| r.0.clone()).collect();
        let rules = rl_balancer::rules::from_spec(&crate::rules::rules(), &names).expect("the rules span the regions");
        rl_balancer::Config {
            interval: self.interval,
            gateway_refresh: self.gateway_refresh,
            gateway_timeout: self.gateway_timeout,
            stale_after: self.stale_after,
            settle: self.settle,
            grace: self.grace,
            timeout: self.timeout,
            delay: Some(self.delay),
            ..rl_balancer::Config::new(regions, rules)
        }
    }
}
