//! RESP3 (`HELLO 3`, redis-py's default) through the relay, and `INFO relay`
//! read by a client that keeps one value per field name.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{call, send, Relay, Resp};
use testkit::Server;

#[test]
fn hello_3_switches_the_connection_to_resp3() {
    let s = Server::start(&[]);
    let relay = Relay::start(&s.url(), &[]);
    let mut c = relay.raw();
    let Resp::Map(hello) = call(&mut c, "HELLO 3") else { panic!("HELLO 3 answers a map") };
    let field = |name: &str| hello.iter().find(|(k, _)| *k == Resp::Bulk(name.into())).map(|(_, v)| v.clone());
    assert_eq!(field("proto"), Some(Resp::Int(3)));
    assert_eq!(field("server"), Some(Resp::Bulk(b"rl-relay".to_vec())));
    assert_eq!(field("mode"), Some(Resp::Bulk(b"standalone".to_vec())));
    assert!(matches!(field("id"), Some(Resp::Int(_))), "{hello:?}");
    // Replies keep their shape; a null is RESP3's.
    assert_eq!(call(&mut c, "RL.TAKE 1 rl:{a}:s 10 1 1000").ints().len(), 6);
    assert_eq!(call(&mut c, "CLIENT GETNAME"), Resp::Null);
    assert_eq!(send(&mut c, b"CLIENT GETNAME\r\n"), Resp::Null);
    let raw = {
        use std::io::{Read, Write};
        c.write_all(b"CLIENT GETNAME\r\n").unwrap();
        let mut buf = [0u8; 3];
        c.read_exact(&mut buf).unwrap();
        buf
    };
    assert_eq!(&raw, b"_\r\n");
    assert!(call(&mut c, "INFO relay").text().starts_with("# relay\r\n"));
    // Back to RESP2.
    let Resp::Array(hello2) = call(&mut c, "HELLO 2") else { panic!("HELLO 2 answers a flat array") };
    assert!(hello2.windows(2).any(|w| w == [Resp::Bulk(b"proto".to_vec()), Resp::Int(2)]), "{hello2:?}");
    assert_eq!(call(&mut c, "CLIENT GETNAME"), Resp::Null);
    assert_eq!(call(&mut c, "HELLO 4").error(), "NOPROTO unsupported protocol version");
    assert_eq!(call(&mut c, "HELLO x").error(), "ERR Protocol version is not an integer or out of range");
    assert_eq!(call(&mut c, "HELLO 3 SETNAME gw-1 EXTRA").error(), "ERR Syntax error in HELLO option 'EXTRA'");
    assert!(matches!(call(&mut c, "HELLO 3 SETNAME gw-1"), Resp::Map(_)));
    assert_eq!(call(&mut c, "CLIENT GETNAME"), Resp::Bulk(b"gw-1".to_vec()));
}

/// The fields of `INFO relay` are unique: one line per listed subject.
#[test]
fn info_relay_names_each_field_once() {
    let s = Server::start(&[]);
    let relay = Relay::start(&s.url(), &[]);
    let mut c = relay.raw();
    for subject in ["a", "b", "c"] {
        for _ in 0..3 {
            call(&mut c, &format!("RL.TAKE 1 rl:{{{subject}}}:s 100 100 1000"));
        }
    }
    let info = relay.info();
    let names: Vec<&str> = info.lines().filter_map(|l| l.split_once(':').map(|(k, _)| k)).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(names.len(), unique.len(), "{info}");
    assert_eq!(info.lines().filter(|l| l.starts_with("subject_")).count(), 3, "{info}");
}

/// redis-py, from `make servers` (its wheel, unpacked under .deps/).
fn redis_py() -> PathBuf {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.deps/redis-py");
    assert!(
        lib.join("redis/__init__.py").exists(),
        "redis-py is not under {}: run `make servers` (it fetches the redis wheel)",
        lib.display()
    );
    lib
}

/// redis-py's default client (RESP3, HELLO 3 at connect) through the relay,
/// with and without a password; `info("relay")` keeps every subject.
#[test]
fn redis_py_default_client_works_through_the_relay() {
    let redis_py = redis_py();
    let s = Server::start(&[]);
    let script = r#"
import sys, redis
port = int(sys.argv[1])
password = sys.argv[2] if len(sys.argv) > 2 else None
r = redis.Redis(port=port, password=password, socket_timeout=5)
assert r.ping() is True
assert r.connection_pool.get_connection().get_protocol() in (3, "3"), "not RESP3"
for subject in ("a", "b"):
    reply = r.execute_command("RL.TAKE", 1, "rl:{%s}:s" % subject, 100, 100, 1000)
    assert reply[0] == 1, reply
info = r.info("relay")
assert info["requests"] >= 2, info
subjects = [k for k in info if k.startswith("subject_") and k[8:].isdigit()]
assert len(subjects) == 2, info
assert all("batch" in info[k] for k in subjects), info
try:
    r.execute_command("FLUSHALL")
    raise SystemExit("FLUSHALL was served")
except redis.ResponseError as e:
    assert "not served by rl-relay" in str(e), e
print("ok", r.connection_pool.get_connection().get_protocol())
"#;
    for auth in [None, Some("s3cret")] {
        let relay = match auth {
            None => Relay::start(&s.url(), &[]),
            Some(password) => {
                let mut start = common::Start::args(&["--redis", &s.url()]);
                start.env.push(("RL_RELAY_AUTH", password.into()));
                Relay::spawn(start)
            }
        };
        let mut cmd = Command::new("python3");
        cmd.args(["-c", script, &relay.port.to_string()]).args(auth).env("PYTHONPATH", &redis_py);
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("redis-py did not finish in 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.starts_with("ok 3"),
            "{auth:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
