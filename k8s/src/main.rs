//! `gpuslice-dra`: see the library's documentation and `docs/kubernetes.md`.

use gpuslice_dra::claims::{ApiClaims, ClaimSource, DirClaims};
use gpuslice_dra::config::{
    ClaimsFrom, Cleanup, Config, ConfigError, PublishTo, CLEANUP_HELP, CLEANUP_USAGE, HELP, USAGE,
};
use gpuslice_dra::driver::Driver;
use gpuslice_dra::error::Error;
use gpuslice_dra::publish::{self, Sink};
use gpuslice_dra::{resource_slice, server};
use std::sync::Arc;

fn main() {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == "cleanup") {
        args.remove(0);
        let c = match Cleanup::parse(args) {
            Ok(c) => c,
            Err(e) => exit_usage(e, CLEANUP_USAGE, CLEANUP_HELP),
        };
        block_on(cleanup(c));
        return;
    }
    let print = args.first().is_some_and(|a| a == "slice");
    if print {
        args.remove(0);
    }
    let cfg = match Config::parse(args) {
        Ok(c) => c,
        Err(e) => exit_usage(e, USAGE, HELP),
    };
    if print {
        if let Err(e) = print_slice(&cfg) {
            eprintln!("gpuslice-dra: {e}");
            std::process::exit(1);
        }
        return;
    }
    block_on(run(cfg));
}

/// `gpuslice-dra slice [FLAGS]`: the ResourceSlice the plugin would publish now, as JSON on
/// stdout (for `kubectl apply --dry-run=server --validate=strict -f -`), from NVML and the
/// ledger's reservations, read only; the GPUs left out are named on stderr.
fn print_slice(cfg: &Config) -> Result<(), Error> {
    let inv = gpuslice_dra::nvml::Nvml::load()?.inventory()?;
    let snap = match gpuslice_ledger::Ledger::open(&cfg.runtime_dir) {
        Ok(l) => l.snapshot(),
        Err(gpuslice_ledger::LedgerError::NotFound(_)) => Default::default(),
        Err(source) => {
            return Err(Error::Ledger {
                dir: cfg.runtime_dir.clone(),
                source: Box::new(source),
            })
        }
    };
    let found = resource_slice::devices(&inv, &snap, cfg.memory_step, cfg.memory_default);
    for (dev, why) in &found.left_out {
        eprintln!("gpuslice-dra: {dev} is left out: {why}");
    }
    let s = resource_slice::resource_slice(&cfg.node_name, &cfg.driver, 1, None, found.published);
    let json = |e: serde_json::Error| Error::Other {
        what: "writing the ResourceSlice as JSON",
        why: e.to_string(),
    };
    let obj = publish::to_object(&s).map_err(json)?;
    println!("{}", serde_json::to_string_pretty(&obj).map_err(json)?);
    Ok(())
}

/// `--help` (exit 0) or a usage error (exit 2).
fn exit_usage(e: ConfigError, usage: &str, help: &str) -> ! {
    match e {
        ConfigError::Help => {
            println!("usage: {usage}\n\n{help}");
            std::process::exit(0)
        }
        ConfigError::Usage(m) => {
            eprintln!("gpuslice-dra: {m}\nusage: {usage}");
            std::process::exit(2)
        }
    }
}

/// Run `f` on a one-thread runtime; an error is printed and exits 1.
fn block_on(f: impl std::future::Future<Output = Result<(), Error>>) {
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
    if let Err(e) = rt.block_on(f) {
        eprintln!("gpuslice-dra: {e}");
        std::process::exit(1);
    }
}

async fn client() -> Result<kube::Client, Error> {
    kube::Client::try_default()
        .await
        .map_err(|source| Error::Api {
            what: "connecting to the API server (in-cluster service account or KUBECONFIG)".into(),
            source,
        })
}

/// `gpuslice-dra cleanup`: remove the driver's ResourceSlices (of one node, or all).
async fn cleanup(c: Cleanup) -> Result<(), Error> {
    let sink = match &c.publish {
        PublishTo::Api => Sink::Api(client().await?),
        PublishTo::File(p) => Sink::File(p.clone()),
    };
    let removed = sink.remove_all(&c.driver, c.node.as_deref()).await?;
    let whose = c
        .node
        .as_deref()
        .map_or("every node".to_string(), |n| format!("node {n}"));
    eprintln!(
        "gpuslice-dra: removed {} ResourceSlice(s) of driver {} on {whose}{}",
        removed.len(),
        c.driver,
        if removed.is_empty() {
            String::new()
        } else {
            format!(": {}", removed.join(", "))
        }
    );
    Ok(())
}

async fn run(cfg: Config) -> Result<(), Error> {
    let needs_api = cfg.claims == ClaimsFrom::Api || cfg.publish == PublishTo::Api;
    let client = if needs_api {
        Some(client().await?)
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
        .map_err(|e| Error::Other {
            what: "SIGTERM handler",
            why: e.to_string(),
        })?;
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
        let removal = sink.remove_all(&cfg.driver, Some(&cfg.node_name));
        match tokio::time::timeout(std::time::Duration::from_secs(10), removal).await {
            Ok(Ok(names)) if names.is_empty() => {
                eprintln!(
                    "gpuslice-dra: no ResourceSlice of node {} to delete",
                    cfg.node_name
                )
            }
            Ok(Ok(names)) => eprintln!("gpuslice-dra: deleted ResourceSlice {}", names.join(", ")),
            Ok(Err(e)) => eprintln!("gpuslice-dra: {e}"),
            Err(_) => eprintln!(
                "gpuslice-dra: deleting the ResourceSlices of node {}: no answer in 10 s",
                cfg.node_name
            ),
        }
    }
    result
}
