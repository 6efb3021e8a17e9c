//! Where the plugin reads a ResourceClaim's allocation: the API server in a cluster, or a
//! directory of claim objects (tests and dry runs). The kubelet's prepare call names a claim
//! (namespace, name, UID) but not what was allocated; the claim's `status.allocation` says.

use k8s_openapi::api::resource::v1::ResourceClaim;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

/// A claim being read: a boxed future (the source is chosen at run time); `Err` is a message
/// for the cluster operator.
pub type ClaimFuture<'a> = Pin<Box<dyn Future<Output = Result<ResourceClaim, String>> + Send + 'a>>;

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
            api.get(name).await.map_err(|e| match &e {
                kube::Error::Api(s) if s.code == 404 => format!(
                    "ResourceClaim {namespace}/{name} not found in the API server (deleted?)"
                ),
                kube::Error::Api(s) if s.code == 403 => format!(
                    "reading ResourceClaim {namespace}/{name} is forbidden: the plugin's service \
                     account needs `get` on resourceclaims.resource.k8s.io (deploy/rbac.yaml): {}",
                    s.message
                ),
                _ => format!("reading ResourceClaim {namespace}/{name} from the API server: {e}"),
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
                return Err(format!("bad claim namespace/name {namespace:?}/{name:?}"));
            }
            let path = self.0.join(namespace).join(format!("{name}.json"));
            let text = tokio::fs::read_to_string(&path).await.map_err(|e| {
                format!("ResourceClaim {namespace}/{name}: {}: {e}", path.display())
            })?;
            serde_json::from_str(&text)
                .map_err(|e| format!("ResourceClaim {namespace}/{name}: {}: {e}", path.display()))
        })
    }
}
