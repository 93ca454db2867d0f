//! Which Prometheus an object's metrics are read from, with which credentials, and whether it
//! may: the address allowlist and the consent of Secrets.
//!
//! Every `spec.metrics.prometheus` field is tenant input. So:
//!
//! - an address is fetched only if its origin (scheme, host, port) is the operator's
//!   `--prometheus-url`, one of its `--allowed-prometheus-address` flags, an address a matching
//!   BackpressurePolicy allows (`metricsAccess.prometheusAddresses`), or the address comes from
//!   a policy's defaults (platform input). Otherwise nothing is fetched, and the error says so
//!   without saying anything about the address (whether it answers is never learned);
//! - the Secret named by `secretRef` is sent only where the Secret consents (its annotation
//!   [`PROMETHEUS_ADDRESSES_ANNOTATION`] lists the address) or where the platform trusts the
//!   address with credentials (the operator's own addresses, a policy entry with
//!   `credentials: true`, or address and `secretRef` both from policy defaults);
//! - the operator's own credentials for `--prometheus-url` come from files (or from userinfo in
//!   the URL, which is split off at startup and never shown).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backpressure_api::v1alpha1::PROMETHEUS_ADDRESSES_ANNOTATION;
use backpressure_core::resolve::EffectiveMetrics;
use backpressure_core::tenancy::address::{self, Origin};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::observe::MetricsError;
use crate::observe::prometheus::PromAuth;

/// How long a credentials file is trusted before it is read again (a mounted Secret rotates).
const REREAD_AFTER: Duration = Duration::from_secs(30);

/// Where the operator's own credentials for `--prometheus-url` come from.
#[derive(Debug)]
pub enum DefaultAuth {
    /// None.
    None,
    /// Userinfo that was in `--prometheus-url` (split off, never shown).
    FromUrl(PromAuth),
    /// A file holding a bearer token (`--prometheus-bearer-token-file`).
    BearerFile(CredentialFile),
    /// A file holding `username:password` (`--prometheus-basic-auth-file`).
    BasicFile(CredentialFile),
}

/// A credentials file, read again at most every 30 s.
pub struct CredentialFile {
    path: PathBuf,
    cached: Mutex<Option<(Instant, String)>>,
}

impl std::fmt::Debug for CredentialFile {
    // The path, never the content.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl CredentialFile {
    /// The file at `path` (read on first use).
    pub fn new(path: PathBuf) -> Self {
        CredentialFile {
            path,
            cached: Mutex::new(None),
        }
    }

    async fn read(&self) -> Result<String, MetricsError> {
        {
            let cached = match self.cached.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            if let Some((at, text)) = cached.as_ref()
                && at.elapsed() < REREAD_AFTER
            {
                return Ok(text.clone());
            }
        }
        let text = tokio::fs::read_to_string(&self.path)
            .await
            .map_err(|e| MetricsError::CredentialsFile(self.path.display().to_string(), e.kind()))?
            .trim()
            .to_owned();
        let mut cached = match self.cached.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *cached = Some((Instant::now(), text.clone()));
        Ok(text)
    }
}

/// The operator's settings for reaching Prometheus.
#[derive(Debug)]
pub struct PrometheusAccess {
    /// `--prometheus-url` without credentials.
    pub default_address: Option<String>,
    /// The operator's credentials for it.
    pub default_auth: DefaultAuth,
    /// `--allowed-prometheus-address`: platform-run Prometheus servers any object may name (and
    /// that may receive an object's `secretRef`).
    pub allowed: Vec<String>,
}

impl PrometheusAccess {
    /// From the command line: the credentials in `prometheus_url`, if any, are split off (used,
    /// never shown); a credentials file wins over them.
    pub fn new(
        prometheus_url: Option<&str>,
        allowed: Vec<String>,
        bearer_token_file: Option<PathBuf>,
        basic_auth_file: Option<PathBuf>,
    ) -> Self {
        let (default_address, url_auth) = match prometheus_url.map(address::split_credentials) {
            Some((clean, creds)) => (Some(clean), creds),
            None => (None, None),
        };
        let default_auth = match (bearer_token_file, basic_auth_file, url_auth) {
            (Some(path), _, _) => DefaultAuth::BearerFile(CredentialFile::new(path)),
            (None, Some(path), _) => DefaultAuth::BasicFile(CredentialFile::new(path)),
            (None, None, Some((username, password))) => {
                DefaultAuth::FromUrl(PromAuth::Basic { username, password })
            }
            (None, None, None) => DefaultAuth::None,
        };
        PrometheusAccess {
            default_address,
            default_auth,
            allowed,
        }
    }

    /// No Prometheus at all (tests of other parts).
    pub fn none() -> Self {
        PrometheusAccess::new(None, Vec::new(), None, None)
    }

    async fn default_credentials(&self) -> Result<PromAuth, MetricsError> {
        Ok(match &self.default_auth {
            DefaultAuth::None => PromAuth::None,
            DefaultAuth::FromUrl(auth) => auth.clone(),
            DefaultAuth::BearerFile(f) => PromAuth::Bearer(f.read().await?),
            DefaultAuth::BasicFile(f) => {
                let text = f.read().await?;
                let (username, password) = text.split_once(':').ok_or_else(|| {
                    MetricsError::CredentialsFile(
                        f.path.display().to_string(),
                        std::io::ErrorKind::InvalidData,
                    )
                })?;
                PromAuth::Basic {
                    username: username.to_owned(),
                    password: password.to_owned(),
                }
            }
        })
    }

    /// The operator's own addresses: `--prometheus-url` and `--allowed-prometheus-address`.
    fn own(&self) -> impl Iterator<Item = &str> {
        self.default_address
            .as_deref()
            .into_iter()
            .chain(self.allowed.iter().map(String::as_str))
    }
}

/// Where and how to query: the address (without credentials) and the credentials.
#[derive(Debug, Clone)]
pub struct Target {
    /// Base URL, credentials removed.
    pub address: String,
    /// Credentials to send.
    pub auth: PromAuth,
}

/// The Prometheus an object in `namespace` reads, with its credentials, or why it may not.
/// Nothing is fetched from the address here; a Secret is read only once the address is
/// allowed.
pub async fn target(
    client: &kube::Client,
    namespace: &str,
    metrics: &EffectiveMetrics,
    access: &PrometheusAccess,
) -> Result<Target, MetricsError> {
    let Some(written) = metrics.address.as_deref() else {
        // The operator's own Prometheus.
        let address = access
            .default_address
            .clone()
            .ok_or(MetricsError::NoAddress)?;
        let auth = match &metrics.secret_ref {
            Some(secret_ref) => read_secret(client, namespace, &secret_ref.name, None).await?,
            None => access.default_credentials().await?,
        };
        return Ok(Target { address, auth });
    };
    let (address, url_auth) = address::split_credentials(written);
    let policy_allowed = metrics.access.prometheus_addresses.iter();
    let allowed = metrics.address_from_policy
        || address::is_allowed(
            &address,
            access
                .own()
                .chain(policy_allowed.clone().map(|p| p.address.as_str())),
        );
    if !allowed {
        return Err(MetricsError::AddressNotAllowed {
            field: metrics_field(metrics.address_from_policy),
            address,
        });
    }
    let auth = match &metrics.secret_ref {
        Some(secret_ref) => {
            let trusted = (metrics.address_from_policy && metrics.secret_ref_from_policy)
                || address::is_allowed(
                    &address,
                    access.own().chain(
                        policy_allowed
                            .filter(|p| p.credentials)
                            .map(|p| p.address.as_str()),
                    ),
                );
            let consent = (!trusted).then_some(address.as_str());
            read_secret(client, namespace, &secret_ref.name, consent).await?
        }
        None => match url_auth {
            Some((username, password)) => PromAuth::Basic { username, password },
            None if access
                .default_address
                .as_deref()
                .is_some_and(|d| address::is_allowed(&address, [d])) =>
            {
                access.default_credentials().await?
            }
            None => PromAuth::None,
        },
    };
    Ok(Target { address, auth })
}

fn metrics_field(from_policy: bool) -> &'static str {
    if from_policy {
        "a BackpressurePolicy's spec.defaults.metrics.prometheus.address"
    } else {
        "spec.metrics.prometheus.address"
    }
}

/// Reads the Secret `name` (keys `token`, or `username` and `password`). With
/// `needs_consent_for`, the Secret must list that address in its
/// [`PROMETHEUS_ADDRESSES_ANNOTATION`]; otherwise its content is not used.
async fn read_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    needs_consent_for: Option<&str>,
) -> Result<PromAuth, MetricsError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = api
        .get(name)
        .await
        .map_err(|e| MetricsError::Secret(name.to_owned(), e.to_string()))?;
    if let Some(address) = needs_consent_for {
        let listed = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PROMETHEUS_ADDRESSES_ANNOTATION))
            .map(String::as_str)
            .unwrap_or_default();
        if !consents(listed, address) {
            return Err(MetricsError::SecretNotAllowed {
                secret: name.to_owned(),
                address: address.to_owned(),
            });
        }
    }
    let data = secret.data.unwrap_or_default();
    let get = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
    };
    if let Some(token) = get("token") {
        return Ok(PromAuth::Bearer(token));
    }
    match (get("username"), get("password")) {
        (Some(username), Some(password)) => Ok(PromAuth::Basic { username, password }),
        _ => Err(MetricsError::Secret(
            name.to_owned(),
            "expected key `token`, or keys `username` and `password`".into(),
        )),
    }
}

/// Whether the annotation value `listed` (URLs separated by commas or white space) names the
/// origin of `address`.
pub fn consents(listed: &str, address: &str) -> bool {
    address::is_allowed(
        address,
        listed
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty()),
    )
}

/// The origin of `address` for messages (never its credentials, path or query).
pub fn origin_of(address: &str) -> String {
    Origin::parse(address)
        .map(|o| o.to_string())
        .unwrap_or_else(|_| address::UNPARSABLE.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_consents_by_listing_origins() {
        let listed = "https://thanos.monitoring:9090, http://127.0.0.1:9090\nhttp://x";
        assert!(consents(listed, "https://thanos.monitoring:9090/api"));
        assert!(consents(listed, "http://127.0.0.1:9090"));
        assert!(consents(listed, "http://x:80"));
        assert!(!consents(listed, "http://127.0.0.1:9091"));
        assert!(!consents(listed, "http://127.0.0.1.evil:9090"));
        assert!(!consents("", "http://x"));
    }

    #[test]
    fn credentials_in_the_url_are_split_off_and_files_win() {
        let a = PrometheusAccess::new(
            Some("http://user:secretpass@127.0.0.1:9090"),
            vec![],
            None,
            None,
        );
        assert_eq!(a.default_address.as_deref(), Some("http://127.0.0.1:9090/"));
        assert!(matches!(
            &a.default_auth,
            DefaultAuth::FromUrl(PromAuth::Basic { username, password })
                if username == "user" && password == "secretpass"
        ));
        assert!(!format!("{a:?}").contains("secretpass"));
        let a = PrometheusAccess::new(
            Some("http://user:secretpass@127.0.0.1:9090"),
            vec![],
            Some("/t".into()),
            None,
        );
        assert!(matches!(a.default_auth, DefaultAuth::BearerFile(_)));
    }

    #[tokio::test]
    async fn credential_files_are_read_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok-secret\n").unwrap();
        let basic = dir.path().join("auth");
        std::fs::write(&basic, "me:pw-secret").unwrap();
        let a = PrometheusAccess::new(Some("http://p:9090"), vec![], Some(token), None);
        assert_eq!(
            a.default_credentials().await.unwrap(),
            PromAuth::Bearer("tok-secret".into())
        );
        assert!(!format!("{a:?}").contains("tok-secret"));
        let a = PrometheusAccess::new(Some("http://p:9090"), vec![], None, Some(basic));
        assert_eq!(
            a.default_credentials().await.unwrap(),
            PromAuth::Basic {
                username: "me".into(),
                password: "pw-secret".into()
            }
        );
        assert!(!format!("{a:?}").contains("pw-secret"));
        let missing = PrometheusAccess::new(None, vec![], Some(dir.path().join("nope")), None);
        assert!(matches!(
            missing.default_credentials().await,
            Err(MetricsError::CredentialsFile(..))
        ));
    }
}
