//! Every object in `deploy/` is a valid object of the Kubernetes version targeted (the
//! k8s-openapi feature in Cargo.toml): it deserializes into k8s-openapi's type for its kind,
//! and serializing that back gives the same object (so no field is misspelled or misplaced:
//! an unknown field would be dropped and show up as a difference). Then the objects agree with
//! each other, with the plugin's defaults and with the monitor's flags.
//!
//! `deploy/gpuslice.yaml` and `deploy/cleanup.yaml` are the Helm chart (`deploy/helm/gpuslice`)
//! rendered with its default values by `scripts/render-manifests.sh`; that they are its current
//! rendering is checked where helm is built (`render-manifests.sh --check`, run by
//! `tests/cluster/test_chart.py` and `scripts/test.sh`). `deploy/example.yaml` is written by
//! hand.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every YAML document of every file in deploy/, as JSON values, with the file it came from.
fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let names: Vec<_> = files.iter().map(|f| f.file_name().unwrap()).collect();
    assert_eq!(
        names,
        ["cleanup.yaml", "example.yaml", "gpuslice.yaml"],
        "deploy/ has {files:?}: the chart's rendering (scripts/render-manifests.sh) and the example"
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
        for d in docs.into_iter().filter(|d| !d.is_null()) {
            out.push((name.clone(), d));
        }
    }
    out
}

/// Deserialize into `T` and back; the round trip must give the same object.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize + k8s_openapi::Resource>(
    file: &str,
    v: &Value,
) -> T {
    let t: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{file}: {} {}: {e}", T::KIND, v["metadata"]["name"]));
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        &back,
        v,
        "{file}: {} {} changed in a round trip through k8s-openapi (a misspelled or misplaced \
         field?)",
        T::KIND,
        v["metadata"]["name"]
    );
    t
}

#[derive(Default)]
struct Objects {
    daemonsets: Vec<DaemonSet>,
    jobs: Vec<Job>,
    roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    accounts: Vec<ServiceAccount>,
    classes: Vec<DeviceClass>,
    templates: Vec<ResourceClaimTemplate>,
    pods: Vec<Pod>,
    policies: Vec<ValidatingAdmissionPolicy>,
    policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    namespaces: Vec<Namespace>,
    services: Vec<Service>,
}

fn objects() -> Objects {
    let mut o = Objects::default();
    for (file, v) in documents() {
        match (
            v["apiVersion"].as_str().unwrap_or(""),
            v["kind"].as_str().unwrap_or(""),
        ) {
            ("apps/v1", "DaemonSet") => o.daemonsets.push(typed(&file, &v)),
            ("batch/v1", "Job") => o.jobs.push(typed(&file, &v)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => o.roles.push(typed(&file, &v)),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                o.bindings.push(typed(&file, &v))
            }
            ("v1", "ServiceAccount") => o.accounts.push(typed(&file, &v)),
            ("v1", "Namespace") => o.namespaces.push(typed(&file, &v)),
            ("v1", "Service") => o.services.push(typed(&file, &v)),
            ("v1", "Pod") => o.pods.push(typed(&file, &v)),
            ("resource.k8s.io/v1", "DeviceClass") => o.classes.push(typed(&file, &v)),
            ("resource.k8s.io/v1", "ResourceClaimTemplate") => o.templates.push(typed(&file, &v)),
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
                o.policies.push(typed(&file, &v))
            }
            ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
                o.policy_bindings.push(typed(&file, &v))
            }
            (a, k) => panic!("{file}: unexpected object {a} {k}"),
        }
    }
    o
}

#[test]
fn deploy_objects_are_valid_and_agree() {
    let o = objects();
    let driver = gpuslice_dra::config::DEFAULT_DRIVER;

    // The class selects this driver's devices.
    assert_eq!(o.classes.len(), 1);
    let class = &o.classes[0];
    let sel = &class.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0];
    assert_eq!(
        sel.cel.as_ref().unwrap().expression,
        format!("device.driver == \"{driver}\"")
    );
    let class_name = class.metadata.name.clone().unwrap();

    // The example's templates ask that class for 4Gi with 250 thousandths and 8Gi with 750,
    // which the slice's policy accepts as they are (multiples of the 256Mi step; compute
    // within a whole GPU) and which fit one 16 GiB GPU together.
    let mut asks = Vec::new();
    for t in &o.templates {
        let spec = t.spec.as_ref().unwrap().spec.as_ref().unwrap();
        let req = &spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[0];
        let exact = req.exactly.as_ref().unwrap();
        assert_eq!(exact.device_class_name, class_name);
        let caps = exact.capacity.as_ref().unwrap().requests.as_ref().unwrap();
        let mem = gpuslice_quantity::parse_kubernetes("capacity", &caps["memory"].0).unwrap();
        assert_eq!(mem % (256 << 20), 0);
        let compute = gpuslice_quantity::parse_kubernetes("capacity", &caps["compute"].0).unwrap();
        asks.push((mem, compute));
    }
    asks.sort();
    assert_eq!(asks, [(4 << 30, 250), (8 << 30, 750)]);

    // Two pods, each with a claim from one of those templates (each template used), used by
    // their container, in the templates' namespace.
    assert_eq!(o.pods.len(), 2);
    let mut used = Vec::new();
    for p in &o.pods {
        let spec = p.spec.as_ref().unwrap();
        let rc = &spec.resource_claims.as_ref().unwrap()[0];
        let t = o
            .templates
            .iter()
            .find(|t| t.metadata.name == rc.resource_claim_template_name)
            .unwrap_or_else(|| panic!("pod {:?}: no template {rc:?}", p.metadata.name));
        used.push(t.metadata.name.clone());
        assert_eq!(p.metadata.namespace, t.metadata.namespace);
        let container_claim = &spec.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .claims
            .as_ref()
            .unwrap()[0];
        assert_eq!(container_claim.name, rc.name);
    }
    used.sort();
    used.dedup();
    assert_eq!(used.len(), o.templates.len(), "every template is used");

    // RBAC: the DaemonSet's service account may get claims and write slices.
    let ds = &o.daemonsets[0];
    let pod = ds.spec.template.spec.as_ref().unwrap();
    let sa = pod.service_account_name.clone().unwrap();
    let ns = ds.metadata.namespace.clone().unwrap();
    assert!(o
        .accounts
        .iter()
        .any(|a| a.metadata.name.as_deref() == Some(&sa)
            && a.metadata.namespace.as_deref() == Some(&ns)));
    assert!(o
        .namespaces
        .iter()
        .any(|n| n.metadata.name.as_deref() == Some(&ns)));
    let binding = o
        .bindings
        .iter()
        .find(|b| {
            b.subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(&ns)
            })
        })
        .expect("a ClusterRoleBinding for the plugin's service account");
    let role = o
        .roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(&binding.role_ref.name))
        .expect("the bound ClusterRole");
    let allows = |resource: &str, verb: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups
                .iter()
                .flatten()
                .any(|g| g == "resource.k8s.io")
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    assert!(allows("resourceclaims", "get"));
    assert!(role.rules.iter().flatten().any(|r| {
        r.api_groups.iter().flatten().any(|g| g.is_empty())
            && r.resources.iter().flatten().any(|x| x == "nodes")
            && r.verbs.iter().any(|v| v == "get")
    }));
    for verb in ["get", "create", "update", "patch", "delete"] {
        assert!(allows("resourceslices", verb), "resourceslices {verb}");
    }
    // ... but only its own node's, through the admission policy and its binding, which apply
    // to the requests of that account.
    assert_eq!(o.policies.len(), 1);
    assert_eq!(
        Some(&o.policy_bindings[0].spec.policy_name),
        o.policies[0].metadata.name.as_ref()
    );
    let conditions = o.policies[0]
        .spec
        .as_ref()
        .unwrap()
        .match_conditions
        .as_ref();
    let condition = &conditions.unwrap()[0].expression;
    assert!(
        condition.contains(&format!("\"system:serviceaccount:{ns}:{sa}\"")),
        "the admission policy names the plugin's account: {condition}"
    );

    // The plugin container: its node name from the downward API, and host paths where the
    // kubelet, the runtime and the claims' CDI specs expect them.
    let plugin = pod.containers.iter().find(|c| c.name == "plugin").unwrap();
    let node_env = plugin
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .unwrap();
    assert_eq!(
        node_env
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "spec.nodeName"
    );
    let host_path = |volume: &str| {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == volume)
            .and_then(|v| v.host_path.as_ref())
            .map(|h| h.path.clone())
            .unwrap_or_else(|| panic!("no hostPath volume {volume}"))
    };
    for m in plugin.volume_mounts.iter().flatten() {
        assert_eq!(
            host_path(&m.name),
            m.mount_path,
            "the plugin writes host paths into CDI specs and gives the kubelet socket paths: \
             mount {} at the same path as on the host",
            m.name
        );
    }
    let mounted = |p: &str| {
        plugin
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == p)
    };
    assert!(mounted("/var/lib/kubelet/plugins_registry"));
    assert!(mounted(&format!("/var/lib/kubelet/plugins/{driver}")));
    // The flags parse as the plugin parses them.
    let mut args: Vec<std::ffi::OsString> = plugin.args.iter().flatten().map(Into::into).collect();
    args.extend(["--node-name".into(), "n".into()]);
    let cfg = gpuslice_dra::config::Config::parse(args).expect("the DaemonSet's flags parse");
    assert_eq!(cfg.driver, driver);
    assert!(mounted(&cfg.registry_dir.to_string_lossy()));
    assert!(mounted(&cfg.plugin_dir.to_string_lossy()));
    assert!(mounted(&cfg.cdi_dir.to_string_lossy()));
    assert!(mounted(&cfg.runtime_dir.to_string_lossy()));
    assert_eq!(
        host_path("host-lib"),
        cfg.library.parent().unwrap().to_string_lossy()
    );
    // Node mode on both sides: the plugin asks the monitor, the monitor owns the policy in the
    // same directory.
    assert_eq!(cfg.mode, gpuslice_dra::config::LedgerMode::Node);
    let monitor = pod.containers.iter().find(|c| c.name == "monitor").unwrap();
    let words = command_line(monitor);
    assert_eq!(words[..2], ["gpuslice", "monitor"]);
    assert_eq!(flag(&words, "--mode"), Some("node"), "{words:?}");
    assert!(monitor.env.iter().flatten().any(|e| {
        e.name == "GPUSLICE_RUNTIME_DIR"
            && e.value.as_deref() == Some(&*cfg.runtime_dir.to_string_lossy())
    }));
    assert!(monitor.volume_mounts.iter().flatten().any(|m| {
        host_path(&m.name) == cfg.runtime_dir.to_string_lossy()
            && m.mount_path == cfg.runtime_dir.to_string_lossy()
    }));
    assert_eq!(pod.host_pid, Some(true), "the monitor checks host pids");

    // Uninstall: the cleanup Job runs `gpuslice-dra cleanup --all-nodes` from the plugin's
    // image, as a service account bound to a role that may list and delete ResourceSlices,
    // and is not the plugin's (whose admission policy keeps it to its own node).
    assert_eq!(o.jobs.len(), 1);
    let job = o.jobs[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let c = &job.containers[0];
    assert_eq!(c.image, plugin.image);
    assert_eq!(
        c.command.as_deref(),
        Some(&["gpuslice-dra".to_string()][..])
    );
    let args: Vec<String> = c.args.clone().unwrap();
    assert_eq!(args[0], "cleanup");
    let parsed = gpuslice_dra::config::Cleanup::parse(args[1..].iter().map(Into::into).collect())
        .expect("the Job's flags parse");
    assert_eq!(parsed.node, None, "every node's slices");
    assert_eq!(parsed.driver, cfg.driver);
    let job_sa = job.service_account_name.clone().unwrap();
    assert_ne!(job_sa, sa);
    let job_binding = o
        .bindings
        .iter()
        .find(|b| b.subjects.iter().flatten().any(|s| s.name == job_sa))
        .expect("a binding for the cleanup Job's account");
    let job_role = o
        .roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(&job_binding.role_ref.name))
        .unwrap();
    for verb in ["list", "delete"] {
        assert!(job_role.rules.iter().flatten().any(|r| {
            r.resources.iter().flatten().any(|x| x == "resourceslices")
                && r.verbs.iter().any(|v| v == verb)
        }));
    }
    assert!(o
        .accounts
        .iter()
        .any(|a| a.metadata.name.as_deref() == Some(&job_sa)));
}

/// A container's command and arguments, as one list of words.
fn command_line(c: &k8s_openapi::api::core::v1::Container) -> Vec<String> {
    c.command.iter().chain(&c.args).flatten().cloned().collect()
}

/// The value of `--flag=value` or `--flag value` in a command line.
fn flag<'a>(words: &'a [String], name: &str) -> Option<&'a str> {
    words.iter().enumerate().find_map(|(i, w)| {
        if w == name {
            words.get(i + 1).map(String::as_str)
        } else {
            w.strip_prefix(name)?.strip_prefix('=')
        }
    })
}

fn the_daemonset(o: &Objects) -> &DaemonSet {
    assert_eq!(o.daemonsets.len(), 1);
    &o.daemonsets[0]
}

/// `gpuslice monitor` reads its flags in order and answers `--help` where it comes, so the
/// container's command line with `--help` after it exits 0 only if every flag before it
/// parses; nothing else runs.
fn monitor_accepts(words: &[String]) -> std::process::Output {
    std::process::Command::new(gpuslice_e2e::artifact(&words[0]))
        .args(&words[1..])
        .arg("--help")
        .output()
        .unwrap()
}

#[test]
fn the_monitors_flags_parse_as_the_monitor_parses_them() {
    let o = objects();
    let pod = the_daemonset(&o).spec.template.spec.as_ref().unwrap();
    let monitor = pod.containers.iter().find(|c| c.name == "monitor").unwrap();
    let words = command_line(monitor);
    let out = monitor_accepts(&words);
    assert!(
        out.status.success(),
        "`{}` is refused by the monitor: {}",
        words.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    // The check can fail: one bad value before `--help` is refused.
    let mut bad = words.clone();
    bad.push("--balloons=maybe".into());
    let out = monitor_accepts(&bad);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--balloons \"maybe\""));

    // The chart's defaults: balloons on, the audit's default action, metrics on every
    // interface of the pod on the port its container and the metrics Service name.
    assert_eq!(flag(&words, "--balloons"), Some("on"));
    assert_eq!(flag(&words, "--on-violation"), None);
    let listen = flag(&words, "--metrics-listen").expect("metrics on by default");
    let (host, port) = listen.rsplit_once(':').unwrap();
    assert_eq!(host, "0.0.0.0", "reachable from the metrics Service");
    let port: i32 = port.parse().unwrap();
    let container_port = monitor
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("a port named metrics");
    assert_eq!(container_port.container_port, port);
    assert_eq!(o.services.len(), 1);
    let svc = o.services[0].spec.as_ref().unwrap();
    let svc_port = &svc.ports.as_ref().unwrap()[0];
    assert_eq!(svc_port.port, port);
    assert_eq!(
        svc_port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into()))
    );
}

/// Whether every label of `selector` is in `labels`.
fn selects(selector: &BTreeMap<String, String>, labels: Option<&BTreeMap<String, String>>) -> bool {
    let labels = labels.cloned().unwrap_or_default();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn the_selectors_pick_the_driver_pods_and_never_change() {
    let o = objects();
    let ds = the_daemonset(&o);
    let selector = ds.spec.selector.match_labels.clone().unwrap();
    // A DaemonSet's selector is immutable: a chart that changes it fails `helm upgrade` of
    // every installed release ("field is immutable"). These are the selector labels of
    // release `gpuslice`, as installed since the chart's first version.
    assert_eq!(
        selector,
        BTreeMap::from([
            ("app.kubernetes.io/name".to_string(), "gpuslice".to_string()),
            (
                "app.kubernetes.io/instance".to_string(),
                "gpuslice".to_string()
            ),
        ]),
        "the DaemonSet's selector changed: installed releases could not be upgraded"
    );
    let pod_labels = ds.spec.template.metadata.as_ref().unwrap().labels.as_ref();
    assert!(selects(&selector, pod_labels));
    // The cleanup Job's pod is neither the DaemonSet's nor a metrics endpoint.
    let job_pod_labels = o.jobs[0].spec.as_ref().unwrap().template.metadata.as_ref();
    let job_pod_labels = job_pod_labels.unwrap().labels.as_ref();
    assert!(!selects(&selector, job_pod_labels), "{job_pod_labels:?}");
    let svc_selector = o.services[0]
        .spec
        .as_ref()
        .unwrap()
        .selector
        .clone()
        .unwrap();
    assert!(selects(&svc_selector, pod_labels));
    assert!(!selects(&svc_selector, job_pod_labels));
}

#[test]
fn only_the_cleanup_is_a_hook() {
    // `kubectl apply -f deploy/gpuslice.yaml` must not run the uninstall's Job (it would
    // delete the ResourceSlices of a driver being installed); deploy/cleanup.yaml is that
    // Job and what it needs, each the chart's pre-delete hook.
    for (file, v) in documents() {
        let hook = v["metadata"]["annotations"]["helm.sh/hook"].as_str();
        match file.as_str() {
            "cleanup.yaml" => assert_eq!(hook, Some("pre-delete"), "{file}: {v}"),
            _ => assert_eq!(hook, None, "{file}: {}", v["metadata"]["name"]),
        }
    }
}
