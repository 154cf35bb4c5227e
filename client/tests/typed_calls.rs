//! The typed calls the Lua backend does not share (CL.THROTTLE), windows on
//! the module, and what the Lua backend answers instead. (Windows on the Lua
//! backend: lua_windows.rs.)

use std::time::Duration;

use rl_client::{Backend, Bucket, Client, Config, Error, Window, WindowMode};
use testkit::Server;

const HOUR: Duration = Duration::from_secs(3600);

fn client(server: &Server, backend: Backend) -> Client {
    let config = Config { backend, timeout: Duration::from_secs(2), ..Config::standalone(server.url()) };
    Client::new(&config).unwrap()
}

#[tokio::test]
async fn windows_in_every_mode_are_all_or_nothing() {
    let s = Server::start(&[]);
    let c = client(&s, Backend::Module);
    for mode in [WindowMode::Sliding, WindowMode::Exact, WindowMode::Fixed] {
        let w = [
            Window::new(format!("{{w}}:{mode:?}:a"), 10, HOUR).unwrap(),
            Window::new(format!("{{w}}:{mode:?}:b"), 2, HOUR).unwrap(),
        ];
        for left in [1, 0] {
            let d = c.window(&w, 1, mode).await.unwrap();
            assert_eq!((d.allowed, d.remaining, d.limit, d.rule), (true, left, 2, 1), "{mode:?}");
        }
        let d = c.window(&w, 1, mode).await.unwrap();
        assert_eq!((d.allowed, d.limit, d.rule), (false, 2, 1), "{mode:?}");
        assert!(d.retry_after.is_some_and(|r| r > Duration::ZERO), "{mode:?}: {d:?}");
        // The refusal counted nothing in the first window: 8 left, and a peek
        // writes nothing either.
        for _ in 0..2 {
            let d = c.window_peek(&w[..1], 1, mode).await.unwrap();
            assert_eq!((d.allowed, d.remaining), (true, 7), "{mode:?}");
        }
        assert_eq!(c.window(&w, 3, mode).await.unwrap().retry_after, None, "{mode:?}: cost above a limit");
    }
}

#[tokio::test]
async fn cl_throttle_answers_as_redis_cell() {
    let s = Server::start(&[]);
    let c = client(&s, Backend::Module);
    let minute = Duration::from_secs(60);
    // max_burst 15, 30 per 60 s: limit 16, one token every 2 s.
    let d = c.throttle("user123", 15, 30, minute, 1).await.unwrap();
    assert_eq!(
        (d.allowed, d.limit, d.remaining, d.retry_after, d.reset_after),
        (true, 16, 15, Some(Duration::ZERO), Duration::from_secs(2))
    );
    let d = c.throttle("user123", 15, 30, minute, 0).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 15), "quantity 0 peeks");
    let d = c.throttle("user123", 15, 30, minute, 16).await.unwrap();
    assert_eq!((d.allowed, d.retry_after), (false, Some(Duration::from_secs(2))));
    let d = c.throttle("user123", 15, 30, minute, 17).await.unwrap();
    assert_eq!((d.allowed, d.retry_after), (false, None), "more than the limit can never pass");
    assert!(matches!(c.throttle("k", 1, 1, Duration::from_millis(1500), 1).await, Err(Error::Invalid(_))));
}

#[tokio::test]
async fn the_lua_backend_says_what_it_lacks() {
    let s = Server::start(&[]);
    let c = client(&s, Backend::Lua);
    assert!(matches!(c.throttle("k", 1, 1, HOUR, 1).await, Err(Error::Unsupported("CL.THROTTLE"))));
    // Beyond the exact range of doubles: refused before anything is sent.
    let huge = [Bucket::new("h", 1_000_000_000, 1, Duration::from_secs(86_400)).unwrap()];
    let e = c.take(&huge, 1).await.unwrap_err();
    assert!(e.to_string().contains("at most 2^52 on the Lua backend"), "{e}");
    // The module takes the same bucket.
    assert!(client(&s, Backend::Module).take(&huge, 1).await.unwrap().allowed);
}

#[tokio::test]
async fn bad_input_is_refused_before_sending() {
    let s = Server::start(&[]);
    let c = client(&s, Backend::Module);
    let b = Bucket::new("k", 10, 1, HOUR).unwrap();
    let cases = [
        c.take(&[], 1).await.unwrap_err(),
        c.take(&[b.clone(), b.clone()], 1).await.unwrap_err(),
        c.take(std::slice::from_ref(&b), 0).await.unwrap_err(),
        c.lease(std::slice::from_ref(&b), 3, 4).await.unwrap_err(),
        c.refund(std::slice::from_ref(&b), 0).await.unwrap_err(),
    ];
    for e in cases {
        assert!(matches!(e, Error::Invalid(_)), "{e}");
    }
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut s.con()).unwrap();
    assert!(!stats.contains("cmdstat_rl."), "nothing reached the server:\n{stats}");
}
