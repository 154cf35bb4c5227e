//! TLS for the test servers: a CA, a server certificate (for `localhost`
//! and `127.0.0.1`) and a client certificate, made by rcgen in the
//! server's temp dir when it starts. No key is ever committed.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// The PEM files of one server's TLS: its CA, its own certificate and key,
/// and a client certificate and key (signed by the same CA) for mTLS.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The CA that signed the server's and the client's certificates.
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// How a server speaks TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tls {
    /// TLS only (`--port 0 --tls-port P`); clients show no certificate.
    Server,
    /// TLS only, and every client must show a certificate signed by the
    /// CA (`--tls-auth-clients yes`).
    Mutual,
}

impl TlsFiles {
    /// A new CA and the certificates it signs, written to `dir`.
    pub fn create(dir: &Path) -> TlsFiles {
        let ca = CertifiedIssuer::self_signed(ca_params("redis-rl test CA"), KeyPair::generate().expect("CA key"))
            .expect("sign the CA");
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            path
        };
        let leaf = |name: &str, usage: Vec<ExtendedKeyUsagePurpose>| {
            let key = KeyPair::generate().expect("key");
            let mut params =
                CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("names");
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = usage;
            let cert = params.signed_by(&key, &ca).expect("sign a certificate");
            (write(&format!("{name}.crt"), &cert.pem()), write(&format!("{name}.key"), &key.serialize_pem()))
        };
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        // A node is a client too: of the other nodes' cluster buses and of
        // its primary's replication link.
        let (server_cert, server_key) = leaf("server", vec![ServerAuth, ClientAuth]);
        let (client_cert, client_key) = leaf("client", vec![ClientAuth]);
        TlsFiles { ca: write("ca.crt", &ca.pem()), server_cert, server_key, client_cert, client_key }
    }

    /// redis-server's arguments for TLS only on `port`.
    pub(crate) fn server_args(&self, port: u16, tls: Tls) -> Vec<String> {
        let path = |p: &PathBuf| p.display().to_string();
        let auth = if tls == Tls::Mutual { "yes" } else { "no" };
        [
            ("--port", "0".to_string()),
            ("--tls-port", port.to_string()),
            ("--tls-cert-file", path(&self.server_cert)),
            ("--tls-key-file", path(&self.server_key)),
            ("--tls-ca-cert-file", path(&self.ca)),
            ("--tls-auth-clients", auth.to_string()),
            // Cluster buses and replication links over TLS too.
            ("--tls-cluster", "yes".to_string()),
            ("--tls-replication", "yes".to_string()),
        ]
        .into_iter()
        .flat_map(|(name, value)| [name.to_string(), value])
        .collect()
    }

    /// redis-cli's arguments to reach such a server (with the client certificate).
    pub fn cli_args(&self) -> Vec<String> {
        let path = |p: &PathBuf| p.display().to_string();
        vec![
            "--tls".into(),
            "--cacert".into(),
            path(&self.ca),
            "--cert".into(),
            path(&self.client_cert),
            "--key".into(),
            path(&self.client_key),
        ]
    }

    /// The CA and the client certificate, as redis-rs takes them.
    pub fn certificates(&self) -> redis::TlsCertificates {
        let read = |p: &PathBuf| std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(&self.client_cert),
                client_key: read(&self.client_key),
            }),
            root_cert: Some(read(&self.ca)),
        }
    }

    /// A redis-rs client for `url` (`rediss://`) trusting the CA and
    /// showing the client certificate: testkit's own connections.
    pub fn client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        // redis-rs builds its rustls configs with the process's provider
        // (ring: rustls deprecates it for lacking post-quantum groups).
        #[allow(deprecated)]
        let _ = rustls::crypto::ring::default_provider().install_default();
        redis::Client::build_with_tls(url, self.certificates())
    }
}

/// A CA of its own in `dir` (as `name`), which signed nothing a test
/// server shows: to see a server refused for a CA that does not vouch
/// for it.
pub fn unrelated_ca(dir: &Path, name: &str) -> PathBuf {
    let ca = CertifiedIssuer::self_signed(ca_params("unrelated CA"), KeyPair::generate().expect("CA key"))
        .expect("sign the CA");
    let path = dir.join(name);
    std::fs::write(&path, ca.pem()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}
