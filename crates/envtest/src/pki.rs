//! The certificates of a test control plane: a CA, the API server's serving certificate (IP SAN
//! 127.0.0.1), an admin client certificate in `system:masters`, and the ServiceAccount signing
//! key. Generated fresh for every control plane and never written outside its temp directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::Error;

/// PEM material and the files it was written to.
#[derive(Debug, Clone)]
pub struct Pki {
    /// CA certificate (PEM).
    pub ca_pem: String,
    /// Admin client certificate (PEM).
    pub admin_cert_pem: String,
    /// Admin client key (PKCS#8 PEM).
    pub admin_key_pem: String,
    /// `ca.crt`.
    pub ca_file: PathBuf,
    /// `apiserver.crt`.
    pub server_cert_file: PathBuf,
    /// `apiserver.key`.
    pub server_key_file: PathBuf,
    /// `sa.key` (private, signs ServiceAccount tokens).
    pub sa_key_file: PathBuf,
    /// `sa.pub` (public, verifies them).
    pub sa_pub_file: PathBuf,
    /// `admin.crt`.
    pub admin_cert_file: PathBuf,
    /// `admin.key`.
    pub admin_key_file: PathBuf,
}

fn pki_err(what: &str, e: rcgen::Error) -> Error {
    Error::Pki(format!("{what}: {e}"))
}

impl Pki {
    /// Generates everything into `dir`.
    pub fn generate(dir: &Path) -> Result<Self, Error> {
        let ca_key = KeyPair::generate().map_err(|e| pki_err("CA key", e))?;
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| pki_err("CA params", e))?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "backpressure-envtest-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .map_err(|e| pki_err("CA cert", e))?;
        let ca_pem = ca_cert.pem();
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().map_err(|e| pki_err("server key", e))?;
        let mut server_params = CertificateParams::new(vec![
            "localhost".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ])
        .map_err(|e| pki_err("server params", e))?;
        server_params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::V4(
                std::net::Ipv4Addr::LOCALHOST,
            )));
        server_params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::V4(
                std::net::Ipv4Addr::new(10, 0, 0, 1),
            )));
        server_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server_params
            .signed_by(&server_key, &issuer)
            .map_err(|e| pki_err("server cert", e))?;

        let admin_key = KeyPair::generate().map_err(|e| pki_err("admin key", e))?;
        let mut admin_params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| pki_err("admin params", e))?;
        admin_params
            .distinguished_name
            .push(DnType::CommonName, "admin");
        admin_params
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin_params
            .signed_by(&admin_key, &issuer)
            .map_err(|e| pki_err("admin cert", e))?;

        let sa_key = KeyPair::generate().map_err(|e| pki_err("service account key", e))?;

        let write = |name: &str, content: &str| -> Result<PathBuf, Error> {
            let p = dir.join(name);
            std::fs::write(&p, content)
                .map_err(|e| Error::io(format!("write {}", p.display()), e))?;
            Ok(p)
        };
        let admin_cert_pem = admin_cert.pem();
        let admin_key_pem = admin_key.serialize_pem();
        Ok(Self {
            ca_file: write("ca.crt", &ca_pem)?,
            server_cert_file: write("apiserver.crt", &server_cert.pem())?,
            server_key_file: write("apiserver.key", &server_key.serialize_pem())?,
            sa_key_file: write("sa.key", &sa_key.serialize_pem())?,
            sa_pub_file: write("sa.pub", &sa_key.public_key_pem())?,
            admin_cert_file: write("admin.crt", &admin_cert_pem)?,
            admin_key_file: write("admin.key", &admin_key_pem)?,
            ca_pem,
            admin_cert_pem,
            admin_key_pem,
        })
    }
}
