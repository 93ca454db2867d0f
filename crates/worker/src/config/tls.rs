//! HTTPS on the admin port (cargo feature `tls`, on by default).
//!
//! The worker serves its admin port over TLS from a certificate and key mounted from a Secret
//! (PEM files, as cert-manager writes them: `tls.crt`, `tls.key`), and the pod declares it
//! with the annotation `backpressure.dev/admin-scheme: https`
//! ([`ADMIN_SCHEME_ANNOTATION`](backpressure_api::wire::ADMIN_SCHEME_ANNOTATION)). The operator
//! connects to the pod IP, verifies the certificate against its own CA bundle
//! (`--push-ca-file`) and the name
//! [`admin_server_name`](backpressure_api::wire::admin_server_name)`(namespace, workload)` =
//! `<workload>.<namespace>.svc`, which the certificate must carry as a DNS subjectAltName. One
//! certificate therefore serves every pod of the workload, and a pod of another workload or
//! namespace (with its own certificate from the same issuer) cannot pose as this one.
//!
//! [`CertFiles`] re-reads the files when they change (checked at most every
//! [`RELOAD_CHECK`]), so a certificate renewed by cert-manager is picked up without a restart;
//! a renewed pair that does not load is reported and the previous one kept.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// How often the certificate files are checked for a change.
pub const RELOAD_CHECK: Duration = Duration::from_secs(10);

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the key or the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let file_err = |path: &Path, reason: String| TlsError::File {
        path: path.to_owned(),
        reason,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_err(cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file_err(cert, "no certificate in the file".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| file_err(key, e.to_string()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key_der)?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

struct Loaded {
    checked: Instant,
    stamp: (Option<SystemTime>, Option<SystemTime>),
    key: Arc<CertifiedKey>,
}

/// A certificate and key from PEM files, reloaded when they change.
pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<Loaded>,
}

impl fmt::Debug for CertFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl CertFiles {
    /// Loads `cert` (the chain, leaf first) and `key` (PKCS#8, PKCS#1 or SEC1).
    pub fn load(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Result<Self, TlsError> {
        let (cert, key) = (cert.into(), key.into());
        let stamp = (modified(&cert), modified(&key));
        let certified = load(&cert, &key)?;
        Ok(CertFiles {
            loaded: Mutex::new(Loaded {
                checked: Instant::now(),
                stamp,
                key: certified,
            }),
            cert,
            key,
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.checked.elapsed() >= RELOAD_CHECK {
            loaded.checked = Instant::now();
            let stamp = (modified(&self.cert), modified(&self.key));
            if stamp != loaded.stamp {
                match load(&self.cert, &self.key) {
                    Ok(k) => {
                        tracing::info!(cert = %self.cert.display(), "admin TLS certificate reloaded");
                        loaded.key = k;
                        loaded.stamp = stamp;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "admin TLS certificate changed but does not load; keeping the previous one");
                    }
                }
            }
        }
        loaded.key.clone()
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A TLS server configuration (TLS 1.2 and 1.3, HTTP/1.1, no client certificates) serving the
/// certificate of `files`.
pub fn server_config(files: CertFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(files));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use backpressure_api::wire::WorkerConfig;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::config::ConfigState;
    use crate::config::admin::Admin;
    use crate::permits::Gate;

    /// A CA and a certificate for `name` signed by it, as PEM: (ca, cert, key).
    fn issue(name: &str) -> (String, String, String) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (ca.pem(), cert.pem(), key.serialize_pem())
    }

    async fn get_healthz(
        addr: std::net::SocketAddr,
        ca_pem: &str,
        name: &str,
    ) -> Result<String, String> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let server = ServerName::try_from(name.to_owned()).unwrap();
        let mut tls = connector
            .connect(server, tcp)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out).await;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    #[tokio::test]
    async fn the_admin_port_serves_https_with_the_mounted_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = issue("w.shop.svc");
        std::fs::write(dir.path().join("tls.crt"), &cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), &key).unwrap();
        let files =
            CertFiles::load(dir.path().join("tls.crt"), dir.path().join("tls.key")).unwrap();
        let config = server_config(files).unwrap();
        let state = ConfigState::new(
            Gate::new(crate::controller::from_config(&WorkerConfig::default(), 1)),
            WorkerConfig::default(),
            None,
        );
        let admin = Arc::new(Admin::new(state, None));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(admin.serve_tls(listener, config, std::future::pending()));

        let ok = get_healthz(addr, &ca, "w.shop.svc").await.unwrap();
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        // Another name (another workload's), or another CA: the client refuses the server.
        let e = get_healthz(addr, &ca, "w.other.svc").await.unwrap_err();
        assert!(e.contains("NotValidForName") || e.contains("name"), "{e}");
        let (other_ca, _, _) = issue("w.shop.svc");
        assert!(get_healthz(addr, &other_ca, "w.shop.svc").await.is_err());
        // Plain HTTP gets no HTTP answer.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        assert!(!String::from_utf8_lossy(&out).contains("200"));
    }

    #[test]
    fn unreadable_or_mismatched_files_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let (_, cert, key) = issue("w.shop.svc");
        let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let e = CertFiles::load(&c, &k).unwrap_err().to_string();
        assert!(e.contains("tls.crt"), "{e}");
        std::fs::write(&c, &cert).unwrap();
        std::fs::write(&k, "not a key").unwrap();
        let e = CertFiles::load(&c, &k).unwrap_err().to_string();
        assert!(e.contains("tls.key"), "{e}");
        std::fs::write(&k, &key).unwrap();
        std::fs::write(&c, "").unwrap();
        let e = CertFiles::load(&c, &k).unwrap_err().to_string();
        assert!(e.contains("no certificate"), "{e}");
    }
}
