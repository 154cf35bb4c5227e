//! The native data types that hold limiter state in the keyspace.

pub mod bucket_type;
