//! `rl-relay`: the lease relay's binary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rl_relay::auth::{self, Credentials};
use rl_relay::limits::Limits;
use rl_relay::logging::{line, redact};
use rl_relay::pool::{Pools, Settings};
use rl_relay::relay::{Options, Relay};
use rl_relay::rls::{upstream_env, Rls};
use rl_relay::upstream::Upstream;
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
    /// Serve Envoy's rate limit service (gRPC) on this address.
    #[arg(long, requires = "rls_config")]
    rls_listen: Option<String>,
    /// envoyproxy/ratelimit's config: a YAML file, or a directory of them (watched).
    #[arg(long, requires = "rls_listen")]
    rls_config: Option<PathBuf>,
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
    /// Start on a missing or empty --rls-config folder, unknown domains answered OK until files come
    /// (envoyproxy/ratelimit's FORCE_START_WITHOUT_INITIAL_CONFIG).
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
}

fn near_limit_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("'{text}': a ratio from 0 to 1")),
    }
}

#[tokio::main]
async fn main() {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            line(e);
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args).await {
        line(e);
        std::process::exit(2);
    }
}

/// The command line; with no argument or `--envoyproxy-env`, after the
/// flags envoyproxy/ratelimit's environment comes to (the command line's
/// own win), its variables set and not served named in a warning.
fn parse() -> Result<Args, String> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let given = &argv[1.min(argv.len())..];
    if !given.is_empty() && !given.iter().any(|a| a == "--envoyproxy-env") {
        return Ok(Args::parse());
    }
    let translated = upstream_env::translate(&|name| std::env::var(name).ok())?;
    if let Some(warning) = translated.warning() {
        line(warning);
    }
    let names: Vec<String> = given.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let program = argv.first().cloned().unwrap_or_else(|| "rl-relay".into());
    let mut words: Vec<std::ffi::OsString> = vec![program, "--envoyproxy-env".into()];
    words.extend(translated.args(&names).into_iter().map(Into::into));
    words.extend(given.iter().cloned());
    Ok(Args::parse_from(words))
}

async fn run(args: Args) -> Result<(), String> {
    let credentials = Credentials::load(args.auth_file.as_deref(), std::env::var(auth::ENV).ok())?;
    let urls: Vec<String> = args.redis.iter().map(|u| redact(u)).collect();
    let timeout = Duration::from_millis(args.timeout_ms);
    let tls = rl_client::Tls {
        ca_file: args.tls_ca_file.clone(),
        cert_file: args.tls_cert_file.clone(),
        key_file: args.tls_key_file.clone(),
        insecure: args.tls_insecure,
    };
    let upstream =
        Upstream::open(&args.redis, args.cluster, &tls, timeout).map_err(|e| format!("--redis {urls:?}: {e}"))?;
    let probe = Upstream::probe(&args.redis, args.cluster, &tls).map_err(|e| format!("--redis {urls:?}: {e}"))?;
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
        tokio::spawn(rl_relay::operator_endpoint::serve(relay.clone(), metrics, rls.as_ref().map(|(r, _)| r.clone())));
    }
    if let Some((rls, listener)) = rls {
        tokio::spawn(async move {
            if let Err(e) = rl_relay::rls::serve::serve(rls, listener).await {
                line(e);
                std::process::exit(2);
            }
        });
    }
    tokio::spawn(relay.clone().probe_forever(probe));
    let Some(listener) = listener else {
        line(format_args!("serving the Envoy front only, for {}", urls.join(" ")));
        return std::future::pending().await;
    };
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let auth = if relay.credentials.required() { "clients authenticate" } else { "no client authentication" };
    let over = match &resp_tls {
        Some(tls) if tls.mutual() => ", over TLS only (clients show a certificate the client CA signed)",
        Some(_) => ", over TLS only",
        None => "",
    };
    line(format_args!(
        "listening on {local}{over} for {}, {auth}, at most {} clients",
        urls.join(" "),
        limits.max_clients
    ));
    rl_relay::resp::serve(relay, listener, fence, resp_tls).await;
    Ok(())
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
async fn rls_front(args: &Args, relay: &Arc<Relay>) -> Result<Option<(Arc<Rls>, TcpListener)>, String> {
    let (Some(address), Some(path)) = (&args.rls.rls_listen, &args.rls.rls_config) else { return Ok(None) };
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
    };
    let config = match rl_relay::rls::watch::load(&options) {
        Ok(config) => config,
        // A folder that is missing or holds no file (one that holds a bad
        // file is refused still).
        Err(e)
            if args.rls.rls_start_without_config
                && rl_relay::rls::config::config_files(path).map_or(!path.exists(), |f| f.is_empty()) =>
        {
            line(format_args!(
                "--rls-config: {e}: started without a config (--rls-start-without-config): unknown domains are \
                 answered OK until files come"
            ));
            rl_relay::rls::config::RlsConfig::default()
        }
        Err(e) => return Err(format!("--rls-config: {e}")),
    };
    let listener = TcpListener::bind(address).await.map_err(|e| format!("--rls-listen {address}: {e}"))?;
    Ok(Some((Arc::new(Rls::new(relay.clone(), args.cluster, config, options)), listener)))
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
