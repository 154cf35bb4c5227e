//! rl-relay: a lease relay for redis-rl (see relay/README.md). Gateways of
//! one data centre point their connection URL at it; it answers RL.TAKE and
//! RL.LEASE from tokens it leased from Redis for the whole group, and
//! forwards the module's other commands; nothing else.

pub mod auth;
pub mod command;
pub mod debug_endpoint;
pub mod files;
pub mod health;
pub mod limits;
pub mod logging;
pub mod operator_endpoint;
pub mod pool;
pub mod relay;
pub mod reply;
pub mod resp;
pub mod rls;
pub mod stats;
pub mod tls;
pub mod upstream;

pub use relay::Relay;
