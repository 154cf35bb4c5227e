//! Settings of a [`Client`](crate::Client), with the defaults of the
//! design notes, and where Redis is: a target's URLs, read and shown
//! without their passwords. What a gateway decides beside them (leases,
//! the deny cache, the fallback) is rl-gateway's `LimiterConfig`.

use std::time::Duration;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::tls::Tls;

/// Where Redis is.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// One server: `redis://[user:password@]host:port[/db]`. A host name
    /// (a managed service's endpoint) is looked up again at every
    /// connection; a server that answers as a replica is left for the
    /// primary its `ROLE` names (see the crate README's failover section).
    Standalone(String),
    /// Redis Cluster: the URLs of some of its nodes, to discover the rest.
    Cluster(Vec<String>),
    /// A primary that Redis Sentinel watches: asked of the sentinels,
    /// and asked again when they switch it or it stops being the primary.
    Sentinel {
        /// The name the sentinels monitor it under (`sentinel monitor NAME ...`).
        master: String,
        /// Some of the sentinels: `host:port` (port 26379 when left out),
        /// or `redis://[user:password@]host:port/` with the sentinels' own
        /// credentials.
        sentinels: Vec<String>,
        /// How to talk to the master once found: its own credentials and
        /// database, apart from the sentinels'.
        node: NodeAuth,
    },
}

/// The credentials and database of a server found through Sentinel.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct NodeAuth {
    /// The ACL user (none: `default`).
    pub username: Option<String>,
    /// The user's password.
    pub password: Option<String>,
    /// The database. Default 0.
    pub db: i64,
}

impl std::fmt::Debug for NodeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAuth")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

/// URLs with their passwords redacted: a config may be logged.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Standalone(url) => f.debug_tuple("Standalone").field(&redacted(url)).finish(),
            Target::Cluster(urls) => {
                f.debug_tuple("Cluster").field(&urls.iter().map(|u| redacted(u)).collect::<Vec<_>>()).finish()
            }
            Target::Sentinel { master, sentinels, node } => f
                .debug_struct("Sentinel")
                .field("master", master)
                .field("sentinels", &sentinels.iter().map(|u| redacted(u)).collect::<Vec<_>>())
                .field("node", node)
                .finish(),
        }
    }
}

/// What the target is, fit for a log line (no password).
impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Standalone(url) => f.write_str(&redacted(url)),
            Target::Cluster(urls) => {
                write!(f, "cluster {}", urls.iter().map(|u| redacted(u)).collect::<Vec<_>>().join(","))
            }
            Target::Sentinel { master, sentinels, .. } => {
                let sentinels: Vec<String> = sentinels.iter().map(|s| redacted(s)).collect();
                write!(f, "sentinel master '{master}' via {}", sentinels.join(","))
            }
        }
    }
}

/// The scheme of a Sentinel target written as one URL.
pub const SENTINEL_SCHEME: &str = "redis+sentinel";

/// The same over TLS: the sentinels and the master are reached with
/// `rediss://`.
pub const SENTINEL_TLS_SCHEME: &str = "rediss+sentinel";

/// The sentinels' port when a sentinel address names none.
pub const SENTINEL_PORT: u16 = 26379;

impl Target {
    /// Every URL (or sentinel address) of the target.
    pub(crate) fn urls(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        match self {
            Target::Standalone(url) => Box::new(std::iter::once(url.as_str())),
            Target::Cluster(urls) => Box::new(urls.iter().map(String::as_str)),
            Target::Sentinel { sentinels, .. } => Box::new(sentinels.iter().map(String::as_str)),
        }
    }

    /// A Sentinel target for `master`, found through `sentinels`
    /// (`host:port` each), with the master's default user and database 0.
    pub fn sentinel<S: Into<String>>(master: impl Into<String>, sentinels: impl IntoIterator<Item = S>) -> Target {
        Target::Sentinel {
            master: master.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            node: NodeAuth::default(),
        }
    }

    /// One server from a `redis://` (or `redis+unix://`) URL, or a
    /// Sentinel target from
    /// `redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[/DB]`
    /// (the credentials and database are the master's; the sentinels' own
    /// go in `?sentinel_username=...&sentinel_password=...`);
    /// `rediss+sentinel://` for sentinels and a master that speak TLS. For
    /// tools that take one `--redis` URL.
    pub fn from_url(url: &str) -> Result<Target> {
        let scheme_rest = |scheme: &str| url.strip_prefix(scheme).and_then(|r| r.strip_prefix("://"));
        let (tls, rest) = match (scheme_rest(SENTINEL_SCHEME), scheme_rest(SENTINEL_TLS_SCHEME)) {
            (Some(rest), _) => (false, rest),
            (None, Some(rest)) => (true, rest),
            (None, None) => return Ok(Target::Standalone(url.to_owned())),
        };
        let bad = |why: &str| Error::invalid(format!("Sentinel URL '{}': {why}", redacted(url)));
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let mut node = NodeAuth::default();
        if let Some(userinfo) = userinfo {
            let (user, password) = userinfo.split_once(':').unwrap_or(("", userinfo));
            node.username =
                Some(decoded(user).ok_or_else(|| bad("bad %-escape in the user"))?).filter(|u| !u.is_empty());
            node.password = Some(decoded(password).ok_or_else(|| bad("bad %-escape in the password"))?);
        }
        let mut segments = path.split('/').filter(|s| !s.is_empty());
        let master = segments.next().ok_or_else(|| bad("no master name: add /NAME after the sentinels"))?;
        let master = decoded(master).ok_or_else(|| bad("bad %-escape in the master's name"))?;
        if let Some(db) = segments.next() {
            node.db = db.parse().map_err(|_| bad(&format!("'{db}' is not a database number")))?;
        }
        if segments.next().is_some() {
            return Err(bad("the path is /MASTER or /MASTER/DB"));
        }
        let (mut sentinel_user, mut sentinel_password) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decoded(value).ok_or_else(|| bad(&format!("bad %-escape in {key}")))?;
            match key {
                "sentinel_username" => sentinel_user = Some(value),
                "sentinel_password" => sentinel_password = Some(value),
                _ => return Err(bad(&format!("unknown parameter '{key}' (sentinel_username, sentinel_password)"))),
            }
        }
        let sentinels = hosts
            .split(',')
            .map(|host| {
                if host.is_empty() {
                    return Err(bad("an empty sentinel address"));
                }
                Ok(match (&sentinel_user, &sentinel_password) {
                    (None, None) if !tls => host.to_owned(),
                    (user, password) => {
                        let scheme = if tls { "rediss" } else { "redis" };
                        let userinfo = match (user, password) {
                            (None, None) => String::new(),
                            (user, password) => format!(
                                "{}:{}@",
                                user.as_deref().map(encoded).unwrap_or_default(),
                                password.as_deref().map(encoded).unwrap_or_default()
                            ),
                        };
                        let port = if host.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
                            String::new()
                        } else {
                            format!(":{SENTINEL_PORT}")
                        };
                        format!("{scheme}://{userinfo}{host}{port}/")
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Target::Sentinel { master, sentinels, node })
    }
}

/// `%XX` escapes decoded; `None` for a broken one or bytes that are not UTF-8.
fn decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Every byte but unreserved ones `%XX`-escaped, for a URL's userinfo.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `url` fit for a log line: a password in its userinfo or in a `password`
/// or `pass` query parameter (redis-rs reads both) becomes `***`, and so
/// does a Sentinel URL's `sentinel_password`.
pub fn redacted(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let host = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            // redis://secret@host: a lone userinfo may be the password.
            None => format!("***@{host}"),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
                    _ => kv.to_owned(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_owned(),
    };
    if scheme.is_empty() {
        format!("{host}{tail}")
    } else {
        format!("{scheme}://{host}{tail}")
    }
}

fn is_secret_param(name: &str) -> bool {
    ["password", "pass", "sentinel_password"].iter().any(|p| name.eq_ignore_ascii_case(p))
}

/// How the limits run on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The redis-rl module's native commands (RL.TAKE, RL.LEASE, ...).
    Module,
    /// The same algorithms as Lua scripts through EVALSHA, for servers that
    /// cannot load modules: token buckets, fixed, sliding and exact windows
    /// and in-flight limits, with limit x period_ms <= 2^52 and an EXACT
    /// window up to 10,000 (`beyond_lua` says why a limit does not fit).
    /// Behind a relay (`Config::relay`), the calls go to the relay as the
    /// module's commands and to Redis, while the relay is down, as the
    /// scripts' calls.
    Lua,
}

/// How to reach Redis, with the defaults below. Start from
/// [`Config::standalone`] or [`Config::cluster`] and change fields:
///
/// ```
/// use std::time::Duration;
/// use rl_client::{Backend, Config};
///
/// let config = Config {
///     backend: Backend::Lua,
///     timeout: Duration::from_millis(10),
///     ..Config::standalone("redis://10.0.0.5:6379/")
/// };
/// # let _ = config;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where Redis is.
    pub target: Target,
    /// A lease relay (rl-relay, `redis://host:port/`, or `rediss://` for
    /// one serving TLS: `tls` applies to it too) in front of `target`:
    /// calls go to it while it answers, and to `target` directly while its
    /// breaker is open (the breaker settings below apply to it as to a
    /// shard). With [`Backend::Lua`] (a relay on `--redis-backend lua`
    /// in front of a Redis without the module) the calls are the module's
    /// commands, and go to `target` directly as the scripts' calls.
    /// Default none: calls go to `target`.
    pub relay: Option<String>,
    /// Default [`Backend::Module`].
    pub backend: Backend,
    /// Whom to trust and the client certificate for `rediss://` URLs
    /// (TLS itself is the URL's scheme). Default: the system roots, no
    /// client certificate; [`Tls::from_env`] reads the environment every
    /// binary shares.
    pub tls: Tls,
    /// Longest wait for any call to Redis; past it the call counts as failed
    /// (and an rl-gateway limiter's fallback answers). Default 50 ms: a timeout below Redis's tail
    /// latency under load turns load into an outage of the limits (the
    /// crate README's fleet simulation shows it with 5 ms).
    pub timeout: Duration,
    /// Longest wait to (re)connect, in the background. Default 250 ms.
    pub connect_timeout: Duration,
    /// Consecutive failures that open a breaker: the relay's here, each
    /// shard's in an rl-gateway limiter. Default 5.
    pub breaker_trip_after: u32,
    /// The share of failed calls that opens a shard's breaker, counted per
    /// second once 20 calls of that second have reported: a Redis slow for
    /// a fraction of calls fails some, seldom five in a row. Default 0.5.
    pub breaker_failure_rate: f64,
    /// How long an open breaker skips its shard before one probe. Default 2 s.
    pub breaker_open_for: Duration,
    /// The clock leases, the deny cache, breakers and the fallback read.
    /// Default [`Clock::System`]; tests and simulations hand a limiter a
    /// [`ManualClock`](crate::ManualClock).
    pub clock: Clock,
}

impl Config {
    /// A primary that Redis Sentinel watches as `master`, found through
    /// `sentinels` (`host:port` each), with every default.
    pub fn sentinel<S: Into<String>>(master: impl Into<String>, sentinels: impl IntoIterator<Item = S>) -> Config {
        Config::with_target(Target::sentinel(master, sentinels))
    }

    /// Any target, with every default.
    pub fn for_target(target: Target) -> Config {
        Config::with_target(target)
    }

    /// One server at `url` (`redis://host:port/`), with every default.
    pub fn standalone(url: impl Into<String>) -> Config {
        Config::with_target(Target::Standalone(url.into()))
    }

    /// A Redis Cluster reached through any of `urls`, with every default.
    pub fn cluster<S: Into<String>>(urls: impl IntoIterator<Item = S>) -> Config {
        Config::with_target(Target::Cluster(urls.into_iter().map(Into::into).collect()))
    }

    fn with_target(target: Target) -> Config {
        Config {
            target,
            relay: None,
            backend: Backend::Module,
            tls: Tls::default(),
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(250),
            breaker_trip_after: 5,
            breaker_failure_rate: 0.5,
            breaker_open_for: Duration::from_secs(2),
            clock: Clock::System,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let positive = [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
            ("breaker_open_for", self.breaker_open_for),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                return Err(Error::invalid(format!("config {name} must be above zero")));
            }
        }
        if self.breaker_trip_after == 0 {
            return Err(Error::invalid("config breaker_trip_after must be at least 1"));
        }
        if !(self.breaker_failure_rate > 0.0 && self.breaker_failure_rate <= 1.0) {
            return Err(Error::invalid(format!(
                "config breaker_failure_rate must be above 0 and at most 1, got {}",
                self.breaker_failure_rate
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_never_show_a_password() {
        for (url, shown) in [
            ("redis://rl-exporter:s3cret@10.0.0.5:6379/0", "redis://rl-exporter:***@10.0.0.5:6379/0"),
            ("rediss://:s3cret@cache.example:6380", "rediss://:***@cache.example:6380"),
            ("redis://s3cret@10.0.0.5/", "redis://***@10.0.0.5/"),
            ("redis://10.0.0.5:6379/", "redis://10.0.0.5:6379/"),
            ("redis+unix:///run/redis.sock?db=1&pass=s3cret", "redis+unix:///run/redis.sock?db=1&pass=***"),
            ("unix:///run/redis.sock?user=u&password=s3cret", "unix:///run/redis.sock?user=u&password=***"),
            ("redis://u:p@ss@host/", "redis://u:***@host/"),
            ("not a url s3cret@x", "***@x"),
            (
                "redis+sentinel://gw:s3cret@10.0.0.5:26379,10.0.0.6/mymaster?sentinel_password=s3cret",
                "redis+sentinel://gw:***@10.0.0.5:26379,10.0.0.6/mymaster?sentinel_password=***",
            ),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
            assert!(!redacted(url).contains("s3cret"));
        }
    }

    #[test]
    fn defaults_are_the_design_notes() {
        let c = Config::standalone("redis://127.0.0.1/");
        assert_eq!(c.timeout, Duration::from_millis(50));
        assert_eq!((c.breaker_trip_after, c.breaker_open_for), (5, Duration::from_secs(2)));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_sentinel_url_keeps_the_master_s_credentials_apart() {
        let t = Target::from_url(
            "redis+sentinel://gw:p%40ss@10.0.0.5:26379,10.0.0.6/mymaster/2?sentinel_password=s%3Acret",
        )
        .unwrap();
        let Target::Sentinel { master, sentinels, node } = &t else { panic!("{t:?}") };
        assert_eq!(master, "mymaster");
        assert_eq!((node.username.as_deref(), node.password.as_deref(), node.db), (Some("gw"), Some("p@ss"), 2));
        assert_eq!(sentinels, &["redis://:s%3Acret@10.0.0.5:26379/", "redis://:s%3Acret@10.0.0.6:26379/"]);
        let shown = format!("{t:?} {t}");
        assert!(!shown.contains("p@ss") && !shown.contains("s%3Acret"), "{shown}");
        assert_eq!(
            t.to_string(),
            "sentinel master 'mymaster' via redis://:***@10.0.0.5:26379/,redis://:***@10.0.0.6:26379/"
        );
        let plain = Target::from_url("redis+sentinel://h1:1,h2/m").unwrap();
        assert_eq!(plain, Target::sentinel("m", ["h1:1", "h2"]));
        let tls = Target::from_url("rediss+sentinel://h1:1,h2/m").unwrap();
        assert_eq!(tls, Target::sentinel("m", ["rediss://h1:1/", "rediss://h2:26379/"]));
        let Target::Sentinel { sentinels, .. } =
            Target::from_url("rediss+sentinel://h1/m?sentinel_password=s%3Acret").unwrap()
        else {
            panic!()
        };
        assert_eq!(sentinels, ["rediss://:s%3Acret@h1:26379/"]);
        assert_eq!(Target::from_url("redis://h:1/").unwrap(), Target::Standalone("redis://h:1/".into()));
        for (url, why) in [
            ("redis+sentinel://h1", "no master name"),
            ("redis+sentinel://h1/m/x", "'x' is not a database number"),
            ("redis+sentinel://h1/m/1/2", "/MASTER or /MASTER/DB"),
            ("redis+sentinel://h1,,h2/m", "an empty sentinel address"),
            ("redis+sentinel://h1/m?timeout=1", "unknown parameter 'timeout'"),
            ("redis+sentinel://u:%zz@h1/m", "bad %-escape in the password"),
        ] {
            let e = Target::from_url(url).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn a_logged_config_shows_no_password() {
        let c = Config::standalone("redis://gw:s3cret@10.0.0.5:6379/");
        let shown = format!("{c:?}");
        assert!(shown.contains("redis://gw:***@10.0.0.5:6379/") && !shown.contains("s3cret"), "{shown}");
        let node = NodeAuth { password: Some("s3cret".into()), ..NodeAuth::default() };
        let t = Target::Sentinel { master: "m".into(), sentinels: vec!["h".into()], node };
        assert!(!format!("{t:?}").contains("s3cret"));
    }

    #[test]
    fn bad_settings_are_named() {
        let base = Config::cluster(["redis://127.0.0.1:7000/"]);
        let e = Config { timeout: Duration::ZERO, ..base.clone() }.validate().unwrap_err();
        assert!(e.to_string().contains("timeout must be above zero"));
        let e = Config { breaker_failure_rate: 0.0, ..base }.validate().unwrap_err();
        assert!(e.to_string().contains("breaker_failure_rate"));
    }
}
