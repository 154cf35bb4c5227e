//! The relay's log lines (standard error): no secret in any of them, and
//! the ones a failure repeats rate limited. Text (`rl-relay: ...`) or, with
//! `--log-format json` (envoyproxy/ratelimit's LOG_FORMAT=json), one JSON
//! object a line as its logrus writes them: `@message`, `@timestamp`
//! (RFC 3339, UTC), `level`. Every line is a warning but those that end the
//! process (errors); `--log-level error` (LOG_LEVEL) keeps the errors only.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static JSON: AtomicBool = AtomicBool::new(false);
static ERRORS_ONLY: AtomicBool = AtomicBool::new(false);

/// How lines are written: `format` text or json, `level` one of logrus's
/// names (any case): panic, fatal and error keep the errors only; warn,
/// warning, info, debug and trace keep every line.
pub fn configure(format: &str, level: &str) -> Result<(), String> {
    let (json, errors_only) = settings(format, level)?;
    JSON.store(json, Relaxed);
    ERRORS_ONLY.store(errors_only, Relaxed);
    Ok(())
}

/// (json, errors only) for `format` and `level`, or what is wrong.
pub fn settings(format: &str, level: &str) -> Result<(bool, bool), String> {
    let json = match format.to_ascii_lowercase().as_str() {
        "text" => false,
        "json" => true,
        _ => return Err(format!("log format '{format}': text or json")),
    };
    let errors_only = match level.to_ascii_lowercase().as_str() {
        "panic" | "fatal" | "error" => true,
        "warn" | "warning" | "info" | "debug" | "trace" => false,
        _ => return Err(format!("log level '{level}': panic, fatal, error, warn, info, debug or trace")),
    };
    Ok((json, errors_only))
}

fn write(level: &str, text: &dyn std::fmt::Display) {
    if JSON.load(Relaxed) {
        let at = humantime::format_rfc3339_nanos(std::time::SystemTime::now());
        let object = serde_json::json!({ "@message": text.to_string(), "@timestamp": at.to_string(), "level": level });
        eprintln!("{object}");
    } else {
        eprintln!("rl-relay: {text}");
    }
}

/// A line to standard error (a warning), prefixed with the program's name.
pub fn line(text: impl std::fmt::Display) {
    if !ERRORS_ONLY.load(Relaxed) {
        write("warning", &text);
    }
}

/// The line of an error that ends the process.
pub fn error(text: impl std::fmt::Display) {
    write("error", &text);
}

/// A Redis URL as it may be logged: the password (or a user-info without
/// one, which may be a token) replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else { return url.to_string() };
    let user = match rest[..at].split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{scheme}://{user}{}", &rest[at..])
}

/// Lines of one kind at most once per `every`; the ones held back are
/// counted into the next.
#[derive(Debug)]
pub struct Throttled {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttled {
    pub fn new(every: Duration) -> Throttled {
        Throttled { every, state: Mutex::new((None, 0)) }
    }

    /// Logs `text` unless a line went out less than `every` ago.
    pub fn log(&self, text: impl FnOnce() -> String) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (last, held) = &mut *state;
        if last.is_some_and(|at| at.elapsed() < self.every) {
            *held += 1;
            return;
        }
        let more = match std::mem::take(held) {
            0 => String::new(),
            n => format!(" ({n} more like it since the last line)"),
        };
        *last = Some(Instant::now());
        line(format_args!("{}{more}", text()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(redact("redis://gw:secret@10.0.0.5:6379/"), "redis://gw:***@10.0.0.5:6379/");
        assert_eq!(redact("redis://:secret@h/0"), "redis://:***@h/0");
        assert_eq!(redact("rediss://token@h"), "rediss://***@h");
        assert_eq!(redact("redis://u:p@ss:w@rd@h:1/?x=@"), "redis://u:***@h:1/?x=@");
        assert_eq!(redact("redis://h:6379/"), "redis://h:6379/");
        assert_eq!(redact("unix:///tmp/s"), "unix:///tmp/s");
        assert_eq!(redact("nonsense"), "nonsense");
    }
}
