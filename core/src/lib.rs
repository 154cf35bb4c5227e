//! The algorithms of redis-rl, free of any Redis type.
//!
//! Time is always a parameter (milliseconds since the Unix epoch), so every
//! rule here is tested with an explicit clock, without a server. The module
//! crate parses arguments, reads the server clock, loads state, calls these
//! functions and writes back what they return.

pub mod acquire;
pub mod bucket;
pub mod codec;
pub mod combine;
pub mod deny;
pub mod exact_log;
pub mod fallback;
pub mod gcra;
pub mod inflight;
pub mod lease;
pub mod limits;
pub mod ratelimit_header;
pub mod window;

pub use acquire::{acquire, acquire_in_place, force, peek, refund, BucketOp, BucketOutcome, BucketUpdate};
pub use bucket::{BucketParams, BucketState};
pub use combine::{Reply, INLINE};
pub use limits::ParamError;
pub use window::WindowMode;
