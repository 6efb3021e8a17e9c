//! Where the plugin reads a ResourceClaim's allocation: the API server in a cluster, or a
//! directory of claim objects (tests and dry runs). The kubelet's prepare call names a claim
//! (namespace, name, UID) but not what was allocated; the claim's `status.allocation` says.

use k8s_openapi::api::resource::v1::ResourceClaim;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

/// A claim being read: a boxed future (the source is chosen at run time).
pub type ClaimFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ResourceClaim, ClaimError>> + Send + 'a>>;

/// Why a claim could not be read, worded for the cluster operator.
#[derive(Debug)]
pub enum ClaimError {
    /// The API server has no such claim.
    NotFound {
        /// `namespace/name`.
        claim: String,
    },
    /// The plugin's service account may not read claims.
    Forbidden {
        /// `namespace/name`.
        claim: String,
        /// The API server's message.
        message: String,
    },
    /// Any other failure of the API server.
    Api {
        /// `namespace/name`.
        claim: String,
        /// Why.
        source: kube::Error,
    },
    /// A namespace or name that cannot be a file name (directory source).
    BadName {
        /// `namespace/name`.
        claim: String,
    },
    /// The claim's file could not be read (directory source).
    Read {
        /// `namespace/name`.
        claim: String,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The claim's file is not a ResourceClaim (directory source).
    Json {
        /// `namespace/name`.
        claim: String,
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
}

impl std::fmt::Display for ClaimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimError::NotFound { claim } => write!(
                f,
                "ResourceClaim {claim} not found in the API server (deleted?)"
            ),
            ClaimError::Forbidden { claim, message } => write!(
                f,
                "reading ResourceClaim {claim} is forbidden: the plugin's service account needs \
                 `get` on resourceclaims.resource.k8s.io (the chart's ClusterRole, \
                 deploy/helm/gpuslice/templates/rbac.yaml): {message}"
            ),
            ClaimError::Api { claim, source } => {
                write!(
                    f,
                    "reading ResourceClaim {claim} from the API server: {source}"
                )
            }
            ClaimError::BadName { claim } => write!(f, "bad claim namespace/name {claim}"),
            ClaimError::Read {
                claim,
                path,
                source,
            } => write!(f, "ResourceClaim {claim}: {}: {source}", path.display()),
            ClaimError::Json {
                claim,
                path,
                source,
            } => write!(f, "ResourceClaim {claim}: {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for ClaimError {}

/// Reads ResourceClaims.
pub trait ClaimSource: Send + Sync {
    /// The claim `namespace/name`.
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> ClaimFuture<'a>;
}

/// Claims from the API server.
pub struct ApiClaims(pub kube::Client);

impl ClaimSource for ApiClaims {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> ClaimFuture<'a> {
        Box::pin(async move {
            let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.0.clone(), namespace);
            let claim = format!("{namespace}/{name}");
            api.get(name).await.map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 => ClaimError::NotFound { claim },
                kube::Error::Api(s) if s.code == 403 => ClaimError::Forbidden {
                    claim,
                    message: s.message,
                },
                source => ClaimError::Api { claim, source },
            })
        })
    }
}

/// Claims from `DIR/<namespace>/<name>.json`.
pub struct DirClaims(pub PathBuf);

impl ClaimSource for DirClaims {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> ClaimFuture<'a> {
        Box::pin(async move {
            if [namespace, name]
                .iter()
                .any(|s| s.is_empty() || s.contains('/') || s.starts_with('.'))
            {
                return Err(ClaimError::BadName {
                    claim: format!("{namespace:?}/{name:?}"),
                });
            }
            let claim = format!("{namespace}/{name}");
            let path = self.0.join(namespace).join(format!("{name}.json"));
            let text = match tokio::fs::read_to_string(&path).await {
                Ok(t) => t,
                Err(source) => {
                    return Err(ClaimError::Read {
                        claim,
                        path,
                        source,
                    })
                }
            };
            serde_json::from_str(&text).map_err(|source| ClaimError::Json {
                claim,
                path,
                source,
            })
        })
    }
}
