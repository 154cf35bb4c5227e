//! Three regions, each a real redis-server with the module (testkit), and
//! the balancers running against them.

use std::sync::{Arc, Mutex, OnceLock};

use rl_balancer::status::Status;
use rl_balancer::{Balancer, Stopped};
use testkit::Server;
use tokio::task::JoinHandle;

use crate::timing::Timing;
use crate::traffic::REGIONS;

pub fn start() -> Vec<Server> {
    REGIONS.iter().map(|_| Server::start(&[])).collect()
}

pub fn regions(servers: &[Server]) -> Vec<(String, String)> {
    REGIONS.iter().zip(servers).map(|(n, s)| (n.to_string(), s.url())).collect()
}

/// The status of every balancer started since the list was last cleared
/// (its rounds, and those whose raise waited for confirmations).
pub fn started() -> &'static Mutex<Vec<Arc<Status>>> {
    static STARTED: OnceLock<Mutex<Vec<Arc<Status>>>> = OnceLock::new();
    STARTED.get_or_init(Mutex::default)
}

/// A balancer running its loop in a task: `kill` aborts it mid-round like
/// a killed process.
pub struct Running {
    task: JoinHandle<Result<(), Stopped>>,
}

impl Running {
    pub fn start(servers: &[Server], timing: &Timing, down: &[&str]) -> Running {
        let mut config = timing.balancer(regions(servers));
        config.down = down.iter().map(|d| d.to_string()).collect();
        let balancer = Balancer::new(config).expect("a valid balancer configuration");
        started().lock().unwrap().push(balancer.status());
        Running { task: tokio::spawn(balancer.run(std::future::pending())) }
    }

    pub fn kill(self) {
        self.task.abort();
    }

    /// Whether it stopped, and why.
    pub fn stopped(&self) -> bool {
        self.task.is_finished()
    }

    pub async fn outcome(self) -> Option<Result<(), Stopped>> {
        if !self.task.is_finished() {
            self.task.abort();
            return None;
        }
        self.task.await.ok()
    }
}
