//! When and where a run ran, for the reports' headers: a busy machine
//! changes real-time figures, so each report says what it ran beside.

/// The UTC time in `date`'s `format` (`+%Y-%m-%d %H:%M UTC`).
fn date(format: &str, otherwise: &str) -> String {
    let out = std::process::Command::new("date").args(["-u", format]).output();
    out.map_or_else(|_| otherwise.into(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    date("+%Y-%m-%d %H:%M UTC", "unknown time")
}

/// `20261205T101500Z`, to name a file by its time.
pub fn stamp() -> String {
    date("+%Y%m%dT%H%M%SZ", "unknown")
}

/// The load averages (1, 5, 15 minutes), as /proc/loadavg has them.
pub fn load() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// The cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// The CPU's model name, from /proc/cpuinfo.
pub fn cpu() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name"));
    model.map_or("unknown CPU", |m| m.trim_start_matches([' ', '\t', ':'])).to_string()
}

/// The process's peak resident memory in MB (Linux: VmHWM).
pub fn peak_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}
