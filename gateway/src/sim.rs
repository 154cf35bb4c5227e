//! Pieces of the limiter that the tree's own simulations and benchmarks run
//! apart: the circuit breaker on a virtual clock (rl-relay's scale model),
//! and the count of lock waits (the threads benchmark). A gateway needs
//! none of them; they change with the limiter.

pub use rl_client::internal::{lock_waits, Breaker, Ticket};
