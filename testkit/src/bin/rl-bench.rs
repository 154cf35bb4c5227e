//! `make bench`: the module's commands side by side with INCR and the seed
//! design's Lua token bucket, on one server, in one run.
//!
//! For each workload: server-side microseconds per call from INFO
//! commandstats (the figure to trust on a small machine), throughput with
//! redis-benchmark at pipeline 1 and 16, and ratios to INCR and to the Lua
//! script. Then memory per key over 100,000 keys. Writes BENCHMARKS.md.
//!
//! Options (env): RL_SERVER (server binary), BENCH_N (calls per pipelined
//! run, default 500000), BENCH_OUT (report path, default BENCHMARKS.md).

use std::fmt::Write as _;
use std::process::Command;

use testkit::Server;

/// The seed design's token bucket script (distributed-rate-limiter, step 2),
/// as a gateway without the module would run it.
const SEED_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local want = tonumber(ARGV[1])
local level, grant = {}, want
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local s = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(s[1]) or burst
  local elapsed = math.max(0, now - (tonumber(s[2]) or now))
  level[i] = math.min(burst, tokens + elapsed * rate / 1000)
  grant = math.min(grant, math.floor(level[i]))
end
if grant < 1 then
  local wait = 0
  for i = 1, #KEYS do
    local rate = tonumber(ARGV[2 * i])
    wait = math.max(wait, math.ceil((1 - level[i]) * 1000 / rate))
  end
  return {0, 0, wait}
end
local left = math.huge
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('HSET', key, 'tokens', level[i] - grant, 'ts', now)
  redis.call('PEXPIRE', key, math.ceil(burst * 1000 / rate) + 1000)
  left = math.min(left, level[i] - grant)
end
return {grant, math.floor(left), 0}
"#;

/// Parameters that never run out (always allowed) and that are empty after
/// one call (always refused).
const ALLOW: &str = "1000000 1000000 1";
const DENY: &str = "1 1 63072000000";
const WINDOW_ALLOW: &str = "1000000000000 63072000000";
/// Always allowed too, but slow to refill, so that keys written once stay
/// (a key spread over 100,000 is updated in place, as in production).
const ALLOW_KEEP: &str = "100000000000 1 1000";

struct Workload {
    name: &'static str,
    /// Command line for redis-benchmark ({sha} is the script's digest).
    args: String,
    /// The `cmdstat_` entry the server counts it under.
    stat: &'static str,
    /// Spread over 100,000 random keys (`__rand_int__` in the args).
    random_keys: bool,
    /// Commands run once before, to drain what must refuse.
    setup: Vec<String>,
}

fn workloads() -> Vec<Workload> {
    let w = |name, args: String, stat, random_keys, setup: &[String]| Workload {
        name,
        args,
        stat,
        random_keys,
        setup: setup.to_vec(),
    };
    let b3 = |p: &str| format!("RL.TAKE 3 {{h}}a {{h}}b {{h}}c {ALLOW} {ALLOW} {p}");
    vec![
        w("INCR (the floor)", "INCR hot".into(), "incr", false, &[]),
        w("RL.TAKE, 1 bucket, allowed", format!("RL.TAKE 1 {{h}}one {ALLOW}"), "rl.take", false, &[]),
        w("RL.TAKE, 1 bucket, refused", format!("RL.TAKE 1 {{h}}none {DENY}"), "rl.take", false, &[format!("RL.TAKE 1 {{h}}none {DENY}")]),
        w("RL.TAKE, 3 buckets, allowed", b3(ALLOW), "rl.take", false, &[]),
        w("RL.TAKE, 3 buckets, refused", b3(DENY), "rl.take", false, &[format!("RL.TAKE 1 {{h}}c {DENY}")]),
        w("RL.TAKE, 1 bucket, 100k random keys", format!("RL.TAKE 1 rl:{{__rand_int__}}:s {ALLOW_KEEP}"), "rl.take", true, &[]),
        w(
            "RL.TAKE, 3 buckets, 100k random keys",
            format!("RL.TAKE 3 rl:{{__rand_int__}}:s rl:{{__rand_int__}}:m rl:{{__rand_int__}}:h {ALLOW_KEEP} {ALLOW_KEEP} {ALLOW_KEEP}"),
            "rl.take",
            true,
            &[],
        ),
        w("RL.LEASE WANT 10, allowed", format!("RL.LEASE 1 {{h}}lease {ALLOW} WANT 10"), "rl.lease", false, &[]),
        w("RL.WINDOW SLIDING, allowed", format!("RL.WINDOW 1 {{h}}sliding {WINDOW_ALLOW}"), "rl.window", false, &[]),
        w("RL.WINDOW FIXED, allowed", format!("RL.WINDOW 1 {{h}}fixed {WINDOW_ALLOW} FIXED"), "rl.window", false, &[]),
        w(
            "RL.WINDOW EXACT, limit 100, 100k random keys",
            "RL.WINDOW 1 rl:{__rand_int__}:e 100 60000 EXACT".into(),
            "rl.window",
            true,
            &[],
        ),
        w("RL.WINDOW EXACT, limit 100, hot key (full log)", "RL.WINDOW 1 {h}exact 100 1000 EXACT".into(), "rl.window", false, &[]),
        w("CL.THROTTLE, allowed", "CL.THROTTLE {h}cell 1000000000 1000000 1 1".into(), "cl.throttle", false, &[]),
        w("CL.THROTTLE, refused", "CL.THROTTLE {h}cellr 0 1 3600 1".into(), "cl.throttle", false, &["CL.THROTTLE {h}cellr 0 1 3600 1".into()]),
        w("Lua script (EVALSHA), 1 key, allowed", "EVALSHA {sha} 1 {h}lua1 1 1000000000 1000000000".into(), "evalsha", false, &[]),
        w(
            "Lua script (EVALSHA), 2 keys, allowed",
            "EVALSHA {sha} 2 {h}lua2a {h}lua2b 1 1000000000 1000000000 1000000000 1000000000".into(),
            "evalsha",
            false,
            &[],
        ),
        w("Lua script (EVALSHA), 1 key, refused", "EVALSHA {sha} 1 {h}luar 1 0.000001 1".into(), "evalsha", false, &["EVALSHA {sha} 1 {h}luar 1 0.000001 1".into()]),
    ]
}

struct Row {
    name: &'static str,
    usec: f64,
    rps_p1: f64,
    rps_p16: f64,
}

fn run_cmd(con: &mut redis::Connection, line: &str) {
    let parts: Vec<&str> = line.split_whitespace().collect();
    let _: redis::Value = redis::cmd(parts[0]).arg(&parts[1..]).query(con).expect(line);
}

fn info(con: &mut redis::Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(con).expect("INFO")
}

fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
}

/// usec_per_call of `stat` since the last CONFIG RESETSTAT.
fn usec_per_call(con: &mut redis::Connection, stat: &str) -> f64 {
    let text = info(con, "commandstats");
    let line = field(&text, &format!("cmdstat_{stat}")).unwrap_or_else(|| panic!("no cmdstat_{stat}"));
    line.split(',')
        .find_map(|kv| kv.strip_prefix("usec_per_call="))
        .and_then(|v| v.parse().ok())
        .expect("usec_per_call")
}

/// redis-benchmark's requests per second for one run.
fn benchmark(port: u16, w: &Workload, sha: &str, pipeline: u32, n: u64) -> f64 {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-c", "50", "-q"]);
    cmd.args(["-n", &n.to_string(), "-P", &pipeline.to_string()]);
    if w.random_keys {
        cmd.args(["-r", "100000"]);
    }
    cmd.args(w.args.replace("{sha}", sha).split_whitespace());
    let out = cmd.output().expect("run redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout);
    // "...: 123456.79 requests per second, p50=..." (the last \r-separated part)
    let last = text.rsplit('\r').next().unwrap_or(&text);
    last.split(": ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no throughput in redis-benchmark output for {}: {text}", w.name))
}

/// used_memory added by 100,000 keys written twice by `write(i)`, per key,
/// and MEMORY USAGE of one of them.
fn memory_per_key(server: &Server, write: impl Fn(usize) -> redis::Cmd, key: impl Fn(usize) -> String) -> (f64, i64) {
    const KEYS: usize = 100_000;
    let mut con = server.con();
    run_cmd(&mut con, "FLUSHALL");
    let clients =
        |con: &mut redis::Connection| field(&info(con, "clients"), "connected_clients").map(|v| v.trim().to_string());
    let open = clients(&mut con);
    let before = used_memory(&mut con);
    // Filled from another connection, closed before measuring, so its
    // query and reply buffers are not counted. Two passes, some ms apart: a
    // key after its second write, as in production (the Lua script's
    // tokens become fractional then).
    {
        let mut filler = server.con();
        for _ in 0..2 {
            for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
                let mut pipe = redis::pipe();
                for &i in chunk {
                    pipe.add_command(write(i)).ignore();
                }
                pipe.query::<()>(&mut filler).expect("fill");
            }
        }
    }
    while clients(&mut con) != open {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let after = used_memory(&mut con);
    let one: i64 = redis::cmd("MEMORY").arg("USAGE").arg(key(42)).query(&mut con).expect("MEMORY USAGE");
    ((after - before) as f64 / KEYS as f64, one)
}

fn used_memory(con: &mut redis::Connection) -> i64 {
    field(&info(con, "memory"), "used_memory").and_then(|v| v.trim().parse().ok()).expect("used_memory")
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    format!("{cpu}, {cores} cores")
}

fn main() {
    let n: u64 = std::env::var("BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(500_000);
    let out_path = std::env::var("BENCH_OUT").unwrap_or_else(|_| "BENCHMARKS.md".into());
    let server = Server::start(&["--appendonly", "no"]);
    let mut con = server.con();
    let version = field(&info(&mut con, "server"), "redis_version").unwrap_or("?").trim().to_string();
    let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(SEED_LUA).query(&mut con).expect("SCRIPT LOAD");

    let mut rows = Vec::new();
    for w in workloads() {
        run_cmd(&mut con, "FLUSHALL");
        for s in &w.setup {
            run_cmd(&mut con, &s.replace("{sha}", &sha));
        }
        let rps_p1 = benchmark(server.port, &w, &sha, 1, n / 5);
        run_cmd(&mut con, "CONFIG RESETSTAT");
        let rps_p16 = benchmark(server.port, &w, &sha, 16, n);
        let usec = usec_per_call(&mut con, w.stat);
        eprintln!("{:<48} {usec:>6.2} us/call {rps_p1:>10.0} rps P1 {rps_p16:>10.0} rps P16", w.name);
        rows.push(Row { name: w.name, usec, rps_p1, rps_p16 });
    }

    let name = |i: usize| format!("rl:{{user:{i:06}}}:per_second");
    let (bucket_bytes, bucket_one) = memory_per_key(
        &server,
        |i| redis::cmd("RL.TAKE").arg(1).arg(name(i)).arg(200).arg(1).arg(60_000).clone(),
        name,
    );
    let (set_bytes, set_one) =
        memory_per_key(&server, |i| redis::cmd("SET").arg(name(i)).arg("v").arg("PX").arg(60_000).clone(), name);
    let (lua_bytes, lua_one) = memory_per_key(
        &server,
        |i| redis::cmd("EVALSHA").arg(&sha).arg(1).arg(name(i)).arg(1).arg(1).arg(200).clone(),
        name,
    );
    let (window_bytes, window_one) =
        memory_per_key(&server, |i| redis::cmd("RL.WINDOW").arg(1).arg(name(i)).arg(100).arg(60_000).clone(), name);

    let report = render(
        &rows,
        &version,
        [(bucket_bytes, bucket_one), (set_bytes, set_one), (lua_bytes, lua_one), (window_bytes, window_one)],
        n,
    );
    std::fs::write(&out_path, &report).expect("write the report");
    println!("{report}");
    eprintln!("written to {out_path}");
}

fn render(rows: &[Row], version: &str, memory: [(f64, i64); 4], n: u64) -> String {
    let usec = |name: &str| rows.iter().find(|r| r.name.starts_with(name)).map(|r| r.usec).unwrap_or(f64::NAN);
    let incr = usec("INCR");
    let lua1 = usec("Lua script (EVALSHA), 1 key, allowed");
    let mut s = String::new();
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(s, "Measured by `make bench` on {date}: Redis {version}, {}.", machine());
    let _ = writeln!(
        s,
        "50 connections on loopback; {n} calls per pipelined run, {} per unpipelined one. Server-side time per call is \
         `usec_per_call` of `INFO commandstats` over the pipelined run: on a 2-core machine where redis-benchmark and \
         the server share the cores, it is the figure to trust; throughput there is noisy.\n",
        n / 5
    );
    let _ =
        writeln!(s, "| workload | server µs/call | x INCR | x Lua 1 key | req/s, pipeline 1 | req/s, pipeline 16 |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.1} | {:.2} | {:.0} | {:.0} |",
            r.name,
            r.usec,
            r.usec / incr,
            r.usec / lua1,
            r.rps_p1,
            r.rps_p16
        );
    }
    let [(bucket, bucket_one), (set, set_one), (lua, lua_one), (window, window_one)] = memory;
    let _ = writeln!(s, "\n## Memory per key (100,000 keys named like `rl:{{user:000042}}:per_second`)\n");
    let _ = writeln!(s, "| key | used_memory per key | MEMORY USAGE of one |");
    let _ = writeln!(s, "|---|---:|---:|");
    let _ = writeln!(s, "| `SET k v PX 60000` (reference) | {set:.1} B | {set_one} B |");
    let _ = writeln!(s, "| RL.TAKE bucket | {bucket:.1} B | {bucket_one} B |");
    let _ = writeln!(s, "| RL.WINDOW SLIDING counter | {window:.1} B | {window_one} B |");
    let _ = writeln!(s, "| Lua script's hash (tokens, ts) | {lua:.1} B | {lua_one} B |");

    let take1 = usec("RL.TAKE, 1 bucket, allowed");
    let check = |ok: bool| if ok { "met" } else { "**not met**" };
    let _ = writeln!(s, "\n## Targets\n");
    let _ = writeln!(s, "| target | measured | |");
    let _ = writeln!(s, "|---|---|---|");
    let mut target = |what: &str, measured: String, ok: bool| {
        let _ = writeln!(s, "| {what} | {measured} | {} |", check(ok));
    };
    target(
        "RL.TAKE 1 bucket allowed: at least 8x less server time than the Lua script",
        format!("{:.1}x less", lua1 / take1),
        lua1 / take1 >= 8.0,
    );
    target("... and at most about 1.3 µs", format!("{take1:.2} µs"), take1 <= 1.3);
    target(
        "... under 0.6x redis-cell's CL.THROTTLE (2.3 µs measured on this kind of machine)",
        format!("{:.2}x", take1 / 2.3),
        take1 / 2.3 < 0.6,
    );
    let refused = usec("RL.TAKE, 1 bucket, refused");
    target("A refused call: at most half an allowed one", format!("{:.2}x", refused / take1), refused <= take1 / 2.0);
    let take3 = usec("RL.TAKE, 3 buckets, allowed");
    target("RL.TAKE 3 buckets: at most twice 1 bucket", format!("{:.2}x", take3 / take1), take3 <= 2.0 * take1);
    let cell = usec("CL.THROTTLE, allowed");
    target("CL.THROTTLE: at most 0.6x redis-cell's 2.3 µs (1.4 µs)", format!("{cell:.2} µs"), cell <= 1.4);
    target("A bucket key: at most 16 B more than SET k v PX", format!("{:+.1} B", bucket - set), bucket - set <= 16.0);
    for (name, limit) in [("RL.LEASE", 1.2), ("RL.WINDOW SLIDING", 1.2), ("RL.WINDOW FIXED", 1.2)] {
        let u = usec(name);
        target(&format!("{name}: within {limit}x of RL.TAKE"), format!("{:.2}x", u / take1), u <= limit * take1);
    }
    // EXACT at a limit of 100 admits 100 a window: its allowed path is
    // measured over 100,000 keys, against RL.TAKE over as many.
    let exact = usec("RL.WINDOW EXACT, limit 100, 100k");
    let take_spread = usec("RL.TAKE, 1 bucket, 100k");
    target(
        "RL.WINDOW EXACT (limit 100): within 2x of RL.TAKE, both over 100k keys",
        format!("{:.2}x", exact / take_spread),
        exact <= 2.0 * take_spread,
    );
    s
}
