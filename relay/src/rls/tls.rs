//! The RLS front's TLS (envoyproxy/ratelimit's GRPC_SERVER_USE_TLS):
//! the server's certificate and key, and with a client CA mutual TLS, a
//! client without a certificate that CA signed refused at the handshake;
//! with a client SAN (GRPC_CLIENT_TLS_SAN) a client certificate not valid
//! for that DNS name is answered UNAUTHENTICATED on every call, counted
//! (`rl_relay_rls_san_refused_total`) and logged, as upstream checks it
//! (`VerifyOptions.DNSName`). The files are read at start (a restart
//! rotates them).

use std::fmt;
use std::path::Path;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// The largest certificate or key file read.
const MAX_PEM_BYTES: usize = 1 << 20;

/// What the front's TLS is made of, read at start.
#[derive(Clone)]
pub struct Tls {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
    /// The DNS name a client certificate must be valid for.
    pub client_san: Option<String>,
}

/// Never the key.
impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("mutual", &self.client_ca.is_some())
            .field("client_san", &self.client_san)
            .finish_non_exhaustive()
    }
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    let text = crate::files::read_bounded(path, MAX_PEM_BYTES, "a PEM file (1 MiB)")
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if !text.contains("-----BEGIN ") {
        return Err(format!("{flag} {}: holds no PEM block", path.display()));
    }
    Ok(text.into_bytes())
}

impl Tls {
    /// Reads the files; the configuration is checked as tonic builds it
    /// ([`Tls::server_config`], at start).
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>, client_san: Option<String>) -> Result<Tls, String> {
        if client_san.is_some() && client_ca.is_none() {
            return Err(
                "--rls-tls-client-san needs --rls-tls-client-ca: without a client CA no client certificate is \
                        asked for"
                    .into(),
            );
        }
        if let Some(san) = &client_san {
            rustls_pki_types::DnsName::try_from(san.as_str())
                .map_err(|_| format!("--rls-tls-client-san {san}: not a DNS name"))?;
        }
        Ok(Tls {
            cert: read("--rls-tls-cert", cert)?,
            key: read("--rls-tls-key", key)?,
            client_ca: client_ca.map(|p| read("--rls-tls-client-ca", p)).transpose()?,
            client_san,
        })
    }

    /// tonic's server TLS: the identity, and with a client CA, client
    /// certificates required and verified against it.
    pub fn server_config(&self) -> ServerTlsConfig {
        let config = ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .timeout(super::serve::HANDSHAKE_TIMEOUT);
        match &self.client_ca {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }

    /// Whether a client's certificate chain (its own first) is valid for
    /// the client SAN (always, when none is set).
    pub fn client_allowed(&self, chain: Option<&[rustls_pki_types::CertificateDer<'static>]>) -> bool {
        let Some(san) = &self.client_san else { return true };
        let Some(first) = chain.and_then(|c| c.first()) else { return false };
        let Ok(name) = rustls_pki_types::ServerName::try_from(san.as_str()) else { return false };
        webpki::EndEntityCert::try_from(first).is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
    }
}
