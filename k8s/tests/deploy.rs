//! Every object in `deploy/` is a valid object of the Kubernetes version targeted (the
//! k8s-openapi feature in Cargo.toml): it deserializes into k8s-openapi's type for its kind,
//! and serializing that back gives the same object (so no field is misspelled or misplaced:
//! an unknown field would be dropped and show up as a difference). Then the objects agree with
//! each other and with the plugin's defaults.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use serde_json::Value;
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
    assert!(files.len() >= 5, "deploy/ has {files:?}");
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

    // The template asks that class for 4Gi and 250 thousandths, which the slice's policy
    // accepts as is (a multiple of the 256Mi step; compute within a whole GPU).
    assert_eq!(o.templates.len(), 1);
    let t = &o.templates[0];
    let req = &t
        .spec
        .as_ref()
        .unwrap()
        .spec
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()[0];
    let exact = req.exactly.as_ref().unwrap();
    assert_eq!(exact.device_class_name, class_name);
    let caps = exact.capacity.as_ref().unwrap().requests.as_ref().unwrap();
    let mem = gpuslice_dra::quantity::parse(&caps["memory"].0).unwrap();
    assert_eq!(mem, 4 << 30);
    assert_eq!(mem % (256 << 20), 0);
    assert_eq!(
        gpuslice_dra::quantity::parse(&caps["compute"].0).unwrap(),
        250
    );

    // Two pods, each with a claim from that template, used by their container.
    assert_eq!(o.pods.len(), 2);
    for p in &o.pods {
        let spec = p.spec.as_ref().unwrap();
        let rc = &spec.resource_claims.as_ref().unwrap()[0];
        assert_eq!(rc.resource_claim_template_name, t.metadata.name);
        assert_eq!(p.metadata.namespace, t.metadata.namespace);
        let used = &spec.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .claims
            .as_ref()
            .unwrap()[0];
        assert_eq!(used.name, rc.name);
    }

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
    // ... but only its own node's, through the admission policy and its binding.
    assert_eq!(o.policies.len(), 1);
    assert_eq!(
        Some(&o.policy_bindings[0].spec.policy_name),
        o.policies[0].metadata.name.as_ref()
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
    let cmd = monitor.command.as_ref().unwrap();
    assert!(cmd.windows(2).any(|w| w == ["--mode", "node"]), "{cmd:?}");
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
