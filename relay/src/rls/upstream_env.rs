//! envoyproxy/ratelimit's environment (its `src/settings/settings.go`):
//! started with no argument (as Envoy Gateway and Istio start
//! `/bin/ratelimit`), or with `--envoyproxy-env`, rl-relay reads upstream's
//! variables and serves the Envoy front as upstream would. [`VARS`] is the
//! one table of every upstream variable and how it is served; docs/envoy.md
//! ("Started as envoyproxy/ratelimit") shows the same table, and the tests
//! below hold both to settings.go's list.
//!
//! The variables become flags ([`translate`]), placed before the command
//! line's own, so a flag given wins over its variable. A variable that is
//! set and not served is named in one warning line at start; one whose
//! value would be served wrongly (another backend, a `CONFIG_TYPE` but
//! FILE and GRPC_XDS_SOTW) refuses the start with a message naming it.

/// How one variable is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Read: it becomes the flag(s) named.
    Served(&'static str),
    /// Read, and served another way (how).
    Differently(&'static str),
    /// Read only together with the variable named, as upstream reads it.
    With(&'static str),
    /// Not served: named in the start's warning when set to anything but
    /// the values listed (those match what rl-relay does).
    Ignored { matching: &'static [&'static str], why: &'static str },
    /// Set to anything but the values listed, the start is refused.
    Refused { allowed: &'static [&'static str], why: &'static str },
}

/// One of upstream's variables: its name, its default in settings.go.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub how: How,
}

/// The flag `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true` becomes (while
/// None, the variable would be named in the start's warning as not served).
pub const STOP_INCREMENT_FLAG: Option<&str> = Some("--rls-stop-increment-when-overlimit");

const FALSE: &[&str] = &["false"];

use How::*;

const fn var(name: &'static str, default: &'static str, how: How) -> Var {
    Var { name, default, how }
}

/// Every variable of upstream's settings.go, in its order.
pub const VARS: &[Var] = &[
    var("HOST", "0.0.0.0", Served("--metrics HOST:PORT (/healthcheck, /metrics, /ready, /live)")),
    var("PORT", "8080", Served("--metrics HOST:PORT")),
    var("DEBUG_HOST", "0.0.0.0", Differently("127.0.0.1 unless set (/rlconfig shows the config's values)")),
    var("DEBUG_PORT", "6070", Served("--debug-listen DEBUG_HOST:DEBUG_PORT (/rlconfig; no pprof, no /stats)")),
    var("GRPC_UDS", "", Served("--rls-listen unix:GRPC_UDS (instead of GRPC_HOST:GRPC_PORT)")),
    var("GRPC_HOST", "0.0.0.0", Served("--rls-listen GRPC_HOST:GRPC_PORT")),
    var("GRPC_PORT", "8081", Served("--rls-listen GRPC_HOST:GRPC_PORT")),
    var("GRPC_MAX_CONNECTION_AGE", "24h", Ignored { matching: &[], why: "connections live until closed" }),
    var("GRPC_MAX_CONNECTION_AGE_GRACE", "1h", With("GRPC_MAX_CONNECTION_AGE")),
    var(
        "GRPC_SERVER_USE_TLS",
        "false",
        Served("--rls-tls-cert, --rls-tls-key, --rls-tls-client-ca, --rls-tls-client-san (reloaded on change)"),
    ),
    var("GRPC_SERVER_TLS_CERT", "", With("GRPC_SERVER_USE_TLS")),
    var("GRPC_SERVER_TLS_KEY", "", With("GRPC_SERVER_USE_TLS")),
    var("GRPC_CLIENT_TLS_CACERT", "", With("GRPC_SERVER_USE_TLS")),
    var("GRPC_CLIENT_TLS_SAN", "", With("GRPC_SERVER_USE_TLS")),
    var(
        "LOG_LEVEL",
        "WARN",
        Differently(
            "--log-level: every line is a warning or an error (each kind at most once per 10 s); ERROR keeps the errors",
        ),
    ),
    var("LOG_FORMAT", "text", Served("--log-format text|json (@message, @timestamp, level)")),
    var("CONFIG_TYPE", "FILE", Served("--rls-config (FILE) or --rls-xds (GRPC_XDS_SOTW); any other refused")),
    var(
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "false",
        Served(
            "--rls-start-without-config (a missing or empty folder starts, unknown domains answered OK; over xDS, \
             ready before the first version)",
        ),
    ),
    var("CONFIG_GRPC_XDS_NODE_ID", "default", Served("--rls-xds-node-id")),
    var("CONFIG_GRPC_XDS_NODE_METADATA", "", Served("--rls-xds-node-metadata key=value,...")),
    var("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", Served("--rls-xds host:port")),
    var("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", Served("--rls-xds-connect-retry-ms (jittered)")),
    var("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", Served("--rls-xds-headers name:value,...")),
    var("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", Served("--rls-xds-tls")),
    var("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", Served("--rls-xds-tls-cert")),
    var("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", Served("--rls-xds-tls-key")),
    var("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", Served("--rls-xds-tls-ca (else the system's roots)")),
    var("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", Served("--rls-xds-tls-san (else the URL's host)")),
    var("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", Served("--rls-xds-backoff-initial-ms")),
    var("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", Served("--rls-xds-backoff-max-ms")),
    var(
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "0.5",
        Differently("the wait doubles after each failed stream, up to the maximum"),
    ),
    var("XDS_CLIENT_BACKOFF_JITTER", "true", Differently("always jittered: between half the wait and all of it")),
    var("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "", Served("--rls-xds-max-message-bytes (else gRPC's 4 MiB)")),
    var("USE_DOG_STATSD", "false", Ignored { matching: FALSE, why: "no DogStatsD: /metrics" }),
    var("USE_DOG_STATSD_MOGRIFIERS", "", With("USE_DOG_STATSD")),
    var(
        "USE_STATSD",
        "true",
        Served("--rls-statsd STATSD_HOST:STATSD_PORT (over UDP), --rls-statsd-tags, --rls-statsd-flush-interval-ms"),
    ),
    var("STATSD_HOST", "localhost", With("USE_STATSD")),
    var("STATSD_PORT", "8125", With("USE_STATSD")),
    var("EXTRA_TAGS", "", With("USE_STATSD")),
    var("STATS_FLUSH_INTERVAL", "10s", With("USE_STATSD")),
    var("DISABLE_STATS", "false", Ignored { matching: FALSE, why: "/metrics is always served (statsd is not sent)" }),
    var(
        "USE_PROMETHEUS",
        "false",
        Differently("--prometheus-listen PROMETHEUS_ADDR: the operator endpoint there too, rl-relay's metric names"),
    ),
    var("PROMETHEUS_ADDR", ":9090", With("USE_PROMETHEUS")),
    var("PROMETHEUS_PATH", "/metrics", Ignored { matching: &["/metrics"], why: "metrics are served on /metrics" }),
    var(
        "PROMETHEUS_MAPPER_YAML",
        "",
        Ignored { matching: &[""], why: "the names are fixed (ratelimit_service_* as statsd-exporter maps them)" },
    ),
    var(
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "false",
        Ignored { matching: FALSE, why: "response times in seconds" },
    ),
    var(
        "RUNTIME_ROOT",
        "/srv/runtime_data/current",
        Served("--rls-config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY"),
    ),
    var("RUNTIME_SUBDIRECTORY", "", Served("--rls-config")),
    var("RUNTIME_APPDIRECTORY", "config", Served("--rls-config")),
    var(
        "RUNTIME_IGNOREDOTFILES",
        "false",
        Differently("names starting with a dot are always skipped (a ConfigMap's ..data)"),
    ),
    var("RUNTIME_WATCH_ROOT", "true", Differently("the folder's files are looked at every second, links followed")),
    var(
        "EXPIRATION_JITTER_MAX_SECONDS",
        "300",
        Differently("windows expire as the module keeps them, no jitter needed"),
    ),
    var(
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "0",
        Differently("refusals are always remembered (the deny cache, --max-subjects)"),
    ),
    var("NEAR_LIMIT_RATIO", "0.8", Served("--rls-near-limit-ratio")),
    var("CACHE_KEY_PREFIX", "", Differently("--rls-prefix rl:rls:CACHE_KEY_PREFIX (keys stay under rl:*)")),
    var("BACKEND_TYPE", "redis", Refused { allowed: &["redis"], why: "the backend is Redis with the redis-rl module" }),
    var(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "false",
        Served("--rls-stop-increment-when-overlimit (docs/token-budgets.md)"),
    ),
    var("LIMIT_RESPONSE_HEADERS_ENABLED", "false", Served("--rls-headers envoyproxy (else off)")),
    var("LIMIT_LIMIT_HEADER", "RateLimit-Limit", Served("--rls-header-names LIMIT,REMAINING,RESET")),
    var("LIMIT_REMAINING_HEADER", "RateLimit-Remaining", Served("--rls-header-names")),
    var("LIMIT_RESET_HEADER", "RateLimit-Reset", Served("--rls-header-names")),
    var(
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "false",
        Served("--rls-ready-without-config while false (upstream's default: healthy with no domain)"),
    ),
    var("REDIS_SOCKET_TYPE", "unix", Served("--redis: tcp or unix (unset: tcp for a host:port, unix for a path)")),
    var(
        "REDIS_TYPE",
        "SINGLE",
        Served("--redis (SINGLE), --redis ... --cluster (CLUSTER), redis+sentinel:// (SENTINEL)"),
    ),
    var(
        "REDIS_URL",
        "/var/run/nutcracker/ratelimit.sock",
        Served("--redis: host:port, a socket path, or a redis:// URL"),
    ),
    var("REDIS_POOL_SIZE", "10", Differently("one multiplexed connection, calls batched")),
    var("REDIS_AUTH", "", Served("the password (or user:password) in --redis's URL, in memory only, never in argv")),
    var("REDIS_TLS", "false", Served("rediss:// for every REDIS_URL server (and sentinel)")),
    var("REDIS_TLS_CLIENT_CERT", "", Served("--tls-cert-file")),
    var("REDIS_TLS_CLIENT_KEY", "", Served("--tls-key-file")),
    var("REDIS_TLS_CACERT", "", Served("--tls-ca-file (else the system roots)")),
    var(
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "false",
        Refused {
            allowed: FALSE,
            why: "rustls checks a certificate's name with its chain; --tls-insecure (tests only) skips both",
        },
    ),
    var("REDIS_PIPELINE_WINDOW", "0", Differently("calls are batched by the relay (one RL.WINDOW per request)")),
    var("REDIS_PIPELINE_LIMIT", "0", Differently("deprecated upstream; calls batched by the relay")),
    var("REDIS_CLUSTER_PIPELINE_PARALLELISM", "1", Differently("calls to a cluster's nodes go in parallel")),
    var(
        "REDIS_PERSECOND",
        "false",
        Ignored { matching: FALSE, why: "per-second limits are counted on REDIS_URL's Redis with the others" },
    ),
    var("REDIS_PERSECOND_SOCKET_TYPE", "unix", With("REDIS_PERSECOND")),
    var("REDIS_PERSECOND_TYPE", "SINGLE", With("REDIS_PERSECOND")),
    var("REDIS_PERSECOND_URL", "/var/run/nutcracker/ratelimitpersecond.sock", With("REDIS_PERSECOND")),
    var("REDIS_PERSECOND_POOL_SIZE", "10", With("REDIS_PERSECOND")),
    var("REDIS_PERSECOND_AUTH", "", With("REDIS_PERSECOND")),
    var("REDIS_PERSECOND_TLS", "false", With("REDIS_PERSECOND")),
    var("REDIS_SENTINEL_AUTH", "", Served("the sentinels' password (REDIS_TYPE=SENTINEL)")),
    var("REDIS_PERSECOND_SENTINEL_AUTH", "", With("REDIS_PERSECOND")),
    var("REDIS_PERSECOND_PIPELINE_WINDOW", "0", With("REDIS_PERSECOND")),
    var("REDIS_PERSECOND_PIPELINE_LIMIT", "0", With("REDIS_PERSECOND")),
    var("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "1", With("REDIS_PERSECOND")),
    var(
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "false",
        Differently("always: not ready while Redis does not answer the probe or lacks the module"),
    ),
    var(
        "REDIS_TIMEOUT",
        "10s",
        Ignored { matching: &[], why: "a decision waits --rls-timeout-ms (15 ms), then its failure mode answers" },
    ),
    var("REDIS_PERSECOND_TIMEOUT", "10s", With("REDIS_PERSECOND")),
    var("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT", Differently("no pool to wait for: one multiplexed connection")),
    var("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT", With("REDIS_PERSECOND")),
    var("REDIS_STARTUP_INITIAL_INTERVAL", "1s", Differently("starts at once, not ready until Redis answers")),
    var("REDIS_STARTUP_MAX_INTERVAL", "30s", Differently("reconnects by itself, probed every second")),
    var("REDIS_STARTUP_MAX_ELAPSED_TIME", "0", Differently("never gives up on Redis")),
    var("MEMCACHE_HOST_PORT", "", With("BACKEND_TYPE")),
    var("MEMCACHE_MAX_IDLE_CONNS", "2", With("BACKEND_TYPE")),
    var("MEMCACHE_SRV", "", With("BACKEND_TYPE")),
    var("MEMCACHE_SRV_REFRESH", "0", With("BACKEND_TYPE")),
    var("MEMCACHE_TLS", "false", With("BACKEND_TYPE")),
    var("MEMCACHE_TLS_CLIENT_CERT", "", With("BACKEND_TYPE")),
    var("MEMCACHE_TLS_CLIENT_KEY", "", With("BACKEND_TYPE")),
    var("MEMCACHE_TLS_CACERT", "", With("BACKEND_TYPE")),
    var("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "false", With("BACKEND_TYPE")),
    var("SHADOW_MODE", "false", Served("--rls-shadow-mode")),
    var("QUOTA_MODE", "false", Served("--rls-quota-mode")),
    var("RESPONSE_DYNAMIC_METADATA", "false", Served("--rls-dynamic-metadata")),
    var("MERGE_DOMAIN_CONFIG", "false", Served("--rls-merge-domains")),
    var("TRACING_ENABLED", "false", Ignored { matching: FALSE, why: "no tracing" }),
    var("TRACING_SERVICE_NAME", "RateLimit", With("TRACING_ENABLED")),
    var("TRACING_SERVICE_NAMESPACE", "", With("TRACING_ENABLED")),
    var("TRACING_SERVICE_INSTANCE_ID", "", With("TRACING_ENABLED")),
    var("TRACING_EXPORTER_PROTOCOL", "http", With("TRACING_ENABLED")),
    var("TRACING_SAMPLING_RATE", "1", With("TRACING_ENABLED")),
];

/// Variables deployments set that are not upstream's: named in the
/// warning, as upstream ignores them.
pub const NOT_UPSTREAM: &[(&str, &str)] = &[(
    "GRPC_SERVER_TLS_CA_CERT",
    "Envoy Gateway sets it; envoyproxy/ratelimit reads GRPC_CLIENT_TLS_CACERT and ignores it",
)];

/// What the environment comes to: flags (each with its values), and the
/// variables set but not served, for the warning line.
#[derive(Debug, Default, PartialEq)]
pub struct Translated {
    pub flags: Vec<(String, Option<String>)>,
    pub not_served: Vec<String>,
}

impl Translated {
    fn flag(&mut self, name: &str, value: impl Into<String>) {
        self.flags.push((name.to_string(), Some(value.into())));
    }

    fn switch(&mut self, name: &str) {
        self.flags.push((name.to_string(), None));
    }

    /// The flags as command-line words, without those `given` names
    /// (a flag on the command line wins over its variable).
    pub fn args(&self, given: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for (flag, value) in &self.flags {
            if given.iter().any(|g| g == flag || g.strip_prefix(flag.as_str()).is_some_and(|r| r.starts_with('='))) {
                continue;
            }
            out.push(flag.clone());
            out.extend(value.clone());
        }
        out
    }

    /// The warning line naming what is set and not served, if any.
    pub fn warning(&self) -> Option<String> {
        (!self.not_served.is_empty()).then(|| {
            format!(
                "envoyproxy/ratelimit variables set and not served (docs/envoy.md, \"Started as \
                 envoyproxy/ratelimit\"): {}",
                self.not_served.join("; ")
            )
        })
    }
}

/// Go's `strconv.ParseBool`, as envconfig reads a bool.
fn parse_bool(name: &str, text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("{name}={text}: not a boolean (true or false)")),
    }
}

/// Whether `value` is one of `values` (a boolean as Go reads it, a name in
/// any case).
fn one_of(name: &str, value: &str, values: &[&str]) -> bool {
    values.iter().any(|v| match (parse_bool(name, v), parse_bool(name, value)) {
        (Ok(a), Ok(b)) => a == b,
        _ => v.eq_ignore_ascii_case(value),
    })
}

/// `host:port`, with an IPv6 host bracketed.
fn host_port(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Every byte but unreserved ones `%XX`-escaped, for a URL's user-info.
fn escaped(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `REDIS_AUTH` (`password` or `user:password`) as a URL's user-info.
fn userinfo(auth: &str) -> String {
    match auth.split_once(':') {
        _ if auth.is_empty() => String::new(),
        Some((user, password)) => format!("{}:{}@", escaped(user), escaped(password)),
        None => format!(":{}@", escaped(auth)),
    }
}

/// One server's URL from upstream's `REDIS_URL` form.
fn server_url(address: &str, socket: &str, auth: &str) -> Result<String, String> {
    if let Some((scheme, rest)) = address.split_once("://") {
        if auth.is_empty() || rest.split('/').next().is_some_and(|a| a.contains('@')) {
            return Ok(address.to_string());
        }
        return Ok(format!("{scheme}://{}{rest}", userinfo(auth)));
    }
    let unix = match socket {
        "" => address.starts_with('/'),
        s if s.eq_ignore_ascii_case("unix") => true,
        s if s.eq_ignore_ascii_case("tcp") => false,
        other => return Err(format!("REDIS_SOCKET_TYPE={other}: tcp or unix")),
    };
    if unix {
        let (user, password) = auth.split_once(':').unwrap_or(("", auth));
        let mut query = Vec::new();
        if !user.is_empty() {
            query.push(format!("user={}", escaped(user)));
        }
        if !password.is_empty() {
            query.push(format!("pass={}", escaped(password)));
        }
        let query = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
        return Ok(format!("redis+unix://{address}{query}"));
    }
    if address.is_empty() || !address.contains(':') {
        return Err(format!("REDIS_URL={address}: host:port (REDIS_SOCKET_TYPE=tcp)"));
    }
    Ok(format!("redis://{}{address}/", userinfo(auth)))
}

/// A Go duration (`300ms`, `1.5s`, `1h30m`, as `time.ParseDuration`) in
/// whole milliseconds, above 0.
fn go_millis(name: &str, text: &str) -> Result<u64, String> {
    let bad = || format!("{name}={text}: not a duration above 0 (such as 500ms, 10s, 1m)");
    let (mut rest, mut total) = (text.trim(), 0f64);
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !c.is_ascii_digit() && c != '.').ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let ms = match &rest[..unit_end] {
            "ns" => 1e-6,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 60e3,
            "h" => 3600e3,
            _ => return Err(bad()),
        };
        total += number * ms;
        rest = &rest[unit_end..];
    }
    match total.round() {
        ms if (1.0..=3_600_000.0).contains(&ms) => Ok(ms as u64),
        _ => Err(format!("{name}={text}: from 1ms to 1h")),
    }
}

/// CONFIG_TYPE=GRPC_XDS_SOTW: the xDS client's flags.
fn xds(
    out: &mut Translated,
    value: &dyn Fn(&str) -> String,
    set: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    out.flag("--rls-xds", value("CONFIG_GRPC_XDS_SERVER_URL"));
    out.flag("--rls-xds-node-id", value("CONFIG_GRPC_XDS_NODE_ID"));
    if let Some(metadata) = set("CONFIG_GRPC_XDS_NODE_METADATA") {
        out.flag("--rls-xds-node-metadata", metadata);
    }
    if let Some(headers) = set("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") {
        out.flag("--rls-xds-headers", headers);
    }
    if parse_bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", &value("CONFIG_GRPC_XDS_SERVER_USE_TLS"))? {
        out.switch("--rls-xds-tls");
        let (cert, key) = (set("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"), set("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"));
        if cert.is_some() != key.is_some() {
            return Err("CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together".into());
        }
        for (variable, flag) in [
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--rls-xds-tls-cert"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--rls-xds-tls-key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--rls-xds-tls-ca"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "--rls-xds-tls-san"),
        ] {
            if let Some(v) = set(variable) {
                out.flag(flag, v);
            }
        }
    }
    for (variable, flag) in [
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "--rls-xds-connect-retry-ms"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "--rls-xds-backoff-initial-ms"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "--rls-xds-backoff-max-ms"),
    ] {
        out.flag(flag, go_millis(variable, &value(variable))?.to_string());
    }
    let factor = value("XDS_CLIENT_BACKOFF_RANDOM_FACTOR");
    factor.parse::<f64>().map_err(|_| format!("XDS_CLIENT_BACKOFF_RANDOM_FACTOR={factor}: not a number"))?;
    parse_bool("XDS_CLIENT_BACKOFF_JITTER", &value("XDS_CLIENT_BACKOFF_JITTER"))?;
    if let Some(size) = set("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
        match size.parse::<u64>() {
            Ok(0) => {}
            Ok(n) => out.flag("--rls-xds-max-message-bytes", n.to_string()),
            Err(_) => return Err(format!("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES={size}: not a number of bytes")),
        }
    }
    Ok(())
}

/// The environment (`get` reads one variable) as flags, or why it cannot
/// be served.
pub fn translate(get: &dyn Fn(&str) -> Option<String>) -> Result<Translated, String> {
    let set = |name: &str| get(name).filter(|v| !v.is_empty());
    let value = |name: &str| {
        set(name).unwrap_or_else(|| VARS.iter().find(|v| v.name == name).map_or("", |v| v.default).to_string())
    };
    let enabled = |name: &str| parse_bool(name, &value(name));
    let mut out = Translated::default();
    for v in VARS {
        let Some(given) = set(v.name) else { continue };
        match v.how {
            Refused { allowed, why } if !one_of(v.name, &given, allowed) => {
                return Err(format!("{}={given} is not served: {why}; refusing to start", v.name));
            }
            Ignored { matching, why } if !one_of(v.name, &given, matching) => {
                out.not_served.push(format!("{} ({why})", v.name));
            }
            _ => {}
        }
    }
    for (name, why) in NOT_UPSTREAM {
        if set(name).is_some() {
            out.not_served.push(format!("{name} ({why})"));
        }
    }
    if enabled("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
        match STOP_INCREMENT_FLAG {
            Some(flag) => out.switch(flag),
            None => out.not_served.push(
                "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (a refused request is never counted here; the variable \
                 itself is not read yet)"
                    .into(),
            ),
        }
    }

    match set("GRPC_UDS") {
        Some(path) => out.flag("--rls-listen", format!("unix:{path}")),
        None => out.flag("--rls-listen", host_port(&value("GRPC_HOST"), &value("GRPC_PORT"))),
    }
    if enabled("GRPC_SERVER_USE_TLS")? {
        let (cert, key) = (value("GRPC_SERVER_TLS_CERT"), value("GRPC_SERVER_TLS_KEY"));
        if cert.is_empty() || key.is_empty() {
            return Err("GRPC_SERVER_USE_TLS=true wants GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY".into());
        }
        out.flag("--rls-tls-cert", cert);
        out.flag("--rls-tls-key", key);
        // A SAN is checked only on the certificates a client CA asks for, as upstream.
        if let Some(ca) = set("GRPC_CLIENT_TLS_CACERT") {
            out.flag("--rls-tls-client-ca", ca);
            if let Some(san) = set("GRPC_CLIENT_TLS_SAN") {
                out.flag("--rls-tls-client-san", san);
            }
        }
    }
    out.flag("--metrics", host_port(&value("HOST"), &value("PORT")));
    // Loopback unless DEBUG_HOST is set: /rlconfig shows the config's descriptor values.
    let debug_host = set("DEBUG_HOST").unwrap_or_else(|| "127.0.0.1".into());
    out.flag("--debug-listen", host_port(&debug_host, &value("DEBUG_PORT")));
    // Upstream writes text for any LOG_FORMAT but json; it refuses a LOG_LEVEL logrus cannot read.
    let level = value("LOG_LEVEL");
    crate::logging::settings("text", &level).map_err(|e| format!("LOG_LEVEL={level}: {e}"))?;
    out.flag("--log-level", level);
    let format = value("LOG_FORMAT");
    let json = format.eq_ignore_ascii_case("json");
    if !json && !format.eq_ignore_ascii_case("text") {
        out.not_served.push(format!("LOG_FORMAT={format} (text or json: lines are text, as upstream writes them)"));
    }
    out.flag("--log-format", if json { "json" } else { "text" });
    if enabled("USE_STATSD")? && !enabled("DISABLE_STATS")? {
        out.flag("--rls-statsd", host_port(&value("STATSD_HOST"), &value("STATSD_PORT")));
        let tags = value("EXTRA_TAGS");
        if !tags.is_empty() {
            crate::rls::statsd::tag_suffix(&tags).map_err(|e| format!("EXTRA_TAGS={tags}: {e}"))?;
            out.flag("--rls-statsd-tags", tags);
        }
        let interval = value("STATS_FLUSH_INTERVAL");
        out.flag("--rls-statsd-flush-interval-ms", go_millis("STATS_FLUSH_INTERVAL", &interval)?.to_string());
    }
    if enabled("USE_PROMETHEUS")? {
        let address = value("PROMETHEUS_ADDR");
        let address = if address.starts_with(':') { format!("0.0.0.0{address}") } else { address };
        out.flag("--prometheus-listen", address);
    }
    let config_type = value("CONFIG_TYPE");
    if config_type.eq_ignore_ascii_case("GRPC_XDS_SOTW") {
        xds(&mut out, &value, &set)?;
    } else if config_type.eq_ignore_ascii_case("FILE") {
        let folder = std::path::Path::new(&value("RUNTIME_ROOT"))
            .join(value("RUNTIME_SUBDIRECTORY"))
            .join(value("RUNTIME_APPDIRECTORY"));
        out.flag("--rls-config", folder.display().to_string());
    } else {
        return Err(format!("CONFIG_TYPE={config_type}: FILE or GRPC_XDS_SOTW"));
    }

    let (url, socket, auth) = (value("REDIS_URL"), get("REDIS_SOCKET_TYPE").unwrap_or_default(), value("REDIS_AUTH"));
    let kind = value("REDIS_TYPE");
    let tls = enabled("REDIS_TLS")?;
    if tls {
        for (variable, flag) in [
            ("REDIS_TLS_CACERT", "--tls-ca-file"),
            ("REDIS_TLS_CLIENT_CERT", "--tls-cert-file"),
            ("REDIS_TLS_CLIENT_KEY", "--tls-key-file"),
        ] {
            if let Some(file) = set(variable) {
                out.flag(flag, file);
            }
        }
    }
    // REDIS_TLS: every server's URL over TLS (upstream's host:port form).
    let server = |address: &str, socket: &str| -> Result<String, String> {
        let url = server_url(address, socket, &auth)?;
        match url.strip_prefix("redis://") {
            Some(rest) if tls => Ok(format!("rediss://{rest}")),
            _ if tls && url.starts_with("redis+unix://") => {
                Err(format!("REDIS_TLS=true with a socket path ({address}): TLS is for host:port"))
            }
            _ => Ok(url),
        }
    };
    if kind.eq_ignore_ascii_case("single") {
        out.flag("--redis", server(&url, &socket)?);
    } else if kind.eq_ignore_ascii_case("cluster") {
        for node in url.split(',') {
            out.flag("--redis", server(node.trim(), "tcp")?);
        }
        out.switch("--cluster");
    } else if kind.eq_ignore_ascii_case("sentinel") {
        let mut parts = url.split(',').map(str::trim);
        let master = parts.next().unwrap_or_default();
        let sentinels: Vec<&str> = parts.collect();
        if master.is_empty() || sentinels.is_empty() {
            return Err(format!(
                "REDIS_URL={url}: REDIS_TYPE=SENTINEL wants <master name>,<sentinel1>,...,<sentinelN>"
            ));
        }
        let sentinel_auth = value("REDIS_SENTINEL_AUTH");
        let query = if sentinel_auth.is_empty() {
            String::new()
        } else {
            format!("?sentinel_password={}", escaped(&sentinel_auth))
        };
        out.flag(
            "--redis",
            format!(
                "{}://{}{}/{}{query}",
                if tls { rl_client::SENTINEL_TLS_SCHEME } else { rl_client::SENTINEL_SCHEME },
                userinfo(&auth),
                sentinels.join(","),
                escaped(master)
            ),
        );
    } else {
        return Err(format!("REDIS_TYPE={kind}: SINGLE, CLUSTER or SENTINEL"));
    }

    let prefix = value("CACHE_KEY_PREFIX");
    if !prefix.is_empty() {
        out.flag("--rls-prefix", format!("rl:rls:{prefix}"));
    }
    let ratio = value("NEAR_LIMIT_RATIO");
    ratio.parse::<f32>().map_err(|_| format!("NEAR_LIMIT_RATIO={ratio}: not a number"))?;
    out.flag("--rls-near-limit-ratio", ratio);
    out.flag("--rls-headers", if enabled("LIMIT_RESPONSE_HEADERS_ENABLED")? { "envoyproxy" } else { "off" });
    out.flag(
        "--rls-header-names",
        format!("{},{},{}", value("LIMIT_LIMIT_HEADER"), value("LIMIT_REMAINING_HEADER"), value("LIMIT_RESET_HEADER")),
    );
    if !enabled("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")? {
        out.switch("--rls-ready-without-config");
    }
    if enabled("FORCE_START_WITHOUT_INITIAL_CONFIG")? {
        out.switch("--rls-start-without-config");
    }
    if enabled("SHADOW_MODE")? {
        out.switch("--rls-shadow-mode");
    }
    if enabled("QUOTA_MODE")? {
        out.switch("--rls-quota-mode");
    }
    if enabled("RESPONSE_DYNAMIC_METADATA")? {
        out.switch("--rls-dynamic-metadata");
    }
    if enabled("MERGE_DOMAIN_CONFIG")? {
        out.switch("--rls-merge-domains");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// envoyproxy/ratelimit's src/settings/settings.go (f2fb157, July
    /// 2026): every `envconfig` name with its default, in order.
    const SETTINGS_GO: &str = "HOST=0.0.0.0 PORT=8080 DEBUG_HOST=0.0.0.0 DEBUG_PORT=6070 GRPC_UDS= GRPC_HOST=0.0.0.0 \
        GRPC_PORT=8081 GRPC_MAX_CONNECTION_AGE=24h GRPC_MAX_CONNECTION_AGE_GRACE=1h GRPC_SERVER_USE_TLS=false \
        GRPC_SERVER_TLS_CERT= GRPC_SERVER_TLS_KEY= GRPC_CLIENT_TLS_CACERT= GRPC_CLIENT_TLS_SAN= LOG_LEVEL=WARN \
        LOG_FORMAT=text CONFIG_TYPE=FILE FORCE_START_WITHOUT_INITIAL_CONFIG=false CONFIG_GRPC_XDS_NODE_ID=default \
        CONFIG_GRPC_XDS_NODE_METADATA= CONFIG_GRPC_XDS_SERVER_URL=localhost:18000 \
        CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=3s CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS= \
        CONFIG_GRPC_XDS_SERVER_USE_TLS=false CONFIG_GRPC_XDS_CLIENT_TLS_CERT= CONFIG_GRPC_XDS_CLIENT_TLS_KEY= \
        CONFIG_GRPC_XDS_SERVER_TLS_CACERT= CONFIG_GRPC_XDS_SERVER_TLS_SAN= XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=10s \
        XDS_CLIENT_BACKOFF_MAX_INTERVAL=60s XDS_CLIENT_BACKOFF_RANDOM_FACTOR=0.5 XDS_CLIENT_BACKOFF_JITTER=true \
        XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES= USE_DOG_STATSD=false USE_DOG_STATSD_MOGRIFIERS= USE_STATSD=true \
        STATSD_HOST=localhost STATSD_PORT=8125 EXTRA_TAGS= STATS_FLUSH_INTERVAL=10s DISABLE_STATS=false \
        USE_PROMETHEUS=false PROMETHEUS_ADDR=:9090 PROMETHEUS_PATH=/metrics PROMETHEUS_MAPPER_YAML= \
        PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=false RUNTIME_ROOT=/srv/runtime_data/current RUNTIME_SUBDIRECTORY= \
        RUNTIME_APPDIRECTORY=config RUNTIME_IGNOREDOTFILES=false RUNTIME_WATCH_ROOT=true \
        EXPIRATION_JITTER_MAX_SECONDS=300 LOCAL_CACHE_SIZE_IN_BYTES=0 NEAR_LIMIT_RATIO=0.8 CACHE_KEY_PREFIX= \
        BACKEND_TYPE=redis STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false LIMIT_RESPONSE_HEADERS_ENABLED=false \
        LIMIT_LIMIT_HEADER=RateLimit-Limit LIMIT_REMAINING_HEADER=RateLimit-Remaining \
        LIMIT_RESET_HEADER=RateLimit-Reset HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=false REDIS_SOCKET_TYPE=unix \
        REDIS_TYPE=SINGLE REDIS_URL=/var/run/nutcracker/ratelimit.sock REDIS_POOL_SIZE=10 REDIS_AUTH= \
        REDIS_TLS=false REDIS_TLS_CLIENT_CERT= REDIS_TLS_CLIENT_KEY= REDIS_TLS_CACERT= \
        REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=false REDIS_PIPELINE_WINDOW=0 REDIS_PIPELINE_LIMIT=0 \
        REDIS_CLUSTER_PIPELINE_PARALLELISM=1 REDIS_PERSECOND=false REDIS_PERSECOND_SOCKET_TYPE=unix \
        REDIS_PERSECOND_TYPE=SINGLE REDIS_PERSECOND_URL=/var/run/nutcracker/ratelimitpersecond.sock \
        REDIS_PERSECOND_POOL_SIZE=10 REDIS_PERSECOND_AUTH= REDIS_PERSECOND_TLS=false REDIS_SENTINEL_AUTH= \
        REDIS_PERSECOND_SENTINEL_AUTH= REDIS_PERSECOND_PIPELINE_WINDOW=0 REDIS_PERSECOND_PIPELINE_LIMIT=0 \
        REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM=1 REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=false \
        REDIS_TIMEOUT=10s REDIS_PERSECOND_TIMEOUT=10s REDIS_POOL_ON_EMPTY_BEHAVIOR=WAIT \
        REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR=WAIT REDIS_STARTUP_INITIAL_INTERVAL=1s REDIS_STARTUP_MAX_INTERVAL=30s \
        REDIS_STARTUP_MAX_ELAPSED_TIME=0 MEMCACHE_HOST_PORT= MEMCACHE_MAX_IDLE_CONNS=2 MEMCACHE_SRV= \
        MEMCACHE_SRV_REFRESH=0 MEMCACHE_TLS=false MEMCACHE_TLS_CLIENT_CERT= MEMCACHE_TLS_CLIENT_KEY= \
        MEMCACHE_TLS_CACERT= MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION=false SHADOW_MODE=false QUOTA_MODE=false \
        RESPONSE_DYNAMIC_METADATA=false MERGE_DOMAIN_CONFIG=false TRACING_ENABLED=false \
        TRACING_SERVICE_NAME=RateLimit TRACING_SERVICE_NAMESPACE= TRACING_SERVICE_INSTANCE_ID= \
        TRACING_EXPORTER_PROTOCOL=http TRACING_SAMPLING_RATE=1";

    #[test]
    fn the_table_is_settings_go_every_variable_with_its_default() {
        let upstream: Vec<(&str, &str)> =
            SETTINGS_GO.split_whitespace().map(|pair| pair.split_once('=').unwrap()).collect();
        assert_eq!(upstream.len(), 114);
        let ours: Vec<(&str, &str)> = VARS.iter().map(|v| (v.name, v.default)).collect();
        assert_eq!(ours, upstream);
        for v in VARS {
            if let With(parent) = v.how {
                assert!(VARS.iter().any(|p| p.name == parent && !matches!(p.how, With(_))), "{}", v.name);
            }
        }
    }

    #[test]
    fn the_docs_table_lists_every_variable_as_the_code_serves_it() {
        let docs = include_str!("../../../docs/envoy.md");
        let section = docs.split("## Started as envoyproxy/ratelimit").nth(1).expect("the docs section");
        for v in VARS.iter().map(|v| v.name).chain(NOT_UPSTREAM.iter().map(|(n, _)| *n)) {
            let row = section
                .lines()
                .find(|l| l.starts_with(&format!("| `{v}`")))
                .unwrap_or_else(|| panic!("{v} has no row in docs/envoy.md's table"));
            let kind = VARS.iter().find(|x| x.name == v).map(|x| match x.how {
                Served(_) => "served",
                Differently(_) => "differently",
                With(_) => "with",
                Ignored { .. } => "not served",
                Refused { .. } => "refused",
            });
            if let Some(kind) = kind {
                assert!(row.contains(&format!("| {kind} |")), "{v}: the docs' row says otherwise than {kind}: {row}");
            }
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn flag(t: &Translated, name: &str) -> Option<String> {
        t.flags.iter().find(|(f, _)| f == name).map(|(_, v)| v.clone().unwrap_or_default())
    }

    #[test]
    fn upstreams_defaults() {
        let t = translate(&env(&[])).unwrap();
        assert_eq!(flag(&t, "--rls-listen").unwrap(), "0.0.0.0:8081");
        assert_eq!(flag(&t, "--metrics").unwrap(), "0.0.0.0:8080");
        assert_eq!(flag(&t, "--debug-listen").unwrap(), "127.0.0.1:6070");
        assert_eq!(flag(&t, "--rls-config").unwrap(), "/srv/runtime_data/current/config");
        assert_eq!(flag(&t, "--redis").unwrap(), "redis+unix:///var/run/nutcracker/ratelimit.sock");
        assert_eq!(flag(&t, "--rls-headers").unwrap(), "off");
        assert_eq!(flag(&t, "--rls-header-names").unwrap(), "RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset");
        assert!(flag(&t, "--rls-ready-without-config").is_some());
        assert!(flag(&t, "--rls-start-without-config").is_none());
        assert!(t.warning().is_none());
    }

    #[test]
    fn envoy_gateways_environment() {
        let t = translate(&env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.redis.svc:6379"),
            ("REDIS_AUTH", "u:p@ss w"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ]))
        .unwrap();
        assert_eq!(flag(&t, "--rls-config").unwrap(), "/data/ratelimit/config");
        assert_eq!(flag(&t, "--redis").unwrap(), "redis://u:p%40ss%20w@redis.redis.svc:6379/");
        assert_eq!(flag(&t, "--prometheus-listen").unwrap(), "0.0.0.0:19001");
        assert!(flag(&t, "--rls-start-without-config").is_some());
        let warning = t.warning().unwrap();
        assert!(warning.contains("PROMETHEUS_MAPPER_YAML") && warning.contains("GRPC_SERVER_TLS_CA_CERT"), "{warning}");
        assert!(!warning.contains("USE_STATSD") && !warning.contains("LOG_LEVEL"), "{warning}");
    }

    #[test]
    fn redis_forms() {
        let url = |pairs: &[(&str, &str)]| {
            let t = translate(&env(pairs)).unwrap();
            let urls: Vec<String> =
                t.flags.iter().filter(|(f, _)| f == "--redis").map(|(_, v)| v.clone().unwrap()).collect();
            (urls.join(" "), flag(&t, "--cluster").is_some())
        };
        assert_eq!(url(&[("REDIS_URL", "127.0.0.1:6379")]), ("redis://127.0.0.1:6379/".into(), false));
        assert_eq!(url(&[("REDIS_URL", "redis://h:1/2"), ("REDIS_AUTH", "pw")]), ("redis://:pw@h:1/2".into(), false));
        assert_eq!(
            url(&[("REDIS_TYPE", "cluster"), ("REDIS_URL", "a:1,b:2"), ("REDIS_SOCKET_TYPE", "tcp")]),
            ("redis://a:1/ redis://b:2/".into(), true)
        );
        assert_eq!(
            url(&[
                ("REDIS_TYPE", "SENTINEL"),
                ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
                ("REDIS_SENTINEL_AUTH", "x")
            ]),
            ("redis+sentinel://s1:26379,s2:26379/mymaster?sentinel_password=x".into(), false)
        );
        assert!(translate(&env(&[("REDIS_TYPE", "SENTINEL"), ("REDIS_URL", "mymaster")])).is_err());
        assert!(translate(&env(&[("REDIS_TYPE", "ring")])).is_err());
    }

    #[test]
    fn refused_and_not_served() {
        let refused = translate(&env(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")])).unwrap_err();
        assert!(refused.contains("CONFIG_TYPE=GRPC_XDS_DELTA") && refused.contains("GRPC_XDS_SOTW"), "{refused}");
        assert!(translate(&env(&[("CONFIG_TYPE", "file")])).is_ok());
        let t = translate(&env(&[("REDIS_TLS", "true"), ("REDIS_URL", "h:6379"), ("REDIS_TLS_CACERT", "/ca.pem")]))
            .unwrap();
        assert_eq!(flag(&t, "--redis").as_deref(), Some("rediss://h:6379/"));
        assert_eq!(flag(&t, "--tls-ca-file").as_deref(), Some("/ca.pem"));
        let t = translate(&env(&[
            ("REDIS_TLS", "true"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ("REDIS_TLS_CLIENT_CERT", "/c.pem"),
            ("REDIS_TLS_CLIENT_KEY", "/k.pem"),
        ]))
        .unwrap();
        assert_eq!(flag(&t, "--redis").as_deref(), Some("rediss+sentinel://s1:26379,s2:26379/mymaster"));
        assert_eq!(flag(&t, "--tls-cert-file").as_deref(), Some("/c.pem"));
        let e = translate(&env(&[("REDIS_TLS", "true"), ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true")]));
        assert!(e.unwrap_err().contains("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"));
        assert!(translate(&env(&[("GRPC_SERVER_USE_TLS", "true")])).is_err(), "no certificate");
        assert!(translate(&env(&[("REDIS_TLS", "0")])).is_ok());
        assert!(translate(&env(&[("BACKEND_TYPE", "memcache")])).is_err());
        let t = translate(&env(&[("LOG_FORMAT", "JSON"), ("LOG_LEVEL", "Error")])).unwrap();
        assert_eq!(
            (flag(&t, "--log-format").unwrap(), flag(&t, "--log-level").unwrap()),
            ("json".into(), "Error".into())
        );
        let t = translate(&env(&[("LOG_FORMAT", "logfmt")])).unwrap();
        assert_eq!(flag(&t, "--log-format").unwrap(), "text");
        assert!(t.warning().unwrap().contains("LOG_FORMAT=logfmt"));
        assert!(translate(&env(&[("LOG_LEVEL", "loud")])).unwrap_err().contains("LOG_LEVEL=loud"));
        let t = translate(&env(&[("GRPC_UDS", "/run/rls.sock")])).unwrap();
        assert_eq!(flag(&t, "--rls-listen").unwrap(), "unix:/run/rls.sock");
        let t = translate(&env(&[("TRACING_ENABLED", "true"), ("DEBUG_PORT", "6071"), ("USE_STATSD", "F")])).unwrap();
        assert_eq!(flag(&t, "--debug-listen").unwrap(), "127.0.0.1:6071");
        let warning = t.warning().unwrap();
        assert!(warning.contains("TRACING_ENABLED") && !warning.contains("DEBUG_PORT"), "{warning}");
        assert!(!warning.contains("USE_STATSD"), "{warning}");
        assert!(translate(&env(&[("SHADOW_MODE", "maybe")])).is_err());
        let t = translate(&env(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"), ("QUOTA_MODE", "1")])).unwrap();
        assert!(flag(&t, "--rls-stop-increment-when-overlimit").is_some() && flag(&t, "--rls-quota-mode").is_some());
        assert!(t.warning().is_none());
    }

    #[test]
    fn statsd_as_upstream_sends_it() {
        // On by default, as upstream (USE_STATSD=true, localhost:8125, 10s).
        let t = translate(&env(&[])).unwrap();
        assert_eq!(flag(&t, "--rls-statsd").unwrap(), "localhost:8125");
        assert_eq!(flag(&t, "--rls-statsd-flush-interval-ms").unwrap(), "10000");
        assert!(flag(&t, "--rls-statsd-tags").is_none());
        let t = translate(&env(&[
            ("STATSD_HOST", "::1"),
            ("STATSD_PORT", "9125"),
            ("EXTRA_TAGS", "zone:eu,app:rl"),
            ("STATS_FLUSH_INTERVAL", "1m30s"),
        ]))
        .unwrap();
        assert_eq!(flag(&t, "--rls-statsd").unwrap(), "[::1]:9125");
        assert_eq!(flag(&t, "--rls-statsd-tags").unwrap(), "zone:eu,app:rl");
        assert_eq!(flag(&t, "--rls-statsd-flush-interval-ms").unwrap(), "90000");
        for off in [("USE_STATSD", "false"), ("DISABLE_STATS", "true")] {
            assert!(flag(&translate(&env(&[off])).unwrap(), "--rls-statsd").is_none(), "{off:?}");
        }
        let e = translate(&env(&[("STATS_FLUSH_INTERVAL", "10")])).unwrap_err();
        assert!(e.contains("STATS_FLUSH_INTERVAL=10"), "{e}");
        assert!(translate(&env(&[("EXTRA_TAGS", "novalue")])).unwrap_err().contains("EXTRA_TAGS"));
    }

    #[test]
    fn envoy_gateways_xds_environment() {
        let t = translate(&env(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway.envoy-gateway-system.svc.cluster.local:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1.5s"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1m30s"),
        ]))
        .unwrap();
        assert!(flag(&t, "--rls-config").is_none());
        assert_eq!(flag(&t, "--rls-xds").unwrap(), "envoy-gateway.envoy-gateway-system.svc.cluster.local:18001");
        assert_eq!(flag(&t, "--rls-xds-node-id").unwrap(), "envoy-ratelimit");
        assert!(flag(&t, "--rls-xds-tls").is_some());
        assert_eq!(flag(&t, "--rls-xds-tls-cert").unwrap(), "/certs/tls.crt");
        assert_eq!(flag(&t, "--rls-xds-tls-ca").unwrap(), "/certs/ca.crt");
        assert!(flag(&t, "--rls-xds-tls-san").is_none());
        assert_eq!(flag(&t, "--rls-xds-connect-retry-ms").unwrap(), "3000");
        assert_eq!(flag(&t, "--rls-xds-backoff-initial-ms").unwrap(), "1500");
        assert_eq!(flag(&t, "--rls-xds-backoff-max-ms").unwrap(), "90000");
        assert!(t.warning().is_none());
        // Without TLS, its files are not read (as upstream).
        let t =
            translate(&env(&[("CONFIG_TYPE", "GRPC_XDS_SOTW"), ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c")])).unwrap();
        assert!(flag(&t, "--rls-xds-tls-cert").is_none() && flag(&t, "--rls-xds").unwrap() == "localhost:18000");
        let xds = |pairs: &[(&'static str, &'static str)]| {
            let mut all = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
            all.extend_from_slice(pairs);
            translate(&env(&all))
        };
        for (variable, bad) in [
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "0s"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3 s"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "half"),
            ("XDS_CLIENT_BACKOFF_JITTER", "yes"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "4MB"),
        ] {
            let e = xds(&[(variable, bad)]).unwrap_err();
            assert!(e.contains(variable), "{variable}={bad}: {e}");
        }
        let e = xds(&[("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"), ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/k")]);
        assert!(e.unwrap_err().contains("go together"));
        assert_eq!(go_millis("X", "250ms"), Ok(250));
        assert_eq!(go_millis("X", "1h"), Ok(3_600_000));
        assert!(go_millis("X", "2h").is_err() && go_millis("X", "").is_err() && go_millis("X", "5x").is_err());
    }

    #[test]
    fn a_flag_given_wins_over_its_variable() {
        let t = translate(&env(&[("GRPC_PORT", "9000"), ("SHADOW_MODE", "true")])).unwrap();
        let args = t.args(&["--rls-listen=127.0.0.1:1".into(), "--rls-shadow-mode".into()]);
        assert!(!args.iter().any(|a| a == "--rls-listen" || a == "--rls-shadow-mode"), "{args:?}");
        assert!(args.iter().any(|a| a == "--metrics"), "{args:?}");
    }
}
