//! Device memory shared between two users' processes on a node (issue 23,
//! docs/architecture/memory.md, "Memory shared between processes"): a root monitor in node
//! mode (`--on-violation kill`), tenants as unprivileged users passing a VMM allocation's POSIX
//! descriptor over a unix socket.
//! The clients are `tests/python/clients/cuda_ipc.py` (ctypes on the fake GPU, one JSON line
//! per command) run by the system's `/usr/bin/python3` as each user. Every test needs root;
//! without root it prints why and passes vacuously. CI runs as root.

use gpuslice_e2e::need_root;
use gpuslice_e2e::node::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Stdio};
use std::time::{Duration, Instant};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;
const CUDA_ERROR_OUT_OF_MEMORY: u64 = 2;
/// What every user can run (the clients need only the standard library and ctypes).
const PYTHON: &str = "/usr/bin/python3";

/// The system's python run as user `uid` (its own group, no others); arguments follow.
fn python_as(uid: u32) -> std::process::Command {
    let mut c = std::process::Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg("--")
        .arg(PYTHON);
    c
}

/// One `cuda_ipc.py ROLE SOCKET` client of a user, under the shim, in its own slice.
struct Client {
    child: Child,
    out: BufReader<ChildStdout>,
    /// Its pid, as it reported it.
    pid: u64,
}

impl Client {
    fn new(n: &Node, uid: u32, slice: &str, quota: &str, role: &str, sock: &Path) -> Client {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/clients/cuda_ipc.py");
        // The Node's environment for `uid` (the fake GPU, the runtime directory, the shim's
        // copy every user can read), with this interpreter instead of one of its binaries.
        let base = n.burn(uid);
        let mut c = python_as(uid);
        c.arg(&script).arg(role).arg(sock);
        for (k, v) in base.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c.env("GPUSLICE_SLICE", slice)
            .env("GPUSLICE_MEMORY", quota)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // SAFETY: umask(2) only, async-signal-safe, in the child before exec: the socket the
        // exporter binds must be connectable by the other user.
        unsafe {
            c.pre_exec(|| {
                libc::umask(0);
                Ok(())
            })
        };
        let mut child = c.spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut cl = Client { child, out, pid: 0 };
        let ready = cl.read();
        assert_eq!(ready["event"], "ready", "{ready}");
        cl.pid = ready["pid"].as_u64().unwrap();
        cl
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        serde_json::from_str(line.trim()).unwrap_or_else(|_| panic!("not JSON: {line:?}"))
    }

    fn ask(&mut self, command: &str) -> Value {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
        let v = self.read();
        assert!(v.get("error").is_none(), "{command}: {v}");
        v
    }

    /// `send` on this exporter, `command` on the importer `to`: the importer's answer.
    fn hand(&mut self, to: &mut Client, command: &str) -> Value {
        assert_eq!(self.ask("send")["event"], "listening");
        let got = to.ask(command);
        let sent = self.read();
        assert!(sent.get("error").is_none(), "{sent}");
        got
    }

    fn exit(mut self) {
        assert_eq!(self.ask("exit")["event"], "exit");
        assert!(self.child.wait().unwrap().success());
    }
}

/// {slice name without its owner: bytes used} from `gpuslice status --json`.
fn used(n: &Node) -> BTreeMap<String, u64> {
    let st = n.status();
    let slices = st["slices"].as_array().cloned().unwrap_or_default();
    slices
        .iter()
        .map(|s| {
            let name = s["name"].as_str().unwrap_or("");
            let short = name.rsplit('/').next().unwrap_or(name).to_string();
            (short, s["memory_used"].as_u64().unwrap_or(0))
        })
        .collect()
}

fn wait_for(what: &str, n: &Node, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{what}: {:?}\n{}",
            used(n),
            n.monitor_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A directory every user may make a socket in (sticky, as /tmp).
fn socket_dir(n: &Node) -> PathBuf {
    let d = n.root().join("sockets");
    std::fs::create_dir_all(&d).unwrap();
    chmod(&d, 0o1777);
    d
}

/// The quota escape of handing a descriptor to another user and exiting: tenant A exports a
/// 256 MiB VMM allocation and sends its descriptor to two processes of tenant B, which keep
/// it without importing; A exits, and once the monitor reaped it A's slice stays charged for
/// the memory the descriptors keep alive. B's import in a 128 MiB slice is refused with
/// CUDA_ERROR_OUT_OF_MEMORY (nothing charged; 128 MiB of its 256 MiB slice are left beside
/// its context); in a 1 GiB slice it succeeds, reads A's bytes, and the charge moves to B's
/// slice (its whole quota less its context and 256 MiB free; A's slice goes). Both
/// closed their descriptors when they imported: once it unmaps, the monitor's scan finds no
/// descriptor and B's slice is uncharged. Nobody is reported or killed.
#[test]
fn a_descriptor_handed_to_another_user_is_charged_to_it_when_imported() {
    need_root!();
    let n = Node::new(1, "4Gi", &["--on-violation", "kill"]);
    let sock = socket_dir(&n).join("vmm.sock");
    let mut x = Client::new(&n, TENANT_A, "x", "1Gi", "vmm-export", &sock);
    let mut m = Client::new(&n, TENANT_B, "y", "1Gi", "vmm-import", &sock);
    let mut small = Client::new(&n, TENANT_B, "small", "256Mi", "vmm-import", &sock);
    // Each process's context is charged inside its slice (128 MiB on a 4 GiB device).
    let ctx = gpuslice_e2e::fake_context_bytes(4 * GI);
    assert_eq!(x.ask("create 256")["status"], 0);
    assert_eq!(x.hand(&mut m, "receive")["received"], true);
    assert_eq!(x.hand(&mut small, "receive")["received"], true);
    wait_for("x charged", &n, || {
        used(&n).get("x") == Some(&(256 * MI + ctx))
    });
    let reaped = format!("reaped pid {}:", x.pid);
    x.exit();
    // The monitor's reap itself (its log line): an import before it is a plain import of a
    // live export, charged nothing (seen once, waiting on the status alone).
    wait_for("x reaped", &n, || n.monitor_log().contains(&reaped));
    // Past a descriptor scan or two: still charged, B's processes hold the descriptors.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(used(&n).get("x"), Some(&(256 * MI)), "held by descriptors");

    let refused = small.ask("import");
    assert_eq!(refused["status"], CUDA_ERROR_OUT_OF_MEMORY, "{refused}");
    assert_eq!(refused["free"], 128 * MI, "{refused}");
    let got = m.ask("import");
    assert_eq!(
        (&got["status"], &got["read_ok"]),
        (&0.into(), &true.into()),
        "{got}"
    );
    assert_eq!(
        got["free"],
        GI - 256 * MI - ctx,
        "charged as its own allocation: {got}"
    );
    wait_for("y charged, x gone", &n, || {
        let u = used(&n);
        u.get("y") == Some(&(256 * MI + ctx))
            && u.get("small") == Some(&ctx)
            && !u.contains_key("x")
    });
    let gone = m.ask("unmap");
    assert_eq!(
        (&gone["unmap"], &gone["release"]),
        (&0.into(), &0.into()),
        "{gone}"
    );
    // Both closed their descriptors when they imported: once the monitor's scan finds none
    // left, the record's charge goes.
    wait_for("y uncharged", &n, || used(&n).get("y") == Some(&ctx));
    assert_eq!(m.ask("info")["free"], GI - ctx);
    assert!(m.child.try_wait().unwrap().is_none() && small.child.try_wait().unwrap().is_none());
    assert!(!n.monitor_log().contains("audit:"), "{}", n.monitor_log());
    m.exit();
    small.exit();
}

/// A process that only holds descriptors: `python3` without the shim (no CUDA at all),
/// connecting to `sock` as `uid`, receiving one descriptor, and keeping it until its stdin
/// closes.
fn holder(uid: u32, sock: &Path) -> Child {
    const HOLD: &str = "import socket, sys\n\
        s = socket.socket(socket.AF_UNIX)\n\
        s.connect(sys.argv[1])\n\
        msg, fds, _, _ = socket.recv_fds(s, 8, 1)\n\
        print('held', len(fds), flush=True)\n\
        sys.stdin.read()\n";
    let mut c = python_as(uid);
    c.arg("-c")
        .arg(HOLD)
        .arg(sock)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    c.spawn().unwrap()
}

/// The escape the descriptor scan closes: tenant A exports a 256 MiB VMM allocation, hands its
/// descriptor to a plain process of tenant B that only holds it (never imports it, no CUDA),
/// and exits. The driver keeps the memory for the descriptor, so A's slice stays charged for it
/// (`gpuslice status --json`) while the holder lives; once the holder exits, the monitor's
/// scan of `/proc/*/fd` finds no descriptor and the charge goes with A's slice.
#[test]
fn memory_only_a_descriptor_holds_stays_charged_to_its_exporter() {
    need_root!();
    let n = Node::new(1, "4Gi", &["--on-violation", "kill"]);
    let sock = socket_dir(&n).join("hold.sock");
    let mut x = Client::new(&n, TENANT_A, "x", "1Gi", "vmm-export", &sock);
    assert_eq!(x.ask("create 256")["status"], 0);
    assert_eq!(x.ask("send")["event"], "listening");
    let mut h = holder(TENANT_B, &sock);
    let mut line = String::new();
    BufReader::new(h.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 1");
    let sent = x.read();
    assert!(sent.get("error").is_none(), "{sent}");
    let reaped = format!("reaped pid {}:", x.pid);
    x.exit();
    wait_for("x reaped", &n, || n.monitor_log().contains(&reaped));
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(used(&n).get("x"), Some(&(256 * MI)), "the holder keeps it");
    // `status` lists the orphan record: charged to x, held by a descriptor only.
    let st = n.status();
    let orphans = st["orphans"].as_array().cloned().unwrap_or_default();
    assert!(
        orphans.len() == 1
            && orphans[0]["bytes"] == 256 * MI
            && orphans[0]["importers"] == 0
            && orphans[0]["slice"]
                .as_str()
                .is_some_and(|s| s.ends_with('x')),
        "{st:#}"
    );
    let table = String::from_utf8_lossy(&n.cli(0, &["status"]).stdout).into_owned();
    assert!(table.contains("descriptors only"), "{table}");
    drop(h.stdin.take());
    assert!(h.wait().unwrap().success());
    wait_for("x uncharged", &n, || !used(&n).contains_key("x"));
    assert_eq!(n.status()["orphans"], serde_json::json!([]));
    assert!(!n.monitor_log().contains("audit:"), "{}", n.monitor_log());
}
