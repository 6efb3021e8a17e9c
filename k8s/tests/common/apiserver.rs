//! A strict fake API server on 127.0.0.1 for the plugin's `--claims api --publish api` paths:
//! HTTP/1.1 as the kube client speaks it, objects held in memory, and every ResourceSlice the
//! plugin applies checked as the API server checks it (`strict.rs`): refused with the API
//! server's `Status` (400 for the schema, 422 Invalid for the validation rules), stored only
//! when it passes. Every request and every verdict is recorded for the tests.

use super::strict::{check_resource_slice, Refusal};
use gpuslice_e2e::{artifact, World};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// One request the fake API server received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub content_type: String,
    pub body: String,
}

/// What the server did with one ResourceSlice sent to it.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub object: Value,
    pub refusal: Option<Refusal>,
}

#[derive(Default)]
pub struct State {
    pub seen: Vec<Seen>,
    /// path -> (status, JSON body) for GETs (nodes, claims); ResourceSlices are in `slices`.
    pub objects: BTreeMap<String, (u16, String)>,
    /// Stored ResourceSlices by name.
    pub slices: BTreeMap<String, Value>,
    /// Every ResourceSlice applied, in order, with what was answered.
    pub verdicts: Vec<Verdict>,
    /// An admission check after validation, as a cluster's ValidatingAdmissionPolicy makes one:
    /// `Some(message)` denies the slice (422, the API server's wording for a policy's denial).
    pub admission: Option<fn(&Value) -> Option<String>>,
    resource_version: u64,
}

impl State {
    pub fn count(&self, method: &str) -> usize {
        self.seen.iter().filter(|s| s.method == method).count()
    }
}

pub fn status(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
    .to_string()
}

/// The server, started on a free port.
pub struct FakeApiServer {
    pub port: u16,
    pub state: Arc<Mutex<State>>,
}

impl FakeApiServer {
    /// Listen, and serve on this thread's runtime.
    pub async fn start() -> FakeApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        tokio::spawn(serve(listener, state.clone()));
        FakeApiServer { port, state }
    }

    /// A kubeconfig that points a client here, written to `path`.
    pub fn write_kubeconfig(&self, path: &Path) {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{}\nusers:\n- name: plugin\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: plugin\ncurrent-context: fake\n",
                self.port
            ),
        )
        .unwrap();
    }

    /// Hold the Node `name` (the slice's owner).
    pub fn add_node(&self, name: &str, uid: &str) {
        self.state.lock().unwrap().objects.insert(
            format!("/api/v1/nodes/{name}"),
            (
                200,
                serde_json::json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "uid": uid}})
                .to_string(),
            ),
        );
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }
}

/// A test's cluster: fake GPUs (`world`), the fake API server holding node `node`, a
/// kubeconfig pointing at it, and the plugin's directories under `root` (its log in `log`).
pub struct Cluster {
    pub world: World,
    pub api: FakeApiServer,
    pub node: String,
    pub root: PathBuf,
    pub kubeconfig: PathBuf,
    pub log: PathBuf,
}

impl Cluster {
    /// `gpus` fake GPUs of 16 GiB.
    pub async fn new(gpus: u32, node: &str) -> Cluster {
        let world = World::new(gpus, "16Gi");
        let root = world.runtime_dir().parent().unwrap().join("k8s");
        std::fs::create_dir_all(&root).unwrap();
        let api = FakeApiServer::start().await;
        api.add_node(node, &format!("uid-of-{node}"));
        let kubeconfig = root.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig);
        Cluster {
            world,
            api,
            node: node.into(),
            log: root.join("plugin.log"),
            root,
            kubeconfig,
        }
    }

    /// The plugin on the node, talking to the API server (claims and slices), its log
    /// appended to `log`; resync every 0.1 s.
    pub fn spawn_plugin(&self, extra: &[&str]) -> Child {
        self.world
            .command(env!("CARGO_BIN_EXE_gpuslice-dra"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("NODE_NAME", &self.node)
            .arg("--registry-dir")
            .arg(self.root.join("reg"))
            .arg("--plugin-dir")
            .arg(self.root.join("plugin"))
            .arg("--cdi-dir")
            .arg(self.root.join("cdi"))
            .arg("--runtime-dir")
            .arg(self.world.runtime_dir())
            .arg("--library")
            .arg(artifact("libgpuslice.so"))
            .args(["--resync", "0.1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.log)
                    .unwrap(),
            )
            .spawn()
            .unwrap()
    }

    /// The plugin's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Wait (without blocking the thread the fake server runs on) for `cond`, generously: the
/// machine may be busy; failing with the plugin's log.
pub async fn wait_until(what: &str, log: &Path, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}; plugin log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait for `child` without blocking this thread (the fake API server runs on it and must
/// answer the plugin's last requests).
pub async fn exited(child: &mut Child) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the plugin did not exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `key=value` terms of a field selector (`spec.driver=D,spec.nodeName=N`).
fn field_selector(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter_map(|kv| kv.strip_prefix("fieldSelector="))
        .flat_map(|v| {
            let v = v
                .replace("%3D", "=")
                .replace("%2C", ",")
                .replace("%2F", "/");
            v.split(',')
                .filter_map(|t| {
                    t.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn field<'a>(obj: &'a Value, path: &str) -> Option<&'a str> {
    path.split('.').try_fold(obj, |o, k| o.get(k))?.as_str()
}

fn not_found(name: &str) -> (u16, String) {
    let m = format!("resourceslices.resource.k8s.io {name:?} not found");
    (404, status(404, "NotFound", &m))
}

/// One request: (status, JSON body).
fn answer(s: &mut State, method: &str, target: &str, body: &str) -> (u16, String) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let slice_name = path.strip_prefix(SLICES).and_then(|r| r.strip_prefix('/'));
    match (method, slice_name) {
        ("GET", None) if path == SLICES => {
            let sel = field_selector(query);
            for (k, _) in &sel {
                if ![
                    "spec.driver",
                    "spec.nodeName",
                    "spec.pool.name",
                    "metadata.name",
                ]
                .contains(&k.as_str())
                {
                    return (
                        400,
                        status(
                            400,
                            "BadRequest",
                            &format!("field label not supported: {k}"),
                        ),
                    );
                }
            }
            let items: Vec<&Value> = s
                .slices
                .values()
                .filter(|o| sel.iter().all(|(k, v)| field(o, k) == Some(v)))
                .collect();
            let list = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                "metadata": {"resourceVersion": s.resource_version.to_string()}, "items": items});
            (200, list.to_string())
        }
        ("GET", Some(name)) => match s.slices.get(name) {
            Some(o) => (200, o.to_string()),
            None => not_found(name),
        },
        ("PATCH", Some(name)) => {
            let obj: Value = match serde_json::from_str(body) {
                Ok(v) => v,
                Err(e) => {
                    return (
                        400,
                        status(400, "BadRequest", &format!("error decoding patch: {e}")),
                    )
                }
            };
            let verdict = check_resource_slice(&obj).err().or_else(|| {
                (field(&obj, "metadata.name") != Some(name)).then(|| Refusal {
                    code: 400,
                    reason: "BadRequest",
                    errors: vec![(
                        "metadata.name".into(),
                        "the name of the object does not match the name on the URL".into(),
                    )],
                })
            });
            s.verdicts.push(Verdict {
                object: obj.clone(),
                refusal: verdict.clone(),
            });
            if let Some(r) = verdict {
                return (r.code, r.status(name).to_string());
            }
            if let Some(denial) = s.admission.and_then(|a| a(&obj)) {
                let message = format!(
                    "resourceslices.resource.k8s.io {name:?} is forbidden: ValidatingAdmissionPolicy \
                     'test-policy' with binding 'test-policy' denied request: {denial}"
                );
                return (422, status(422, "Invalid", &message));
            }
            s.resource_version += 1;
            let mut stored = obj;
            stored["metadata"]["resourceVersion"] = s.resource_version.to_string().into();
            s.slices.insert(name.to_string(), stored.clone());
            (200, stored.to_string())
        }
        ("DELETE", Some(name)) => match s.slices.remove(name) {
            Some(o) => (200, o.to_string()),
            None => not_found(name),
        },
        ("GET", None) => s
            .objects
            .get(path)
            .cloned()
            .unwrap_or_else(|| (404, status(404, "NotFound", &format!("{path} not found")))),
        _ => (405, status(405, "MethodNotAllowed", "not in the fake")),
    }
}

/// Serve HTTP/1.1 on `listener` (keep-alive, Content-Length bodies: what the kube client sends).
async fn serve(listener: tokio::net::TcpListener, state: Arc<Mutex<State>>) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            return;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let (r, mut w) = sock.into_split();
            let mut r = BufReader::new(r);
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                let mut parts = line.split_whitespace();
                let (method, target) = (
                    parts.next().unwrap_or("").to_string(),
                    parts.next().unwrap_or("").to_string(),
                );
                let (mut len, mut content_type) = (0usize, String::new());
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        match k.to_ascii_lowercase().as_str() {
                            "content-length" => len = v.trim().parse().unwrap_or(0),
                            "content-type" => content_type = v.trim().to_string(),
                            _ => {}
                        }
                    }
                }
                let mut body = vec![0; len];
                if r.read_exact(&mut body).await.is_err() {
                    return;
                }
                let body = String::from_utf8_lossy(&body).into_owned();
                let (code, reply) = {
                    let mut s = state.lock().unwrap();
                    s.seen.push(Seen {
                        method: method.clone(),
                        target: target.clone(),
                        content_type,
                        body: body.clone(),
                    });
                    answer(&mut s, &method, &target, &body)
                };
                let head = format!(
                    "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    reply.len()
                );
                if w.write_all(head.as_bytes()).await.is_err()
                    || w.write_all(reply.as_bytes()).await.is_err()
                {
                    return;
                }
            }
        });
    }
}
