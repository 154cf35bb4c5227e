//! The relay's own credentials: what a client must present before anything
//! is served (the RESP front's AUTH and HELLO AUTH; any other front the
//! same). They come from a file (`--auth-file`) or the environment
//! (`RL_RELAY_AUTH`), never the command line, where every user of the host
//! can read them; and they are never logged.
//!
//! One entry a line: `PASSWORD` (for the user `default`, as `AUTH PASSWORD`
//! means on Redis) or `USER PASSWORD`. Several entries for one user let a
//! password be rotated: add the new one, move the gateways, drop the old.

/// The environment variable that may hold one entry.
pub const ENV: &str = "RL_RELAY_AUTH";

/// The largest `--auth-file`, never read past.
pub const MAX_FILE_BYTES: usize = 1 << 20;

/// Users and passwords a client may authenticate with; none: no
/// authentication asked.
#[derive(Clone, Default)]
pub struct Credentials {
    entries: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let users: Vec<&str> = self.entries.iter().map(|(u, _)| u.as_str()).collect();
        f.debug_struct("Credentials").field("users", &users).finish_non_exhaustive()
    }
}

/// What a check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    Accepted,
    /// A wrong user or password.
    Refused,
    /// `AUTH password` to a relay that asks for none (Redis's error).
    NoneConfigured,
}

impl Credentials {
    /// No credentials: every client is served unauthenticated.
    pub fn none() -> Credentials {
        Credentials::default()
    }

    /// Entries from `text`, one a line (`#` comments and blank lines
    /// skipped). `source` names where they came from in errors, which never
    /// quote a line.
    pub fn parse(text: &str, source: &str) -> Result<Credentials, String> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let (user, password) = match words[..] {
                [password] => ("default", password),
                [user, password] => (user, password),
                _ => return Err(format!("{source}: line {}: expected PASSWORD or USER PASSWORD", n + 1)),
            };
            entries.push((user.to_string(), password.as_bytes().to_vec()));
        }
        if entries.is_empty() {
            return Err(format!("{source}: no credentials in it (one PASSWORD or USER PASSWORD a line)"));
        }
        Ok(Credentials { entries })
    }

    /// From `--auth-file` or `RL_RELAY_AUTH` (not both), or none.
    pub fn load(file: Option<&std::path::Path>, env: Option<String>) -> Result<Credentials, String> {
        match (file, env) {
            (Some(_), Some(_)) => Err(format!("--auth-file and {ENV} are both set: give the credentials once")),
            (Some(path), None) => {
                let text = crate::files::read_bounded(path, MAX_FILE_BYTES, "an auth file (1 MiB)")
                    .map_err(|e| format!("--auth-file {}: {e}", path.display()))?;
                Credentials::parse(&text, &format!("--auth-file {}", path.display()))
            }
            (None, Some(text)) => Credentials::parse(&text, ENV),
            (None, None) => Ok(Credentials::none()),
        }
    }

    /// Whether clients must authenticate.
    pub fn required(&self) -> bool {
        !self.entries.is_empty()
    }

    /// `AUTH [user] password` (no user: `default`), as Redis answers it.
    pub fn check(&self, user: Option<&[u8]>, password: &[u8]) -> Check {
        if !self.required() {
            // Redis's default user without a password: any password for
            // it, an error for `AUTH password`, no other user.
            return match user {
                None => Check::NoneConfigured,
                Some(b"default") => Check::Accepted,
                Some(_) => Check::Refused,
            };
        }
        let user = user.unwrap_or(b"default");
        // Every entry is compared, in time that depends on no secret byte.
        let mut accepted = false;
        for (name, secret) in &self.entries {
            accepted |= constant_time_eq(name.as_bytes(), user) & constant_time_eq(secret, password);
        }
        if accepted {
            Check::Accepted
        } else {
            Check::Refused
        }
    }
}

/// Equal bytes, compared without an early exit (the length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_entries_and_checks_them() {
        let c = Credentials::parse("# comment\n\n  gw  first \ngw second\nfor-default\n", "file").unwrap();
        assert!(c.required());
        assert_eq!(c.check(Some(b"gw"), b"first"), Check::Accepted);
        assert_eq!(c.check(Some(b"gw"), b"second"), Check::Accepted);
        assert_eq!(c.check(None, b"for-default"), Check::Accepted);
        assert_eq!(c.check(Some(b"default"), b"for-default"), Check::Accepted);
        assert_eq!(c.check(Some(b"gw"), b"for-default"), Check::Refused);
        assert_eq!(c.check(None, b"first"), Check::Refused);
        assert_eq!(c.check(Some(b"gw"), b"firs"), Check::Refused);
        assert!(!format!("{c:?}").contains("first"), "Debug shows no password");
    }

    #[test]
    fn refuses_files_that_give_nothing_or_too_much_without_quoting_them() {
        let e = Credentials::parse("a b c-secret\n", "f").unwrap_err();
        assert_eq!(e, "f: line 1: expected PASSWORD or USER PASSWORD");
        assert!(Credentials::parse("# x\n", "f").unwrap_err().contains("no credentials"));
        assert!(Credentials::load(Some(std::path::Path::new("/x")), Some("p".into())).unwrap_err().contains("both"));
        assert!(!Credentials::load(None, None).unwrap().required());
    }

    #[test]
    fn without_credentials_auth_answers_as_redis_default_user_does() {
        let c = Credentials::none();
        assert_eq!(c.check(None, b"x"), Check::NoneConfigured);
        assert_eq!(c.check(Some(b"default"), b"x"), Check::Accepted);
        assert_eq!(c.check(Some(b"other"), b"x"), Check::Refused);
    }
}
