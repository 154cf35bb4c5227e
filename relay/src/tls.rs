//! The TLS of the relay's fronts, one home for both: the RLS front's
//! (`--rls-tls-*`, envoyproxy/ratelimit's GRPC_SERVER_USE_TLS) and the
//! RESP front's (`--resp-tls-*`, gateways across the network). The
//! server's certificate and key, and with a client CA mutual TLS, a
//! client without a certificate that CA signed refused at the handshake
//! (counted by the front). On the RLS front, with a client SAN
//! (GRPC_CLIENT_TLS_SAN) a client certificate not valid for that DNS name
//! has every call answered UNAUTHENTICATED, counted
//! (`rl_relay_rls_san_refused_total`) and logged, as upstream checks it
//! (`VerifyOptions.DNSName`).
//!
//! The files are read at start (a bad one refuses the start) and looked at
//! every second after: once one changes, all are read again and, when they
//! make a good configuration, new connections get it (logged); a bad one
//! is logged and counted by the front (`rl_relay_rls_tls_reload_errors_total`,
//! `rl_relay_tls_reload_errors_total`), the certificates in force kept.
//! Connections open keep what they were accepted with, as upstream's.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::logging::line;

/// The largest certificate or key file read.
const MAX_PEM_BYTES: usize = 1 << 20;

/// How often the files are looked at.
const POLL: Duration = Duration::from_secs(1);

/// Which front a [`Tls`] serves: its name in the log, its flags' prefix
/// in errors, and the protocols it offers by ALPN.
#[derive(Clone, Copy, Debug)]
pub struct Front {
    name: &'static str,
    flag: &'static str,
    alpn: &'static [&'static [u8]],
}

/// The Envoy front: gRPC, so HTTP/2.
pub const RLS: Front = Front { name: "RLS front", flag: "--rls-tls", alpn: &[b"h2"] };
/// The RESP front: Redis clients offer no ALPN.
pub const RESP: Front = Front { name: "RESP front", flag: "--resp-tls", alpn: &[] };

/// The files the front's TLS is made of.
#[derive(Clone, Debug)]
struct Files {
    front: Front,
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

type Fingerprint = Vec<Option<(u64, Option<SystemTime>)>>;

impl Files {
    fn all(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.cert, &self.key].into_iter().chain(self.client_ca.as_ref())
    }

    /// Each file's size and modification time (links followed: a
    /// Kubernetes secret's files are links swapped at once).
    fn fingerprint(&self) -> Fingerprint {
        self.all().map(|p| std::fs::metadata(p).ok().map(|m| (m.len(), m.modified().ok()))).collect()
    }

    /// A server configuration from the files, or what is wrong with them.
    fn build(&self) -> Result<ServerConfig, String> {
        let flag = self.front.flag;
        let certs = CertificateDer::pem_slice_iter(&read(&format!("{flag}-cert"), &self.cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{flag}-cert {}: {e}", self.cert.display()))?;
        if certs.is_empty() {
            return Err(format!("{flag}-cert {}: holds no certificate", self.cert.display()));
        }
        let key = PrivateKeyDer::from_pem_slice(&read(&format!("{flag}-key"), &self.key)?)
            .map_err(|e| format!("{flag}-key {}: {e}", self.key.display()))?;
        // ring, as tonic's tls-ring: rustls deprecates it for having no
        // post-quantum key exchange; aws-lc-rs, which has, builds a C
        // library at every cold build.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let shown = |e: &dyn fmt::Display| format!("{flag}-client-ca {}: {e}", path.display());
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(&read(&format!("{flag}-client-ca"), path)?) {
                    roots.add(cert.map_err(|e| shown(&e))?).map_err(|e| shown(&e))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| shown(&e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| format!("{flag}-cert {} with {flag}-key: {e}", self.cert.display()))?;
        config.alpn_protocols = self.front.alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

/// A PEM file, bounded (the xDS client reads its own with it too).
pub(crate) fn read(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    let text = crate::files::read_bounded(path, MAX_PEM_BYTES, "a PEM file (1 MiB)")
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    Ok(text.into_bytes())
}

/// The front's TLS: the configuration in force, and what it is made of.
pub struct Tls {
    files: Files,
    /// The DNS name a client certificate must be valid for.
    pub client_san: Option<String>,
    config: RwLock<Arc<ServerConfig>>,
}

/// Never the key.
impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).field("client_san", &self.client_san).finish()
    }
}

impl Tls {
    /// Reads the files and builds `front`'s configuration: any error
    /// refuses the start.
    pub fn load(
        front: Front,
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
        client_san: Option<String>,
    ) -> Result<Tls, String> {
        let flag = front.flag;
        if client_san.is_some() && client_ca.is_none() {
            return Err(format!(
                "{flag}-client-san needs {flag}-client-ca: without a client CA no client certificate is asked for"
            ));
        }
        if let Some(san) = &client_san {
            rustls_pki_types::DnsName::try_from(san.as_str())
                .map_err(|_| format!("{flag}-client-san {san}: not a DNS name"))?;
        }
        let files = Files { front, cert: cert.into(), key: key.into(), client_ca: client_ca.map(Into::into) };
        let config = files.build()?;
        Ok(Tls { files, client_san, config: RwLock::new(Arc::new(config)) })
    }

    /// An acceptor with the configuration in force.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Whether clients must show a certificate the client CA signed.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Looks at the files every second until the process ends; reads them
    /// again once one changed (a refusal counted by `refused`).
    pub async fn watch(self: Arc<Self>, refused: impl Fn() + Send + 'static) {
        let name = self.files.front.name;
        let mut seen = self.files.fingerprint();
        loop {
            tokio::time::sleep(POLL).await;
            let now = self.files.fingerprint();
            if now == seen {
                continue;
            }
            seen = now;
            let files = self.files.clone();
            let built = tokio::task::spawn_blocking(move || files.build())
                .await
                .unwrap_or_else(|e| Err(format!("reading them failed: {e}")));
            match built {
                Ok(config) => {
                    *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
                    line(format_args!("{name}: TLS certificates reloaded, for new connections"));
                }
                Err(e) => {
                    refused();
                    line(format_args!("{name}: TLS certificates refused, the ones in force kept: {e}"));
                }
            }
        }
    }

    /// Whether a client's certificate chain (its own first) is valid for
    /// the client SAN (always, when none is set).
    pub fn client_allowed(&self, chain: Option<&[CertificateDer<'_>]>) -> bool {
        let Some(san) = &self.client_san else { return true };
        let Some(first) = chain.and_then(|c| c.first()) else { return false };
        let Ok(name) = rustls_pki_types::ServerName::try_from(san.as_str()) else { return false };
        webpki::EndEntityCert::try_from(first).is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
    }
}
