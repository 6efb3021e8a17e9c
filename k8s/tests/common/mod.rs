//! What the plugin's test files share (each `tests/*.rs` is its own crate and includes this as
//! `mod common`).

use std::path::PathBuf;

/// A gRPC channel to the plugin's unix socket at `path`, as the kubelet opens one.
pub async fn channel(path: PathBuf) -> tonic::transport::Channel {
    tonic::transport::Endpoint::try_from("http://localhost")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connect to the plugin's socket")
}
