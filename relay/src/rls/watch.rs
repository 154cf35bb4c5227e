//! The config, watched: every `--rls-config` file's size and modification
//! time (and the list of files of a directory) looked at every poll; on a
//! change the whole config is read again. A good one replaces the one in
//! force (logged, `ratelimit_service_config_load_success`); a bad one, or
//! a directory left with no file, is refused and the one in force kept
//! (logged with the file, line, path and reason,
//! `ratelimit_service_config_load_error`). A hostile one (an alias bomb,
//! a huge file, a folder of too many files) is refused the same way,
//! within the bounds of `config`; it is read and parsed off the runtime's
//! workers, which keep answering meanwhile.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::SystemTime;

use super::config::{config_files, ConfigError, RlsConfig};
use super::Rls;
use crate::logging::line;

/// What the files look like: each one's name, size and modification time.
type Fingerprint = Vec<(String, u64, Option<SystemTime>)>;

fn fingerprint(rls: &Rls) -> Result<Fingerprint, ConfigError> {
    let files = config_files(&rls.options.config_path)?;
    Ok(files
        .into_iter()
        .map(|(name, path)| {
            let meta = std::fs::metadata(&path).ok();
            let len = meta.as_ref().map_or(0, |m| m.len());
            (name, len, meta.and_then(|m| m.modified().ok()))
        })
        .collect())
}

/// Reads the config at `--rls-config`: refused when it has no file.
pub fn load(options: &super::Options) -> Result<RlsConfig, ConfigError> {
    let config = RlsConfig::load(&options.config_path, options.merge_domains)?;
    if config.files.is_empty() {
        return Err(ConfigError {
            file: options.config_path.display().to_string(),
            problem: None,
            reason: "holds no .yaml or .yml file".into(),
        });
    }
    Ok(config)
}

/// Watches until the process ends.
pub async fn watch(rls: Arc<Rls>) {
    let mut seen = fingerprint(&rls).ok();
    loop {
        tokio::time::sleep(rls.options.poll).await;
        let now = fingerprint(&rls).ok();
        if now == seen {
            continue;
        }
        seen = now;
        let reading = rls.clone();
        let loaded = match tokio::task::spawn_blocking(move || load(&reading.options)).await {
            Ok(loaded) => loaded,
            Err(e) => Err(ConfigError {
                file: rls.options.config_path.display().to_string(),
                problem: None,
                reason: format!("reading it failed: {e}"),
            }),
        };
        match apply(&rls, loaded) {
            Ok((files, domains)) => line(format_args!("RLS config reloaded: {files} files, {domains} domains")),
            Err(e) => line(format_args!("RLS config refused, the one in force kept: {e}")),
        }
    }
}

/// A config read (from the files, or over xDS) put in force, or refused
/// and the one in force kept: counted either way. Its files and domains.
pub(super) fn apply(rls: &Rls, loaded: Result<RlsConfig, ConfigError>) -> Result<(usize, usize), ConfigError> {
    // On the Lua scripts, a limit they cannot count is refused here, as a
    // bad file is (config/lua_fit.rs).
    let loaded = loaded.and_then(|config| if rls.on_lua() { config.fits_lua().map(|()| config) } else { Ok(config) });
    match loaded {
        Ok(config) => {
            let shape = (config.files.len(), config.domains.len());
            rls.set_config(config);
            rls.stats.config_load_success.fetch_add(1, Relaxed);
            Ok(shape)
        }
        Err(e) => {
            rls.stats.config_load_error.fetch_add(1, Relaxed);
            Err(e)
        }
    }
}

/// With `--redis-backend auto`, once the first probe decides: on the Lua
/// scripts, the limits of the config in force they cannot count are
/// logged (each is then answered by its failure mode, and
/// `rl_relay_rls_limits_beyond_backend` counts them); later configs are
/// refused with them, by `apply`.
pub async fn once_decided(rls: Arc<Rls>) {
    while rls.relay().backend().current().is_none() {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let beyond = if rls.on_lua() { rls.config().beyond_lua() } else { return };
    if let Some(first) = beyond.first() {
        line(format_args!(
            "--redis-backend auto chose the Lua scripts, and {} limits of the config in force are beyond them: each \
             is answered by its failure mode (a config with them is now refused): {first}",
            beyond.len()
        ));
    }
}
