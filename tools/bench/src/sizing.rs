//! Memory per key of every kind the module stores, on each server of the
//! matrix: `MEMORY USAGE` of one key (what the value and its key name take)
//! and the growth of `used_memory` per key over many keys (what a server
//! really spends: the keyspace dictionary and expiry entries included).

use std::path::{Path, PathBuf};

use testkit::Server;

use crate::load::field;
use crate::servers::module_server;

/// Keys per kind; the kinds that need many calls per key use fewer.
const KEYS: usize = 100_000;
const FEW_KEYS: usize = 10_000;

/// Bucket keys at growing counts. What a key costs depends on how full the
/// keyspace's hash tables are (they double as keys are added: just past a
/// doubling, 1,100,000 keys, is the dearest point, and until the server has
/// moved every key to the doubled table, which Redis 8.2 does over minutes,
/// both tables are counted), so one count gives one point of a range;
/// 3,000,000 is the README's million subjects of three rules. Measured
/// right after writing, as a growing keyspace is.
pub const SCALES: [usize; 4] = [100_000, 1_000_000, 1_100_000, 3_000_000];

/// The bucket written at scale: full again in an hour, so no key expires
/// while the millions are written.
fn scaled_bucket(name: &str, _pass: usize) -> redis::Cmd {
    cmd(&["RL.TAKE", "1", name, "200", "1", "3600000"])
}

pub struct Kind {
    pub name: &'static str,
    keys: usize,
    /// Calls per key: each pass writes every key once, a few ms apart (two
    /// for the single-value kinds: a key after its second write, as in
    /// production; the Lua hash's tokens become fractional then).
    passes: usize,
    /// The command writing key `name` in pass `pass`.
    write: fn(&str, usize) -> redis::Cmd,
    /// On the redis-cell server instead of ours.
    pub redis_cell: bool,
}

/// A 32-byte request id, distinct per pass.
fn request_id(pass: usize) -> String {
    format!("req-{pass:028}")
}

fn cmd(words: &[&str]) -> redis::Cmd {
    let mut c = redis::Cmd::new();
    for w in words {
        c.arg(*w);
    }
    c
}

pub fn kinds() -> Vec<Kind> {
    let k = |name, keys, passes, write, redis_cell| Kind { name, keys, passes, write, redis_cell };
    vec![
        k("`SET k v PX 60000` (reference)", KEYS, 2, |n, _| cmd(&["SET", n, "v", "PX", "60000"]), false),
        k("token bucket (`RL.TAKE`)", KEYS, 2, |n, _| cmd(&["RL.TAKE", "1", n, "200", "1", "60000"]), false),
        k("SLIDING window", KEYS, 2, |n, _| cmd(&["RL.WINDOW", "1", n, "100", "60000"]), false),
        k("FIXED window", KEYS, 2, |n, _| cmd(&["RL.WINDOW", "1", n, "100", "60000", "FIXED"]), false),
        k("EXACT log, 1 entry", KEYS, 1, |n, _| cmd(&["RL.WINDOW", "1", n, "100", "60000", "EXACT"]), false),
        k("EXACT log, 100 entries", FEW_KEYS, 100, |n, _| cmd(&["RL.WINDOW", "1", n, "100", "60000", "EXACT"]), false),
        k(
            "in-flight set, 1 slot (32-byte id)",
            KEYS,
            1,
            |n, p| cmd(&["RL.ACQUIRE", "1", n, "20", "60000", "ID", &request_id(p)]),
            false,
        ),
        k(
            "in-flight set, 20 slots (32-byte ids)",
            FEW_KEYS,
            20,
            |n, p| cmd(&["RL.ACQUIRE", "1", n, "20", "60000", "ID", &request_id(p)]),
            false,
        ),
        // 1 per minute: the key outlives the writing of the others.
        k("`CL.THROTTLE` (ours)", KEYS, 2, |n, _| cmd(&["CL.THROTTLE", n, "100", "1", "60", "1"]), false),
        k("`CL.THROTTLE` (redis-cell)", KEYS, 2, |n, _| cmd(&["CL.THROTTLE", n, "100", "1", "60", "1"]), true),
    ]
}

/// One kind's figures on one server.
pub struct Size {
    pub used_per_key: f64,
    pub memory_usage: i64,
    pub keys: usize,
}

pub struct ServerSizes {
    pub version: String,
    /// The allocator the server was built with (INFO server mem_allocator).
    pub allocator: String,
    /// By kind, None where the kind was not measured (redis-cell elsewhere).
    pub sizes: Vec<Option<Size>>,
    /// `used_memory` per bucket key at each of [`SCALES`].
    pub at_scale: Vec<f64>,
    /// How long this server's sizing took.
    pub seconds: f64,
}

impl ServerSizes {
    /// The lowest and highest `used_memory` per bucket key over [`SCALES`].
    pub fn bucket_range(&self) -> (f64, f64) {
        let low = self.at_scale.iter().copied().fold(f64::INFINITY, f64::min);
        let high = self.at_scale.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (low, high)
    }
}

/// The key name of subject `i`: 27 bytes, as a gateway names them.
pub fn key_name(i: usize) -> String {
    format!("rl:{{user:{i:06}}}:per_second")
}

/// Measures every kind on each server binary; redis-cell's key on the first
/// one only (where it is built for).
pub fn measure(binaries: &[PathBuf], redis_cell: Option<&Path>) -> Vec<ServerSizes> {
    let kinds = kinds();
    binaries
        .iter()
        .enumerate()
        .map(|(n, binary)| {
            let ours = Server::start_binary(binary, &[]);
            let cell = redis_cell.filter(|_| n == 0).map(|so| module_server(so, &[]));
            let mut con = ours.con();
            let text: String = redis::cmd("INFO").arg("server").query(&mut con).expect("INFO");
            let version = ["valkey_version", "redis_version"]
                .iter()
                .find_map(|f| {
                    field(&text, f)
                        .map(|v| format!("{} {}", if *f == "valkey_version" { "Valkey" } else { "Redis" }, v.trim()))
                })
                .unwrap_or_else(|| "?".into());
            let memory: String = redis::cmd("INFO").arg("memory").query(&mut con).expect("INFO");
            let allocator = field(&memory, "mem_allocator").map(|a| a.trim().to_owned()).unwrap_or_else(|| "?".into());
            eprintln!("sizing on {version}");
            let started = std::time::Instant::now();
            let sizes = kinds
                .iter()
                .map(|kind| {
                    let port = match (&cell, kind.redis_cell) {
                        (_, false) => ours.port,
                        (Some(c), true) => c.port,
                        (None, true) => return None,
                    };
                    Some(size(port, kind))
                })
                .collect();
            let at_scale = SCALES
                .iter()
                .map(|&keys| {
                    let (per_key, _) = fill(ours.port, keys, 2, scaled_bucket);
                    eprintln!("  {keys} bucket keys: {per_key:.1} B per key");
                    per_key
                })
                .collect();
            ServerSizes { version, allocator, sizes, at_scale, seconds: started.elapsed().as_secs_f64() }
        })
        .collect()
}

fn size(port: u16, kind: &Kind) -> Size {
    let (used_per_key, memory_usage) = fill(port, kind.keys, kind.passes, kind.write);
    Size { used_per_key, memory_usage, keys: kind.keys }
}

/// Writes `keys` keys `passes` times on an empty server: the growth of
/// `used_memory` per key, and `MEMORY USAGE` of one of them.
fn fill(port: u16, keys: usize, passes: usize, write: fn(&str, usize) -> redis::Cmd) -> (f64, i64) {
    let mut con = crate::servers::connect(port);
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(&mut con).expect("FLUSHALL");
    let clients = |con: &mut redis::Connection| {
        let text: String = redis::cmd("INFO").arg("clients").query(con).expect("INFO");
        field(&text, "connected_clients").map(|v| v.trim().to_string())
    };
    let open = clients(&mut con);
    let before = used_memory(&mut con);
    // Filled from another connection, closed before measuring, so that its
    // query and reply buffers are not counted.
    {
        let mut filler = crate::servers::connect(port);
        for pass in 0..passes {
            for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
                let mut pipe = redis::pipe();
                for &i in chunk {
                    pipe.add_command(write(&key_name(i), pass)).ignore();
                }
                pipe.query::<()>(&mut filler).unwrap_or_else(|e| panic!("{}: {e}", key_name(chunk[0])));
            }
            // Entries of a log are per millisecond: the next pass is later.
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    while clients(&mut con) != open {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let after = used_memory(&mut con);
    // The last key written: the freshest of all.
    let one: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key_name(keys - 1))
        .query(&mut con)
        .unwrap_or_else(|e| panic!("MEMORY USAGE {}: {e}", key_name(keys - 1)));
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(&mut con).expect("FLUSHALL");
    ((after - before) as f64 / keys as f64, one)
}

fn used_memory(con: &mut redis::Connection) -> i64 {
    let text: String = redis::cmd("INFO").arg("memory").query(con).expect("INFO memory");
    field(&text, "used_memory").and_then(|v| v.trim().parse().ok()).expect("used_memory")
}
