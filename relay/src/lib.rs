//! rl-relay: a lease relay for redis-rl (see relay/README.md). Gateways of
//! one data centre point their connection URL at it; it answers RL.TAKE and
//! RL.LEASE from tokens it leased from Redis for the whole group, and
//! forwards everything else.

pub mod command;
pub mod pool;
pub mod server;
pub mod stats;
pub mod upstream;
