//! The RLS front: Envoy's rate limit service (gRPC, `envoy.service.
//! ratelimit.v3.RateLimitService/ShouldRateLimit`) on envoyproxy/
//! ratelimit's configuration, decided by the relay against the module.

pub mod config;
