//! The certificates of a test control plane: a CA, the API server's serving certificate (IP SAN
//! 127.0.0.1), an admin client certificate in `system:masters`, and the ServiceAccount signing
//! key. Generated fresh for every control plane and never written outside its temp directory.
//!
//! For the aggregation layer (KEDA's metrics adapter behind `external.metrics.k8s.io`): a
//! front-proxy CA and the `front-proxy-client` certificate kube-apiserver presents to aggregated
//! servers, and KEDA's certificate directory (`ca.crt`, `tls.crt`, `tls.key`: one key pair
//! serving the adapter and the operator's gRPC metrics service on 127.0.0.1 and their Service
//! names, and used as the client of that gRPC service).

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
    /// `front-proxy-ca.crt`: kube-apiserver's `--requestheader-client-ca-file`.
    pub front_proxy_ca_file: PathBuf,
    /// `front-proxy-client.crt` (CN `front-proxy-client`).
    pub front_proxy_client_cert_file: PathBuf,
    /// `front-proxy-client.key`.
    pub front_proxy_client_key_file: PathBuf,
    /// `keda-certs/`: `ca.crt` (this CA), `tls.crt`, `tls.key`.
    pub keda_cert_dir: PathBuf,
    /// `ca.key`: the CA's key, for [`Pki::issue`] (a test node's kubelet certificates).
    pub ca_key_file: PathBuf,
}

/// A certificate issued by [`Pki::issue`] and the files it was written to.
#[derive(Debug, Clone)]
pub struct Issued {
    /// `<name>.crt`.
    pub cert_file: PathBuf,
    /// `<name>.key`.
    pub key_file: PathBuf,
    /// The certificate (PEM).
    pub cert_pem: String,
    /// The key (PKCS#8 PEM).
    pub key_pem: String,
}

/// The CA's parameters (its name and usages): the same for [`Pki::generate`] and [`Pki::issue`].
fn ca_params() -> Result<CertificateParams, Error> {
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| pki_err("CA params", e))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "backpressure-envtest-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

fn pki_err(what: &str, e: rcgen::Error) -> Error {
    Error::Pki(format!("{what}: {e}"))
}

impl Pki {
    /// Generates everything into `dir`.
    pub fn generate(dir: &Path) -> Result<Self, Error> {
        Self::generate_with(dir, &[])
    }

    /// [`Pki::generate`] with more IP addresses in the API server's certificate (a test node's
    /// bridge address, where the API server also listens).
    pub fn generate_with(dir: &Path, server_ips: &[std::net::IpAddr]) -> Result<Self, Error> {
        let ca_key = KeyPair::generate().map_err(|e| pki_err("CA key", e))?;
        let ca_params = ca_params()?;
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
        for ip in server_ips {
            server_params
                .subject_alt_names
                .push(SanType::IpAddress(*ip));
        }
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

        // The aggregation layer: a separate CA for the front proxy, as kubeadm does.
        let fp_ca_key = KeyPair::generate().map_err(|e| pki_err("front-proxy CA key", e))?;
        let mut fp_ca_params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| pki_err("front-proxy CA params", e))?;
        fp_ca_params
            .distinguished_name
            .push(DnType::CommonName, "backpressure-envtest-front-proxy-ca");
        fp_ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        fp_ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let fp_ca_cert = fp_ca_params
            .self_signed(&fp_ca_key)
            .map_err(|e| pki_err("front-proxy CA cert", e))?;
        let fp_issuer = Issuer::new(fp_ca_params, fp_ca_key);
        let fp_key = KeyPair::generate().map_err(|e| pki_err("front-proxy client key", e))?;
        let mut fp_params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| pki_err("front-proxy client params", e))?;
        fp_params
            .distinguished_name
            .push(DnType::CommonName, "front-proxy-client");
        fp_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let fp_cert = fp_params
            .signed_by(&fp_key, &fp_issuer)
            .map_err(|e| pki_err("front-proxy client cert", e))?;

        // KEDA: one pair for the adapter's serving port and both ends of the gRPC service.
        let keda_key = KeyPair::generate().map_err(|e| pki_err("KEDA key", e))?;
        let mut keda_params = CertificateParams::new(vec![
            "localhost".to_owned(),
            "keda-metrics-apiserver.keda.svc".to_owned(),
            "keda-operator.keda.svc".to_owned(),
            "keda-operator.keda.svc.cluster.local".to_owned(),
        ])
        .map_err(|e| pki_err("KEDA params", e))?;
        keda_params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::V4(
                std::net::Ipv4Addr::LOCALHOST,
            )));
        keda_params
            .distinguished_name
            .push(DnType::CommonName, "keda-operator");
        keda_params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let keda_cert = keda_params
            .signed_by(&keda_key, &issuer)
            .map_err(|e| pki_err("KEDA cert", e))?;

        let write = |name: &str, content: &str| -> Result<PathBuf, Error> {
            let p = dir.join(name);
            std::fs::write(&p, content)
                .map_err(|e| Error::io(format!("write {}", p.display()), e))?;
            Ok(p)
        };
        let admin_cert_pem = admin_cert.pem();
        let admin_key_pem = admin_key.serialize_pem();
        let keda_dir = dir.join("keda-certs");
        std::fs::create_dir_all(&keda_dir)
            .map_err(|e| Error::io(format!("create {}", keda_dir.display()), e))?;
        write("keda-certs/ca.crt", &ca_pem)?;
        write("keda-certs/tls.crt", &keda_cert.pem())?;
        write("keda-certs/tls.key", &keda_key.serialize_pem())?;
        Ok(Self {
            front_proxy_ca_file: write("front-proxy-ca.crt", &fp_ca_cert.pem())?,
            front_proxy_client_cert_file: write("front-proxy-client.crt", &fp_cert.pem())?,
            front_proxy_client_key_file: write("front-proxy-client.key", &fp_key.serialize_pem())?,
            keda_cert_dir: keda_dir,
            ca_file: write("ca.crt", &ca_pem)?,
            ca_key_file: write("ca.key", &issuer.key().serialize_pem())?,
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

    /// Issues a certificate signed by this CA, written to `<dir>/<name>.crt` and `.key`: a
    /// client certificate for `common_name` in `organizations`, and a serving one too when
    /// `server_ips` is not empty (with those IP SANs and `dns_names`).
    pub fn issue(
        &self,
        dir: &Path,
        name: &str,
        common_name: &str,
        organizations: &[&str],
        server_ips: &[std::net::IpAddr],
        dns_names: &[&str],
    ) -> Result<Issued, Error> {
        let ca_key_pem = std::fs::read_to_string(&self.ca_key_file)
            .map_err(|e| Error::io(format!("read {}", self.ca_key_file.display()), e))?;
        let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| pki_err("CA key", e))?;
        // The same name and key as the CA certificate: what an issued certificate refers to.
        let issuer = Issuer::new(ca_params()?, ca_key);
        let key = KeyPair::generate().map_err(|e| pki_err("key", e))?;
        let mut params = CertificateParams::new(
            dns_names
                .iter()
                .map(|d| (*d).to_owned())
                .collect::<Vec<_>>(),
        )
        .map_err(|e| pki_err("params", e))?;
        for ip in server_ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for org in organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if !server_ips.is_empty() {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|e| pki_err("cert", e))?;
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        let cert_file = dir.join(format!("{name}.crt"));
        let key_file = dir.join(format!("{name}.key"));
        for (path, text) in [(&cert_file, &cert_pem), (&key_file, &key_pem)] {
            std::fs::write(path, text)
                .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        }
        Ok(Issued {
            cert_file,
            key_file,
            cert_pem,
            key_pem,
        })
    }
}
