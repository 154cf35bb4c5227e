//! One RESP connection's own state (authenticated or not, its protocol, its
//! name) and the commands about it, answered as Redis answers them.

use bytes::Bytes;

use super::allow::{self, Kind};
use super::encode::Protocol;
use super::reader::strict_int;
use crate::auth::{Check, Credentials};
use crate::reply::Reply;

const NOAUTH: &str = "NOAUTH Authentication required.";
const NOAUTH_HELLO: &str = "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
                            HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
                            select the RESP protocol version at the same time";
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
const NO_PASSWORD: &str = "ERR AUTH <password> called without any password configured for the default user. \
                           Are you sure your configuration is correct?";

/// What to do with a command.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Answered here.
    Answer(Reply),
    /// Answered here, then the connection closes (QUIT).
    Close(Reply),
    /// One of the module's commands: the relay answers.
    Relay,
    /// `INFO`: the relay's report.
    Info,
    /// A refused AUTH (counted).
    AuthFailed(Reply),
    /// Not on the allow-list (counted).
    Refused(Reply),
}

#[derive(Debug)]
pub struct Session {
    pub protocol: Protocol,
    authenticated: bool,
    name: Option<Bytes>,
    id: u64,
}

fn wrong_arity(command: &str) -> Reply {
    Reply::error(format!("ERR wrong number of arguments for '{command}' command"))
}

impl Session {
    pub fn new(id: u64, credentials: &Credentials) -> Session {
        Session { protocol: Protocol::Resp2, authenticated: !credentials.required(), name: None, id }
    }

    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// What `args` asks of this connection.
    pub fn step(&mut self, args: &[Bytes], credentials: &Credentials) -> Step {
        let kind = allow::classify(args);
        if kind == Kind::Refused {
            return Step::Refused(Reply::error(allow::refusal(args)));
        }
        if !self.authenticated && !kind.before_auth() {
            return Step::Answer(Reply::error(NOAUTH));
        }
        let n = args.len();
        Step::Answer(match kind {
            Kind::Module => return Step::Relay,
            Kind::Info => return Step::Info,
            Kind::Refused => unreachable!("refused above"),
            Kind::Ping => match n {
                1 => Reply::Simple("PONG".into()),
                2 => Reply::Bulk(args[1].clone()),
                _ => wrong_arity("ping"),
            },
            Kind::Quit => return Step::Close(Reply::OK),
            Kind::Reset => {
                *self = Session::new(self.id, credentials);
                Reply::Simple("RESET".into())
            }
            Kind::Auth => {
                let (user, password) = match n {
                    2 => (None, &args[1]),
                    3 => (Some(args[1].as_ref()), &args[2]),
                    _ => return Step::Answer(wrong_arity("auth")),
                };
                match credentials.check(user, password) {
                    Check::Accepted => {
                        self.authenticated = true;
                        Reply::OK
                    }
                    Check::Refused => return Step::AuthFailed(Reply::error(WRONGPASS)),
                    Check::NoneConfigured => Reply::error(NO_PASSWORD),
                }
            }
            Kind::Hello => return self.hello(args, credentials),
            Kind::Select => match (n, args.get(1).and_then(|db| strict_int(db))) {
                (2, Some(0)) => Reply::OK,
                (2, Some(_)) => Reply::error("ERR DB index is out of range (rl-relay serves database 0 only)"),
                (2, None) => Reply::error("ERR value is not an integer or out of range"),
                _ => wrong_arity("select"),
            },
            Kind::ClientSetInfo => match n {
                4 if [&b"LIB-NAME"[..], b"LIB-VER"].iter().any(|a| args[2].eq_ignore_ascii_case(a)) => Reply::OK,
                4 => Reply::error(format!("ERR Unrecognized option '{}'", String::from_utf8_lossy(&args[2]))),
                _ => wrong_arity("client|setinfo"),
            },
            Kind::ClientSetName => match n {
                3 => {
                    self.name = Some(args[2].clone()).filter(|name| !name.is_empty());
                    Reply::OK
                }
                _ => wrong_arity("client|setname"),
            },
            Kind::ClientGetName => self.name.clone().map_or(Reply::Null, Reply::Bulk),
            Kind::ClientId => Reply::Int(self.id as i64),
        })
    }

    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`.
    fn hello(&mut self, args: &[Bytes], credentials: &Credentials) -> Step {
        let protocol = match args.get(1) {
            None => self.protocol,
            Some(version) => match strict_int(version) {
                Some(2) => Protocol::Resp2,
                Some(3) => Protocol::Resp3,
                Some(_) => return Step::Answer(Reply::error("NOPROTO unsupported protocol version")),
                None => return Step::Answer(Reply::error("ERR Protocol version is not an integer or out of range")),
            },
        };
        let (mut auth, mut name) = (None, None);
        let mut i = 2;
        while i < args.len() {
            let option = &args[i];
            if option.eq_ignore_ascii_case(b"AUTH") && i + 2 < args.len() {
                auth = Some((&args[i + 1], &args[i + 2]));
                i += 3;
            } else if option.eq_ignore_ascii_case(b"SETNAME") && i + 1 < args.len() {
                name = Some(args[i + 1].clone());
                i += 2;
            } else {
                return Step::Answer(Reply::error(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(option)
                )));
            }
        }
        if let Some((user, password)) = auth {
            match credentials.check(Some(user), password) {
                Check::Accepted => self.authenticated = true,
                _ => return Step::AuthFailed(Reply::error(WRONGPASS)),
            }
        }
        if !self.authenticated {
            return Step::Answer(Reply::error(NOAUTH_HELLO));
        }
        self.protocol = protocol;
        if let Some(name) = name {
            self.name = Some(name).filter(|n| !n.is_empty());
        }
        let field = |name: &'static str, value: Reply| (Reply::bulk(name), value);
        Step::Answer(Reply::Map(vec![
            field("server", Reply::bulk("rl-relay")),
            field("version", Reply::bulk(env!("CARGO_PKG_VERSION"))),
            field("proto", Reply::Int(protocol.version())),
            field("id", Reply::Int(self.id as i64)),
            field("mode", Reply::bulk("standalone")),
            field("role", Reply::bulk("master")),
            field("modules", Reply::Array(Vec::new())),
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    fn answer(step: Step) -> Reply {
        match step {
            Step::Answer(r) | Step::Close(r) | Step::AuthFailed(r) | Step::Refused(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn connection_commands_answer_as_redis_does() {
        let none = Credentials::none();
        let mut s = Session::new(7, &none);
        let mut step = |line: &str| answer(s.step(&args(line), &none));
        assert_eq!(step("PING"), Reply::Simple("PONG".into()));
        assert_eq!(step("PING a b"), wrong_arity("ping"));
        assert_eq!(step("SELECT 0"), Reply::OK);
        assert_eq!(step("SELECT 00"), Reply::error("ERR value is not an integer or out of range"));
        assert!(matches!(step("SELECT 1"), Reply::Error(e) if e.starts_with("ERR DB index is out of range")));
        assert_eq!(step("CLIENT SETINFO lib-ver 1.0"), Reply::OK);
        assert_eq!(step("CLIENT SETINFO other 1"), Reply::error("ERR Unrecognized option 'other'"));
        assert_eq!(step("CLIENT GETNAME"), Reply::Null);
        assert_eq!(step("CLIENT SETNAME gw"), Reply::OK);
        assert_eq!(step("CLIENT GETNAME"), Reply::bulk("gw"));
        assert_eq!(step("CLIENT ID"), Reply::Int(7));
        assert_eq!(step("HELLO 3 AUTH"), Reply::error("ERR Syntax error in HELLO option 'AUTH'"));
        assert!(matches!(step("HELLO"), Reply::Map(_)));
        assert_eq!(step("RESET"), Reply::Simple("RESET".into()));
        assert_eq!(step("CLIENT GETNAME"), Reply::Null);
        assert_eq!(s.step(&args("QUIT"), &none), Step::Close(Reply::OK));
        assert_eq!(s.step(&args("RL.TAKE 1 k 1 1 1"), &none), Step::Relay);
        assert_eq!(s.step(&args("INFO"), &none), Step::Info);
        assert!(matches!(s.step(&args("KEYS *"), &none), Step::Refused(_)));
    }

    #[test]
    fn nothing_but_auth_before_it() {
        let creds = Credentials::parse("gw pass\n", "t").unwrap();
        let mut s = Session::new(1, &creds);
        assert_eq!(s.step(&args("RL.TAKE 1 k 1 1 1"), &creds), Step::Answer(Reply::error(NOAUTH)));
        assert_eq!(s.step(&args("HELLO 3"), &creds), Step::Answer(Reply::error(NOAUTH_HELLO)));
        assert_eq!(s.step(&args("AUTH gw nope"), &creds), Step::AuthFailed(Reply::error(WRONGPASS)));
        assert_eq!(s.protocol, Protocol::Resp2);
        assert!(matches!(s.step(&args("HELLO 3 AUTH gw pass"), &creds), Step::Answer(Reply::Map(_))));
        assert_eq!(s.protocol, Protocol::Resp3);
        assert_eq!(s.step(&args("RL.TAKE 1 k 1 1 1"), &creds), Step::Relay);
        s.step(&args("RESET"), &creds);
        assert_eq!(s.protocol, Protocol::Resp2);
        assert_eq!(s.step(&args("PING"), &creds), Step::Answer(Reply::error(NOAUTH)));
    }
}
