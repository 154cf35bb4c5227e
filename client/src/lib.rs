mod client;
mod config;
mod connection;
mod decision;
mod error;
mod policy;
mod slot;

pub use client::{Bucket, Client, Window, WindowMode};
pub use config::{Backend, Config};
pub use connection::Target;
pub use decision::{Decision, Grant, Source};
pub use error::{Error, Result};
pub use policy::{FailMode, Policy, PolicyBuilder, Rule};
