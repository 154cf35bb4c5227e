//! `rl-bench tls` (`make bench-tls`): the cost of TLS to Redis. RL.TAKE
//! through rl-client (the path every gateway's decision that reaches Redis
//! takes) to one server listening on a plaintext and a TLS port, over TCP
//! and over TLS in interleaved rounds; decisions per second, and CPU per
//! decision of the client process and of the server, and the server's reads
//! per decision (`total_reads_processed`: how many calls arrive together).
//! Prints a table for docs/benchmarks.md.
//!
//! Options (env): BENCH_N (decisions per run, default 100000),
//! BENCH_ROUNDS (default 5), BENCH_TASKS (concurrent callers sharing the
//! client's one connection, default 64).

use std::time::{Duration, Instant};

use rl_client::{Bucket, Client, Config, Tls};
use testkit::{free_port, Server, TlsFiles};

use crate::env_num;
use crate::load::{cpu_seconds, field, Measured};

/// Subjects the decisions are spread over (each a bucket that never runs
/// dry: every decision is an admission, as most are).
const SUBJECTS: u64 = 10_000;

pub fn main() {
    let ops = env_num("BENCH_N", 100_000);
    let rounds = env_num("BENCH_ROUNDS", 5) as usize;
    let tasks = env_num("BENCH_TASKS", 64).max(1);
    let load_before = crate::report::load_average();
    let dir = tempfile::tempdir().expect("temp dir");
    let files = TlsFiles::create(dir.path());
    let tls_port = free_port().to_string();
    let path = |p: &std::path::Path| p.display().to_string();
    let (cert, key, ca) = (path(&files.server_cert), path(&files.server_key), path(&files.ca));
    let server = Server::start(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let _guard = runtime.enter();
    let config = |url: String, tls: Tls| Config { tls, timeout: Duration::from_secs(2), ..Config::standalone(url) };
    let paths = [
        ("TCP", Client::new(&config(server.url(), Tls::default())).expect("client")),
        (
            "TLS",
            Client::new(&config(
                format!("rediss://127.0.0.1:{tls_port}/"),
                Tls { ca_file: Some(files.ca.clone()), ..Tls::default() },
            ))
            .expect("TLS client"),
        ),
    ];
    let mut ctl = server.con();
    let mut results: Vec<Vec<(Measured, f64)>> = vec![Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, (name, client)) in paths.iter().enumerate() {
            let (m, reads) = runtime.block_on(measure(client, &mut ctl, ops, tasks));
            eprintln!(
                "round {} {name}: {:>9.0} decisions/s, client {:>5.1} cpu us, server {:>5.1} cpu us, {reads:.3} server \
                 reads per decision",
                round + 1,
                m.ops_per_sec,
                m.usec,
                m.cpu
            );
            results[i].push((m, reads));
        }
    }
    let load_after = crate::report::load_average();
    println!(
        "{} decisions a run, {tasks} callers on one client, {rounds} interleaved rounds; {}; load average {load_before} \
         before, {load_after} after; median (min to max)\n",
        ops,
        crate::report::machine()
    );
    println!("| path | decisions/s | client CPU µs/decision | server CPU µs/decision | server reads/decision |");
    println!("|---|---|---|---|---|");
    for (i, (name, _)) in paths.iter().enumerate() {
        let r = &results[i];
        println!(
            "| {name} | {} | {} | {} | {} |",
            spread(r, |(m, _)| m.ops_per_sec, 0),
            spread(r, |(m, _)| m.usec, 1),
            spread(r, |(m, _)| m.cpu, 1),
            spread(r, |(_, reads)| *reads, 3)
        );
    }
}

/// `ops` RL.TAKEs by `tasks` callers on `client`: decisions per second
/// (`ops_per_sec`), the client process's CPU µs per decision (in `usec`)
/// and the server's (in `cpu`); and the server's reads per decision.
async fn measure(client: &Client, ctl: &mut redis::Connection, ops: u64, tasks: u64) -> (Measured, f64) {
    // Warm: the connection made, the keys there.
    take_all(client, SUBJECTS, tasks).await;
    let (server_before, client_before, reads_before) = (cpu_seconds(ctl), process_cpu(), reads(ctl));
    let start = Instant::now();
    take_all(client, ops, tasks).await;
    let elapsed = start.elapsed().as_secs_f64();
    let (server_after, client_after, reads_after) = (cpu_seconds(ctl), process_cpu(), reads(ctl));
    let measured = Measured {
        usec: (client_after - client_before) * 1e6 / ops as f64,
        cpu: (server_after - server_before) * 1e6 / ops as f64,
        ops_per_sec: ops as f64 / elapsed,
    };
    // Less the two INFO calls of the measurement itself.
    (measured, (reads_after - reads_before - 2.0) / ops as f64)
}

/// The reads the server has processed (`total_reads_processed`).
fn reads(ctl: &mut redis::Connection) -> f64 {
    let text: String = redis::cmd("INFO").arg("stats").query(ctl).expect("INFO stats");
    field(&text, "total_reads_processed").and_then(|v| v.trim().parse().ok()).expect("total_reads_processed")
}

async fn take_all(client: &Client, ops: u64, tasks: u64) {
    let calls = (0..tasks).map(|t| {
        let client = client.clone();
        let share = ops / tasks + u64::from(t < ops % tasks);
        tokio::spawn(async move {
            for i in 0..share {
                let subject = (t * 7919 + i * 104_729) % SUBJECTS;
                let bucket = Bucket::new(format!("bench:tls:{{{subject}}}"), 1 << 40, 1 << 40, Duration::from_secs(1))
                    .expect("bucket");
                let d = client.take(&[bucket], 1).await.expect("RL.TAKE");
                assert!(d.allowed, "a bucket that never runs dry refused");
            }
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.expect("a caller");
    }
}

/// CPU seconds this process has used (user and system).
fn process_cpu() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the struct it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The median of `of` over `runs`, and its range, to `digits` decimals.
fn spread<T>(runs: &[T], of: impl Fn(&T) -> f64, digits: usize) -> String {
    let mut values: Vec<f64> = runs.iter().map(of).collect();
    values.sort_by(|a, b| a.total_cmp(b));
    let median = values[values.len() / 2];
    format!("{median:.digits$} ({:.digits$} to {:.digits$})", values[0], values[values.len() - 1])
}
