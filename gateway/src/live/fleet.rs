//! A rule set's identity across the fleet: lineages, and what each
//! gateway reports it runs (read by `rlctl status`).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Which publication of a rules store a set is (both `None` for a set
/// not from a store).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The publication's id: new with every change to the store.
    pub(crate) publication: Option<String>,
    /// The store's line of versions.
    pub(crate) lineage: Option<String>,
}

/// A new lineage or publication id: 16 hex digits, unique per call (the time, the
/// process, a counter and the process's random hash keys go in).
pub(crate) fn new_lineage() -> String {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let seed = RandomState::new().hash_one((nanos, std::process::id(), CALLS.fetch_add(1, Ordering::Relaxed)));
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&seed.to_le_bytes()))
}

/// A gateway's name when its source names none: the host and the
/// process, then `#2`, `#3` for a process's later watchers.
pub(crate) fn default_gateway_name() -> String {
    static WATCHERS: AtomicU64 = AtomicU64::new(0);
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "gateway".to_owned());
    let n = WATCHERS.fetch_add(1, Ordering::Relaxed) + 1;
    let name = format!("{host}:{}", std::process::id());
    if n == 1 {
        name
    } else {
        format!("{name}#{n}")
    }
}

/// What one gateway last said it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayReport {
    /// The version in force on it.
    pub version: u64,
    /// Its publication id.
    #[serde(default)]
    pub publication: Option<String>,
    /// Its lineage.
    pub lineage: Option<String>,
    /// Milliseconds since its source last confirmed it (the status's `age`).
    pub age_ms: u64,
    /// Its status's `last_error`.
    pub last_error: Option<String>,
    /// When it wrote this, Unix milliseconds on its clock.
    pub reported_at_ms: u64,
    /// How often it polls (and so reports), in milliseconds.
    pub poll_every_ms: u64,
}

impl GatewayReport {
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub(crate) fn from_json(text: &str) -> Option<GatewayReport> {
        serde_json::from_str(text).ok()
    }

    /// When it was written.
    pub fn reported_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.reported_at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lineages_differ_and_reports_round_trip() {
        let (a, b) = (new_lineage(), new_lineage());
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
        let r = GatewayReport {
            version: 3,
            publication: Some(b),
            lineage: Some(a),
            age_ms: 12,
            last_error: Some("x\ny".to_owned()),
            reported_at_ms: 1_700_000_000_000,
            poll_every_ms: 5000,
        };
        assert_eq!(GatewayReport::from_json(&r.to_json()), Some(r));
        assert_eq!(GatewayReport::from_json("{"), None);
    }
}

/// Reports older than this are of gateways gone: `rlctl status` removes them.
pub const REPORT_FORGOTTEN_AFTER: Duration = Duration::from_secs(86_400);

/// What `rlctl status` says of the fleet: the lines to print, the
/// warnings (a gateway behind, silent or stale), and the names of reports
/// old enough to forget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetStatus {
    /// One line for the spread, then one per gateway.
    pub lines: Vec<String>,
    /// What needs a look; `rlctl status` exits 1 when there is any.
    pub warnings: Vec<String>,
    /// Gateways that have not reported for [`REPORT_FORGOTTEN_AFTER`].
    pub gone: Vec<String>,
}

/// The fleet against the store's `version`, `publication` and `lineage`,
/// published at `published_at`, seen at `now`. A gateway is behind when it
/// runs another version or publication though the publication is older than two of
/// its polls and 2 s; silent when it has not reported for three polls and
/// 10 s; stale when its own status has not been confirmed for a minute.
pub fn fleet_status(
    version: u64,
    publication: Option<&str>,
    lineage: Option<&str>,
    published_at: Option<SystemTime>,
    reports: &[(String, GatewayReport)],
    now: SystemTime,
) -> FleetStatus {
    let mut status = FleetStatus::default();
    let ago = |at: SystemTime| {
        humantime::format_duration(Duration::from_secs(now.duration_since(at).unwrap_or_default().as_secs()))
    };
    let of = |l: Option<&str>| l.map(|l| format!(" of lineage {l}")).unwrap_or_default();
    let mut spread: Vec<((u64, Option<String>), usize)> = Vec::new();
    let mut lines = Vec::new();
    for (name, r) in reports {
        let silent_for = now.duration_since(r.reported_at()).unwrap_or_default();
        if silent_for >= REPORT_FORGOTTEN_AFTER {
            status.gone.push(name.clone());
            continue;
        }
        let identity = (r.version, r.lineage.clone());
        match spread.iter_mut().find(|(i, _)| *i == identity) {
            Some((_, n)) => *n += 1,
            None => spread.push((identity, 1)),
        }
        let poll = Duration::from_millis(r.poll_every_ms);
        let runs = format!("version {}{}", r.version, of(r.lineage.as_deref()));
        let current = r.version == version && r.publication.as_deref() == publication;
        let settled = published_at
            .is_none_or(|at| now.duration_since(at).unwrap_or_default() > poll * 2 + Duration::from_secs(2));
        let mut marks = Vec::new();
        if !current {
            if settled {
                marks.push("BEHIND");
                status.warnings.push(format!(
                    "gateway {name} is behind: it runs {runs}, the store has version {version}{} (published {} ago){}",
                    of(lineage),
                    published_at.map(ago).map(|d| d.to_string()).unwrap_or_else(|| "?".to_owned()),
                    r.last_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
                ));
            } else {
                marks.push("catching up");
            }
        }
        if silent_for > poll * 3 + Duration::from_secs(10) {
            marks.push("SILENT");
            status.warnings.push(format!(
                "gateway {name} has not reported for {} (it ran {runs}): stopped, or cannot reach the rules server",
                ago(r.reported_at())
            ));
        }
        if r.age_ms > 60_000 {
            marks.push("STALE");
            status.warnings.push(format!(
                "gateway {name}'s rules were last confirmed {} before its report: its source does not hold what it runs",
                humantime::format_duration(Duration::from_secs(r.age_ms / 1000))
            ));
        }
        let marks = if marks.is_empty() { String::new() } else { format!(" [{}]", marks.join(", ")) };
        let error = r.last_error.as_deref().map(|e| format!("; last error: {}", escaped(e))).unwrap_or_default();
        lines.push(format!(
            "  {name}: {runs}{marks}, confirmed {} before its report {} ago{error}",
            humantime::format_duration(Duration::from_millis(r.age_ms - r.age_ms % 100)),
            ago(r.reported_at())
        ));
    }
    spread.sort_by_key(|((version, _), _)| std::cmp::Reverse(*version));
    let counts: Vec<String> =
        spread.iter().map(|((v, l), n)| format!("version {v}{}: {n}", of(l.as_deref()))).collect();
    let reporting = reports.len() - status.gone.len();
    status.lines.push(if reporting == 0 {
        "gateways: none reporting".to_owned()
    } else {
        format!("gateways: {reporting} reporting; {}", counts.join(", "))
    });
    status.lines.extend(lines);
    status
}

/// `text` with control characters (a newline, an escape) written as
/// escapes, so a value cannot forge a line of a listing.
pub fn escaped(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

#[cfg(test)]
mod status_tests {
    use super::*;

    fn report(version: u64, lineage: &str, reported_ago: u64, now: SystemTime) -> GatewayReport {
        GatewayReport {
            version,
            publication: Some(format!("{lineage}{version}")),
            lineage: Some(lineage.to_owned()),
            age_ms: 300,
            last_error: None,
            reported_at_ms: crate::live::store::unix_ms(now - Duration::from_secs(reported_ago)),
            poll_every_ms: 5000,
        }
    }

    #[test]
    fn the_fleet_shows_its_spread_and_who_is_behind_silent_or_gone() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let published = Some(now - Duration::from_secs(60));
        let reports = vec![
            ("a".to_owned(), report(7, "L", 1, now)),
            ("b".to_owned(), report(6, "L", 1, now)),
            ("c".to_owned(), report(7, "L", 120, now)),
            ("d".to_owned(), report(7, "L", 2 * 86_400, now)),
        ];
        let s = fleet_status(7, Some("L7"), Some("L"), published, &reports, now);
        assert_eq!(s.lines[0], "gateways: 3 reporting; version 7 of lineage L: 2, version 6 of lineage L: 1");
        assert!(s.lines[2].contains("b: version 6 of lineage L [BEHIND]"), "{s:?}");
        assert_eq!(s.warnings.len(), 2, "{s:?}");
        assert!(
            s.warnings[0].starts_with("gateway b is behind: it runs version 6 of lineage L, the store has version 7")
        );
        assert!(s.warnings[1].starts_with("gateway c has not reported for 2m"), "{s:?}");
        assert_eq!(s.gone, ["d"]);
        // Just published: still catching up, no warning.
        let s = fleet_status(7, Some("L7"), Some("L"), Some(now - Duration::from_secs(3)), &reports[..2], now);
        assert!(s.warnings.is_empty() && s.lines[2].contains("[catching up]"), "{s:?}");
        assert_eq!(escaped("a\nb\u{1b}"), "a\\nb\\u{1b}");
    }
}
