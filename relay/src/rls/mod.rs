//! The RLS front: Envoy's rate limit service (gRPC, `envoy.service.
//! ratelimit.v3.RateLimitService/ShouldRateLimit`) on envoyproxy/
//! ratelimit's configuration, decided by the relay against the module,
//! beside the RESP front and sharing its pools, its connection to Redis,
//! its bounds and its readiness (docs/envoy.md).
//!
//! config/      the YAML files: read, refused, matched
//! keys.rs      a descriptor's counter key
//! windows.rs   fixed-window leases and the deny cache, pure
//! fallback.rs  the local stand-ins while Redis cannot answer
//! decide.rs    one request's limits, all or nothing
//! slots.rs     algorithm: concurrency (RL.ACQUIRE / RL.RELEASE)
//! service.rs   ShouldRateLimit: bounds, matching, the answer
//! headers.rs   response headers (the draft's, envoyproxy/ratelimit's)
//! stats.rs     statistics under envoyproxy/ratelimit's names
//! statsd.rs    the same sent to statsd (USE_STATSD)
//! watch.rs     the config reloaded when a file changes
//! serve.rs     the listener, its bounds, gRPC health
//! socket.rs    its TCP or Unix socket (GRPC_UDS); its TLS is ../tls.rs
//! upstream_env.rs  envoyproxy/ratelimit's environment variables as flags
//! upstream_answer.rs  its quota mode and dynamic metadata on an answer
//! xds.rs       the config over xDS (CONFIG_TYPE=GRPC_XDS_SOTW)
//! xds_proto.rs its messages (rls_conf.proto), read as YAML files

pub mod config;
pub mod decide;
pub mod fallback;
pub mod headers;
pub mod keys;
pub mod serve;
pub mod service;
pub mod slots;
pub mod socket;
pub mod stats;
pub mod statsd;
pub mod upstream_answer;
pub mod upstream_env;
pub mod watch;
pub mod windows;
pub mod xds;
pub mod xds_proto;

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use config::RlsConfig;
use decide::Engine;
use stats::Stats;

use crate::auth::constant_time_eq;
use crate::Relay;

/// How the RLS front runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// `--rls-config`: a file or a directory.
    pub config_path: PathBuf,
    /// Files naming the same domain are merged (else refused).
    pub merge_domains: bool,
    /// Before every counter key.
    pub prefix: String,
    /// Longest a decision waits for Redis before the failure modes answer.
    pub timeout: Duration,
    pub headers: headers::Style,
    /// Every OVER_LIMIT answered OK (statuses kept), as envoyproxy/
    /// ratelimit's SHADOW_MODE.
    pub global_shadow: bool,
    /// A shared secret the caller must send (`authorization: Bearer ...`).
    pub token: Option<String>,
    /// How often the config files are looked at.
    pub poll: Duration,
    /// Hits past this share of a limit count as near_limit.
    pub near_limit_ratio: f64,
    /// Ready with a config of no domain (envoyproxy/ratelimit's default).
    pub ready_without_config: bool,
    /// Every limit in quota mode (envoyproxy/ratelimit's QUOTA_MODE).
    pub quota_mode: bool,
    /// Answers carry `dynamic_metadata` (its RESPONSE_DYNAMIC_METADATA).
    pub dynamic_metadata: bool,
    /// Served over TLS (its GRPC_SERVER_USE_TLS).
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// `--rls-stop-increment-when-overlimit`: usage reported on a limit
    /// already over counts nothing (envoyproxy/ratelimit's
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
    pub stop_increment_when_overlimit: bool,
    /// The statistics sent to statsd too (its USE_STATSD).
    pub statsd: Option<Arc<statsd::Statsd>>,
    /// The config over xDS instead of `config_path`'s files.
    pub xds: Option<xds::XdsOptions>,
}

impl Default for Options {
    /// The flags' defaults, on `rls.yaml`.
    fn default() -> Options {
        Options {
            config_path: "rls.yaml".into(),
            merge_domains: false,
            prefix: "rl:rls:".into(),
            timeout: Duration::from_millis(15),
            headers: headers::Style::default(),
            global_shadow: false,
            token: None,
            poll: Duration::from_secs(1),
            near_limit_ratio: 0.8,
            ready_without_config: false,
            quota_mode: false,
            dynamic_metadata: false,
            tls: None,
            stop_increment_when_overlimit: false,
            statsd: None,
            xds: None,
        }
    }
}

/// The RLS front's state.
pub struct Rls {
    pub engine: Arc<Engine>,
    config: RwLock<Arc<RlsConfig>>,
    pub options: Options,
    pub stats: Stats,
    /// A descriptor of the config in force is in quota mode.
    quota_in_config: std::sync::atomic::AtomicBool,
    /// SIGTERM came: not ready, calls in flight finishing (main.rs).
    pub draining: std::sync::atomic::AtomicBool,
    /// Told when the front's listener is closed (serve.rs), so a drain
    /// says "not ready" only once no new connection can come.
    pub listener_closed: tokio::sync::Notify,
    /// Over xDS, until a first version is applied (unless started
    /// without a config): not ready.
    first_config_pending: std::sync::atomic::AtomicBool,
}

impl Rls {
    /// The front with its first config (read and checked by the caller).
    pub fn new(relay: Arc<Relay>, cluster: bool, config: RlsConfig, options: Options) -> Rls {
        let mut stats = Stats::default();
        stats.near_limit_ratio = Some(options.near_limit_ratio);
        stats.statsd = options.statsd.clone().map(|s| s as Arc<dyn stats::Sink>);
        // The files read at start are a load; over xDS, the first version is.
        if options.xds.is_none() {
            stats.config_load_success.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let first_config_pending = options.xds.as_ref().is_some_and(|x| !x.force_start).into();
        let quota_in_config = upstream_answer::quota_anywhere(&config).into();
        Rls {
            engine: Arc::new(Engine::new(relay, cluster, options.stop_increment_when_overlimit)),
            config: RwLock::new(Arc::new(config)),
            options,
            stats,
            quota_in_config,
            draining: false.into(),
            listener_closed: tokio::sync::Notify::new(),
            first_config_pending,
        }
    }

    pub fn relay(&self) -> &Arc<Relay> {
        &self.engine.relay
    }

    /// The config in force.
    pub fn config(&self) -> Arc<RlsConfig> {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_config(&self, config: RlsConfig) {
        let quota = upstream_answer::quota_anywhere(&config);
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        self.quota_in_config.store(quota, std::sync::atomic::Ordering::Relaxed);
    }

    /// Ready: a config with a domain is in force (or any config, with
    /// `ready_without_config`; over xDS, once one came), Redis answers the
    /// relay's probe, and no SIGTERM came.
    pub fn ready(&self) -> bool {
        !self.draining.load(std::sync::atomic::Ordering::Relaxed)
            && !self.first_config_pending.load(std::sync::atomic::Ordering::Relaxed)
            && (self.options.ready_without_config || !self.config().domains.is_empty())
            && self.relay().health.ready()
    }

    /// Whether the module's commands go to Redis as rl-client's Lua
    /// scripts (`--redis-backend lua`, or `auto` finding no module).
    pub fn on_lua(&self) -> bool {
        self.relay().backend().current() == Some(crate::upstream::Backend::Lua)
    }

    /// Whether a call's metadata carries the token (when one is set).
    fn authorized(&self, metadata: &tonic::metadata::MetadataMap) -> bool {
        self.authorized_by(metadata.get("authorization").and_then(|v| v.to_str().ok()))
    }

    /// Whether an `authorization` value carries the token (when one is
    /// set): `Bearer TOKEN`, the scheme in any case (RFC 7235).
    pub fn authorized_by(&self, authorization: Option<&str>) -> bool {
        let Some(token) = &self.options.token else { return true };
        constant_time_eq(bearer(authorization.unwrap_or_default()).as_bytes(), token.as_bytes())
    }

    /// The RLS front's part of /metrics.
    pub fn metrics(&self) -> String {
        let config = self.config();
        let windows = self.engine.windows();
        let gauges = [
            ("rl_relay_rls_ready", "1 while a config is in force and Redis answers, else 0", u64::from(self.ready())),
            (
                "rl_relay_rls_connections",
                "connections open on the RLS front; past rl_relay_rls_max_connections new ones wait",
                self.stats.connections.load(std::sync::atomic::Ordering::Relaxed),
            ),
            (
                "rl_relay_rls_health_connections",
                "token-less connections kept past --auth-timeout-ms for health checks only, apart from \
                 rl_relay_rls_max_connections",
                self.stats.health_connections.load(std::sync::atomic::Ordering::Relaxed),
            ),
            (
                "rl_relay_rls_max_connections",
                "--max-clients of the RLS front (fitted to the open-file limit)",
                self.relay().limits.max_clients as u64,
            ),
            ("rl_relay_rls_domains", "domains of the config in force", config.domains.len() as u64),
            (
                "rl_relay_rls_limits_beyond_backend",
                "limits of the config in force the Redis backend in force cannot count (the Lua scripts' bounds, \
                 after --redis-backend auto chose them): each answered by its failure mode",
                if self.on_lua() { config.beyond_lua().len() as u64 } else { 0 },
            ),
            ("rl_relay_rls_config_files", "files of the config in force", config.files.len() as u64),
            ("rl_relay_rls_windows", "windows held in memory (leases, refusals)", windows.len() as u64),
            ("rl_relay_rls_window_evictions", "windows dropped to make room", windows.evictions()),
            (
                "rl_relay_rls_window_time",
                "1 while RL.WINDOW gives the server's reading (TIME), 0 since a module older than it refused (tried \
                 again every minute): a refused request's windows counted in other calls are then not given back",
                u64::from(self.engine.window_time_taken()),
            ),
            (
                "rl_relay_rls_xds_connected",
                "1 while the config stream to the xDS server (--rls-xds) is open, else 0",
                self.stats.xds_connected.load(std::sync::atomic::Ordering::Relaxed),
            ),
        ];
        drop(windows);
        self.stats.metrics(&self.engine.counters, &gauges)
    }
}

/// The credentials of a `Bearer` authorization (empty for another scheme).
fn bearer(authorization: &str) -> &str {
    match authorization.split_once(' ') {
        Some((scheme, credentials)) if scheme.eq_ignore_ascii_case("bearer") => credentials.trim_start_matches(' '),
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::bearer;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for sent in ["Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR  s3cret"] {
            assert_eq!(bearer(sent), "s3cret", "{sent}");
        }
        for sent in ["Basic s3cret", "Bearers3cret", "s3cret", "", "Bearer", "Token s3cret"] {
            assert_eq!(bearer(sent), "", "{sent}");
        }
        // The token's own case is kept.
        assert_eq!(bearer("bearer S3CRET"), "S3CRET");
    }
}
