//! The TLS flags every binary of the tree that calls Redis takes, named
//! alike and read from the same environment as rl-client's
//! [`Tls::from_env`](rl_gateway::Tls::from_env) (`RL_TLS_*`): rlctl (and
//! `rlctl metrics`) and rl-balancer. rl-relay spells the same four.

use std::path::PathBuf;

use clap::Args;
use rl_gateway::Tls;

/// For `rediss://` URLs: whom to trust and the client certificate to show.
#[derive(Args, Clone, Debug, Default)]
pub struct TlsFlags {
    /// For rediss:// URLs: PEM file of the CA that signed Redis's
    /// certificates, trusted instead of the system roots (SSL_CERT_FILE).
    #[arg(long, env = "RL_TLS_CA_FILE", value_name = "FILE", global = true)]
    pub tls_ca_file: Option<PathBuf>,
    /// For rediss:// URLs: PEM file of the client certificate, for a Redis
    /// that requires one (tls-auth-clients yes); with --tls-key-file.
    #[arg(long, env = "RL_TLS_CERT_FILE", value_name = "FILE", global = true)]
    pub tls_cert_file: Option<PathBuf>,
    /// For rediss:// URLs: PEM file of the client certificate's key.
    #[arg(long, env = "RL_TLS_KEY_FILE", value_name = "FILE", global = true)]
    pub tls_key_file: Option<PathBuf>,
    /// For rediss:// URLs: accept any certificate Redis shows, unverified.
    /// Tests only: anyone on the path can read and change the calls.
    #[arg(long, env = "RL_TLS_INSECURE", global = true)]
    pub tls_insecure: bool,
}

impl TlsFlags {
    /// The settings rl-client takes.
    pub fn tls(&self) -> Tls {
        Tls {
            ca_file: self.tls_ca_file.clone(),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
            insecure: self.tls_insecure,
        }
    }
}
