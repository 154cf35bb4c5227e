//! redis-cell, built by the bench itself so that CL.THROTTLE is compared
//! with it in the same run.
//!
//! Where the module comes from, first match wins:
//! 1. `REDIS_CELL_SO=path` (and `REDIS_CELL_VERSION`, shown in the report);
//! 2. the cached build under `.deps/redis-cell/`;
//! 3. `REDIS_CELL_SRC`: a checkout of brandur/redis-cell (or a bare git
//!    mirror of it), built as is: the newest upstream, 0.5.x, is not on
//!    crates.io;
//! 4. the newest published crate, 0.2.2, fetched by cargo from crates.io.
//!
//! None of it is committed: the source and the build stay under `.deps/`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The published crate used when no source is given.
const PUBLISHED: &str = "0.2.2";

pub struct Cell {
    pub so: PathBuf,
    /// "0.5.0 (brandur/redis-cell source)" and the like.
    pub version: String,
}

fn deps() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps/redis-cell")
}

/// redis-cell's module, or why there is none.
pub fn locate() -> Result<Cell, String> {
    if let Some(so) = std::env::var_os("REDIS_CELL_SO") {
        let version = std::env::var("REDIS_CELL_VERSION").unwrap_or_else(|_| "version not given".into());
        let so = PathBuf::from(so);
        return if so.exists() {
            Ok(Cell { version: format!("{version} (REDIS_CELL_SO={})", so_name(&so)), so })
        } else {
            Err(format!("REDIS_CELL_SO={} does not exist", so.display()))
        };
    }
    let dir = deps();
    let (so, stamp) = (dir.join("libredis_cell.so"), dir.join("VERSION"));
    if let (true, Ok(version)) = (so.exists(), std::fs::read_to_string(&stamp)) {
        return Ok(Cell { so, version: version.trim().to_string() });
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let (src, origin) = match std::env::var_os("REDIS_CELL_SRC") {
        Some(src) => (checkout(Path::new(&src), &dir)?, "brandur/redis-cell source"),
        None => (published(&dir)?, "crates.io"),
    };
    let version = manifest_version(&src)?;
    eprintln!("building redis-cell {version} from {}", src.display());
    let target = dir.join("target");
    let out = Command::new("cargo")
        .args(["build", "--release", "--lib", "--manifest-path"])
        .arg(src.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .output()
        .map_err(|e| format!("run cargo: {e}"))?;
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        return Err(format!("building redis-cell {version} failed: {}", tail.join(" / ")));
    }
    std::fs::copy(target.join("release/libredis_cell.so"), &so).map_err(|e| format!("copy the build: {e}"))?;
    let version = format!("{version} ({origin})");
    std::fs::write(&stamp, &version).map_err(|e| format!("write {}: {e}", stamp.display()))?;
    Ok(Cell { so, version })
}

fn so_name(so: &Path) -> String {
    so.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// A source tree from `src`: a checkout as is, or a git directory
/// exported (its HEAD) into `dir/src`, made a workspace of its own (it
/// sits inside ours).
fn checkout(src: &Path, dir: &Path) -> Result<PathBuf, String> {
    if src.join("Cargo.toml").exists() {
        return Ok(src.to_path_buf());
    }
    let out_dir = dir.join("src");
    let _ = std::fs::remove_dir_all(&out_dir);
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("create {}: {e}", out_dir.display()))?;
    let status = Command::new("sh")
        .arg("-c")
        .arg("git --git-dir=\"$1\" archive HEAD | tar -x -C \"$2\"")
        .args(["sh", &src.to_string_lossy(), &out_dir.to_string_lossy()])
        .status()
        .map_err(|e| format!("run git archive: {e}"))?;
    if !status.success() || !out_dir.join("Cargo.toml").exists() {
        return Err(format!(
            "REDIS_CELL_SRC={} is neither a checkout nor a git directory of redis-cell",
            src.display()
        ));
    }
    own_workspace(&out_dir)?;
    Ok(out_dir)
}

/// The published crate's source: cargo fetches it into its registry cache
/// for a throwaway package that depends on it; it is copied from there
/// (the registry copy is read-only, and the build needs its own lock file).
fn published(dir: &Path) -> Result<PathBuf, String> {
    let fetcher = dir.join("fetch");
    std::fs::create_dir_all(fetcher.join("src")).map_err(|e| format!("create {}: {e}", fetcher.display()))?;
    let manifest = format!(
        "[package]\nname = \"fetch-redis-cell\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[dependencies]\n\
         redis-cell = \"={PUBLISHED}\"\n\n[workspace]\n"
    );
    std::fs::write(fetcher.join("Cargo.toml"), manifest).map_err(|e| e.to_string())?;
    std::fs::write(fetcher.join("src/lib.rs"), "").map_err(|e| e.to_string())?;
    let out = Command::new("cargo")
        .args(["fetch", "--manifest-path"])
        .arg(fetcher.join("Cargo.toml"))
        .output()
        .map_err(|e| format!("run cargo fetch: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo could not fetch redis-cell {PUBLISHED}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("no CARGO_HOME or HOME")?;
    let registry = std::fs::read_dir(home.join("registry/src")).map_err(|e| format!("read the cargo registry: {e}"))?;
    let fetched = registry
        .filter_map(Result::ok)
        .map(|d| d.path().join(format!("redis-cell-{PUBLISHED}")))
        .find(|p| p.join("Cargo.toml").exists())
        .ok_or_else(|| format!("redis-cell {PUBLISHED} is not in the cargo registry after cargo fetch"))?;
    let copy = dir.join(format!("src-{PUBLISHED}"));
    let _ = std::fs::remove_dir_all(&copy);
    let status = Command::new("cp").arg("-r").arg(&fetched).arg(&copy).status().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("copy {} failed", fetched.display()));
    }
    own_workspace(&copy)?;
    Ok(copy)
}

/// Marks a copied package as a workspace root, so that cargo does not take
/// it for a member of ours.
fn own_workspace(src: &Path) -> Result<(), String> {
    let manifest = src.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).map_err(|e| format!("read {}: {e}", manifest.display()))?;
    if text.lines().any(|l| l.trim() == "[workspace]") {
        return Ok(());
    }
    std::fs::write(&manifest, format!("{text}\n[workspace]\n"))
        .map_err(|e| format!("write {}: {e}", manifest.display()))
}

fn manifest_version(src: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(src.join("Cargo.toml")).map_err(|e| format!("read {}: {e}", src.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("version").map(|v| v.trim_start_matches([' ', '=']).trim_matches('"').to_string()))
        .ok_or_else(|| format!("no version in {}/Cargo.toml", src.display()))
}
