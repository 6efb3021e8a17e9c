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

/// [`python_as`] in a PID namespace of its own, as in a pod of its own (`unshare` stays
/// outside and waits for it).
fn python_in_own_pid_ns_as(uid: u32) -> std::process::Command {
    let mut c = std::process::Command::new("unshare");
    c.args(["--pid", "--fork", "setpriv"])
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args(["--clear-groups", "--", PYTHON]);
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
        Client::with(n, python_as(uid), uid, slice, quota, role, sock)
    }

    /// [`Client::new`] with the interpreter `c` runs (of `uid`).
    fn with(
        n: &Node,
        mut c: std::process::Command,
        uid: u32,
        slice: &str,
        quota: &str,
        role: &str,
        sock: &Path,
    ) -> Client {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/clients/cuda_ipc.py");
        // The Node's environment for `uid` (the fake GPU, the runtime directory, the shim's
        // copy every user can read), with this interpreter instead of one of its binaries.
        let base = n.burn(uid);
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
/// descriptor, and B's slice is uncharged once B has no process left that may hold one unseen.
/// Nobody is reported or killed.
#[test]
fn a_descriptor_handed_to_another_user_is_charged_to_it_when_imported() {
    need_root!();
    let n = Node::new(1, "4Gi", &["--on-violation", "kill"]);
    let sock = socket_dir(&n).join("vmm.sock");
    let mut x = Client::new(&n, HANDED_EXPORTER, "x", "1Gi", "vmm-export", &sock);
    let mut m = Client::new(&n, HANDED_IMPORTER, "y", "1Gi", "vmm-import", &sock);
    let mut small = Client::new(&n, HANDED_IMPORTER, "small", "256Mi", "vmm-import", &sock);
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
    // Both closed their descriptors when they imported, but B's processes may still hold one
    // unseen (sent away before the unmap, in flight): the charge stays while B has processes
    // in the PID namespace of the record's exporter (now m) ...
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        used(&n).get("y"),
        Some(&(256 * MI + ctx)),
        "B's processes live"
    );
    assert!(m.child.try_wait().unwrap().is_none() && small.child.try_wait().unwrap().is_none());
    assert!(!n.monitor_log().contains("audit:"), "{}", n.monitor_log());
    // ... and goes once none is left, with the slice it alone kept.
    m.exit();
    small.exit();
    wait_for("y uncharged", &n, || !used(&n).contains_key("y"));
    assert_eq!(n.status()["orphans"], serde_json::json!([]));
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

/// Users of these tests alone: a record whose descriptor may be in flight stays charged while
/// its exporter's uid has a process in its PID namespace (here the host's, which every other
/// namespace is nested in), so another test's processes of the same uid would hold these
/// records back.
const IN_FLIGHT_KEPT: u32 = 47041;
const IN_FLIGHT_DROPPED: u32 = 47042;
const RESTART_EXPORTER: u32 = 47043;
const RESTART_HOLDER: u32 = 47044;
const RESTART_EXPORTER_2: u32 = 47045;
const RESTART_IMPORTER: u32 = 47046;
const RESTART_EXPORTER_3: u32 = 47047;
const RESTART_IMPORTER_3: u32 = 47048;
const HANDED_EXPORTER: u32 = 47049;
const HANDED_IMPORTER: u32 = 47050;
const POD_EXPORTER: u32 = 47051;
const POD_HOLDER: u32 = 47052;
const LIVE_EXPORTER: u32 = 47053;
const LIVE_IMPORTER: u32 = 47054;

/// A plain process (no shim, no CUDA) of `uid` connected to the exporter's socket `sock` that
/// leaves the descriptor queued there (in flight) until told `receive`; it exits when its stdin
/// closes, dropping its socket and whatever is queued in it.
fn parked(uid: u32, sock: &Path) -> (Child, BufReader<ChildStdout>) {
    const PARK: &str = "import socket, sys\n\
        s = socket.socket(socket.AF_UNIX)\n\
        s.connect(sys.argv[1])\n\
        print('connected', flush=True)\n\
        for line in sys.stdin:\n    \
            msg, fds, _, _ = socket.recv_fds(s, 8, 1)\n    \
            print('held', len(fds), flush=True)\n";
    let mut c = python_as(uid);
    c.arg("-c")
        .arg(PARK)
        .arg(sock)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

fn line(out: &mut BufReader<ChildStdout>) -> String {
    let mut l = String::new();
    out.read_line(&mut l).unwrap();
    l.trim().to_string()
}

/// The one orphan record `status --json` lists: charged to slice `x`, held by `importers` live
/// importers (0: by descriptors only).
fn one_orphan_of_x(n: &Node, bytes: u64, importers: usize) {
    let st = n.status();
    let orphans = st["orphans"].as_array().cloned().unwrap_or_default();
    assert!(
        orphans.len() == 1
            && orphans[0]["bytes"] == bytes
            && orphans[0]["importers"] == importers
            && orphans[0]["slice"]
                .as_str()
                .is_some_and(|s| s.ends_with('x')),
        "{st:#}\n{}",
        n.monitor_log()
    );
}

/// Issue #34: a descriptor in flight (sent with SCM_RIGHTS, queued in the receiver's socket, in
/// no process's descriptor table) when its exporter exits. The driver keeps the memory for it,
/// so the exporter's slice stays charged while the exporter's uid has a process in its PID
/// namespace (the monitor cannot see into socket queues: docs/security.md); `receive`: the
/// receiver then takes it (now found in its descriptors) and exits; else it exits without
/// receiving, and the kernel drops the queued descriptor with the socket. Either way, once no
/// process can hold it, the charge goes with the slice.
fn in_flight_case(uid: u32, receive: bool) {
    need_root!();
    let n = Node::new(1, "4Gi", &["--on-violation", "kill"]);
    let sock = socket_dir(&n).join("in-flight.sock");
    let mut x = Client::new(&n, uid, "x", "1Gi", "vmm-export", &sock);
    assert_eq!(x.ask("create 256")["status"], 0);
    assert_eq!(x.ask("send")["event"], "listening");
    let (mut h, mut out) = parked(uid, &sock);
    assert_eq!(line(&mut out), "connected");
    // The exporter sent it and closed its own descriptor: it is only in the socket's queue.
    let sent = x.read();
    assert!(sent.get("error").is_none(), "{sent}");
    let reaped = format!("reaped pid {}:", x.pid);
    x.exit();
    wait_for("x reaped", &n, || n.monitor_log().contains(&reaped));
    // Past a descriptor scan or two: no process holds the descriptor, one may still receive it.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        used(&n).get("x"),
        Some(&(256 * MI)),
        "in flight: {}",
        n.monitor_log()
    );
    one_orphan_of_x(&n, 256 * MI, 0);
    // The monitor says why it keeps it, naming the uid whose processes hold it back.
    let why = format!("its exporter's uid {uid} still has processes in its PID namespace");
    assert!(n.monitor_log().contains(&why), "{}", n.monitor_log());
    let stdin = h.stdin.as_mut().unwrap();
    if receive {
        writeln!(stdin, "receive").unwrap();
        stdin.flush().unwrap();
        assert_eq!(line(&mut out), "held 1");
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(used(&n).get("x"), Some(&(256 * MI)), "received, held");
    }
    drop(h.stdin.take());
    assert!(h.wait().unwrap().success());
    wait_for("x uncharged", &n, || !used(&n).contains_key("x"));
    assert_eq!(n.status()["orphans"], serde_json::json!([]));
    assert!(!n.monitor_log().contains("audit:"), "{}", n.monitor_log());
}

#[test]
fn a_descriptor_in_flight_when_its_exporter_exits_stays_charged_until_received_and_closed() {
    in_flight_case(IN_FLIGHT_KEPT, true);
}

#[test]
fn a_descriptor_in_flight_when_its_exporter_exits_stays_charged_until_its_socket_goes() {
    in_flight_case(IN_FLIGHT_DROPPED, false);
}

/// Issue #34: what keeps a record no descriptor holds is a process of its exporter's uid in
/// the exporter's PID namespace, not one of that uid anywhere: another pod of the same uid
/// (each here a PID namespace of its own; the other pod's process holds a unix socket, where a
/// descriptor could be in flight) keeps nothing of someone else's charged. The exporter hands
/// its descriptor to a plain holder of another uid and exits; the holder keeps it charged
/// until it exits, and then the charge goes, the other pod's process still running.
#[test]
fn a_process_of_the_same_uid_in_another_pid_namespace_keeps_no_record() {
    need_root!();
    let n = Node::new(1, "4Gi", &["--on-violation", "kill"]);
    let sock = socket_dir(&n).join("pod.sock");
    let pod_a = python_in_own_pid_ns_as(POD_EXPORTER);
    let mut x = Client::with(&n, pod_a, POD_EXPORTER, "x", "1Gi", "vmm-export", &sock);
    assert_eq!(x.ask("create 256")["status"], 0);
    assert_eq!(x.ask("send")["event"], "listening");
    let mut h = holder(POD_HOLDER, &sock);
    let mut out = BufReader::new(h.stdout.take().unwrap());
    assert_eq!(line(&mut out), "held 1");
    let sent = x.read();
    assert!(sent.get("error").is_none(), "{sent}");
    let mut pod_b = python_in_own_pid_ns_as(POD_EXPORTER)
        .arg("-c")
        .arg("import socket, sys; a, b = socket.socketpair(); print('up', flush=True); sys.stdin.read()")
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pod_out = BufReader::new(pod_b.stdout.take().unwrap());
    assert_eq!(line(&mut pod_out), "up");
    x.exit();
    // Reaped (its pid in the log is the host's, not the one it reported): its record orphaned.
    wait_for("x reaped", &n, || {
        n.status()["orphans"]
            .as_array()
            .is_some_and(|o| o.len() == 1)
    });
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(used(&n).get("x"), Some(&(256 * MI)), "the holder keeps it");
    drop(h.stdin.take());
    assert!(h.wait().unwrap().success());
    wait_for("x uncharged beside the other pod", &n, || {
        !used(&n).contains_key("x")
    });
    assert_eq!(n.status()["orphans"], serde_json::json!([]));
    assert!(
        pod_b.try_wait().unwrap().is_none(),
        "the other pod's process runs"
    );
    drop(pod_b.stdin.take());
    assert!(pod_b.wait().unwrap().success());
}

/// Issue #34: a record whose exporter exited survives a monitor killed with SIGKILL and
/// restarted, held by another user's process: a plain one holding its descriptor, or
/// (`importer`) one that imported and maps it; the exporter exits before the monitor is
/// killed, or (`exporter_dies_while_down`) is SIGKILLed while it is down. The exporter's slice `x` is still charged for it
/// (`status`: its usage and the orphan), and enforced as such: a new process of `x` finds the
/// quota less its context and the record's 256 MiB free, and gets no more. When the holder
/// exits (or the importer unmaps it) and the exporter's uid has no process left (the new one
/// exits too), the charge goes with the slice.
fn restart_case(exporter: u32, other: u32, importer: bool, exporter_dies_while_down: bool) {
    need_root!();
    let mut n = Node::new(1, "4Gi", &["--on-violation", "kill"]);
    let ctx = gpuslice_e2e::fake_context_bytes(4 * GI);
    let dir = socket_dir(&n);
    let sock = dir.join("a.sock");
    let mut x = Client::new(&n, exporter, "x", "1Gi", "vmm-export", &sock);
    assert_eq!(x.ask("create 256")["status"], 0);
    let (mut h, mut m) = (None, None);
    if importer {
        let mut c = Client::new(&n, other, "y", "1Gi", "vmm-import", &sock);
        let got = x.hand(&mut c, "import");
        assert_eq!(
            (&got["status"], &got["read_ok"]),
            (&0.into(), &true.into()),
            "{got}"
        );
        m = Some(c);
    } else {
        assert_eq!(x.ask("send")["event"], "listening");
        let mut c = holder(other, &sock);
        let mut out = BufReader::new(c.stdout.take().unwrap());
        assert_eq!(line(&mut out), "held 1");
        let sent = x.read();
        assert!(sent.get("error").is_none(), "{sent}");
        h = Some(c);
    }
    let reaped = format!("reaped pid {}:", x.pid);
    let mut alive = Some(x);
    if !exporter_dies_while_down {
        alive.take().unwrap().exit();
        wait_for("x reaped", &n, || n.monitor_log().contains(&reaped));
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(used(&n).get("x"), Some(&(256 * MI)), "the holder keeps it");
    }

    n.stop_monitor();
    if let Some(mut x) = alive {
        // Its charge is in its own word of a region only it and the dead monitor held.
        x.child.kill().unwrap();
        x.child.wait().unwrap();
    }
    let restarts = n.monitor_log().matches("node mode: the policy").count();
    n.start_monitor();
    // Past the restarted monitor's first ticks and descriptor scans.
    wait_for("the monitor restarted", &n, || {
        n.monitor_log().matches("node mode: the policy").count() > restarts
    });
    if exporter_dies_while_down {
        // Only the restarted monitor can say it: the first one stopped with x alive.
        wait_for("x reaped", &n, || n.monitor_log().contains(&reaped));
    }
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(used(&n).get("x"), Some(&(256 * MI)), "{}", n.monitor_log());
    one_orphan_of_x(&n, 256 * MI, usize::from(importer));
    let mut late = Client::new(&n, exporter, "x", "1Gi", "vmm-import", &dir.join("b.sock"));
    let info = late.ask("info");
    assert_eq!(
        info["free"],
        GI - ctx - 256 * MI,
        "charged after the restart: {info}"
    );
    let rest = (GI - ctx - 256 * MI) / MI;
    let got = late.ask(&format!("alloc {rest}"));
    assert_eq!(
        (&got["status"], &got["free"]),
        (&0.into(), &0.into()),
        "{got}"
    );
    assert_eq!(late.ask("alloc 1")["status"], CUDA_ERROR_OUT_OF_MEMORY);
    assert!(
        n.monitor_log().contains("keeps 256 MiB of exported memory"),
        "{}",
        n.monitor_log()
    );

    assert!(!n.monitor_log().contains("audit:"), "{}", n.monitor_log());
    // The new process of the exporter's uid keeps the record while it lives (a descriptor may
    // be where no scan sees it: docs/security.md); once it exited, the holder still does.
    late.exit();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(used(&n).get("x"), Some(&(256 * MI)), "the holder keeps it");
    if let Some(mut h) = h {
        drop(h.stdin.take());
        assert!(h.wait().unwrap().success());
    }
    if let Some(m) = &mut m {
        let gone = m.ask("unmap");
        assert_eq!(
            (&gone["unmap"], &gone["release"]),
            (&0.into(), &0.into()),
            "{gone}"
        );
    }
    wait_for("the record let go", &n, || !used(&n).contains_key("x"));
    assert_eq!(n.status()["orphans"], serde_json::json!([]));
    if let Some(m) = m {
        m.exit();
    }
}

#[test]
fn a_record_only_a_descriptor_holds_survives_a_monitor_restart() {
    restart_case(RESTART_EXPORTER, RESTART_HOLDER, false, false);
}

#[test]
fn a_record_an_importer_holds_survives_a_monitor_restart() {
    restart_case(RESTART_EXPORTER_2, RESTART_IMPORTER, true, false);
}

#[test]
fn a_record_whose_exporter_died_while_the_monitor_was_down_stays_charged() {
    restart_case(RESTART_EXPORTER_3, RESTART_IMPORTER_3, true, true);
}

/// Issue #34: a monitor SIGKILLed and restarted while the exporter lives (an importer holding
/// its export) recovers the exporter's slice from its region once: the slice is charged its
/// context and the 256 MiB, never twice (the record's bytes are in the exporter's own word
/// already), and the exporter can still allocate the rest of its quota. Once it exits the
/// importer holds the charge; once the importer unmaps and exits, it goes.
#[test]
fn a_restart_with_the_exporter_alive_charges_its_export_once() {
    need_root!();
    let mut n = Node::new(1, "4Gi", &["--on-violation", "kill"]);
    let ctx = gpuslice_e2e::fake_context_bytes(4 * GI);
    let sock = socket_dir(&n).join("live.sock");
    let mut x = Client::new(&n, LIVE_EXPORTER, "x", "1Gi", "vmm-export", &sock);
    assert_eq!(x.ask("create 256")["status"], 0);
    let mut m = Client::new(&n, LIVE_IMPORTER, "y", "1Gi", "vmm-import", &sock);
    let got = x.hand(&mut m, "import");
    assert_eq!(
        (&got["status"], &got["read_ok"]),
        (&0.into(), &true.into()),
        "{got}"
    );
    let before = used(&n);
    assert_eq!(before.get("x"), Some(&(256 * MI + ctx)), "{before:?}");

    let restarts = n.monitor_log().matches("node mode: the policy").count();
    n.stop_monitor();
    n.start_monitor();
    wait_for("the monitor restarted", &n, || {
        n.monitor_log().matches("node mode: the policy").count() > restarts
    });
    // Past the restarted monitor's first ticks and descriptor scans.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(used(&n), before, "{}", n.monitor_log());
    assert_eq!(x.ask("info")["free"], GI - ctx - 256 * MI);
    let rest = (GI - ctx - 256 * MI) / MI;
    let got = x.ask(&format!("alloc {rest}"));
    assert_eq!(
        (&got["status"], &got["free"]),
        (&0.into(), &0.into()),
        "{got}"
    );
    assert_eq!(x.ask("alloc 1")["status"], CUDA_ERROR_OUT_OF_MEMORY);

    x.exit();
    wait_for("x held by its importer", &n, || {
        used(&n).get("x") == Some(&(256 * MI))
    });
    let gone = m.ask("unmap");
    assert_eq!(
        (&gone["unmap"], &gone["release"]),
        (&0.into(), &0.into()),
        "{gone}"
    );
    m.exit();
    wait_for("x uncharged", &n, || !used(&n).contains_key("x"));
    assert_eq!(n.status()["orphans"], serde_json::json!([]));
    assert!(!n.monitor_log().contains("audit:"), "{}", n.monitor_log());
}
