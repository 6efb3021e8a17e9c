//! The two gRPC servers the kubelet talks to, on unix sockets: the registration service (in
//! the kubelet's `plugins_registry` directory, where the kubelet finds the plugin) and the DRA
//! service (v1 and v1beta1 on one socket; the kubelet picks the newest both sides know).

use crate::driver::{ClaimRef, Driver};
use crate::error::Error;
use crate::proto::{registration, v1, v1beta1};
use std::path::Path;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The plugin type a DRA driver registers as.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The services served, as the registration names them: the DRA service (newest first) and
/// the optional device-health service (`health.rs`). A kubelet picks the DRA version both
/// know and ignores names it does not know.
pub const SUPPORTED_VERSIONS: [&str; 4] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    crate::health::SERVICES[0],
    crate::health::SERVICES[1],
];

/// The registration service.
pub struct Registration {
    /// Driver name.
    pub driver: String,
    /// The DRA socket's path.
    pub endpoint: String,
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(registration::PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            eprintln!(
                "gpuslice-dra: registered with the kubelet as {}",
                self.driver
            );
        } else {
            eprintln!(
                "gpuslice-dra: the kubelet refused the registration: {} (is the kubelet's DRA \
                 version one of {SUPPORTED_VERSIONS:?}?)",
                s.error
            );
        }
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

/// The DRA service (v1; v1beta1 converts to it).
#[derive(Clone)]
pub struct Dra(pub Arc<Driver>);

fn refs(claims: Vec<v1::Claim>) -> Vec<ClaimRef> {
    claims
        .into_iter()
        .map(|c| ClaimRef {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

impl Dra {
    async fn prepare(
        &self,
        req: v1::NodePrepareResourcesRequest,
    ) -> v1::NodePrepareResourcesResponse {
        let claims = refs(req.claims);
        let results = self.0.prepare(&claims).await;
        let mut out = v1::NodePrepareResourcesResponse::default();
        for (c, r) in claims.into_iter().zip(results) {
            let entry = match r {
                Ok(devices) => v1::NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|d| v1::Device {
                            request_names: d.request_names,
                            pool_name: d.pool_name,
                            device_name: d.device_name,
                            cdi_device_ids: d.cdi_device_ids,
                        })
                        .collect(),
                    error: String::new(),
                },
                Err(e) => v1::NodePrepareResourceResponse {
                    devices: vec![],
                    error: e.to_string(),
                },
            };
            out.claims.insert(c.uid, entry);
        }
        out
    }

    async fn unprepare(
        &self,
        req: v1::NodeUnprepareResourcesRequest,
    ) -> v1::NodeUnprepareResourcesResponse {
        let claims = refs(req.claims);
        let results = self.0.unprepare(&claims).await;
        let mut out = v1::NodeUnprepareResourcesResponse::default();
        for (c, r) in claims.into_iter().zip(results) {
            out.claims.insert(
                c.uid,
                v1::NodeUnprepareResourceResponse {
                    error: r.err().map(|e| e.to_string()).unwrap_or_default(),
                },
            );
        }
        out
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for Dra {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        Ok(Response::new(self.prepare(req.into_inner()).await))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(self.unprepare(req.into_inner()).await))
    }
}

/// v1beta1 and v1 messages are the same on the wire (same fields, names and numbers): convert
/// by re-decoding.
fn convert<A: prost::Message, B: prost::Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("converting between DRA v1beta1 and v1: {e}")))
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for Dra {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let r = self.prepare(convert(req.get_ref())?).await;
        Ok(Response::new(convert(&r)?))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let r = self.unprepare(convert(req.get_ref())?).await;
        Ok(Response::new(convert(&r)?))
    }
}

/// Bind a unix socket at `path`, replacing a stale one (a previous plugin's).
pub fn bind(path: &Path) -> Result<tokio::net::UnixListener, Error> {
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { what, path, source }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("removing the old socket", path)(e)),
    }
    tokio::net::UnixListener::bind(path).map_err(io("listening on", path))
}

/// The connections of `listener`, each with its `:authority` made valid: the kubelet's plugin
/// watcher sends the socket's path there, which h2 refuses (`authority.rs`).
fn incoming(
    listener: tokio::net::UnixListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<crate::authority::Authority<tokio::net::UnixStream>>>
{
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::UnixListenerStream::new(listener)
        .map(|c| c.map(crate::authority::Authority::new))
}

/// Serve the DRA service on `listener` until the process ends.
pub async fn serve_dra(
    driver: Arc<Driver>,
    listener: tokio::net::UnixListener,
) -> Result<(), Error> {
    let health = crate::health::Health {
        pool: driver.config().node_name.clone(),
        gpus: driver.health(),
    };
    let dra = Dra(driver);
    use crate::proto::{health_v1, health_v1alpha1};
    tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(dra.clone()))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(dra))
        .add_service(
            health_v1::dra_resource_health_server::DraResourceHealthServer::new(health.clone()),
        )
        .add_service(
            health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(health),
        )
        .serve_with_incoming(incoming(listener))
        .await
        .map_err(|source| Error::Serve {
            what: "the DRA service",
            source,
        })
}

/// Serve the registration service on `listener` until the process ends.
pub async fn serve_registration(
    reg: Registration,
    listener: tokio::net::UnixListener,
) -> Result<(), Error> {
    tonic::transport::Server::builder()
        .add_service(registration::registration_server::RegistrationServer::new(
            reg,
        ))
        .serve_with_incoming(incoming(listener))
        .await
        .map_err(|source| Error::Serve {
            what: "the registration service",
            source,
        })
}
