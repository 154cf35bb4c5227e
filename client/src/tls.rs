//! TLS to Redis (`rediss://`): whom to trust, how to show ourselves, and
//! the one switch that skips verification (tests only).
//!
//! A standalone or Sentinel primary's stream is made here (rustls on
//! tokio), so that its connection keeps TCP_NODELAY and its closed flag
//! (`endpoint.rs`); a cluster, the sentinels and pub/sub connections go
//! through redis-rs's own rustls support with the same files
//! ([`Loaded::certificates`]). Either way: the CA file when one is set,
//! else the system roots as rustls-native-certs reads them
//! (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the OS store).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::{ErrorKind, RedisError, RedisResult};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::{Error, Result};

/// The environment every binary reads its TLS settings from
/// ([`Tls::from_env`]): the CA file, the client certificate and key, and
/// the insecure switch.
pub const TLS_ENV: [&str; 4] = ["RL_TLS_CA_FILE", "RL_TLS_CERT_FILE", "RL_TLS_KEY_FILE", "RL_TLS_INSECURE"];

/// How to reach a Redis that speaks TLS (a `rediss://` URL): whom to trust
/// and the client certificate to show. TLS itself is the URL's scheme;
/// these settings with a `redis://` target are refused as a config error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tls {
    /// PEM file of the CA (or CAs) that signed the servers' certificates,
    /// trusted instead of the system roots. None: the system roots
    /// (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the OS store).
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (chain), for servers that
    /// require one (`tls-auth-clients yes`). Goes with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key_file: Option<PathBuf>,
    /// Accept any certificate the server shows, unverified: anyone on the
    /// path can read and change the traffic. For tests only; a warning is
    /// logged at the first connection. A URL's `#insecure` does the same.
    pub insecure: bool,
}

impl Tls {
    /// The settings from `RL_TLS_CA_FILE`, `RL_TLS_CERT_FILE`,
    /// `RL_TLS_KEY_FILE` and `RL_TLS_INSECURE` (`1`/`true`/`yes` or
    /// `0`/`false`/`no`); unset or empty: the default.
    pub fn from_env() -> Result<Tls> {
        Tls::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Tls> {
        let [ca, cert, key, insecure] = TLS_ENV;
        let path = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let insecure = match var(insecure).unwrap_or_default().to_ascii_lowercase().as_str() {
            "" | "0" | "false" | "no" => false,
            "1" | "true" | "yes" => true,
            other => return Err(Error::invalid(format!("{insecure}='{other}': use 1 or 0"))),
        };
        Ok(Tls { ca_file: path(ca), cert_file: path(cert), key_file: path(key), insecure })
    }

    /// Anything set apart from the defaults.
    pub fn is_set(&self) -> bool {
        *self != Tls::default()
    }
}

/// The TLS that connections to `urls` need: loaded when one of them is
/// `rediss://`; settings given for plaintext URLs only are refused (TLS
/// is the URL's scheme: a `redis://` URL would silently ignore them).
pub(crate) fn for_urls<'a>(tls: &Tls, mut urls: impl Iterator<Item = &'a str>) -> Result<Option<Arc<Loaded>>> {
    let uses_tls = urls.any(|url| url.get(..9).is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://")));
    match (uses_tls, tls.is_set()) {
        (true, _) => Ok(Some(Loaded::load(tls)?)),
        (false, true) => Err(Error::invalid(
            "config tls is set, but no URL of the target is rediss://: use rediss:// URLs for a server that speaks TLS",
        )),
        (false, false) => Ok(None),
    }
}

/// [`Tls`] with its files read: what connections use.
pub(crate) struct Loaded {
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    /// Verifies the server (the CA file or the system roots); why not,
    /// for a machine without system roots (then only `insecure` connects).
    verified: std::result::Result<Arc<ClientConfig>, String>,
    /// `insecure` or a URL's `#insecure`: verifies nothing.
    unverified: Arc<ClientConfig>,
    /// The same files for redis-rs (a cluster, the sentinels, pub/sub).
    certificates: redis::TlsCertificates,
    insecure: bool,
    warned: AtomicBool,
}

impl Loaded {
    /// Reads the files now: a missing or bad one is a config error that
    /// names it, at `Client::new`, not at the first call.
    pub(crate) fn load(tls: &Tls) -> Result<Arc<Loaded>> {
        // redis-rs builds its own rustls configs with the process's provider.
        let _ = provider().install_default();
        let provider = Arc::new(provider());
        let root_pem = tls.ca_file.as_deref().map(|p| read(p, "ca_file")).transpose()?;
        let identity = match (&tls.cert_file, &tls.key_file) {
            (Some(cert), Some(key)) => Some((read(cert, "cert_file")?, read(key, "key_file")?)),
            (None, None) => None,
            _ => return Err(Error::invalid("config tls: cert_file and key_file go together")),
        };
        let roots = match (&tls.ca_file, &root_pem) {
            (Some(path), Some(pem)) => Ok(ca_roots(path, pem)?),
            _ => system_roots(),
        };
        let chain = identity
            .as_ref()
            .map(|(cert, key)| {
                let (cert_path, key_path) = (tls.cert_file.as_deref().unwrap(), tls.key_file.as_deref().unwrap());
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad_file(cert_path, "cert_file", &e.to_string()))?;
                if chain.is_empty() {
                    return Err(bad_file(cert_path, "cert_file", "no certificate in it"));
                }
                let key =
                    PrivateKeyDer::from_pem_slice(key).map_err(|e| bad_file(key_path, "key_file", &e.to_string()))?;
                Ok((chain, key))
            })
            .transpose()?;
        let config = |verifier: Option<Arc<dyn ServerCertVerifier>>| -> Result<Arc<ClientConfig>> {
            let builder = ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| Error::invalid(format!("config tls: {e}")))?;
            let builder = match verifier {
                Some(verifier) => builder.dangerous().with_custom_certificate_verifier(verifier),
                None => builder.with_root_certificates(roots.clone().map_err(Error::Invalid)?),
            };
            let config = match &chain {
                Some((chain, key)) => builder.with_client_auth_cert(chain.clone(), key.clone_key()).map_err(|e| {
                    Error::invalid(format!("config tls: the client certificate and key do not go together: {e}"))
                })?,
                None => builder.with_no_client_auth(),
            };
            Ok(Arc::new(config))
        };
        Ok(Arc::new(Loaded {
            ca_file: tls.ca_file.clone(),
            cert_file: tls.cert_file.clone(),
            verified: match config(None) {
                Err(Error::Invalid(why)) if tls.ca_file.is_none() => Err(why),
                other => Ok(other?),
            },
            unverified: config(Some(Arc::new(AnyCertificate(provider.clone()))))?,
            certificates: redis::TlsCertificates {
                client_tls: identity
                    .map(|(client_cert, client_key)| redis::ClientTlsConfig { client_cert, client_key }),
                root_cert: root_pem,
            },
            insecure: tls.insecure,
            warned: AtomicBool::new(false),
        }))
    }

    /// The files as redis-rs takes them.
    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        self.certificates.clone()
    }

    /// Verification skipped by the settings (not only by a URL).
    pub(crate) fn insecure(&self) -> bool {
        self.insecure
    }

    /// Logs, once, that `server`'s certificate is not checked.
    pub(crate) fn warn_insecure(&self, server: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "rl_client", server,
                "TLS without verification (insecure): the server's certificate is not checked; for tests only");
        }
    }

    /// The TLS handshake with `server` (`host:port`) on `tcp`; `insecure`:
    /// the URL said `#insecure`. A certificate refused names the CA that
    /// did not vouch for it.
    pub(crate) async fn handshake(
        &self,
        tcp: tokio::net::TcpStream,
        host: &str,
        insecure: bool,
        server: &str,
    ) -> RedisResult<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let insecure = insecure || self.insecure;
        if insecure {
            self.warn_insecure(server);
        }
        let config = match (insecure, &self.verified) {
            (true, _) => &self.unverified,
            (false, Ok(verified)) => verified,
            (false, Err(why)) => {
                return Err(RedisError::from((ErrorKind::InvalidClientConfig, "no roots", format!("{server}: {why}"))))
            }
        };
        let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned()).map_err(|e| {
            RedisError::from((ErrorKind::InvalidClientConfig, "bad TLS server name", format!("'{host}': {e}")))
        })?;
        let handshake = tokio_rustls::TlsConnector::from(config.clone()).connect(name, tcp).await;
        handshake.map_err(|e| {
            let text = format!("TLS handshake with {server} failed: {e} (does it speak TLS on that port?)");
            self.refused(rustls_error(&e), text, server)
        })
    }

    /// The connection's setup failed after the handshake: with TLS 1.3, a
    /// server that wants a client certificate says so only now. (redis-rs
    /// keeps the I/O error's rustls cause out of reach: its text says.)
    pub(crate) fn setup_failed(&self, e: RedisError, server: &str) -> RedisError {
        let text = e.to_string();
        match text.split_once("received fatal alert: ") {
            Some((_, alert)) => self.refused_by_server(alert.split_whitespace().next().unwrap_or(alert), server),
            None => e,
        }
    }

    /// A TLS failure, worded for the operator: whose certificate was not
    /// trusted by what, or what the server refused.
    fn refused(&self, error: Option<&rustls::Error>, otherwise: String, server: &str) -> RedisError {
        let trust = match &self.ca_file {
            Some(path) => format!("the CA file {}", path.display()),
            None => "the system roots (SSL_CERT_FILE, SSL_CERT_DIR, the OS store)".to_string(),
        };
        let text = match error {
            Some(rustls::Error::InvalidCertificate(why)) => {
                format!("the TLS certificate of {server} is not trusted by {trust}: {why:?}")
            }
            Some(rustls::Error::AlertReceived(alert)) => return self.refused_by_server(&format!("{alert:?}"), server),
            Some(other) => format!("TLS with {server} failed: {other}"),
            None => otherwise,
        };
        RedisError::from((ErrorKind::Io, "TLS refused", text))
    }
}

impl Loaded {
    /// The server sent `alert`: most likely about our certificate.
    fn refused_by_server(&self, alert: &str, server: &str) -> RedisError {
        let text = match &self.cert_file {
            None => format!(
                "{server} refused the TLS connection ({alert}): it may require a client certificate \
                 (cert_file and key_file, RL_TLS_CERT_FILE and RL_TLS_KEY_FILE)"
            ),
            Some(cert) => format!(
                "{server} refused the TLS connection ({alert}): it may not accept the client certificate {}",
                cert.display()
            ),
        };
        RedisError::from((ErrorKind::Io, "TLS refused", text))
    }
}

/// The rustls error inside an I/O error, if that is what it is.
fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// ring: built with cc alone, where aws-lc-rs (rustls's default, with
/// post-quantum key exchange) needs more of a toolchain; Redis servers
/// offer no post-quantum groups yet.
#[allow(deprecated)]
fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn read(path: &Path, field: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| bad_file(path, field, &e.to_string()))
}

fn bad_file(path: &Path, field: &str, why: &str) -> Error {
    Error::invalid(format!("config tls {field} {}: {why}", path.display()))
}

fn ca_roots(path: &Path, pem: &[u8]) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| bad_file(path, "ca_file", &e.to_string()))?;
        roots.add(cert).map_err(|e| bad_file(path, "ca_file", &e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad_file(path, "ca_file", "no certificate in it"));
    }
    Ok(roots)
}

/// The system roots, as rustls-native-certs reads them; none at all is an
/// error for the connections that verify (every server would be refused).
fn system_roots() -> std::result::Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(format!(
            "config tls: no system roots to trust ({}): set ca_file (RL_TLS_CA_FILE)",
            if why.is_empty() { "none found".to_string() } else { why.join("; ") }
        ));
    }
    Ok(roots)
}

/// Accepts any certificate (the signatures of the handshake are still
/// checked): [`Tls::insecure`].
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_names_are_read_and_checked() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(Tls::from_vars(vars(&[])).unwrap(), Tls::default());
        let tls = Tls::from_vars(vars(&[
            ("RL_TLS_CA_FILE", "/etc/rl/ca.pem"),
            ("RL_TLS_CERT_FILE", "/etc/rl/c.pem"),
            ("RL_TLS_KEY_FILE", "/etc/rl/k.pem"),
            ("RL_TLS_INSECURE", "0"),
        ]))
        .unwrap();
        assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/etc/rl/ca.pem")));
        assert_eq!((tls.cert_file.is_some(), tls.key_file.is_some(), tls.insecure), (true, true, false));
        assert!(Tls::from_vars(vars(&[("RL_TLS_INSECURE", "YES")])).unwrap().insecure);
        let e = Tls::from_vars(vars(&[("RL_TLS_INSECURE", "maybe")])).unwrap_err().to_string();
        assert!(e.contains("RL_TLS_INSECURE='maybe'"), "{e}");
    }

    #[test]
    fn bad_files_are_named_at_load() {
        let missing = Tls { ca_file: Some("/nonexistent/ca.pem".into()), ..Tls::default() };
        let e = Loaded::load(&missing).err().unwrap().to_string();
        assert!(e.contains("ca_file /nonexistent/ca.pem"), "{e}");
        let half = Tls { cert_file: Some("/x.pem".into()), ..Tls::default() };
        let e = Loaded::load(&half).err().unwrap().to_string();
        assert!(e.contains("cert_file and key_file go together"), "{e}");
        let not_pem = std::env::temp_dir().join(format!("rl-tls-not-pem-{}", std::process::id()));
        std::fs::write(&not_pem, "not a certificate").unwrap();
        let e = Loaded::load(&Tls { ca_file: Some(not_pem.clone()), ..Tls::default() }).err().unwrap().to_string();
        let _ = std::fs::remove_file(&not_pem);
        assert!(e.contains("no certificate in it"), "{e}");
    }
}
