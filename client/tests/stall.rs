//! A Redis that stalls (CLIENT PAUSE, as a failover pauses it; or a slow
//! command) answers the calls queued on a connection once it goes on. The
//! client gives up on a connection after three calls in a row time out and
//! makes a new one; the calls it sent on the old one must still reach
//! Redis, since callers that timed out may have admitted from a fallback
//! on the promise that Redis counts them later (docs/error-bounds.md).

use std::time::{Duration, Instant};

use rl_client::{Bucket, Client, Config};
use testkit::Server;

/// Tokens left in `key`'s bucket, read without spending any.
fn remaining(server: &Server, key: &str) -> i64 {
    let reply: Vec<i64> =
        redis::cmd("RL.PEEK").arg(1).arg(key).arg(1000).arg(1).arg(3_600_000).query(&mut server.con()).unwrap();
    reply[1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sent_before_a_reconnect_are_counted_when_redis_goes_on() {
    let server = Server::start(&[]);
    let config = Config { timeout: Duration::from_millis(50), ..Config::standalone(server.url()) };
    let client = Client::new(&config).unwrap();
    let bucket = [Bucket::new("stalled", 1000, 1, Duration::from_secs(3600)).unwrap()];
    // Connected, and one token spent.
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(d) = client.take(&bucket, 1).await {
                break d;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the client connects");
    assert!(first.allowed);
    // What Redis counted so far (a first call that timed out while the
    // client connected may have counted too).
    let before = remaining(&server, "stalled");

    // Redis holds every client's commands for 10 s; three calls time out on
    // the connection, and the client drops it for a new one.
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(10_000).arg("ALL").query(&mut server.con()).unwrap();
    let paused = Instant::now();
    let mut timed_out = 0;
    for _ in 0..3 {
        if client.take(&bucket, 1).await.is_err() {
            timed_out += 1;
        }
    }
    if paused.elapsed() >= Duration::from_secs(8) {
        eprintln!("the machine is too busy for the pause to hold three calls: nothing to check");
        return;
    }
    assert_eq!(timed_out, 3, "the calls in the pause time out");

    // Once the pause ends, Redis counts the three calls it held.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = remaining(&server, "stalled");
        if left == before - 3 {
            break;
        }
        assert!(left > before - 3, "more counted than sent: {left} left of {before}");
        assert!(
            Instant::now() < deadline,
            "calls sent before the reconnect were lost: {left} left of {before}, {} expected",
            before - 3
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
