//! The RESP front's allow-list: what a client may send. The module's public
//! commands go to the relay (`command::FORWARDED`); the few a client's
//! library sends about its own connection are answered here, for that
//! connection alone (the relay's connection to Redis is shared, so no
//! client command may change it); everything else is refused by name.
//!
//! What clients send at connect, and so what is answered here: redis-rs
//! (rl-client's `ConnectionManager`, `MultiplexedConnection`): `HELLO 3
//! [AUTH user pass]` with `protocol=resp3`, else `AUTH [user] pass` when the
//! URL has a password (again without the user if the first is refused as
//! too many arguments), `SELECT db` when the URL names one, `CLIENT SETINFO
//! LIB-NAME` and `LIB-VER` (errors ignored); its cluster client adds
//! `CLUSTER SLOTS` and a `PING` per node, which the relay is not (it is one
//! server to its clients). redis-py: `HELLO 3 [AUTH ...]` (its default),
//! `CLIENT MAINT_NOTIFICATIONS` (refused; it goes on), `CLIENT SETNAME`,
//! `CLIENT SETINFO`, `SELECT`; its health checks are `PING`.

use bytes::Bytes;

use crate::command;

/// A client's command, as the front handles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One of the module's public commands: to the relay.
    Module,
    Ping,
    Auth,
    Hello,
    Quit,
    Reset,
    Select,
    ClientSetInfo,
    ClientSetName,
    ClientGetName,
    ClientId,
    Info,
    /// Not served: refused by name.
    Refused,
}

impl Kind {
    /// Answered before authentication, as Redis does (its `no-auth` commands).
    pub fn before_auth(self) -> bool {
        matches!(self, Kind::Auth | Kind::Hello | Kind::Quit | Kind::Reset)
    }
}

/// Commands whose refusal names their subcommand too (`CONFIG GET`).
const CONTAINERS: [&str; 16] = [
    "ACL", "CLIENT", "CLUSTER", "COMMAND", "CONFIG", "DEBUG", "FUNCTION", "LATENCY", "MEMORY", "MODULE", "OBJECT",
    "PUBSUB", "SCRIPT", "SLOWLOG", "XGROUP", "XINFO",
];

pub fn classify(args: &[Bytes]) -> Kind {
    let Some(name) = args.first() else { return Kind::Refused };
    let is = |word: &str| name.eq_ignore_ascii_case(word.as_bytes());
    if command::is_forwarded(name) {
        Kind::Module
    } else if is("PING") {
        Kind::Ping
    } else if is("AUTH") {
        Kind::Auth
    } else if is("HELLO") {
        Kind::Hello
    } else if is("QUIT") {
        Kind::Quit
    } else if is("RESET") {
        Kind::Reset
    } else if is("SELECT") {
        Kind::Select
    } else if is("INFO") {
        Kind::Info
    } else if is("CLIENT") {
        let sub = |word: &str| args.get(1).is_some_and(|s| s.eq_ignore_ascii_case(word.as_bytes()));
        if sub("SETINFO") {
            Kind::ClientSetInfo
        } else if sub("SETNAME") {
            Kind::ClientSetName
        } else if sub("GETNAME") {
            Kind::ClientGetName
        } else if sub("ID") {
            Kind::ClientId
        } else {
            Kind::Refused
        }
    } else {
        Kind::Refused
    }
}

/// The refusal of a command not served: "ERR command 'FLUSHALL' is not
/// served by rl-relay", the name as sent (bytes a reply cannot carry as
/// `?`, at most 64 of them).
pub fn refusal(args: &[Bytes]) -> String {
    let mut name = args.first().map(|n| shown(n)).unwrap_or_default();
    if CONTAINERS.iter().any(|c| c.as_bytes().eq_ignore_ascii_case(args.first().map_or(&[][..], |n| n))) {
        if let Some(sub) = args.get(1) {
            name.push(' ');
            name.push_str(&shown(sub));
        }
    }
    format!("ERR command '{name}' is not served by rl-relay")
}

/// `word` as a reply may carry it: bytes it cannot as `?`, at most 64.
pub(super) fn shown(word: &[u8]) -> String {
    word.iter().take(64).map(|&b| if b.is_ascii_graphic() { char::from(b) } else { '?' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    #[test]
    fn classifies_what_clients_send() {
        for (line, kind) in [
            ("RL.TAKE 1 k 1 1 1", Kind::Module),
            ("cl.throttle k 1 1 1", Kind::Module),
            ("ping", Kind::Ping),
            ("HELLO 3 AUTH u p", Kind::Hello),
            ("client setinfo LIB-NAME redis-rs", Kind::ClientSetInfo),
            ("CLIENT SETNAME gw", Kind::ClientSetName),
            ("CLIENT KILL ID 1", Kind::Refused),
            ("CLIENT MAINT_NOTIFICATIONS ON", Kind::Refused),
            ("RESET", Kind::Reset),
            ("FLUSHALL", Kind::Refused),
            ("RL.INSPECT k", Kind::Refused),
            ("EVAL x 0", Kind::Refused),
        ] {
            assert_eq!(classify(&args(line)), kind, "{line}");
        }
        assert_eq!(classify(&[]), Kind::Refused);
    }

    #[test]
    fn refusals_name_the_command_as_sent() {
        assert_eq!(refusal(&args("flushall")), "ERR command 'flushall' is not served by rl-relay");
        assert_eq!(refusal(&args("CONFIG SET maxmemory 1")), "ERR command 'CONFIG SET' is not served by rl-relay");
        assert_eq!(refusal(&args("config")), "ERR command 'config' is not served by rl-relay");
        assert_eq!(refusal(&[Bytes::from_static(b"A\r\nB")]), "ERR command 'A??B' is not served by rl-relay");
        assert_eq!(
            refusal(&[Bytes::from(vec![b'x'; 100])]).len(),
            "ERR command '' is not served by rl-relay".len() + 64
        );
    }
}
