//! The load: `CONNECTIONS` connections, each sending its share of the
//! operations in pipelined batches, and what the server says it spent.
//!
//! A workload's operation is one command or a pair (RL.ACQUIRE then
//! RL.RELEASE of the same id): redis-benchmark sends one command only, so
//! the bench brings its own loader. Commands are packed once per batch
//! shape; the keys spread over 100,000 subjects are drawn per operation.

use std::time::Instant;

use redis::ConnectionLike;

pub const CONNECTIONS: usize = 20;
pub const PIPELINE: usize = 16;
/// Subjects a spread workload draws from.
pub const SPREAD: u64 = 100_000;

/// One operation's commands, with placeholders: `{r}` a random subject
/// (the same in every key of the operation), `{id}` the connection's
/// 32-byte request id.
pub struct Op<'a> {
    pub commands: &'a [String],
    pub spread: bool,
    /// Whether the first integer of every reply to the first command is
    /// non-zero (granted; for CL.THROTTLE, limited), so that a workload meant
    /// to be allowed is never measured refusing, or the reverse.
    pub first: Option<bool>,
}

/// What one timed run measured.
pub struct Measured {
    /// Server µs per operation: the commandstats time of its commands.
    pub usec: f64,
    /// Server CPU µs per operation (user + sys of the whole process:
    /// networking, propagation and AOF writes included).
    pub cpu: f64,
    /// Operations per second over all connections.
    pub ops_per_sec: f64,
}

/// Sends `ops` operations over `CONNECTIONS` connections to `port` and
/// measures them (the commandstats of `stats`, reset before).
pub fn run(port: u16, op: &Op, stats: &[&str], ops: u64, ctl: &mut redis::Connection) -> Measured {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(ctl).expect("CONFIG RESETSTAT");
    let cpu_before = cpu_seconds(ctl);
    let start = Instant::now();
    std::thread::scope(|s| {
        for c in 0..CONNECTIONS {
            let share = ops / CONNECTIONS as u64 + u64::from((c as u64) < ops % CONNECTIONS as u64);
            s.spawn(move || drive(port, op, c, share));
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = (cpu_seconds(ctl) - cpu_before) * 1e6 / ops as f64;
    let text: String = redis::cmd("INFO").arg("commandstats").query(ctl).expect("INFO commandstats");
    let usec: f64 = stats.iter().map(|s| command_usec(&text, s)).sum::<f64>() / ops as f64;
    Measured { usec, cpu, ops_per_sec: ops as f64 / elapsed }
}

fn drive(port: u16, op: &Op, connection: usize, ops: u64) {
    let mut con = crate::servers::connect(port);
    let id = format!("req-{connection:028}");
    let per_batch = (PIPELINE / op.commands.len()).max(1) as u64;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (connection as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let fixed = (!op.spread).then(|| pack(op, &id, per_batch, &mut rng));
    let mut left = ops;
    while left > 0 {
        let n = left.min(per_batch);
        let packed = match &fixed {
            Some(p) if n == per_batch => p.clone(),
            _ => pack(op, &id, n, &mut rng),
        };
        let count = n as usize * op.commands.len();
        let replies = con.req_packed_commands(&packed, 0, count).unwrap_or_else(|e| panic!("{}: {e}", op.commands[0]));
        check(op, &replies);
        left -= n;
    }
}

/// Panics on a server error or on an operation that did not go the way
/// the workload means it to.
fn check(op: &Op, replies: &[redis::Value]) {
    for (i, reply) in replies.iter().enumerate() {
        if let redis::Value::ServerError(e) = reply {
            panic!("{}: {e:?}", op.commands[i % op.commands.len()]);
        }
        if let (0, Some(want)) = (i % op.commands.len(), op.first) {
            let got = match reply {
                redis::Value::Array(items) => items.first().and_then(|v| redis::from_redis_value_ref::<i64>(v).ok()),
                _ => None,
            };
            assert_eq!(got.map(|v| v != 0), Some(want), "{}: reply {reply:?}", op.commands[0]);
        }
    }
}

fn pack(op: &Op, id: &str, n: u64, rng: &mut u64) -> Vec<u8> {
    let mut pipe = redis::pipe();
    for _ in 0..n {
        let subject = (xorshift(rng) % SPREAD).to_string();
        for line in op.commands {
            let mut cmd = redis::Cmd::new();
            for word in line.split_whitespace() {
                cmd.arg(word.replace("{r}", &subject).replace("{id}", id));
            }
            pipe.add_command(cmd);
        }
    }
    pipe.get_packed_pipeline()
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Total `usec` of `cmdstat_<name>` since the last reset (0 if not called).
fn command_usec(text: &str, name: &str) -> f64 {
    field(text, &format!("cmdstat_{name}"))
        .and_then(|line| line.split(',').find_map(|kv| kv.strip_prefix("usec=")).and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

pub fn cpu_seconds(con: &mut redis::Connection) -> f64 {
    let text: String = redis::cmd("INFO").arg("cpu").query(con).expect("INFO cpu");
    ["used_cpu_sys", "used_cpu_user"]
        .iter()
        .map(|f| field(&text, f).and_then(|v| v.trim().parse::<f64>().ok()).expect("used_cpu"))
        .sum()
}

pub fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
}
