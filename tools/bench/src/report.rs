//! BENCHMARKS.md: the timings with their spread, the targets as ratios of
//! the same round, and the sizing table.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::process::Command;

use crate::load::{Measured, CONNECTIONS, PIPELINE, SPREAD};
use crate::servers::Condition;
use crate::sizing::{self, ServerSizes};
use crate::workloads::Workload;

pub struct Run {
    pub version: String,
    /// The version measured, or why redis-cell is not in the run.
    pub redis_cell: Result<String, String>,
    pub load_before: String,
    pub load_after: String,
    pub ops: u64,
    pub rounds: usize,
    pub minutes: f64,
}

type Results = HashMap<(usize, &'static str), Vec<Measured>>;

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

pub fn machine() -> String {
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

/// min, median, max.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn figures(results: &Results, c: usize, id: &str, f: fn(&Measured) -> f64) -> Vec<f64> {
    results.get(&(c, id)).map(|ms| ms.iter().map(f).collect()).unwrap_or_default()
}

enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

/// `a / b`, round by round.
fn ratios(results: &Results, c: usize, a: &str, b: &str) -> Vec<f64> {
    let usec = |m: &Measured| m.usec;
    figures(results, c, a, usec).iter().zip(figures(results, c, b, usec)).map(|(x, y)| x / y).collect()
}

pub fn render(run: &Run, workloads: &[Workload], results: &Results, sizes: &[ServerSizes]) -> String {
    let mut s = String::new();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "Measured by `make bench` on {date} ({:.1} minutes): Redis {}, {}.",
        run.minutes,
        run.version,
        machine()
    );
    let _ = writeln!(s, "Load average (1, 5, 15 min) before: {}; after: {}.", run.load_before, run.load_after);
    let _ = match &run.redis_cell {
        Ok(v) => writeln!(s, "redis-cell: {v}, on its own server of the same binary in the same conditions."),
        Err(e) => writeln!(s, "redis-cell: **not measured**: {e}. The targets against it are left open."),
    };
    let _ = writeln!(
        s,
        "\n{} interleaved rounds; in each, every workload runs {} operations on a fresh keyspace over {CONNECTIONS} \
         connections at pipeline {PIPELINE}, in both conditions: **bare** (no AOF, no replica) and **replica + AOF** \
         (appendonly yes, appendfsync everysec, one replica attached and in sync). An operation is one command, or \
         a pair (acquire then release of the same id). Workloads over {SPREAD} subjects are warmed with as many \
         operations first.\n",
        run.rounds, run.ops
    );
    let _ = writeln!(
        s,
        "**µs/op** is the server's own time (the `usec` of `INFO commandstats` for the operation's commands, per \
         operation): the figure to trust on a small shared machine. **CPU µs/op** is the server process's user + \
         system CPU per operation: networking, propagation to the replica and AOF writes included. Each cell: \
         median, then min–max over the rounds. ops/s is what this loader reached on the same 2 cores as the \
         server: noisy.\n"
    );
    let bare = 0;
    let prod = Condition::ALL.iter().position(|c| *c == Condition::ReplicaAof).unwrap_or(1);
    let _ = writeln!(
        s,
        "| workload | µs/op, bare | µs/op, replica + AOF | x INCR (bare) | CPU µs/op, bare | CPU µs/op, replica + AOF | ops/s, bare |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    let incr = spread(figures(results, bare, "incr", |m| m.usec)).1;
    for w in workloads {
        let cell = |c: usize, f: fn(&Measured) -> f64| {
            let (lo, mid, hi) = spread(figures(results, c, w.id, f));
            format!("{mid:.2} ({lo:.2}–{hi:.2})")
        };
        let usec = |m: &Measured| m.usec;
        let cpu = |m: &Measured| m.cpu;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {} | {} | {:.0} |",
            w.name,
            cell(bare, usec),
            cell(prod, usec),
            spread(figures(results, bare, w.id, usec)).1 / incr,
            cell(bare, cpu),
            cell(prod, cpu),
            spread(figures(results, bare, w.id, |m| m.ops_per_sec)).1,
        );
    }

    let _ = writeln!(s, "\n## Targets\n");
    let _ = writeln!(
        s,
        "Each a ratio of server µs/op of two workloads in the same round of the same run; median (min–max) over \
         the rounds, and in how many rounds it holds.\n"
    );
    let _ = writeln!(s, "| target | bare | replica + AOF | |");
    let _ = writeln!(s, "|---|---|---|---|");
    let targets: [(&str, &str, &str, Bound); 11] = [
        ("our CL.THROTTLE at most 0.6x redis-cell's (allowed)", "throttle", "cell", Bound::AtMost(0.6)),
        ("our CL.THROTTLE no dearer than RL.TAKE (allowed)", "throttle", "take", Bound::AtMost(1.0)),
        ("Lua bucket script at least 8x RL.TAKE (1 key, allowed)", "lua", "take", Bound::AtLeast(8.0)),
        ("refused RL.TAKE at most half an allowed one", "take_refused", "take", Bound::AtMost(0.5)),
        ("RL.TAKE with 3 buckets at most twice 1 bucket", "take3", "take", Bound::AtMost(2.0)),
        ("RL.LEASE within 1.2x of RL.TAKE", "lease", "take", Bound::AtMost(1.2)),
        ("RL.WINDOW SLIDING within 1.2x of RL.TAKE", "sliding", "take", Bound::AtMost(1.2)),
        ("RL.WINDOW FIXED within 1.2x of RL.TAKE", "fixed", "take", Bound::AtMost(1.2)),
        (
            "RL.WINDOW EXACT (limit 100) within 2x of RL.TAKE, both over 100k subjects",
            "exact_spread",
            "take_spread",
            Bound::AtMost(2.0),
        ),
        ("RL.ACQUIRE + RL.RELEASE within 2x of one RL.TAKE", "acquire_release", "take", Bound::AtMost(2.0)),
        (
            "Lua in-flight script at least 5x RL.ACQUIRE + RL.RELEASE",
            "lua_flight",
            "acquire_release",
            Bound::AtLeast(5.0),
        ),
    ];
    for (what, a, b, bound) in targets {
        let verdicts: Vec<(String, bool)> = [bare, prod]
            .iter()
            .map(|&c| {
                let r = ratios(results, c, a, b);
                let holds = |x: f64| match bound {
                    Bound::AtMost(v) => x <= v,
                    Bound::AtLeast(v) => x >= v,
                };
                let rounds_met = r.iter().filter(|x| holds(**x)).count();
                if r.is_empty() {
                    return ("—".to_string(), false);
                }
                let (lo, mid, hi) = spread(r.clone());
                (format!("{mid:.2}x ({lo:.2}–{hi:.2}), {rounds_met} of {}", r.len()), holds(mid))
            })
            .collect();
        let status = match (
            verdicts.iter().all(|v| v.1),
            results.contains_key(&(bare, a)) && results.contains_key(&(bare, b)),
        ) {
            (_, false) => "not measured",
            (true, true) => "met",
            (false, true) => "**not met**",
        };
        let _ = writeln!(s, "| {what} | {} | {} | {status} |", verdicts[0].0, verdicts[1].0);
    }
    sizing_section(&mut s, sizes);
    s
}

fn sizing_section(s: &mut String, sizes: &[ServerSizes]) {
    let kinds = sizing::kinds();
    let _ = writeln!(s, "\n## Memory per key\n");
    let _ = writeln!(
        s,
        "Keys named like `{}` (27 bytes), written by one connection, measured after it closed. Each cell: \
         growth of `used_memory` per key (what the server spends: key name, value, keyspace dictionary and \
         expiry entries) / `MEMORY USAGE` of one key (value and name only). The multi-entry kinds are measured \
         over fewer keys (the count is in the row).\n",
        sizing::key_name(42)
    );
    let _ = write!(s, "| key kind | keys |");
    for server in sizes {
        let _ = write!(s, " {} |", server.version);
    }
    let _ = writeln!(s, "\n|---|---:|{}", "---:|".repeat(sizes.len()));
    for (k, kind) in kinds.iter().enumerate() {
        let keys = sizes.iter().find_map(|sv| sv.sizes[k].as_ref().map(|z| z.keys)).unwrap_or(0);
        let _ = write!(s, "| {} | {keys} |", kind.name);
        for server in sizes {
            let _ = match &server.sizes[k] {
                Some(z) => write!(s, " {:.1} B / {} B |", z.used_per_key, z.memory_usage),
                None => write!(s, " |"),
            };
        }
        let _ = writeln!(s);
    }

    // A bucket key against a plain string, and a million subjects.
    let per_key = |server: &ServerSizes, k: usize| server.sizes[k].as_ref().map(|z| z.used_per_key).unwrap_or(f64::NAN);
    let (set, bucket) = (0, 1);
    let _ = writeln!(s, "\nA bucket key over `SET k v PX` under the same name (target: at most 16 B more):");
    for server in sizes {
        // Whole bytes: a tenth of a byte per key is 10 KB of allocator noise.
        let extra = (per_key(server, bucket) - per_key(server, set)).round();
        let _ =
            writeln!(s, "{} {extra:+.0} B ({}),", server.version, if extra <= 16.0 { "met" } else { "**not met**" });
    }
    scale_section(s, sizes);
}

/// Bucket keys by the million: the range per server, and the README's
/// million subjects of three rules at the dear end of it.
fn scale_section(s: &mut String, sizes: &[ServerSizes]) {
    let _ = writeln!(
        s,
        "\nBucket keys at scale: `used_memory` per key right after writing that many (twice each, full again in \
         an hour), as in a keyspace that grows. The cost moves with how full the keyspace's hash tables are: \
         they double as keys come, and until every key has moved to the doubled table (Redis 8.2 takes minutes) \
         both are allocated; just past a doubling, 1,100,000 keys, is the dear point. So quote the range.\n"
    );
    let _ = write!(s, "| server (allocator) |");
    for keys in sizing::SCALES {
        let _ = write!(s, " {keys} keys |");
    }
    let _ = writeln!(s, " range | sizing took |\n|---|{}---:|---:|", "---:|".repeat(sizing::SCALES.len()));
    for server in sizes {
        let _ = write!(s, "| {} ({}) |", server.version, server.allocator);
        for b in &server.at_scale {
            let _ = write!(s, " {b:.1} B |");
        }
        let (low, high) = server.bucket_range();
        let _ = writeln!(s, " {low:.0}-{high:.0} B | {:.0} s |", server.seconds);
    }
    let _ = writeln!(
        s,
        "\nA million subjects with three bucket rules each, all holding keys at once, are 3,000,000 keys; at the \
         high end of each range:\n"
    );
    let _ = writeln!(s, "| server | 3,000,000 keys | `maxmemory` for it at 70% | RAM with room for a fork (x2) |");
    let _ = writeln!(s, "|---|---:|---:|---:|");
    for server in sizes {
        let total = server.bucket_range().1 * 3_000_000.0 / 1e6;
        let _ =
            writeln!(s, "| {} | {total:.0} MB | {:.0} MB | {:.0} MB |", server.version, total / 0.7, 2.0 * total / 0.7);
    }
    let _ = writeln!(
        s,
        "\n`MEMORY USAGE` counts a key's value and name only (72 B of a bucket key here): size from `used_memory`. \
         An AOF rewrite or an RDB save forks the server; every page written while the child runs is copied, so \
         under steady writes to all keys the worst case is a second copy of the dataset: give the machine about \
         twice `maxmemory`."
    );
}

/// The memory section alone (`rl-bench sizing`), put in place of the one
/// in `report` (or at its end).
pub fn replace_sizing(report: &str, sizes: &[ServerSizes]) -> String {
    let mut section = String::new();
    sizing_section(&mut section, sizes);
    let kept = report.find("\n## Memory per key").map_or(report, |at| &report[..at]);
    format!("{}{section}", kept.trim_end_matches('\n').to_owned() + "\n")
}
