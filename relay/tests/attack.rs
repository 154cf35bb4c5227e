//! The outside attack's reproducers against the relay (issue 24): the relay
//! as a real process, raw TCP for the byte-level cases, a real server with
//! the module behind it.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{call, closed, command, read, send, Relay, Resp, Start};
use testkit::Server;

/// The relay still serves a new connection (once it has seen the closes
/// of the connections a test dropped).
fn still_serves(relay: &mut Relay) {
    assert!(relay.alive(), "the relay died: {}", relay.log());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match call(&mut relay.raw(), "PING") {
            Resp::Error(e) if e == "ERR max number of clients reached" && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            reply => return assert_eq!(reply, Resp::Simple("PONG".into())),
        }
    }
}

#[test]
fn nested_arrays_are_a_protocol_error_not_a_crash() {
    let s = Server::start(&[]);
    let mut relay = Relay::start(&s.url(), &[]);
    let mut c = relay.raw();
    let nested = b"*1\r\n".repeat(10_000);
    let reply = send(&mut c, &nested);
    assert_eq!(reply.error(), "ERR Protocol error: expected '$', got '*'");
    assert!(closed(&mut c), "the connection stays open after a protocol error");
    still_serves(&mut relay);
}

#[test]
fn lengths_are_bounded_before_anything_is_buffered() {
    let s = Server::start(&[]);
    let mut relay = Relay::start(&s.url(), &["--max-request-bytes", "4096", "--max-arguments", "64"]);
    for (request, error) in [
        (&b"*1\r\n$400000000\r\n"[..], "ERR Protocol error: invalid bulk length"),
        (b"*1\r\n$4097\r\n", "ERR Protocol error: invalid bulk length"),
        (b"*1\r\n$-1\r\n", "ERR Protocol error: invalid bulk length"),
        (b"*1\r\n$x\r\n", "ERR Protocol error: invalid bulk length"),
        (b"*100000\r\n", "ERR Protocol error: invalid multibulk length"),
        (b"*65\r\n", "ERR Protocol error: invalid multibulk length"),
        (b"*1x\r\n", "ERR Protocol error: invalid multibulk length"),
        (b"*11111111111111111111111111111111111111111111", "ERR Protocol error: too big mbulk count string"),
        (b"*1\r\n$11111111111111111111111111111111111111111111", "ERR Protocol error: too big bulk count string"),
    ] {
        let mut c = relay.raw();
        let reply = send(&mut c, request);
        assert!(reply.error().starts_with(error), "{:?}: {reply:?}", String::from_utf8_lossy(request));
        assert!(closed(&mut c), "{:?}: still open", String::from_utf8_lossy(request));
    }
    // Arguments that add up past the ceiling, each below it.
    let mut c = relay.raw();
    let big = vec![b'x'; 1500];
    let reply = send(&mut c, &common::encode(&[b"RL.PEEK", &big, &big, &big]));
    assert!(reply.error().starts_with("ERR Protocol error: invalid bulk length"), "{reply:?}");
    // An inline line past the ceiling, with no end in sight.
    let mut c = relay.raw();
    let reply = send(&mut c, &vec![b'a'; 8192]);
    assert!(reply.error().starts_with("ERR Protocol error: too big inline request"), "{reply:?}");
    still_serves(&mut relay);
}

/// Three connections each sending most of a 400 MB argument (the attack
/// took the relay to 465 MB): refused at the header, nothing held.
#[test]
fn unfinished_huge_arguments_hold_no_memory() {
    let s = Server::start(&[]);
    let mut relay = Relay::start(&s.url(), &[]);
    let before = relay.rss();
    let chunk = vec![b'x'; 1 << 20];
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = relay.raw();
        c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = c.write_all(b"*2\r\n$3\r\nGET\r\n$400000000\r\n");
        for _ in 0..50 {
            if c.write_all(&chunk).is_err() {
                break;
            }
        }
        held.push(c);
    }
    std::thread::sleep(Duration::from_millis(200));
    let grown = relay.rss().saturating_sub(before);
    assert!(grown < 32 << 20, "the relay grew by {} MB", grown >> 20);
    still_serves(&mut relay);
}

/// A client that pipelines without reading its answers: the relay stops
/// reading it once what it holds for it reaches --max-pending-bytes.
#[test]
fn a_client_that_never_reads_holds_a_bounded_amount() {
    let s = Server::start(&[]);
    let mut relay = Relay::start(&s.url(), &[]);
    let before = relay.rss();
    let arg = vec![b'p'; 60_000];
    let ping = common::encode(&[b"PING", &arg]);
    let mut c = relay.raw();
    c.set_nonblocking(true).unwrap();
    let started = Instant::now();
    let mut sent = 0usize;
    let mut offset = 0;
    while started.elapsed() < Duration::from_secs(3) && sent < 200 << 20 {
        match c.write(&ping[offset..]) {
            Ok(n) => {
                sent += n;
                offset = (offset + n) % ping.len();
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let grown = relay.rss().saturating_sub(before);
    assert!(sent > 30 << 20 || grown < 32 << 20, "sent only {} MB", sent >> 20);
    assert!(grown < 32 << 20, "the relay grew by {} MB for one client ({} MB sent)", grown >> 20, sent >> 20);
    still_serves(&mut relay);
}

fn acl_user(s: &Server, user: &str, password: &str) {
    let rules = format!(
        "{user} on >{password} ~rl:* -@all +rl.take +rl.peek +rl.lease +rl.refund +rl.window +rl.windowpeek \
         +cl.throttle +rl.acquire +rl.release +rl.inflight +ping"
    );
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER");
    for r in rules.split(' ') {
        cmd.arg(r);
    }
    let _: () = cmd.query(&mut s.con()).unwrap();
}

#[test]
fn reset_does_not_hand_the_relays_redis_connection_to_the_default_user() {
    let s = Server::start(&[]);
    acl_user(&s, "gw", "gwsecret");
    let _: () = redis::cmd("SET").arg("keep").arg("1").query(&mut s.con()).unwrap();
    let url = format!("redis://gw:gwsecret@127.0.0.1:{}/", s.port);
    let relay = Relay::start(&url, &[]);
    let mut c = relay.raw();
    assert_eq!(call(&mut c, "RESET"), Resp::Simple("RESET".into()));
    let flush = call(&mut c, "FLUSHALL");
    assert_eq!(flush.error(), "ERR command 'FLUSHALL' is not served by rl-relay");
    let kept: Option<String> = redis::cmd("GET").arg("keep").query(&mut s.con()).unwrap();
    assert_eq!(kept.as_deref(), Some("1"), "FLUSHALL went through");
    // The relay's connection to Redis is still the gateway user's.
    let reply = call(&mut c, "RL.TAKE 1 rl:{a}:s 10 1 1000");
    assert_eq!(reply.ints()[0], 1, "{reply:?}");
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut s.con()).unwrap();
    assert!(!clients.lines().any(|l| l.contains("lib-name=redis-rs") && l.contains("user=default")), "{clients}");
    assert!(clients.lines().any(|l| l.contains("user=gw")), "{clients}");
}

#[test]
fn only_the_modules_commands_are_forwarded() {
    let mut s = Server::start(&[]);
    let _: () = redis::cmd("SET").arg("keep").arg("1").query(&mut s.con()).unwrap();
    let relay = Relay::start(&s.url(), &[]);
    let mut c = relay.raw();
    for (line, name) in [
        ("KEYS *", "KEYS"),
        ("CONFIG GET requirepass", "CONFIG GET"),
        ("CONFIG SET maxmemory 1", "CONFIG SET"),
        ("EVAL return 1 0", "EVAL"),
        ("SCRIPT FLUSH", "SCRIPT FLUSH"),
        ("SWAPDB 0 1", "SWAPDB"),
        ("FLUSHDB", "FLUSHDB"),
        ("flushall", "flushall"),
        ("GET keep", "GET"),
        ("SET plain v", "SET"),
        ("MULTI", "MULTI"),
        ("SUBSCRIBE c", "SUBSCRIBE"),
        ("MONITOR", "MONITOR"),
        ("CLIENT KILL TYPE normal", "CLIENT KILL"),
        ("RL.INSPECT rl:{a}:s", "RL.INSPECT"),
        ("RL.SET k x 0", "RL.SET"),
        ("NOSUCHCOMMAND a", "NOSUCHCOMMAND"),
        ("SHUTDOWN NOSAVE", "SHUTDOWN"),
    ] {
        let reply = call(&mut c, line);
        assert_eq!(reply.error(), format!("ERR command '{name}' is not served by rl-relay"), "{line}");
    }
    assert!(s.is_running(), "SHUTDOWN went through");
    let maxmemory: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("maxmemory").query(&mut s.con()).unwrap();
    assert_eq!(maxmemory[1], "0");
    let kept: Option<String> = redis::cmd("GET").arg("keep").query(&mut s.con()).unwrap();
    assert_eq!(kept.as_deref(), Some("1"));
    // The module's public commands are Redis's answers.
    for line in [
        "RL.PEEK 1 rl:{b}:s 5 1 1000",
        "RL.REFUND 1 rl:{b}:s 5 1 1000 TOKENS 1",
        "RL.WINDOW 1 rl:{b}:w 5 1000",
        "RL.WINDOWPEEK 1 rl:{b}:w 5 1000",
        "CL.THROTTLE rl:{b}:cell 5 10 60 1",
        "RL.ACQUIRE 1 rl:{b}:f 3 30000 ID one",
        "RL.INFLIGHT 1 rl:{b}:f 3 30000",
        "RL.RELEASE 1 rl:{b}:f ID one",
    ] {
        let reply = call(&mut c, line);
        assert!(matches!(reply, Resp::Array(_) | Resp::Int(_)), "{line}: {reply:?}");
    }
    // Refusals answer at once: a word too long or with bytes a reply cannot carry.
    let reply = send(&mut c, &common::encode(&[b"FLUSH\r\nALL"]));
    assert_eq!(reply.error(), "ERR command 'FLUSH??ALL' is not served by rl-relay");
}

/// A blocking command of each family is refused at once, and another
/// client's RL.TAKE meanwhile is answered by Redis.
#[test]
fn no_blocking_command_stalls_other_clients() {
    let s = Server::start(&[]);
    let _: () =
        redis::cmd("XGROUP").arg("CREATE").arg("s").arg("g").arg("$").arg("MKSTREAM").query(&mut s.con()).unwrap();
    let relay = Relay::start(&s.url(), &["--timeout-ms", "300"]);
    for (line, name) in [
        ("BRPOPLPUSH nolist b 0", "BRPOPLPUSH"),
        ("BLMPOP 0 1 nolist LEFT", "BLMPOP"),
        ("WAIT 1 0", "WAIT"),
        ("XREADGROUP GROUP g c BLOCK 0 STREAMS s >", "XREADGROUP"),
        ("BLPOP nolist 0", "BLPOP"),
        ("BZPOPMIN nozset 0", "BZPOPMIN"),
        ("XREAD BLOCK 0 STREAMS s $", "XREAD"),
    ] {
        let mut blocker = relay.raw();
        blocker.write_all(&command(line)).unwrap();
        let mut other = relay.raw();
        let take = call(&mut other, "RL.TAKE 1 rl:{x}:s 1000 1000 1000 COST 1");
        assert!(matches!(take, Resp::Array(_)), "{line} stalled RL.TAKE: {take:?}");
        let reply = read(&mut blocker).unwrap_or_else(|| panic!("{line}: no answer"));
        assert_eq!(reply.error(), format!("ERR command '{name}' is not served by rl-relay"), "{line}");
    }
}

fn connect_all(relay: &Relay, n: usize) -> (Vec<TcpStream>, usize) {
    let mut served = Vec::new();
    let mut refused = 0;
    for _ in 0..n {
        let mut c = relay.raw();
        match call(&mut c, "PING") {
            Resp::Simple(p) if p == "PONG" => served.push(c),
            Resp::Error(e) if e == "ERR max number of clients reached" => {
                assert!(closed(&mut c), "a refused client stays connected");
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    (served, refused)
}

#[test]
fn max_clients_refuses_the_excess_as_redis_does() {
    let s = Server::start(&[]);
    let mut relay = Relay::start(&s.url(), &["--max-clients", "5"]);
    let (mut served, refused) = connect_all(&relay, 8);
    assert_eq!((served.len(), refused), (5, 3));
    served.pop();
    // The relay notices the close (until then a new client is rightly
    // refused, and counted), then the freed place is taken again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !call(&mut served[0], "INFO relay").text().contains("connected_clients:4\r\n") {
        assert!(Instant::now() < deadline, "the close was not noticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    still_serves(&mut relay);
    let info = call(&mut served[0], "INFO relay").text();
    assert!(info.contains("rejected_clients:3\r\n"), "{info}");
}

/// At 256 open files and 375 connections the relay spun a core: the
/// default --max-clients stays below the descriptor limit, and the excess
/// is refused with an error.
#[test]
fn at_the_descriptor_limit_the_excess_is_refused_and_the_relay_idles() {
    let s = Server::start(&[]);
    let mut start = Start::args(&["--redis", &s.url()]);
    start.max_files = Some(256);
    let mut relay = Relay::spawn(start);
    let (mut served, refused) = connect_all(&relay, 375);
    assert!(refused > 0, "{} served at a limit of 256 files", served.len());
    assert!(served.len() >= 64, "only {} served", served.len());
    let info = call(&mut served[0], "INFO relay").text();
    assert!(info.contains(&format!("max_clients:{}\r\n", served.len())), "{info}");
    let before = relay.cpu_time();
    std::thread::sleep(Duration::from_secs(2));
    let used = relay.cpu_time() - before;
    assert!(used < Duration::from_millis(500), "{used:?} of CPU in 2 s while idle");
    drop(served);
    still_serves(&mut relay);
}

#[test]
fn the_protocol_is_read_as_strictly_as_redis_and_inline_commands_are_answered() {
    let s = Server::start(&[]);
    let mut relay = Relay::start(&s.url(), &[]);
    for (request, error) in [
        (&b"*1\r\n$4\r\nPINGxx"[..], "ERR Protocol error: expected CRLF after a bulk string"),
        (b"*1\r\n+PING\r\n", "ERR Protocol error: expected '$', got '+'"),
        (b"*1\r\n:1\r\n", "ERR Protocol error: expected '$', got ':'"),
        (b"PING \"unbalanced\r\n", "ERR Protocol error: unbalanced quotes in request"),
    ] {
        let mut c = relay.raw();
        let reply = send(&mut c, request);
        assert_eq!(reply.error(), error, "{:?}", String::from_utf8_lossy(request));
        assert!(closed(&mut c));
    }
    let mut c = relay.raw();
    // Empty requests are skipped, as Redis does; inline commands answered.
    assert_eq!(send(&mut c, b"*0\r\n*-1\r\n\r\nPING\r\n"), Resp::Simple("PONG".into()));
    assert_eq!(send(&mut c, b"PING hello\n"), Resp::Bulk(b"hello".to_vec()));
    assert_eq!(send(&mut c, b"PING \"two words\\x21\"\r\n"), Resp::Bulk(b"two words!".to_vec()));
    let take = send(&mut c, b"RL.TAKE 1 rl:{i}:s 10 1 1000\r\n");
    assert_eq!(take.ints()[0], 1);
    assert_eq!(send(&mut c, b"GET x\r\n").error(), "ERR command 'GET' is not served by rl-relay");
    still_serves(&mut relay);
}

/// 100,000 refusals held for two years filled the table: new subjects were
/// never pooled. The table evicts by recency and cost, and a refusal is
/// held at most --max-refusal-hold-ms (its retry time stays Redis's).
#[test]
fn a_table_full_of_long_refusals_still_pools_new_subjects() {
    let s = Server::start(&[]);
    let relay = Relay::start(&s.url(), &["--max-subjects", "200"]);
    let mut c = relay.con();
    let mut pipe = redis::pipe();
    for i in 0..400 {
        for _ in 0..2 {
            pipe.cmd("RL.TAKE").arg(1).arg(format!("rl:{{k{i}}}:s")).arg(1).arg(1).arg(63_072_000_000u64);
        }
    }
    let replies: Vec<Vec<i64>> = pipe.query(&mut c).unwrap();
    // Pipelined calls run concurrently: of each pair, one is admitted.
    for pair in replies.chunks(2) {
        let refused: Vec<&Vec<i64>> = pair.iter().filter(|r| r[0] == 0).collect();
        assert!(refused.len() == 1 && refused[0][2] > 60_000_000_000, "one refused for 2 years: {pair:?}");
    }
    let held = relay.info_field("subjects");
    assert!(held <= 200, "{held} subjects held");
    // A fresh subject is pooled: its calls are answered from memory.
    let from_memory = relay.info_field("from_memory");
    for _ in 0..200 {
        let reply: Vec<i64> =
            redis::cmd("RL.TAKE").arg(1).arg("rl:{fresh}:s").arg(100_000).arg(100_000).arg(1000).query(&mut c).unwrap();
        assert_eq!(reply[0], 1);
    }
    let served = relay.info_field("from_memory") - from_memory;
    assert!(served >= 190, "only {served} of 200 calls of a new subject answered from memory");
    assert!(relay.info_field("evicted_subjects") > 0);
}

#[test]
fn a_refusal_is_held_a_bounded_time_and_keeps_redis_retry_time() {
    let s = Server::start(&[]);
    let relay = Relay::start(&s.url(), &["--max-refusal-hold-ms", "300"]);
    let mut c = relay.raw();
    let take = "RL.TAKE 1 rl:{long}:s 1 1 63072000000";
    assert_eq!(call(&mut c, take).ints()[0], 1);
    let refused = call(&mut c, take).ints();
    assert_eq!(refused[0], 0);
    let forwarded = relay.info_field("forwarded");
    let from_memory = call(&mut c, take).ints();
    assert_eq!(from_memory[0], 0);
    assert!(from_memory[2] > 60_000_000_000, "the retry time is Redis's: {from_memory:?}");
    assert_eq!(relay.info_field("forwarded"), forwarded, "answered from memory");
    std::thread::sleep(Duration::from_millis(400));
    let again = call(&mut c, take).ints();
    assert_eq!(again[0], 0);
    assert_eq!(relay.info_field("forwarded"), forwarded + 1, "Redis is asked again once the hold is over");
}

/// Answers go out in order, and one that is ready is not held back while
/// the next waits for Redis.
#[test]
fn a_ready_answer_is_not_held_behind_a_slow_one() {
    let s = Server::start(&[]);
    let relay = Relay::start(&s.url(), &["--timeout-ms", "5000"]);
    let mut c = relay.raw();
    assert_eq!(call(&mut c, "PING"), Resp::Simple("PONG".into()));
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(3000).arg("ALL").query(&mut s.con()).unwrap();
    let started = Instant::now();
    c.write_all(&[command("PING first"), command("RL.PEEK 1 rl:{p}:s 5 1 1000")].concat()).unwrap();
    assert_eq!(read(&mut c), Some(Resp::Bulk(b"first".to_vec())));
    let first = started.elapsed();
    assert!(first < Duration::from_secs(2), "the ready answer waited {first:?} for the paused one");
    assert!(matches!(read(&mut c), Some(Resp::Array(_))), "the paused call is answered after the pause");
    assert!(started.elapsed() >= Duration::from_secs(2));
}
