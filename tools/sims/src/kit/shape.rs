//! The seed traffic shape, per 300 gateways: one hot subject pressing a
//! 10,000/s plan and three on 100,000/s plans, each sent 25,000 requests a
//! second; 5,000 quiet subjects at 2 a second on 10/s plans; an abuser at
//! 10,000 a second on a 10/s plan; 100 login subjects at 2 a second on 30 a
//! minute, fail-closed. `make sim` runs it on 300 real gateways (its
//! defaults); the scale model multiplies the subjects with the fleet and
//! checks itself against `make sim`'s report, row by row ([`Class::row`]).

/// The classes of subjects, in the reports' order.
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

    /// Subjects per 300 gateways.
    pub const fn per_300(self) -> u32 {
        [1, 3, 5000, 1, 100][self as usize]
    }

    /// Requests a second to one subject.
    pub const fn rate(self) -> f64 {
        [25_000.0, 25_000.0, 2.0, 10_000.0, 2.0][self as usize]
    }

    /// Requests a second to the class's subjects together, at 300 gateways.
    pub const fn rate_per_300(self) -> f64 {
        self.per_300() as f64 * self.rate()
    }

    /// Its plan: capacity, refill, period in ms.
    pub const fn plan(self) -> (u64, u64, u64) {
        [(10_000, 10_000, 1000), (100_000, 100_000, 1000), (10, 10, 1000), (10, 10, 1000), (30, 30, 60_000)]
            [self as usize]
    }

    /// Refused outright while Redis cannot answer.
    pub const fn fail_closed(self) -> bool {
        matches!(self, Class::Login)
    }

    /// Its row in `make sim`'s table of where the leases phase's calls go,
    /// which the scale model reads back.
    pub const fn row(self) -> &'static str {
        ["hot, pressing its limit", "hot, within its limit", "quiet", "abuser", "logins"][self as usize]
    }
}
