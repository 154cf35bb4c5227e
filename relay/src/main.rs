//! `rl-relay`: the lease relay's binary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rl_relay::auth::{self, Credentials};
use rl_relay::limits::Limits;
use rl_relay::logging::{self, line, redact};
use rl_relay::operator_endpoint::Pages;
use rl_relay::pool::{Pools, Settings};
use rl_relay::relay::{Options, Relay};
use rl_relay::rls::socket::Listener;
use rl_relay::rls::{upstream_env, Rls};
use rl_relay::upstream::{Backend, Choice, Upstream};
use tokio::net::TcpListener;

/// Descriptors kept for the relay's own use (its listeners, its connections
/// to Redis, the metrics endpoint's clients) below the open-file limit.
const RESERVED_FDS: u64 = 32 + rl_relay::operator_endpoint::MAX_CONNECTIONS as u64;

/// A lease relay for redis-rl: gateways connect to it as to Redis.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    /// Address gateways connect to (127.0.0.1:6380 unless started with
    /// envoyproxy/ratelimit's environment, where only the Envoy front serves
    /// unless this is given).
    #[arg(long)]
    listen: Option<String>,
    /// Read envoyproxy/ratelimit's environment variables (as when started with
    /// no argument), the flags given winning over them (docs/envoy.md).
    #[arg(long)]
    envoyproxy_env: bool,
    /// Redis URL (repeat with --cluster for a cluster's seed nodes).
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis: Vec<String>,
    /// The --redis URLs are nodes of a Redis Cluster.
    #[arg(long)]
    cluster: bool,
    /// What carries the module's commands out on Redis: module (the redis-rl module; without it the relay
    /// is not ready), lua (rl-client's Lua scripts, for a Redis that cannot load modules) or auto (the
    /// module if Redis has it, else the scripts: decided by the first probe Redis answers, and logged).
    #[arg(long, env = "RL_REDIS_BACKEND", default_value = "module", value_parser = Backend::parse)]
    redis_backend: Backend,
    /// For rediss:// URLs: PEM file of the CA that signed Redis's
    /// certificates, trusted instead of the system roots (SSL_CERT_FILE).
    #[arg(long, env = "RL_TLS_CA_FILE", value_name = "FILE")]
    tls_ca_file: Option<PathBuf>,
    /// For rediss:// URLs: PEM file of the client certificate, for a Redis
    /// that requires one (tls-auth-clients yes); with --tls-key-file.
    #[arg(long, env = "RL_TLS_CERT_FILE", value_name = "FILE")]
    tls_cert_file: Option<PathBuf>,
    /// For rediss:// URLs: PEM file of the client certificate's key.
    #[arg(long, env = "RL_TLS_KEY_FILE", value_name = "FILE")]
    tls_key_file: Option<PathBuf>,
    /// For rediss:// URLs: accept any certificate Redis shows, unverified.
    /// Tests only: anyone on the path can read and change the calls.
    #[arg(long, env = "RL_TLS_INSECURE")]
    tls_insecure: bool,
    /// Relays sharing the limits (one per data centre group): a batch is
    /// the relay's share, rate / relays.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    relays: u32,
    /// A batch is this many ms of the relay's share of the rate.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    lease_window_ms: u64,
    /// Held tokens unspent this long after their last grant are dropped.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    lease_ttl_ms: u64,
    /// Longest wait for Redis; past it the gateway gets a TRYAGAIN error.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
    /// Most subjects held; past it a new subject takes an idle one's place,
    /// or is forwarded.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    max_subjects: u64,
    /// Longest a refusal from Redis is remembered (then Redis is asked
    /// again), whatever retry time it named.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    max_refusal_hold_ms: u64,
    /// Clients' credentials: a file of `PASSWORD` or `USER PASSWORD` lines
    /// (or the RL_RELAY_AUTH variable, one such entry). Without either,
    /// clients are served unauthenticated.
    #[arg(long)]
    auth_file: Option<PathBuf>,
    /// With credentials: a connection not authenticated this long after it
    /// was accepted is closed (it holds a --max-clients slot). On the RLS
    /// front: a connection that completed no call (with the token, when
    /// --rls-token-file is set) this long after its accept is closed, and a
    /// call whose body has not all arrived this long after its headers fails.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    auth_timeout_ms: u64,
    /// Most client connections at once (lowered to fit the open-file limit).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_clients: u64,
    /// Longest command, its arguments together (an inline line too).
    #[arg(long, default_value_t = 64 << 10, value_parser = clap::value_parser!(u64).range(64..=(64 << 20)))]
    max_request_bytes: u64,
    /// Most arguments of a command.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(8..=1_000_000))]
    max_arguments: u64,
    /// Most bytes of a connection's commands read and not yet answered.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1024..=(1 << 30)))]
    max_pending_bytes: u64,
    /// Subjects by their keys in INFO and metrics (else hash tags hashed).
    #[arg(long)]
    show_subjects: bool,
    /// Serve /metrics, /ready and /live over HTTP on this address.
    #[arg(long)]
    metrics: Option<String>,
    /// The same endpoint on another address too (envoyproxy/ratelimit's
    /// PROMETHEUS_ADDR).
    #[arg(long)]
    prometheus_listen: Option<String>,
    /// Serve the debug port here: /rlconfig, the RLS config in force as envoyproxy/ratelimit prints it
    /// (DEBUG_HOST:DEBUG_PORT). For operators: it shows the config's descriptor values. An address it
    /// cannot bind is logged and the relay serves without it, as upstream.
    #[arg(long)]
    debug_listen: Option<String>,
    /// Log lines as text, or json: one object a line as envoyproxy/ratelimit's LOG_FORMAT=json writes them.
    #[arg(long, default_value = "text")]
    log_format: String,
    /// error (or panic, fatal): only the lines of errors that end the process; warn, info, debug, trace: every
    /// line (envoyproxy/ratelimit's LOG_LEVEL).
    #[arg(long, default_value = "warn")]
    log_level: String,
    #[command(flatten)]
    resp_tls: RespTlsArgs,
    #[command(flatten)]
    rls: RlsArgs,
}

/// The RESP front over TLS, for gateways that reach it across the network
/// with `rediss://` (docs/relay.md "TLS on the RESP front").
#[derive(clap::Args, Debug)]
struct RespTlsArgs {
    /// Serve the RESP front over TLS only, with this certificate chain (PEM; reloaded when it changes).
    #[arg(long, env = "RL_RELAY_RESP_TLS_CERT", value_name = "FILE", requires = "resp_tls_key")]
    resp_tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "RL_RELAY_RESP_TLS_KEY", value_name = "FILE", requires = "resp_tls_cert")]
    resp_tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate this CA (PEM) signed.
    #[arg(long, env = "RL_RELAY_RESP_TLS_CLIENT_CA", value_name = "FILE", requires = "resp_tls_cert")]
    resp_tls_client_ca: Option<PathBuf>,
}

/// The RLS front (Envoy's rate limit service, relay/README.md "Behind Envoy").
#[derive(clap::Args, Debug)]
struct RlsArgs {
    /// Serve Envoy's rate limit service (gRPC) on this address (HOST:PORT), or on a Unix socket
    /// (unix:PATH, envoyproxy/ratelimit's GRPC_UDS); its config from --rls-config or --rls-xds.
    #[arg(long)]
    rls_listen: Option<String>,
    /// envoyproxy/ratelimit's config: a YAML file, or a directory of them (watched).
    #[arg(long, requires = "rls_listen", conflicts_with = "rls_xds")]
    rls_config: Option<PathBuf>,
    /// The config over xDS instead (CONFIG_TYPE=GRPC_XDS_SOTW): the ADS server, host:port.
    #[arg(long, requires = "rls_listen")]
    rls_xds: Option<String>,
    /// The node id sent to the xDS server (CONFIG_GRPC_XDS_NODE_ID).
    #[arg(long, default_value = "default", requires = "rls_xds")]
    rls_xds_node_id: String,
    /// The node's metadata, key=value,... (CONFIG_GRPC_XDS_NODE_METADATA).
    #[arg(long, default_value = "", requires = "rls_xds")]
    rls_xds_node_metadata: String,
    /// Headers sent with the xDS stream, name:value,... (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
    #[arg(long, default_value = "", requires = "rls_xds")]
    rls_xds_headers: String,
    /// TLS to the xDS server (CONFIG_GRPC_XDS_SERVER_USE_TLS): its CA from --rls-xds-tls-ca, else the system's.
    #[arg(long, requires = "rls_xds")]
    rls_xds_tls: bool,
    /// Mutual TLS: the client certificate (PEM) shown to the xDS server (CONFIG_GRPC_XDS_CLIENT_TLS_CERT).
    #[arg(long, requires_all = ["rls_xds_tls", "rls_xds_tls_key"])]
    rls_xds_tls_cert: Option<PathBuf>,
    /// Its private key (PEM; CONFIG_GRPC_XDS_CLIENT_TLS_KEY).
    #[arg(long, requires_all = ["rls_xds_tls", "rls_xds_tls_cert"])]
    rls_xds_tls_key: Option<PathBuf>,
    /// The CA (PEM) the xDS server's certificate must chain to (CONFIG_GRPC_XDS_SERVER_TLS_CACERT).
    #[arg(long, requires = "rls_xds_tls")]
    rls_xds_tls_ca: Option<PathBuf>,
    /// The DNS name the xDS server's certificate must be valid for, else the URL's host
    /// (CONFIG_GRPC_XDS_SERVER_TLS_SAN).
    #[arg(long, requires = "rls_xds_tls")]
    rls_xds_tls_san: Option<String>,
    /// The wait before trying again to connect to the xDS server, jittered
    /// (CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL).
    #[arg(long, default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    rls_xds_connect_retry_ms: u64,
    /// The first wait before opening again a config stream that failed to the xDS server, doubled at each failure
    /// (XDS_CLIENT_BACKOFF_INITIAL_INTERVAL).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    rls_xds_backoff_initial_ms: u64,
    /// The longest wait (XDS_CLIENT_BACKOFF_MAX_INTERVAL).
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    rls_xds_backoff_max_ms: u64,
    /// The largest response read from the xDS server (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES; gRPC's 4 MiB).
    #[arg(long, default_value_t = 4 << 20, value_parser = clap::value_parser!(u64).range(1024..=(64 << 20)))]
    rls_xds_max_message_bytes: u64,
    /// Files naming the same domain are merged (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); else refused.
    #[arg(long)]
    rls_merge_domains: bool,
    /// Before every counter key the RLS front makes (under the relay ACL recipe's `~rl:*`); RESP clients
    /// are refused every key under it, on every relay.
    #[arg(long, default_value = "rl:rls:")]
    rls_prefix: String,
    /// Longest a decision waits for Redis before the failure modes answer.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    rls_timeout_ms: u64,
    /// Response headers: off (as envoyproxy/ratelimit by default), draft (RateLimit, RateLimit-Policy,
    /// Retry-After) or envoyproxy (RateLimit-Limit, -Remaining, -Reset).
    #[arg(long, default_value = "off", value_parser = rl_relay::rls::headers::Style::parse)]
    rls_headers: rl_relay::rls::headers::Style,
    /// Answer every OVER_LIMIT as OK (statuses kept), as envoyproxy/ratelimit's SHADOW_MODE.
    #[arg(long)]
    rls_shadow_mode: bool,
    /// A file holding a token callers must send as `authorization: Bearer TOKEN`.
    #[arg(long)]
    rls_token_file: Option<PathBuf>,
    /// Hits admitted past this share of a limit count as near_limit (envoyproxy/ratelimit's NEAR_LIMIT_RATIO).
    #[arg(long, default_value_t = 0.8, value_parser = near_limit_ratio)]
    rls_near_limit_ratio: f64,
    /// The names of `--rls-headers envoyproxy`'s three headers: LIMIT,REMAINING,RESET.
    #[arg(long, default_value = "RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset", value_parser = rl_relay::rls::headers::Names::parse)]
    rls_header_names: rl_relay::rls::headers::Names,
    /// Ready with a config of no domain (envoyproxy/ratelimit's default; else not ready until one is loaded).
    #[arg(long)]
    rls_ready_without_config: bool,
    /// Start on a missing or empty --rls-config folder, unknown domains answered OK until files come;
    /// with --rls-xds, ready before the first version (envoyproxy/ratelimit's FORCE_START_WITHOUT_INITIAL_CONFIG).
    #[arg(long)]
    rls_start_without_config: bool,
    /// Every limit in quota mode, as `quota_mode: true` makes one (envoyproxy/ratelimit's QUOTA_MODE).
    #[arg(long)]
    rls_quota_mode: bool,
    /// Answers carry dynamic_metadata: the request and the config's metadata of the limits that admitted it
    /// (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA).
    #[arg(long)]
    rls_dynamic_metadata: bool,
    /// Serve the RLS front over TLS with this certificate chain (PEM; envoyproxy/ratelimit's GRPC_SERVER_TLS_CERT).
    #[arg(long, requires = "rls_tls_key")]
    rls_tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "rls_tls_cert")]
    rls_tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate this CA (PEM) signed (GRPC_CLIENT_TLS_CACERT).
    #[arg(long, requires = "rls_tls_cert")]
    rls_tls_client_ca: Option<PathBuf>,
    /// With --rls-tls-client-ca: the DNS name a client certificate must be valid for (GRPC_CLIENT_TLS_SAN).
    #[arg(long, requires = "rls_tls_client_ca")]
    rls_tls_client_san: Option<String>,
    /// Usage reported on a limit already over counts nothing (envoyproxy/ratelimit's
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); by default it counts in full (docs/token-budgets.md).
    #[arg(long)]
    rls_stop_increment_when_overlimit: bool,
    /// Send the RLS front's statistics to this statsd server (HOST:PORT, UDP) under envoyproxy/ratelimit's
    /// names (its USE_STATSD, STATSD_HOST, STATSD_PORT); /metrics stays.
    #[arg(long)]
    rls_statsd: Option<String>,
    /// On SIGTERM (or SIGINT): the longest wait for the calls in flight and the Redis calls they started
    /// (refunds) before the relay exits 0; meanwhile it is not ready and accepts no connection.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    rls_drain_timeout_ms: u64,
    /// With --rls-statsd: tags in every name as key:value,key:value (envoyproxy/ratelimit's EXTRA_TAGS).
    #[arg(long, default_value = "", requires = "rls_statsd")]
    rls_statsd_tags: String,
    /// With --rls-statsd: counters sent every this many ms (envoyproxy/ratelimit's STATS_FLUSH_INTERVAL).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    rls_statsd_flush_interval_ms: u64,
}

fn near_limit_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("'{text}': a ratio from 0 to 1")),
    }
}

#[tokio::main]
async fn main() {
    let (args, warning) = match parse() {
        Ok(parsed) => parsed,
        Err(e) => {
            logging::error(e);
            std::process::exit(2);
        }
    };
    if let Err(e) = logging::configure(&args.log_format, &args.log_level) {
        logging::error(format_args!("--log-format/--log-level: {e}"));
        std::process::exit(2);
    }
    if let Some(warning) = warning {
        line(warning);
    }
    if let Err(e) = run(args).await {
        logging::error(e);
        std::process::exit(2);
    }
}

/// The command line; with no argument or `--envoyproxy-env`, after the
/// flags envoyproxy/ratelimit's environment comes to (the command line's
/// own win), and the warning naming its variables set and not served.
fn parse() -> Result<(Args, Option<String>), String> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let given = &argv[1.min(argv.len())..];
    if !given.is_empty() && !given.iter().any(|a| a == "--envoyproxy-env") {
        return Ok((Args::parse(), None));
    }
    // Its refusal written as LOG_FORMAT asks, when it can be read.
    let variable = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let _ = logging::configure(&variable("LOG_FORMAT").unwrap_or("text".into()), "warn");
    let translated = upstream_env::translate(&|name| std::env::var(name).ok())?;
    let names: Vec<String> = given.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let program = argv.first().cloned().unwrap_or_else(|| "rl-relay".into());
    let mut words: Vec<std::ffi::OsString> = vec![program, "--envoyproxy-env".into()];
    words.extend(translated.args(&names).into_iter().map(Into::into));
    words.extend(given.iter().cloned());
    // A value clap refuses is written as LOG_FORMAT asks too (help and
    // version print as clap prints them).
    match Args::try_parse_from(words) {
        Ok(args) => Ok((args, translated.warning())),
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => Err(e.render().to_string().trim_start_matches("error: ").trim_end().to_string()),
    }
}

async fn run(args: Args) -> Result<(), String> {
    let signals = termination()?;
    let credentials = Credentials::load(args.auth_file.as_deref(), std::env::var(auth::ENV).ok())?;
    let urls: Vec<String> = args.redis.iter().map(|u| redact(u)).collect();
    let timeout = Duration::from_millis(args.timeout_ms);
    let tls = rl_client::Tls {
        ca_file: args.tls_ca_file.clone(),
        cert_file: args.tls_cert_file.clone(),
        key_file: args.tls_key_file.clone(),
        insecure: args.tls_insecure,
    };
    let backend = Choice::new(args.redis_backend);
    let upstream = Upstream::open(&args.redis, args.cluster, &tls, timeout)
        .map_err(|e| format!("--redis {urls:?}: {e}"))?
        .on(&backend);
    let probe =
        Upstream::probe(&args.redis, args.cluster, &tls).map_err(|e| format!("--redis {urls:?}: {e}"))?.on(&backend);
    line(match args.redis_backend {
        Backend::Module => "--redis-backend module: the redis-rl module's commands (Redis must have the module loaded)",
        Backend::Lua => "--redis-backend lua: rl-client's Lua scripts, no module needed (docs/error-bounds.md)",
        Backend::Auto => "--redis-backend auto: the module if Redis has it, else the Lua scripts, decided at start",
    });
    if args.max_request_bytes > args.max_pending_bytes {
        return Err(format!(
            "--max-request-bytes {} is above --max-pending-bytes {}: a command could never be read",
            args.max_request_bytes, args.max_pending_bytes
        ));
    }
    // The RESP front: always, but as envoyproxy/ratelimit's drop-in unless asked for.
    let listen = match (&args.listen, args.envoyproxy_env) {
        (Some(address), _) => Some(address.clone()),
        (None, false) => Some("127.0.0.1:6380".to_string()),
        (None, true) => None,
    };
    let fronts = u64::from(listen.is_some()) + u64::from(args.rls.rls_listen.is_some());
    let limits = Limits {
        max_request_bytes: args.max_request_bytes as usize,
        max_arguments: args.max_arguments as usize,
        max_pending_bytes: args.max_pending_bytes as usize,
        max_clients: fit_max_clients(args.max_clients, fronts.max(1)) as usize,
        auth_timeout: Duration::from_millis(args.auth_timeout_ms),
    };
    let settings = Settings {
        window_ms: args.lease_window_ms,
        ttl_ms: args.lease_ttl_ms,
        relays: args.relays,
        max_subjects: args.max_subjects as usize,
        max_hold_ms: args.max_refusal_hold_ms,
    };
    let options = Options { timeout, limits, credentials, show_subjects: args.show_subjects };
    let relay = Arc::new(Relay::new(Pools::new(settings), upstream, options));
    let listener = match &listen {
        Some(address) => Some(TcpListener::bind(address).await.map_err(|e| format!("--listen {address}: {e}"))?),
        None => None,
    };
    let fence = rl_relay::resp::fence::Fence::new(&args.rls.rls_prefix)?;
    let resp_tls = resp_tls(&args.resp_tls, listen.is_some())?;
    let rls = rls_front(&args, &relay).await?;
    for (flag, address) in [("--metrics", &args.metrics), ("--prometheus-listen", &args.prometheus_listen)] {
        let Some(address) = address else { continue };
        let metrics = TcpListener::bind(address).await.map_err(|e| format!("{flag} {address}: {e}"))?;
        let front = rls.as_ref().map(|(r, _)| r.clone());
        tokio::spawn(rl_relay::operator_endpoint::serve(relay.clone(), metrics, front, Pages::Operator));
    }
    if let Some(address) = &args.debug_listen {
        match TcpListener::bind(address).await {
            Ok(debug) => {
                let front = rls.as_ref().map(|(r, _)| r.clone());
                tokio::spawn(rl_relay::operator_endpoint::serve(relay.clone(), debug, front, Pages::Debug));
            }
            Err(e) => line(format_args!("--debug-listen {address}: {e}: serving without the debug port")),
        }
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let rls = rls.map(|(rls, listener)| {
        let front = rls.clone();
        let task = tokio::spawn(async move {
            let mut stopped = stopped;
            let stop = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = rl_relay::rls::serve::serve(front, listener, stop).await {
                logging::error(e);
                std::process::exit(2);
            }
        });
        (rls, task)
    });
    tokio::spawn(relay.clone().probe_forever(probe));
    match listener {
        Some(listener) => {
            let local = listener.local_addr().map_err(|e| e.to_string())?;
            let auth = if relay.credentials.required() { "clients authenticate" } else { "no client authentication" };
            let over = match &resp_tls {
                Some(tls) if tls.mutual() => ", over TLS only (clients show a certificate the client CA signed)",
                Some(_) => ", over TLS only",
                None => "",
            };
            let max = limits.max_clients;
            line(format_args!("listening on {local}{over} for {}, {auth}, at most {max} clients", urls.join(" ")));
            tokio::spawn(rl_relay::resp::serve(relay, listener, fence, resp_tls));
        }
        None => line(format_args!("serving the Envoy front only, for {}", urls.join(" "))),
    }
    let signal = signals.await;
    drain(signal, rls, stop, Duration::from_millis(args.rls.rls_drain_timeout_ms)).await;
    Ok(())
}

/// SIGTERM or SIGINT, once either comes (the handlers installed at once).
fn termination() -> Result<impl std::future::Future<Output = &'static str>, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM's handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT's handler: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// After `signal`, as envoyproxy/ratelimit (its health turns failed, its
/// gRPC server stops gracefully): the Envoy front is not ready, accepts no
/// connection, answers the calls in flight, and the Redis calls they
/// started in the background (refunds) are answered, all within `bound`;
/// then the process exits 0. The RESP front's connections end with it.
async fn drain(
    signal: &str,
    rls: Option<(Arc<Rls>, tokio::task::JoinHandle<()>)>,
    stop: tokio::sync::watch::Sender<bool>,
    bound: Duration,
) {
    let Some((rls, task)) = rls else {
        line(format_args!("{signal}: exiting"));
        return;
    };
    let ms = bound.as_millis();
    line(format_args!(
        "{signal}: draining the Envoy front: not ready, no new connection, the calls in flight answered (at most \
         {ms} ms, --rls-drain-timeout-ms)"
    ));
    let deadline = tokio::time::Instant::now() + bound;
    // The listener closed first: once /healthcheck says 500, a new
    // connection is refused (tonic drops it on the stop, in its own task).
    let _ = stop.send(true);
    let _ = tokio::time::timeout_at(deadline, rls.listener_closed.notified()).await;
    rls.draining.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered = tokio::time::timeout_at(deadline, task).await.is_ok();
    let background = || rls.engine.background.load(std::sync::atomic::Ordering::Relaxed);
    while background() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match (answered, background()) {
        (true, 0) => line(format_args!("{signal}: drained, exiting")),
        (answered, left) => line(format_args!(
            "{signal}: {ms} ms passed (--rls-drain-timeout-ms): exiting with {}{left} background Redis calls \
             (refunds, leases) unanswered",
            if answered { "" } else { "calls still in flight, and " }
        )),
    }
}

/// The RESP front's TLS, when asked for: files that cannot make one refuse
/// the start, and so does TLS asked for a RESP front that does not serve.
fn resp_tls(args: &RespTlsArgs, serves: bool) -> Result<Option<Arc<rl_relay::tls::Tls>>, String> {
    let (Some(cert), Some(key)) = (&args.resp_tls_cert, &args.resp_tls_key) else { return Ok(None) };
    if !serves {
        return Err(
            "--resp-tls-cert: the RESP front does not serve (started as envoyproxy/ratelimit: add --listen)".into()
        );
    }
    let tls = rl_relay::tls::Tls::load(rl_relay::tls::RESP, cert, key, args.resp_tls_client_ca.as_deref(), None)?;
    Ok(Some(Arc::new(tls)))
}

/// The largest `--rls-token-file`: a token is a line, never megabytes.
const MAX_TOKEN_BYTES: usize = 64 << 10;

/// The RLS front and its listener, when asked for: a config that cannot be
/// read refuses to start.
async fn rls_front(args: &Args, relay: &Arc<Relay>) -> Result<Option<(Arc<Rls>, Listener)>, String> {
    let Some(address) = &args.rls.rls_listen else { return Ok(None) };
    let xds = xds_options(&args.rls)?;
    let path = match (&args.rls.rls_config, &xds) {
        (Some(path), _) => path.clone(),
        (None, Some(_)) => PathBuf::new(),
        (None, None) => return Err("--rls-listen needs its config: --rls-config or --rls-xds".into()),
    };
    let token = match &args.rls.rls_token_file {
        Some(file) => {
            let text = rl_relay::files::read_bounded(file, MAX_TOKEN_BYTES, "a token file")
                .map_err(|e| format!("--rls-token-file {}: {e}", file.display()))?;
            let token = text.trim().to_string();
            if token.is_empty() {
                return Err(format!("--rls-token-file {}: empty", file.display()));
            }
            Some(token)
        }
        None => None,
    };
    let options = rl_relay::rls::Options {
        config_path: path.clone(),
        xds,
        merge_domains: args.rls.rls_merge_domains,
        prefix: args.rls.rls_prefix.clone(),
        timeout: Duration::from_millis(args.rls.rls_timeout_ms),
        headers: args.rls.rls_headers.named(args.rls.rls_header_names),
        global_shadow: args.rls.rls_shadow_mode,
        token,
        poll: Duration::from_secs(1),
        near_limit_ratio: args.rls.rls_near_limit_ratio,
        ready_without_config: args.rls.rls_ready_without_config,
        quota_mode: args.rls.rls_quota_mode,
        dynamic_metadata: args.rls.rls_dynamic_metadata,
        tls: match (&args.rls.rls_tls_cert, &args.rls.rls_tls_key) {
            (Some(cert), Some(key)) => {
                let tls = rl_relay::tls::Tls::load(
                    rl_relay::tls::RLS,
                    cert,
                    key,
                    args.rls.rls_tls_client_ca.as_deref(),
                    args.rls.rls_tls_client_san.clone(),
                )?;
                Some(Arc::new(tls))
            }
            _ => None,
        },
        stop_increment_when_overlimit: args.rls.rls_stop_increment_when_overlimit,
        statsd: match &args.rls.rls_statsd {
            Some(target) => {
                let interval = Duration::from_millis(args.rls.rls_statsd_flush_interval_ms);
                let statsd = rl_relay::rls::statsd::Statsd::connect(target, &args.rls.rls_statsd_tags, interval)
                    .map_err(|e| format!("--rls-statsd {e}"))?;
                Some(Arc::new(statsd))
            }
            None => None,
        },
    };
    let loaded = match options.xds {
        // Over xDS: none until the first version.
        Some(_) => Ok(rl_relay::rls::config::RlsConfig::default()),
        // On the Lua scripts, a limit beyond them refuses the start, as a
        // bad file does (with `auto`, once decided: watch::once_decided).
        None if relay.backend().current() == Some(rl_relay::upstream::Backend::Lua) => {
            rl_relay::rls::watch::load(&options).and_then(|c| c.fits_lua().map(|()| c))
        }
        None => rl_relay::rls::watch::load(&options),
    };
    let config = match loaded {
        Ok(config) => config,
        // A folder that is missing or holds no file (one that holds a bad
        // file is refused still).
        Err(e)
            if args.rls.rls_start_without_config
                && rl_relay::rls::config::config_files(&path).map_or(!path.exists(), |f| f.is_empty()) =>
        {
            line(format_args!(
                "--rls-config: {e}: started without a config (--rls-start-without-config): unknown domains are \
                 answered OK until files come"
            ));
            rl_relay::rls::config::RlsConfig::default()
        }
        Err(e) => return Err(format!("--rls-config: {e}")),
    };
    let listener = Listener::bind(address).await?;
    Ok(Some((Arc::new(Rls::new(relay.clone(), args.cluster, config, options)), listener)))
}

/// The xDS client's options, checked (a bad one refuses the start).
fn xds_options(rls: &RlsArgs) -> Result<Option<rl_relay::rls::xds::XdsOptions>, String> {
    use rl_relay::rls::xds;
    let Some(url) = &rls.rls_xds else { return Ok(None) };
    let options = xds::XdsOptions {
        url: url.clone(),
        node_id: rls.rls_xds_node_id.clone(),
        node_metadata: xds::pairs("--rls-xds-node-metadata", &rls.rls_xds_node_metadata, '=', false)?,
        headers: xds::pairs("--rls-xds-headers", &rls.rls_xds_headers, ':', true)?,
        tls: rls.rls_xds_tls.then(|| xds::ClientTls {
            cert: rls.rls_xds_tls_cert.clone(),
            key: rls.rls_xds_tls_key.clone(),
            ca: rls.rls_xds_tls_ca.clone(),
            san: rls.rls_xds_tls_san.clone(),
        }),
        connect_retry: Duration::from_millis(rls.rls_xds_connect_retry_ms),
        backoff_initial: Duration::from_millis(rls.rls_xds_backoff_initial_ms),
        backoff_max: Duration::from_millis(rls.rls_xds_backoff_max_ms),
        max_message_bytes: rls.rls_xds_max_message_bytes as usize,
        force_start: rls.rls_start_without_config,
    };
    options.check()?;
    Ok(Some(options))
}

/// `wanted` clients on each of `fronts` fronts (the RESP front, and the
/// RLS front when it serves: each takes up to `--max-clients`) if the
/// open-file limit allows them (raised toward the hard limit if need be, as
/// Redis does), else as many as it allows, said in the log.
fn fit_max_clients(wanted: u64, fronts: u64) -> u64 {
    let need = wanted.saturating_mul(fronts).saturating_add(RESERVED_FDS);
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return wanted;
        }
        if limit.rlim_cur < need && limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: need.min(limit.rlim_max), rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = raised.rlim_cur;
            }
        }
    }
    if limit.rlim_cur >= need {
        return wanted;
    }
    let fit = (limit.rlim_cur.saturating_sub(RESERVED_FDS) / fronts).max(1);
    let each = if fronts > 1 { " on each of the RESP and RLS fronts" } else { "" };
    line(format_args!(
        "--max-clients {wanted} lowered to {fit}{each}: the open-file limit is {} and the relay keeps \
         {RESERVED_FDS} for itself (raise it with ulimit -n or LimitNOFILE=)",
        limit.rlim_cur
    ));
    fit
}
