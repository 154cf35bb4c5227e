//! What deploy/packaging/ relies on: the systemd units pass `systemd-analyze
//! verify`, and a server that cannot load its data exits with status 0 (so
//! its unit restarts it on `always`, not `on-failure`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::{free_port, Server};

#[test]
fn the_systemd_units_verify() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd");
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for entry in std::fs::read_dir(&units).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("service") {
            continue;
        }
        // The binaries are not installed here: any executable stands in
        // for them, so the check is of the units themselves.
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace("/usr/bin/rl-relay", "/bin/true").replace("/usr/bin/rl-balancer", "/bin/true");
        let text = text.replace("/usr/bin/rlctl", "/bin/true");
        let copy = dir.path().join(path.file_name().unwrap());
        std::fs::write(&copy, text).unwrap();
        let out = Command::new("systemd-analyze").arg("verify").arg(&copy).output().expect("systemd-analyze");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.trim().is_empty(), "{}: {said}", path.display());
        checked += 1;
    }
    assert_eq!(checked, 4, "redis-rl, rl-relay, rl-balancer, rl-exporter@");
}

/// Runs `binary` with `args` until it exits (at most 60 s): its status code.
fn exit_code(binary: &Path, args: &[&str]) -> i32 {
    let mut child = Command::new(binary).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} {args:?} did not exit", binary.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_server_that_cannot_load_its_data_exits_with_status_zero() {
    let binary = testkit::server_binary();
    // An RDB of the module's keys, loaded by a server without the module.
    let with = Server::start(&[]);
    testkit::call(&mut with.con(), "RL.TAKE", "1 k 10 1 60000");
    let _: () = redis::cmd("SAVE").query(&mut with.con()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(with.dir().join("dump.rdb"), dir.path().join("dump.rdb")).unwrap();
    let log = dir.path().join("server.log");
    let port = free_port().to_string();
    let args = ["--port", &port, "--dir", dir.path().to_str().unwrap(), "--logfile", log.to_str().unwrap()];
    assert_eq!(exit_code(&binary, &args), 0, "an RDB it cannot load");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("no matching module type 'rl-bucket'"), "{text}");
    // A replica without the module, syncing from a primary with its keys.
    let dir = tempfile::tempdir().unwrap();
    let (port, primary) = (free_port().to_string(), with.port.to_string());
    let log = dir.path().join("replica.log");
    let args = [
        "--port",
        &port,
        "--dir",
        dir.path().to_str().unwrap(),
        "--logfile",
        log.to_str().unwrap(),
        "--save",
        "",
        "--replicaof",
        "127.0.0.1",
        &primary,
    ];
    assert_eq!(exit_code(&binary, &args), 0, "a replica without the module");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("no matching module type 'rl-bucket'"), "{text}");
}
