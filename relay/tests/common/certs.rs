//! Certificates made in the test (rcgen), never committed: a CA and the
//! leaves it signed, each as NAME.crt and NAME.key beside ca.crt.
#![allow(dead_code)]

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA named `ca_name` in `dir` (ca.crt), and for each `(name, sans)` a
/// certificate it signed for those names.
pub fn certificates(dir: &Path, ca_name: &str, leaves: &[(&str, &[&str])]) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    for (name, sans) in leaves {
        let key = KeyPair::generate().unwrap();
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let cert = CertificateParams::new(sans).unwrap().signed_by(&key, &ca).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

/// A file of `dir`, as text.
pub fn pem(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap()
}
