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
use rl_relay::rls::Rls;
use rl_relay::upstream::Upstream;
use tokio::net::TcpListener;

/// Descriptors kept for the relay's own use (its listeners, its connections
/// to Redis, the metrics endpoint's clients) below the open-file limit.
const RESERVED_FDS: u64 = 32 + rl_relay::operator_endpoint::MAX_CONNECTIONS as u64;

/// A lease relay for redis-rl: gateways connect to it as to Redis.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    /// Address gateways connect to.
    #[arg(long, default_value = "127.0.0.1:6380")]
    listen: String,
    /// Redis URL (repeat with --cluster for a cluster's seed nodes).
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis: Vec<String>,
    /// The --redis URLs are nodes of a Redis Cluster.
    #[arg(long)]
    cluster: bool,
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
    #[command(flatten)]
    rls: RlsArgs,
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
    /// Response headers: draft (RateLimit, RateLimit-Policy, Retry-After), envoyproxy (RateLimit-Limit,
    /// -Remaining, -Reset) or off.
    #[arg(long, default_value = "draft", value_parser = rl_relay::rls::headers::Style::parse)]
    rls_headers: rl_relay::rls::headers::Style,
    /// Answer every OVER_LIMIT as OK (statuses kept), as envoyproxy/ratelimit's SHADOW_MODE.
    #[arg(long)]
    rls_shadow_mode: bool,
    /// A file holding a token callers must send as `authorization: Bearer TOKEN`.
    #[arg(long)]
    rls_token_file: Option<PathBuf>,
    /// Usage reported on a limit already over counts nothing (envoyproxy/ratelimit's
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); by default it counts in full (docs/token-budgets.md).
    #[arg(long)]
    rls_stop_increment_when_overlimit: bool,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        line(e);
        std::process::exit(2);
    }
}

async fn run(args: Args) -> Result<(), String> {
    let credentials = Credentials::load(args.auth_file.as_deref(), std::env::var(auth::ENV).ok())?;
    let urls: Vec<String> = args.redis.iter().map(|u| redact(u)).collect();
    let timeout = Duration::from_millis(args.timeout_ms);
    let upstream = Upstream::open(&args.redis, args.cluster, timeout).map_err(|e| format!("--redis {urls:?}: {e}"))?;
    let probe = Upstream::probe(&args.redis, args.cluster).map_err(|e| format!("--redis {urls:?}: {e}"))?;
    if args.max_request_bytes > args.max_pending_bytes {
        return Err(format!(
            "--max-request-bytes {} is above --max-pending-bytes {}: a command could never be read",
            args.max_request_bytes, args.max_pending_bytes
        ));
    }
    let limits = Limits {
        max_request_bytes: args.max_request_bytes as usize,
        max_arguments: args.max_arguments as usize,
        max_pending_bytes: args.max_pending_bytes as usize,
        max_clients: fit_max_clients(args.max_clients, 1 + u64::from(args.rls.rls_listen.is_some())) as usize,
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
    let listener = TcpListener::bind(&args.listen).await.map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let fence = rl_relay::resp::fence::Fence::new(&args.rls.rls_prefix)?;
    let rls = rls_front(&args, &relay).await?;
    if let Some(address) = &args.metrics {
        let metrics = TcpListener::bind(address).await.map_err(|e| format!("--metrics {address}: {e}"))?;
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
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let auth = if relay.credentials.required() { "clients authenticate" } else { "no client authentication" };
    line(format_args!("listening on {local} for {}, {auth}, at most {} clients", urls.join(" "), limits.max_clients));
    rl_relay::resp::serve(relay, listener, fence).await;
    Ok(())
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
        headers: args.rls.rls_headers,
        global_shadow: args.rls.rls_shadow_mode,
        token,
        poll: Duration::from_secs(1),
        stop_increment_when_overlimit: args.rls.rls_stop_increment_when_overlimit,
    };
    let config = rl_relay::rls::watch::load(&options).map_err(|e| format!("--rls-config: {e}"))?;
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
