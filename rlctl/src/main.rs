//! rlctl: validate a rule file, publish it to Redis, see what is in force
//! and what every gateway runs, add or remove emergency overrides, unlock
//! a subject, and go back to a past rule set. What an on-call engineer types at
//! 3 a.m.; every failure says what is wrong and exits non-zero.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand};
use rl_gateway::live::{
    diff, escaped, fleet_status, override_id, parse_network, remaining, LimitSpec, MatchSpec, Mode, RuleSetSpec,
    RuleSpec, RulesStore, Snapshot, Stored, DEFAULT_KEY, MAX_OVERRIDE,
};
use rl_gateway::{Backend, Error, FailMode};

#[derive(Parser)]
#[command(name = "rlctl", version, about = "Live rate-limit rules: validate, publish, inspect, override; metrics")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    tls: rlctl::tls_flags::TlsFlags,
}

#[derive(Args)]
struct Store {
    // The help as an attribute: its URL templates' brackets would read as
    // links in a doc comment (rustdoc).
    #[arg(
        long,
        env = "RL_REDIS_URL",
        value_name = "URL",
        help = "The Redis server holding the rules: redis://[user:password@]host:port/, or the master Sentinel names: \
                redis+sentinel://[user:password@]host:port[,host:port...]/MASTER"
    )]
    redis: String,
    /// The rules hash (also the channel new versions are announced on).
    #[arg(long, default_value = DEFAULT_KEY)]
    key: String,
}

#[derive(Subcommand)]
enum Command {
    /// Check a rule file (TOML, or JSON if it ends in .json) without publishing it.
    Validate {
        file: String,
        /// Check as a gateway on the Lua backend would (no windows or quotas).
        #[arg(long)]
        lua: bool,
        /// Also ask this server (the limiter's) whether it accepts every
        /// limit (an EXACT window above its max-log-limit, an in-flight
        /// limit above its max-inflight-limit).
        #[arg(long, value_name = "URL")]
        redis: Option<String>,
    },
    /// Check a rule file with the overrides in force and publish it as the next version.
    Publish {
        file: String,
        #[command(flatten)]
        store: Store,
    },
    /// Show the version in force, its rules and overrides.
    Active {
        #[command(flatten)]
        store: Store,
    },
    /// What every gateway runs: the fleet's spread of versions, and a
    /// warning (exit 1) for a gateway behind, silent or stale.
    Status {
        #[command(flatten)]
        store: Store,
    },
    /// Clear a subject's counts (every rule's keys for it) and tell every
    /// gateway to drop its deny entries and leases for it.
    Unlock {
        /// The subject as the gateway keys it: an API key, `ip:203.0.113.7/32`.
        subject: String,
        /// The rules file the gateways run, for a fleet that publishes
        /// nothing (its keys are found there; with a published set too,
        /// the keys of both).
        #[arg(long, value_name = "FILE")]
        rules: Option<PathBuf>,
        #[command(flatten)]
        store: Store,
    },
    /// The rule sets published, newest first (the last ten are kept).
    History {
        #[command(flatten)]
        store: Store,
    },
    /// What changes: from the set in force (or --from VERSION) to FILE (or
    /// --to VERSION, or the set in force).
    Diff {
        /// A rule file to compare with.
        file: Option<String>,
        /// A version from the history to compare from.
        #[arg(long, value_name = "VERSION")]
        from: Option<u64>,
        /// A version from the history to compare to.
        #[arg(long, value_name = "VERSION", conflicts_with = "file")]
        to: Option<u64>,
        #[command(flatten)]
        store: Store,
    },
    /// Publish a past rule set again, as the next version (checked as publish checks it).
    Rollback {
        /// The version in the history to go back to.
        version: u64,
        #[command(flatten)]
        store: Store,
    },
    /// Emergency overrides: they always expire and carry a reason.
    #[command(subcommand)]
    Override(OverrideCommand),
    /// Serve the limiter's counters (INFO rl, evictions, memory, refused
    /// calls) as Prometheus metrics on GET /metrics, until stopped.
    Metrics {
        /// The Redis server to read INFO from (one exporter per server), or
        /// redis+sentinel://host:port[,host:port...]/MASTER: the master, followed.
        #[arg(long, env = "RL_REDIS_URL", value_name = "URL")]
        redis: String,
        /// Where to listen (port 10079: 9121 is redis_exporter's).
        #[arg(long, default_value = "127.0.0.1:10079", value_name = "ADDR")]
        listen: String,
    },
}

#[derive(Subcommand)]
enum OverrideCommand {
    /// Add (or replace) the override of one subject or one network.
    Add(AddOverride),
    /// List the overrides, expired ones marked.
    List {
        #[command(flatten)]
        store: Store,
    },
    /// Remove an override.
    Remove {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        store: Store,
    },
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct Matched {
    /// The subject (API key, user) the override is for.
    #[arg(long)]
    subject: Option<String>,
    /// The address or network the override is for (2001:db8::/48).
    #[arg(long)]
    ip: Option<String>,
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct Target {
    /// The subject whose override goes.
    #[arg(long)]
    subject: Option<String>,
    /// The address or network whose override goes.
    #[arg(long)]
    ip: Option<String>,
    /// The override's id.
    #[arg(long)]
    id: Option<String>,
}

#[derive(Args)]
struct AddOverride {
    #[command(flatten)]
    matched: Matched,
    /// The override's id (default: ovr-, the subject or network, and a hash of it).
    #[arg(long)]
    id: Option<String>,
    /// A limit: NAME=COUNT/PER, then ,burst=N or ,window ,exact ,quota, or
    /// ,inflight (PER is then the timeout: concurrent=20/30s,inflight) (repeatable).
    #[arg(long = "limit", required = true, value_name = "SPEC")]
    limits: Vec<String>,
    /// How long it lasts (15m, 2h, 3d) or until when (2026-10-28T09:00:00Z); at most 30 days.
    #[arg(long)]
    expires: String,
    /// Why: the ticket or incident.
    #[arg(long)]
    reason: String,
    /// Refuse instead of limiting locally while Redis is down.
    #[arg(long)]
    fail_closed: bool,
    /// With --ip: every address of the network shares one set of buckets
    /// (without it, each client of the network, an IPv6 /64 by default, has its own).
    #[arg(long)]
    shared: bool,
    /// With --ip: allow a network broader than the set's broad_ipv4_prefix
    /// (/16) or broad_ipv6_prefix (/32); 0.0.0.0/0 outranks every rule.
    #[arg(long)]
    broad: bool,
    #[command(flatten)]
    store: Store,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    TLS.get_or_init(|| cli.tls.tls());
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start: {e}")),
    };
    match runtime.block_on(run(cli.command)) {
        Ok((text, None)) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Ok((text, Some(problem))) => {
            println!("{text}");
            fail(&problem)
        }
        Err(e) => fail(&e.to_string()),
    }
}

fn fail(text: &str) -> ExitCode {
    eprintln!("rlctl: {text}");
    ExitCode::FAILURE
}

/// What to print, and a problem that makes the exit code 1 though
/// something useful was printed.
type Output = (String, Option<String>);

async fn run(command: Command) -> Result<Output, Error> {
    let done = |text: String| Ok((text, None));
    match command {
        Command::Validate { file, lua, redis } => {
            let spec = RuleSetSpec::from_file(&file)?;
            let backend = if lua { Backend::Lua } else { Backend::Module };
            let version = spec.version.unwrap_or(0);
            let snapshot = Snapshot::compile_for(&spec, &[], version, backend)?;
            let mut note = None;
            if let Some(url) = redis {
                if check_server(&url, backend, &snapshot, true).await? == Checked::NoModule {
                    note = Some(lua_gateways_accept(&spec, &[], version, &url)?);
                }
            }
            let ok = format!("{file}: ok, version {}: {}", snapshot.version(), summary(&snapshot));
            let lines = std::iter::once(ok)
                .chain(note)
                .chain(inflight_limits(&snapshot))
                .chain(global_splits(&snapshot))
                .collect::<Vec<_>>()
                .join("\n");
            done(with_warnings(lines, &snapshot))
        }
        Command::Publish { file, store } => {
            let spec = RuleSetSpec::from_file(&file)?;
            let store = open(&store)?;
            let before = store.read().await?;
            // The server the rules are published to, as the limiter's:
            // each gateway asks its own again before installing.
            let overrides = before.overrides.clone();
            let next = spec.version.unwrap_or(before.version.saturating_add(1));
            let mut note = None;
            if let Ok(snapshot) = Snapshot::compile(&spec, &overrides, next) {
                if check_server(store.url(), Backend::Module, &snapshot, false).await? == Checked::NoModule {
                    note = Some(lua_gateways_accept(&spec, &overrides, next, store.url())?);
                }
            }
            let version = store.publish(&spec).await?;
            let lineage = store.read().await?.lineage.unwrap_or_default();
            let mut published = format!(
                "published {file} as version {version} of lineage {lineage} on {} {}",
                rl_gateway::redacted(store.url()),
                store.key()
            );
            if before.version == 0 {
                published.push_str(&format!(
                    "\nnote: the store held no rules: lineage {lineage} starts here; every gateway takes it, whatever \
                     version it ran (a first publication, or the rules were lost: check `rlctl status`)"
                ));
            }
            if let Some(note) = note {
                published.push('\n');
                published.push_str(&note);
            }
            // Checked by publish already: compiled again only for its warnings.
            match Snapshot::compile(&spec, &[], version) {
                Ok(snapshot) => done(with_warnings(published, &snapshot)),
                Err(_) => done(published),
            }
        }
        Command::Active { store } => active(&open(&store)?.read().await?),
        Command::Status { store } => status(&open(&store)?).await,
        Command::Unlock { subject, rules, store } => unlock(&open(&store)?, &subject, rules.as_deref()).await,
        Command::History { store } => history(&open(&store)?).await,
        Command::Diff { file, from, to, store } => {
            let store = open(&store)?;
            let past = |version: u64| {
                let store = store.clone();
                async move {
                    let history = store.history().await?;
                    let entry = history.into_iter().find(|e| e.version == version);
                    entry
                        .map(|e| e.rules)
                        .ok_or_else(|| Error::Rules(format!("version {version} is not in the history")))
                }
            };
            let in_force = || async {
                store.read().await?.rules.ok_or_else(|| Error::Rules("nothing is published yet".to_owned()))
            };
            let (old, old_name) = match from {
                Some(v) => (past(v).await?, format!("version {v}")),
                None => (in_force().await?, "the set in force".to_owned()),
            };
            let (new, new_name) = match (&file, to) {
                (Some(file), _) => (RuleSetSpec::from_file(file)?, file.clone()),
                (None, Some(v)) => (past(v).await?, format!("version {v}")),
                (None, None) => (in_force().await?, "the set in force".to_owned()),
            };
            let lines = diff(&old, &new);
            if lines.is_empty() {
                return done(format!("no change from {old_name} to {new_name}"));
            }
            done(std::iter::once(format!("from {old_name} to {new_name}:")).chain(lines).collect::<Vec<_>>().join("\n"))
        }
        Command::Rollback { version, store } => {
            let store = open(&store)?;
            let published = store.rollback(version).await?;
            done(format!("version {version} published again as version {published}"))
        }
        Command::Metrics { redis, listen } => {
            let listener = tokio::net::TcpListener::bind(&listen)
                .await
                .map_err(|e| Error::invalid(format!("cannot listen on {listen}: {e}")))?;
            let at = listener.local_addr().map_or(listen, |a| a.to_string());
            eprintln!("rlctl: serving http://{at}/metrics for {}", rl_gateway::redacted(&redis));
            rlctl::exporter::serve(&redis, &tls(), listener).await.map_err(Error::invalid)?;
            Ok((String::new(), None))
        }
        Command::Override(OverrideCommand::Add(add)) => {
            let store = open(&add.store)?;
            let rule = override_rule(&add)?;
            let version = store.set_override(&rule).await?;
            let expires = rule.expires.as_deref().unwrap_or("?");
            done(format!("override '{}' in force from version {version}, until {expires}", rule.id))
        }
        Command::Override(OverrideCommand::List { store }) => {
            let stored = open(&store)?.read().await?;
            let list = overrides(&stored, SystemTime::now()).unwrap_or_else(|| "no overrides".to_owned());
            Ok((list, invalid_problem(&stored)))
        }
        Command::Override(OverrideCommand::Remove { target, store }) => {
            let store = open(&store)?;
            let (id, version) = match (target.id, target.subject, target.ip) {
                (Some(id), _, _) => {
                    let version = store.remove_override(&id).await?;
                    (id, version)
                }
                (None, Some(s), _) => store.remove_override_for(&subject_match(s)).await?,
                (None, None, Some(ip)) => store.remove_override_for(&ip_match(&ip)).await?,
                (None, None, None) => {
                    return Err(Error::Rules("name the override: --subject, --ip or --id".to_owned()))
                }
            };
            done(format!("override '{id}' removed in version {version}"))
        }
    }
}

/// A server without the module runs gateways on the Lua backend: the set
/// is held to what their scripts can count, as `validate --lua` holds it.
/// The note saying so, or the refusal naming the limit and the bound.
fn lua_gateways_accept(spec: &RuleSetSpec, overrides: &[RuleSpec], version: u64, url: &str) -> Result<String, Error> {
    let url = rl_gateway::redacted(url);
    Snapshot::compile_for(spec, overrides, version, Backend::Lua).map_err(|e| {
        let e = e.to_string();
        Error::Rules(format!(
            "rule set rejected: the server at {url} has no redis-rl module, so its gateways run the Lua backend, which \
             refuses it: {}",
            e.strip_prefix("rule set rejected: ").unwrap_or(&e)
        ))
    })?;
    Ok(format!(
        "note: the server at {url} has no redis-rl module: the set was checked as gateways on the Lua backend check it \
         (rlctl validate --lua)"
    ))
}

/// What the server said of a set's limits.
#[derive(Debug, PartialEq, Eq)]
enum Checked {
    /// It accepts them (or could not be asked, past `publish`'s warning).
    Accepted,
    /// Asked as the module, it knows no redis-rl command.
    NoModule,
}

/// Refuses a set whose limits the server at `url` refuses. When the
/// server cannot be asked, `validate` (`strict`) fails and `publish` goes
/// on (its gateways ask their own servers before installing).
async fn check_server(url: &str, backend: Backend, snapshot: &Snapshot, strict: bool) -> Result<Checked, Error> {
    // A command line, not a request path: the gateways' 50 ms would fail
    // a check over TLS to a distant server.
    let wait = Duration::from_secs(5);
    let config = rl_gateway::Config {
        backend,
        tls: tls(),
        timeout: wait,
        connect_timeout: wait,
        ..rl_gateway::Config::standalone(url)
    };
    let client = rl_gateway::Client::new(&config)?;
    match rl_gateway::live::server_refusals(&client, snapshot).await {
        Ok(faults) if faults.is_empty() => Ok(Checked::Accepted),
        Ok(faults) => Err(Error::Rules(format!(
            "rule set rejected: the server at {} refuses {}",
            rl_gateway::redacted(url),
            faults.join("; ")
        ))),
        Err(rl_gateway::Error::Redis(e)) if e.to_string().contains("unknown command") => Ok(Checked::NoModule),
        Err(e) if strict => {
            Err(Error::Rules(format!("cannot ask {} about the set's limits: {e}", rl_gateway::redacted(url))))
        }
        Err(e) => {
            eprintln!("rlctl: warning: cannot ask the server about the set's limits ({e}): gateways check them before installing");
            Ok(Checked::Accepted)
        }
    }
}

fn with_warnings(text: String, snapshot: &Snapshot) -> String {
    let warnings = snapshot.warnings().iter().map(|w| format!("warning: {w}"));
    std::iter::once(text).chain(warnings).collect::<Vec<_>>().join("\n")
}

fn subject_match(subject: String) -> MatchSpec {
    MatchSpec { subject: Some(subject), ..MatchSpec::default() }
}

/// A network as written, or as parsed when it parses: `10.1.2.3` is kept
/// as `10.1.2.3/32`, `::ffff:10.0.0.0/104` as `10.0.0.0/8`.
fn ip_match(ip: &str) -> MatchSpec {
    let text = parse_network(ip).map_or_else(|| ip.to_owned(), |net| net.to_string());
    MatchSpec { ip: Some(text), ..MatchSpec::default() }
}

/// The exit-code problem of a store with overrides that do not parse.
fn invalid_problem(stored: &Stored) -> Option<String> {
    (!stored.invalid.is_empty()).then(|| {
        format!(
            "{} stored override(s) are invalid (listed above): gateways refuse this version until they are removed",
            stored.invalid.len()
        )
    })
}

/// The TLS settings of this run (`--tls-*`, `RL_TLS_*`), for every server it calls.
static TLS: std::sync::OnceLock<rl_gateway::Tls> = std::sync::OnceLock::new();

fn tls() -> rl_gateway::Tls {
    TLS.get().cloned().unwrap_or_default()
}

fn open(store: &Store) -> Result<RulesStore, Error> {
    RulesStore::with_tls(&store.redis, &store.key, &tls(), Duration::from_secs(5))
}

fn override_rule(add: &AddOverride) -> Result<RuleSpec, Error> {
    let scope = match (&add.matched.subject, &add.matched.ip) {
        (Some(s), None) => subject_match(s.clone()),
        (None, Some(ip)) => ip_match(ip),
        _ => return Err(Error::Rules("an override is for one --subject or one --ip".to_owned())),
    };
    if add.shared && add.matched.ip.is_none() {
        return Err(Error::Rules(
            "--shared is for an --ip override: a network whose clients share one set of buckets".to_owned(),
        ));
    }
    if add.broad && add.matched.ip.is_none() {
        return Err(Error::Rules("--broad is for an --ip override: a network broader than /16 or /32".to_owned()));
    }
    let limits = add
        .limits
        .iter()
        .map(|l| check_parts(l).and_then(|()| LimitSpec::parse_short(l)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RuleSpec {
        id: add.id.clone().unwrap_or_else(|| override_id(&scope)),
        scope,
        limits,
        mode: Mode::Enforce,
        fail: if add.fail_closed { FailMode::Closed } else { FailMode::Open },
        shared: add.shared,
        broad: add.broad,
        expires: Some(expiry(&add.expires, SystemTime::now())?),
        reason: add.reason.clone(),
        global: None,
        ..RuleSpec::default()
    })
}

/// Refuses a `--limit` whose options conflict (`burst=5,burst=7`,
/// `window,exact`, a burst with another kind than a bucket): the last one
/// would otherwise win, silently.
fn check_parts(text: &str) -> Result<(), Error> {
    let options: Vec<&str> = text.split(',').skip(1).map(str::trim).collect();
    let bad = |why: String| Error::Rules(format!("--limit {text:?}: {why}"));
    let bursts: Vec<&str> = options.iter().filter_map(|o| o.strip_prefix("burst=")).collect();
    let kinds: Vec<&&str> = options.iter().filter(|o| !o.starts_with("burst=")).collect();
    if bursts.len() > 1 {
        return Err(bad(format!("burst is given {} times ({}): give it once", bursts.len(), bursts.join(", "))));
    }
    if kinds.len() > 1 {
        let list: Vec<&str> = kinds.iter().map(|k| **k).collect();
        return Err(bad(format!("{} kinds given ({}): a limit has one", kinds.len(), list.join(", "))));
    }
    if let (Some(kind), Some(_)) = (kinds.first(), bursts.first()) {
        return Err(bad(format!("burst is for a bucket, not {kind}")));
    }
    Ok(())
}

/// `15m` from now, or a UTC time as written; within [`MAX_OVERRIDE`] of
/// `now` (checked here, before a far date can overflow or fail to print).
fn expiry(text: &str, now: SystemTime) -> Result<String, Error> {
    let at = match humantime::parse_rfc3339(text) {
        Ok(at) => Some(at),
        Err(_) => match humantime::parse_duration(text) {
            Ok(d) => now.checked_add(d),
            Err(_) => {
                return Err(Error::Rules(format!(
                    "--expires {text:?} is neither a duration (15m, 2h, 3d) nor a UTC time (2026-10-28T09:00:00Z)"
                )))
            }
        },
    };
    match at {
        Some(at) if at.duration_since(now).unwrap_or_default() <= MAX_OVERRIDE => {
            Ok(humantime::format_rfc3339_seconds(at).to_string())
        }
        _ => Err(Error::Rules(format!(
            "--expires {text:?}: an override must end within 30 days; lasting limits belong in the rule file"
        ))),
    }
}

fn summary(snapshot: &Snapshot) -> String {
    let rules = snapshot.rules();
    let shadow = rules.iter().filter(|r| r.mode() == Mode::Shadow).count();
    let overrides = rules.iter().filter(|r| r.is_override()).count();
    let inflight = rules.iter().filter(|r| r.inflight().is_some()).count();
    format!("{} rules ({shadow} in shadow mode, {overrides} overrides, {inflight} with in-flight limits)", rules.len())
}

/// One line per rule with in-flight limits: what each holds at most.
fn inflight_limits(snapshot: &Snapshot) -> Vec<String> {
    let rules = snapshot.rules().iter().filter_map(|r| Some((r, r.inflight()?)));
    rules
        .map(|(rule, policy)| {
            let limits: Vec<String> = policy
                .rules()
                .iter()
                .map(|l| {
                    format!(
                        "{} at most {} at once, timeout {}",
                        l.name(),
                        l.limit(),
                        humantime::format_duration(l.timeout())
                    )
                })
                .collect();
            format!("  in flight: rule '{}' ({}): {}", rule.id(), rule.scope(), limits.join("; "))
        })
        .collect()
}

/// One line per global rule: the regions it spans and its fixed split.
fn global_splits(snapshot: &Snapshot) -> Vec<String> {
    let rules = snapshot.rules().iter().filter_map(|r| Some((r, r.global()?)));
    rules.map(|(rule, global)| format!("  global: rule '{}' ({}): {global}", rule.id(), rule.scope())).collect()
}

fn active(stored: &Stored) -> Result<Output, Error> {
    let Some(rules) = &stored.rules else {
        return Ok((format!("version {}: nothing published", stored.version), None));
    };
    let now = SystemTime::now();
    // One bad override does not hide the rest: each is checked with the
    // set alone, and the ones that pass are shown together.
    let (snapshot, refused) = match Snapshot::compile(rules, &stored.overrides, stored.version) {
        Ok(snapshot) => (snapshot, Vec::new()),
        Err(whole) => {
            let (good, bad): (Vec<&RuleSpec>, Vec<&RuleSpec>) = stored
                .overrides
                .iter()
                .partition(|o| Snapshot::compile(rules, std::slice::from_ref(*o), stored.version).is_ok());
            let good: Vec<RuleSpec> = good.into_iter().cloned().collect();
            match Snapshot::compile(rules, &good, stored.version) {
                Ok(snapshot) if !bad.is_empty() => {
                    let why = |o: &RuleSpec| {
                        let e = Snapshot::compile(rules, std::slice::from_ref(o), stored.version).err();
                        e.map(|e| e.to_string()).unwrap_or_default()
                    };
                    (snapshot, bad.into_iter().map(|o| format!("override '{}': {}", o.id, why(o))).collect())
                }
                _ => return Err(whole),
            }
        }
    };
    let when = stored.published_at.map(|t| humantime::format_rfc3339_seconds(t).to_string()).unwrap_or_default();
    let mut out = vec![format!("version {} (changed {when}): {}", stored.version, summary(&snapshot))];
    for (rule, spec) in snapshot.rules().iter().zip(&rules.rules) {
        let limits: Vec<String> = spec.limits.iter().map(ToString::to_string).collect();
        let mode = if rule.mode() == Mode::Shadow { " [shadow]" } else { "" };
        let expiry = match rule.expires() {
            Some(_) if rule.is_expired(now) => " (expired)".to_owned(),
            Some(at) => format!(" (expires in {})", humantime::format_duration(round(remaining(at, now)))),
            None => String::new(),
        };
        let global = rule.global().map(|g| format!(" [global: {g}]")).unwrap_or_default();
        out.push(format!("  {}: {}{mode}{expiry}: {}{global}", rule.id(), rule.scope(), limits.join(", ")));
    }
    if let Some(list) = overrides(stored, now) {
        out.push(list);
    }
    let mut problem = invalid_problem(stored);
    if !refused.is_empty() {
        out.push("refused by every gateway (remove with rlctl override remove --id ID):".to_owned());
        out.extend(refused.iter().map(|r| format!("  {r}")));
        problem = Some(format!("{} override(s) make gateways refuse version {}", refused.len(), stored.version));
    }
    Ok((out.join("\n"), problem))
}

fn overrides(stored: &Stored, now: SystemTime) -> Option<String> {
    if stored.overrides.is_empty() && stored.invalid.is_empty() {
        return None;
    }
    let mut out = vec!["overrides:".to_owned()];
    for o in &stored.overrides {
        let target = o.scope.subject.as_deref().map(|s| format!("subject {s:?}")).or(o
            .scope
            .ip
            .as_ref()
            .map(|ip| format!("ip {ip}")));
        let shared = if o.shared { ", shared" } else { "" };
        let until = o.expires.as_deref().and_then(|e| humantime::parse_rfc3339(e).ok());
        let left = match until {
            Some(at) if at <= now => "expired".to_owned(),
            Some(at) => format!("expires in {}", humantime::format_duration(round(remaining(at, now)))),
            None => "no expiry".to_owned(),
        };
        let limits: Vec<String> = o.limits.iter().map(ToString::to_string).collect();
        out.push(format!(
            "  {}: {}{shared} ({left}): {}; reason: {}",
            o.id,
            target.unwrap_or_default(),
            limits.join(", "),
            escaped(&o.reason)
        ));
    }
    out.extend(stored.invalid.iter().map(|i| format!("  invalid: {i}")));
    Some(out.join("\n"))
}

/// Whole seconds read better in a listing.
fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

async fn status(store: &RulesStore) -> Result<Output, Error> {
    let stored = store.read().await?;
    let reports = store.reports().await?;
    let fleet = fleet_status(
        stored.version,
        stored.publication.as_deref(),
        stored.lineage.as_deref(),
        stored.published_at,
        &reports,
        SystemTime::now(),
    );
    store.forget_reports(&fleet.gone).await?;
    let when = stored.published_at.map(|t| humantime::format_rfc3339_seconds(t).to_string()).unwrap_or_default();
    let head = match &stored.lineage {
        _ if stored.version == 0 => "the store holds no rules".to_owned(),
        Some(l) => format!("the store: version {} of lineage {l} (changed {when})", stored.version),
        None => format!("the store: version {} (changed {when})", stored.version),
    };
    let mut out = vec![head];
    out.extend(fleet.lines);
    out.extend(fleet.warnings.iter().map(|w| format!("warning: {w}")));
    let problem =
        (!fleet.warnings.is_empty()).then(|| format!("{} warning(s) about the fleet (above)", fleet.warnings.len()));
    Ok((out.join("\n"), problem))
}

/// Every key the rules in force keep for `subject` (each rate limit of
/// every rule and override), those of the published set and of `file`
/// (the rules file a fleet runs without publishing); in-flight slots
/// belong to running requests and are left.
async fn unlock(store: &RulesStore, subject: &str, file: Option<&Path>) -> Result<Output, Error> {
    let stored = store.read().await?;
    let from_file = file.map(RuleSetSpec::from_file).transpose()?;
    let sets: Vec<&RuleSetSpec> = stored.rules.iter().chain(&from_file).collect();
    if sets.is_empty() {
        return Err(Error::Rules(
            "nothing is published yet: give the rules file the gateways run with --rules FILE, and its keys are \
             found there"
                .to_owned(),
        ));
    }
    let mut keys = Vec::new();
    for rules in sets {
        // Overrides that do not compile still name their keys' prefix:
        // each is taken with the set alone, and the ones that fail left out.
        let good: Vec<RuleSpec> = stored
            .overrides
            .iter()
            .filter(|o| Snapshot::compile(rules, std::slice::from_ref(*o), stored.version).is_ok())
            .cloned()
            .collect();
        let snapshot = Snapshot::compile(rules, &good, stored.version)?;
        for rule in snapshot.rules() {
            keys.extend(rule.policy().keys(subject)?);
        }
    }
    keys.sort();
    keys.dedup();
    let (deleted, heard) = store.unlock(subject, &keys).await?;
    Ok((
        format!(
            "unlocked {subject:?}: {deleted} of its {} keys held counts and were deleted; {heard} gateway watcher(s) told to drop its deny entries and leases",
            keys.len()
        ),
        None,
    ))
}

async fn history(store: &RulesStore) -> Result<Output, Error> {
    let history = store.history().await?;
    if history.is_empty() {
        return Ok(("no rule sets in the history".to_owned(), None));
    }
    let stored = store.read().await?;
    // The newest set of the store's lineage is the one in force (later
    // versions may be override changes).
    let in_force = history.iter().position(|e| stored.lineage.as_deref() == Some(e.lineage.as_str()));
    let lines = history.iter().enumerate().map(|(i, e)| {
        let current = in_force == Some(i);
        format!(
            "version {} of lineage {}, published {}: {} rules{}",
            e.version,
            e.lineage,
            humantime::format_rfc3339_seconds(e.published_at),
            e.rules.rules.len(),
            if current { " (the set in force)" } else { "" }
        )
    });
    Ok((lines.collect::<Vec<_>>().join("\n"), None))
}
