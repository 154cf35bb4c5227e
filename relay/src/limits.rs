//! What a client of any front may send and hold: the relay's own ceilings,
//! far below Redis's (a command here is a module call of a few hundred
//! bytes; Redis allows 512 MB an argument and 1 GB a connection).

use std::time::Duration;

/// Ceilings on a client's requests and on the clients themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A command's arguments together, in bytes (an inline line too).
    pub max_request_bytes: usize,
    /// Arguments of one command.
    pub max_arguments: usize,
    /// Bytes of a connection's commands read and not yet answered; past it
    /// the relay reads no more from that connection until answers go out.
    pub max_pending_bytes: usize,
    /// Connections at once; past it a new one is answered
    /// "-ERR max number of clients reached" and closed.
    pub max_clients: usize,
    /// With credentials, how long after its accept a connection may stay
    /// unauthenticated before it is closed (it holds a `max_clients` slot).
    pub auth_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_request_bytes: 64 << 10,
            max_arguments: 1024,
            max_pending_bytes: 1 << 20,
            max_clients: 10_000,
            auth_timeout: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// What a connection is charged for a request of `bytes` (its arguments
    /// and their bookkeeping), against `max_pending_bytes`.
    pub fn charge(&self, bytes: usize, arguments: usize) -> u32 {
        let charge = bytes.saturating_add(arguments.saturating_mul(32)).min(self.max_pending_bytes);
        u32::try_from(charge).unwrap_or(u32::MAX)
    }
}
