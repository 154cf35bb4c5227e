//! make debs's Debian packages (`make test-packages` builds them, then runs
//! this), each unpacked with `dpkg -x` into a temp root: the module loads
//! into redis-server through the packaged conf snippet and answers
//! RL.TAKE; the binaries answer `--version`; the systemd units verify
//! against the packaged binaries; the environment files are there, the
//! exporter's unreadable to others (it holds a password).

mod support;

use std::path::{Path, PathBuf};

use support::{repo_path, run, version};
use testkit::PlainServer;

/// `package`'s .deb in dist/.
fn deb(package: &str) -> PathBuf {
    let dist = repo_path("dist");
    let prefix = format!("{package}_{}", version());
    let found = std::fs::read_dir(&dist)
        .unwrap_or_else(|e| panic!("{}: {e}: run make test-packages (it runs make debs)", dist.display()))
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with(&prefix) && name.ends_with(".deb")
        });
    found.unwrap_or_else(|| panic!("no {prefix}*.deb in {}: run make test-packages", dist.display()))
}

/// A control field of `deb`.
fn field(deb: &Path, name: &str) -> String {
    let (ok, said) = run("dpkg-deb", &["-f", deb.to_str().unwrap(), name]);
    assert!(ok, "{said}");
    said.trim().to_string()
}

/// `deb` unpacked into a new temp root; its listing (`dpkg-deb -c`).
fn unpack(deb: &Path) -> (tempfile::TempDir, String) {
    let root = tempfile::tempdir().unwrap();
    let (ok, said) = run("dpkg", &["-x", deb.to_str().unwrap(), root.path().to_str().unwrap()]);
    assert!(ok, "dpkg -x {}: {said}", deb.display());
    let (ok, listing) = run("dpkg-deb", &["-c", deb.to_str().unwrap()]);
    assert!(ok, "{listing}");
    (root, listing)
}

/// The mode column of `path` in a `dpkg-deb -c` listing.
fn mode<'a>(listing: &'a str, path: &str) -> &'a str {
    let line = listing
        .lines()
        .find(|l| l.ends_with(&format!(".{path}")))
        .unwrap_or_else(|| panic!("{path} not in\n{listing}"));
    line.split_whitespace().next().unwrap()
}

/// The systemd unit `unit` of an unpacked package, verified with its
/// binary's path pointed at the unpacked one.
fn verify_unit(root: &Path, listing: &str, unit: &str, binary: &str) {
    let path = ["lib/systemd/system", "usr/lib/systemd/system"]
        .iter()
        .map(|dir| root.join(dir).join(unit))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{unit} not in\n{listing}"));
    let text = std::fs::read_to_string(&path).unwrap();
    let installed = format!("/usr/bin/{binary}");
    assert!(text.contains(&format!("ExecStart={installed}")), "{unit} runs {installed}");
    let unpacked = root.join("usr/bin").join(binary);
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join(unit);
    std::fs::write(&copy, text.replace(&installed, unpacked.to_str().unwrap())).unwrap();
    let (ok, said) = run("systemd-analyze", &["verify", copy.to_str().unwrap()]);
    assert!(ok && said.trim().is_empty(), "{unit}: {said}");
}

fn common_fields(deb: &Path, package: &str) {
    assert_eq!(field(deb, "Package"), package);
    assert!(field(deb, "Version").starts_with(&version()), "{package}: {}", field(deb, "Version"));
    assert!(field(deb, "Depends").contains("libc6"), "{package}: Depends {}", field(deb, "Depends"));
}

#[test]
#[ignore = "make test-packages: needs make debs"]
fn the_module_package_loads_into_redis_server_through_its_snippet() {
    let deb = deb("redis-rl-module");
    common_fields(&deb, "redis-rl-module");
    let (root, listing) = unpack(&deb);
    let module = root.path().join("usr/lib/redis/modules/libredis_rl.so");
    assert!(module.is_file(), "{listing}");
    let snippet = std::fs::read_to_string(root.path().join("etc/redis/redis-rl.conf")).expect("the conf snippet");
    // The snippet as packaged, its module path pointed at the unpacked one.
    let copy = root.path().join("snippet.conf");
    std::fs::write(
        &copy,
        snippet.replace("/usr/lib/redis/modules/", &format!("{}/", module.parent().unwrap().display())),
    )
    .unwrap();
    let server = PlainServer::start_with(&["--include".as_ref(), copy.as_os_str()]);
    let mut con = server.con();
    let reply = testkit::call(&mut con, "RL.TAKE", "1 k 10 1 1000");
    assert_eq!(&reply[..2], [1, 9], "{reply:?}");
    let policy: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query(&mut con).unwrap();
    assert_eq!(policy[1], "volatile-ttl");
    // The snippet is a conffile: an upgrade keeps the operator's edits.
    let control = tempfile::tempdir().unwrap();
    let (ok, said) = run("dpkg-deb", &["-e", deb.to_str().unwrap(), control.path().to_str().unwrap()]);
    assert!(ok, "{said}");
    let conffiles = std::fs::read_to_string(control.path().join("conffiles")).unwrap_or_default();
    assert!(conffiles.lines().any(|l| l == "/etc/redis/redis-rl.conf"), "conffiles: {conffiles}");
}

#[test]
#[ignore = "make test-packages: needs make debs"]
fn the_binary_packages_run_and_carry_their_units_and_environment() {
    // (package, binary, unit, environment file, its mode)
    let packages = [
        ("rl-relay", "rl-relay", "rl-relay.service", "etc/default/rl-relay", "-rw-r--r--"),
        ("rl-balancer", "rl-balancer", "rl-balancer.service", "etc/default/rl-balancer", "-rw-r--r--"),
        ("rlctl", "rlctl", "rl-exporter@.service", "etc/default/rl-exporter-local", "-rw-------"),
    ];
    for (package, binary, unit, environment, env_mode) in packages {
        let deb = deb(package);
        common_fields(&deb, package);
        let (root, listing) = unpack(&deb);
        let path = root.path().join("usr/bin").join(binary);
        let (ok, said) = run(path.to_str().unwrap(), &["--version"]);
        assert!(ok, "{package}: {binary} --version: {said}");
        assert_eq!(said.trim(), format!("{binary} {}", version()));
        verify_unit(root.path(), &listing, unit, binary);
        assert!(root.path().join(environment).is_file(), "{package}: {environment}\n{listing}");
        assert_eq!(mode(&listing, &format!("/{environment}")), env_mode, "{package}: {environment}");
    }
}
