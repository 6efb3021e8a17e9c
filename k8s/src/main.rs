//! `gpuslice-dra`: see the library's documentation and `docs/kubernetes.md`.

use gpuslice_dra::claims::{ApiClaims, ClaimSource, DirClaims};
use gpuslice_dra::config::{ClaimsFrom, Config, ConfigError, PublishTo, HELP, USAGE};
use gpuslice_dra::driver::Driver;
use gpuslice_dra::publish::{self, Sink};
use gpuslice_dra::server;
use std::sync::Arc;

fn main() {
    let cfg = match Config::parse(std::env::args_os().skip(1).collect()) {
        Ok(c) => c,
        Err(ConfigError::Help) => {
            println!("usage: {USAGE}\n\n{HELP}");
            return;
        }
        Err(ConfigError::Usage(m)) => {
            eprintln!("gpuslice-dra: {m}\nusage: {USAGE}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuslice-dra: starting the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(cfg)) {
        eprintln!("gpuslice-dra: {e}");
        std::process::exit(1);
    }
}

async fn run(cfg: Config) -> Result<(), String> {
    let needs_api = cfg.claims == ClaimsFrom::Api || cfg.publish == PublishTo::Api;
    let client = if needs_api {
        Some(kube::Client::try_default().await.map_err(|e| {
            format!("connecting to the API server (in-cluster service account or KUBECONFIG): {e}")
        })?)
    } else {
        None
    };
    let claims: Box<dyn ClaimSource> = match &cfg.claims {
        ClaimsFrom::Api => Box::new(ApiClaims(client.clone().expect("client made above"))),
        ClaimsFrom::Dir(d) => Box::new(DirClaims(d.clone())),
    };
    let sink = match &cfg.publish {
        PublishTo::Api => Sink::Api(client.clone().expect("client made above")),
        PublishTo::File(p) => Sink::File(p.clone()),
    };
    let driver = Arc::new(Driver::new(cfg.clone(), claims)?);
    // The DRA socket first: the kubelet connects to it as soon as registration succeeds.
    let dra = server::bind(&cfg.dra_socket())?;
    let reg = server::bind(&cfg.registration_socket())?;
    eprintln!(
        "gpuslice-dra: driver {} on node {}: DRA service on {}, registration on {}",
        cfg.driver,
        cfg.node_name,
        cfg.dra_socket().display(),
        cfg.registration_socket().display()
    );
    let registration = server::Registration {
        driver: cfg.driver.clone(),
        endpoint: cfg.dra_socket().to_string_lossy().into_owned(),
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    let (result, signalled) = tokio::select! {
        r = server::serve_dra(driver.clone(), dra) => (r, false),
        r = server::serve_registration(registration, reg) => (r, false),
        () = publish::run(driver.clone(), sink.clone()) => (Ok(()), false),
        _ = term.recv() => (Ok(()), true),
        _ = tokio::signal::ctrl_c() => (Ok(()), true),
    };
    // The registration socket goes first, so the kubelet stops calling; prepared claims stay
    // prepared (their slices and CDI specs are on disk) for the next plugin.
    let _ = std::fs::remove_file(cfg.registration_socket());
    let _ = std::fs::remove_file(cfg.dra_socket());
    // A clean stop (SIGTERM: the DaemonSet deleted, or its pod replaced) takes the node's
    // devices off the scheduler's list: no claim is placed on a node whose plugin is gone. The
    // next plugin publishes them again. (The kubelet would also delete the slice, 30 s after
    // the plugin unregistered; a plugin killed without a clean stop leaves that to it.)
    if signalled && !cfg.keep_slice_on_exit {
        let name = gpuslice_dra::slice::object_name(&cfg.node_name, &cfg.driver);
        match tokio::time::timeout(std::time::Duration::from_secs(10), sink.delete(&name)).await {
            Ok(Ok(())) => eprintln!("gpuslice-dra: deleted ResourceSlice {name}"),
            Ok(Err(e)) => eprintln!("gpuslice-dra: {e}"),
            Err(_) => eprintln!("gpuslice-dra: deleting ResourceSlice {name}: no answer in 10 s"),
        }
    }
    result
}
