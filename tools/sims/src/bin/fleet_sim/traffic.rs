//! Who sends what: the plans subjects are on (the seed shape's,
//! rl_sims::kit::shape), and the classes of traffic.

use std::time::Duration;

use rl_gateway::{Policy, Rule};
use rl_sims::kit::shape;

use crate::Settings;

/// The plans subjects are on, under one key prefix per phase so that each
/// phase starts from full buckets.
pub struct Plans {
    /// A big customer's plan: 100,000 a second.
    pub big: Policy,
    /// A smaller plan the first hot subject is on, below what it sends.
    pub capped: Policy,
    /// Everyone else, the abuser included.
    pub standard: Policy,
    /// Login attempts: refused outright while Redis is down.
    pub login: Policy,
}

impl Plans {
    pub fn new(phase: &str) -> Plans {
        let plan = |name: &str, rule: &str, class: shape::Class| {
            let (capacity, refill, period) = class.plan();
            let rule = Rule::new(rule, capacity, refill, Duration::from_millis(period));
            let rule = if class.fail_closed() { rule.fail_closed() } else { rule };
            Policy::builder(format!("{phase}-{name}")).rule(rule).build().expect("the plans are valid")
        };
        Plans {
            big: plan("big", "per_second", shape::Class::Hot),
            capped: plan("capped", "per_second", shape::Class::Pressing),
            standard: plan("standard", "per_second", shape::Class::Quiet),
            login: plan("login", "attempts", shape::Class::Login),
        }
    }
}

/// Who sends a request: the classes of traffic, each with its own row in
/// the tallies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Hot(usize),
    Quiet,
    Abuser,
    Login,
}

pub struct Traffic {
    pub settings: Settings,
    pub classes: Vec<(Class, f64)>,
    pub hot: Vec<String>,
    pub quiet: Vec<String>,
    pub login: Vec<String>,
}

impl Traffic {
    pub fn new(s: &Settings) -> Traffic {
        let names = |kind: &str, n: usize| (0..n).map(|i| format!("{kind}-{i}")).collect::<Vec<_>>();
        let mut classes: Vec<(Class, f64)> =
            (0..s.hot_subjects).map(|i| (Class::Hot(i), s.hot_rate / s.hot_subjects as f64)).collect();
        classes.extend([(Class::Quiet, s.quiet_rate), (Class::Abuser, s.abuser_rate), (Class::Login, s.login_rate)]);
        Traffic {
            settings: s.clone(),
            classes,
            hot: names("hot", s.hot_subjects),
            quiet: names("quiet", s.quiet_subjects),
            login: names("login", s.login_subjects),
        }
    }

    /// The row of a class in the tallies.
    pub fn row(&self, class: Class) -> usize {
        let hot = self.settings.hot_subjects;
        match class {
            Class::Hot(i) => i,
            Class::Quiet => hot,
            Class::Abuser => hot + 1,
            Class::Login => hot + 2,
        }
    }

    pub fn label(&self, class: Class) -> String {
        match class {
            Class::Hot(i) => self.hot[i].clone(),
            Class::Quiet => format!("quiet ({} subjects)", self.settings.quiet_subjects),
            Class::Abuser => "abuser".into(),
            Class::Login => format!("login ({} subjects)", self.settings.login_subjects),
        }
    }

    pub fn policy<'a>(&self, plans: &'a Plans, class: Class) -> &'a Policy {
        match class {
            Class::Hot(0) => &plans.capped,
            Class::Hot(_) => &plans.big,
            Class::Quiet | Class::Abuser => &plans.standard,
            Class::Login => &plans.login,
        }
    }

    /// A subject of the class: hot and abuser are one each; quiet and login
    /// subjects are picked at random.
    pub fn subject(&self, class: Class) -> &str {
        match class {
            Class::Hot(i) => &self.hot[i],
            Class::Quiet => &self.quiet[fastrand::usize(..self.quiet.len())],
            Class::Abuser => "abuser",
            Class::Login => &self.login[fastrand::usize(..self.login.len())],
        }
    }
}
