//! Real ServiceAccount tokens from the TokenRequest API.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

use super::SuiteError;

/// A ServiceAccount, written `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl fmt::Display for ServiceAccountRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl FromStr for ServiceAccountRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ServiceAccountRef {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("{s:?} is not namespace/name")),
        }
    }
}

/// Mints tokens for two identities: the operator's, which the worker must accept, and another
/// one, which it must refuse with 403.
#[derive(Clone)]
pub struct KubeTokens {
    client: kube::Client,
    /// The identity the worker accepts pushes from.
    pub operator: ServiceAccountRef,
    /// An identity it must refuse.
    pub other: ServiceAccountRef,
}

impl fmt::Debug for KubeTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeTokens")
            .field("operator", &self.operator)
            .field("other", &self.other)
            .finish_non_exhaustive()
    }
}

impl KubeTokens {
    /// Tokens minted through `client` (it needs `create` on `serviceaccounts/token` for both).
    pub fn new(
        client: kube::Client,
        operator: ServiceAccountRef,
        other: ServiceAccountRef,
    ) -> Self {
        KubeTokens {
            client,
            operator,
            other,
        }
    }

    /// A token of `who` for `audience`, valid for ten minutes (the API's minimum).
    pub async fn mint(
        &self,
        who: &ServiceAccountRef,
        audience: &str,
    ) -> Result<String, SuiteError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &who.namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.to_owned()],
                expiration_seconds: Some(600),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        let answer = api
            .create_token_request(&who.name, &PostParams::default(), &request)
            .await
            .map_err(|source| SuiteError::Token {
                who: who.to_string(),
                source,
            })?;
        answer
            .status
            .map(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| SuiteError::EmptyToken(who.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_refs_parse_namespace_slash_name_only() {
        let r: ServiceAccountRef = "bp-system/backpressure-operator".parse().unwrap();
        assert_eq!(r.namespace, "bp-system");
        assert_eq!(r.name, "backpressure-operator");
        assert_eq!(r.to_string(), "bp-system/backpressure-operator");
        for bad in ["", "x", "/x", "x/", "a/b/c"] {
            assert!(bad.parse::<ServiceAccountRef>().is_err(), "{bad}");
        }
    }
}
