//! `gpuslice run`: run one program under gpuslice.
//!
//! The wrapper checks everything it can before anything starts (flags, values, the library, the
//! program), then sets the `GPUSLICE_*` variables and `LD_PRELOAD` for the child only, starts
//! the node monitor in the background when none holds this ledger's lock, and spawns the
//! program. It stays as the program's parent rather than `exec`ing it so that the monitor
//! notice, signal forwarding and the exit status behave the same way every time; the cost is
//! one sleeping process.
//!
//! - Exit status: the program's own, or `128 + N` when a signal `N` killed it; 2 for bad usage
//!   or a missing library; 127/126 when the program cannot be found/executed (as `env` does).
//! - Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to the wrapper are
//!   passed on to the program. Ones the kernel generated (Ctrl-C at a terminal) are not, since
//!   the program is in the same foreground process group and already got them.
//! - The library: `$GPUSLICE_LIBRARY` when set (an explicit choice, never silently replaced),
//!   else `libgpuslice.so` beside the binary (a cargo build), else `../lib/libgpuslice.so`
//!   (an install prefix). [`find_library`] is shared with `gpuslice cdi`.
//! - `LD_PRELOAD`: ours first, then the user's entries; entries naming a `libgpuslice.so` are
//!   dropped, and ours is left out when `/etc/ld.so.preload` already lists one, so the shim is
//!   never loaded twice.
//! - Variables already in the environment apply when their flag is not given; flags win.
//! - One slice for the whole process tree: without `--slice` (or `GPUSLICE_SLICE` /
//!   `CUDA_DEVICE_MEMORY_SHARED_CACHE` in the environment) CMD gets a generated
//!   `GPUSLICE_SLICE` ([`generated_slice_name`]), so its workers share one quota.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::cli::{self, Failure};
use crate::error::{LibraryError, SettingError};

const USAGE: &cli::Command = &crate::commands::RUN;

/// File name of the shim, as built by cargo and as installed.
pub const LIBRARY_NAME: &str = "libgpuslice.so";

/// Signals passed on to the program.
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// The running child's pid, read by the signal handler; 0 when there is none (before the spawn,
/// and once it has exited, so a signal never reaches a reused pid).
static CHILD: AtomicI32 = AtomicI32::new(0);
/// A signal that arrived between installing the handler and the spawn, delivered right after.
static PENDING: AtomicI32 = AtomicI32::new(0);

/// Entry point of `gpuslice run`; returns the exit status.
pub fn main(args: Vec<OsString>) -> i32 {
    match run(args) {
        Ok(code) => code,
        Err(f) => f.report(),
    }
}

/// What the command line asked for.
#[derive(Debug, Default)]
pub struct Limits {
    /// `--memory`: passed verbatim as `GPUSLICE_MEMORY` once it parses.
    pub memory: Option<String>,
    /// `--compute`: `GPUSLICE_COMPUTE`.
    pub compute: Option<String>,
    /// `--compute-cap`: `GPUSLICE_COMPUTE_CAP`.
    pub compute_cap: Option<String>,
    /// `--slice`: `GPUSLICE_SLICE`.
    pub slice: Option<String>,
    /// `--priority`: `GPUSLICE_PRIORITY` (`latency` or `normal`).
    pub priority: Option<String>,
}

impl Limits {
    /// The variables these limits set, in a fixed order.
    pub fn env(&self) -> Vec<(&'static str, &str)> {
        let mut v = Vec::new();
        for (name, value) in [
            ("GPUSLICE_MEMORY", &self.memory),
            ("GPUSLICE_COMPUTE", &self.compute),
            ("GPUSLICE_COMPUTE_CAP", &self.compute_cap),
            ("GPUSLICE_SLICE", &self.slice),
            ("GPUSLICE_PRIORITY", &self.priority),
        ] {
            if let Some(value) = value {
                v.push((name, value.as_str()));
            }
        }
        v
    }

    /// The flags (without `--`) that [`Limits::set`] takes; `gpuslice cdi` shares them.
    pub const FLAGS: [&'static str; 5] = ["memory", "compute", "compute-cap", "slice", "priority"];

    /// Set one of [`Limits::FLAGS`] from its value, the next of `args`, validating it.
    pub fn set(&mut self, name: &str, args: &mut cli::Args) -> Result<(), Failure> {
        let flag = format!("--{name}");
        let value = args.utf8(&flag)?;
        let usage = args.usage;
        check_value(&flag, &value).map_err(|e| Failure::usage(e.to_string(), usage))?;
        let slot = match name {
            "memory" => &mut self.memory,
            "compute" => &mut self.compute,
            "compute-cap" => &mut self.compute_cap,
            "priority" => &mut self.priority,
            _ => &mut self.slice,
        };
        cli::once(slot, &flag, value, usage)
    }

    /// Checks that need more than one flag: a cap below the share it caps (the ledger's rule,
    /// the one the shim applies to the variables).
    pub fn check(&self, usage: &'static cli::Command) -> Result<(), Failure> {
        use gpuslice_quantity::{
            check_cap_not_below_share, parse_cap_per_device, parse_fraction_per_device,
            ComputeSetting,
        };
        let (Some(share), Some(cap)) = (&self.compute, &self.compute_cap) else {
            return Ok(());
        };
        // Each value was checked by `set`.
        let (Ok(share_parsed), Ok(cap_parsed)) = (
            parse_fraction_per_device("--compute", share),
            parse_cap_per_device("--compute-cap", cap),
        ) else {
            return Ok(());
        };
        check_cap_not_below_share(
            ComputeSetting {
                setting: "--compute",
                value: share,
                parsed: &share_parsed,
            },
            ComputeSetting {
                setting: "--compute-cap",
                value: cap,
                parsed: &cap_parsed,
            },
        )
        .map_err(|e| Failure::usage(e.to_string(), usage))
    }
}

/// Validate one flag's value with the ledger's parsers and rules (the ones the shim applies to
/// the variables), so a value `run` accepts is one the shim accepts, and a bad one is a usage
/// error here rather than a failed `cuInit` inside the program. The message names the flag,
/// the value and the accepted forms.
fn check_value(flag: &str, value: &str) -> Result<(), SettingError> {
    use gpuslice_quantity::{
        check_slice_name, parse_cap_per_device, parse_fraction_per_device, parse_size_per_device,
    };
    // `parse_size_per_device` is the quota parser: it refuses 0, as the shim does.
    match flag {
        "--memory" => parse_size_per_device(flag, value).map(drop),
        "--compute" => parse_fraction_per_device(flag, value).map(drop),
        "--compute-cap" => parse_cap_per_device(flag, value).map(drop),
        "--slice" => check_slice_name(flag, value),
        "--priority" => return cli::priority_class(value).map(drop),
        _ => Ok(()),
    }
    .map_err(SettingError::Quantity)
}

/// Parse `gpuslice run`'s arguments: the limits and the program's command line (no side
/// effects; `--help` is [`Failure::Helped`]).
pub(crate) fn parse(args: Vec<OsString>) -> Result<(Limits, Vec<OsString>), Failure> {
    let mut limits = Limits::default();
    let mut args = cli::Args::new(args, USAGE);
    let mut command: Vec<OsString> = Vec::new();
    while let Some(arg) = args.next()? {
        match arg {
            lexopt::Arg::Long(name) if Limits::FLAGS.contains(&name) => {
                let name = name.to_string();
                limits.set(&name, &mut args)?;
            }
            // The first word that is not an option starts the program; everything after it,
            // options included, is the program's (`--` is optional but allowed).
            lexopt::Arg::Value(program) => {
                command.push(program);
                command.extend(args.parser.raw_args().map_err(cli::lex(USAGE))?);
                break;
            }
            other => return Err(Failure::usage(other.unexpected().to_string(), USAGE)),
        }
    }
    limits.check(USAGE)?;
    if command.is_empty() {
        return Err(Failure::usage(
            "missing the program to run (CMD ARGS...)",
            USAGE,
        ));
    }
    Ok((limits, command))
}

fn run(args: Vec<OsString>) -> Result<i32, Failure> {
    let (mut limits, command) = parse(args)?;
    // Under /etc/ld.so.preload the shim is in every process already: adding another copy
    // would intercept twice, so the program gets only the user's entries then.
    let system_wide = read_system_preload()
        .and_then(|text| system_shim(&text))
        .filter(|p| p.is_file());
    let library = match (&system_wide, find_library()) {
        (_, Ok(l)) => Some(l),
        (Some(_), Err(_)) => None,
        (None, Err(e)) => return Ok(fail(cli::EXIT_USAGE, &e.to_string())),
    };
    let program = match resolve_program(&command[0]) {
        Ok(p) => p,
        Err((code, msg)) => return Ok(fail(code, &msg)),
    };

    if std::env::var_os("GPUSLICE_DISABLE").as_deref() != Some(OsStr::new("1")) {
        ensure_monitor();
    }

    // CMD and every process it starts form one slice: without a name of the user's, a
    // generated one, so a spawn pool or torchrun's ranks share the quota instead of each
    // taking all of it.
    if limits.slice.is_none() && !slice_named_by_env() {
        limits.slice = Some(generated_slice_name());
    }
    let mut cmd = std::process::Command::new(&program);
    cmd.arg0(&command[0]).args(&command[1..]);
    for (k, v) in limits.env() {
        cmd.env(k, v);
    }
    let ours = if system_wide.is_some() {
        None
    } else {
        library.as_deref()
    };
    match preload_list(std::env::var_os("LD_PRELOAD").as_deref(), ours) {
        Some(list) => cmd.env("LD_PRELOAD", list),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    spawn_and_wait(cmd, &command[0])
}

/// Whether the environment already groups CMD's processes into a slice (`GPUSLICE_SLICE`, or
/// HAMi's `CUDA_DEVICE_MEMORY_SHARED_CACHE`, which the shim turns into one): then `run` keeps
/// that grouping.
fn slice_named_by_env() -> bool {
    ["GPUSLICE_SLICE", "CUDA_DEVICE_MEMORY_SHARED_CACHE"]
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

/// `run-<pid>-<random>`: a slice name of this run alone (the pid of this wrapper, which lives
/// as long as CMD, and 32 random bits so a reused pid never meets a slice left from before).
/// The slice is an ordinary process slice: the ledger removes it with its last process.
pub fn generated_slice_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS's random source once per process, then varied.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("run-{}-{:08x}", std::process::id(), h.finish() as u32)
}

/// Print `gpuslice: MSG` and return `code`.
fn fail(code: i32, msg: &str) -> i32 {
    eprintln!("gpuslice: {msg}");
    code
}

/// Where `libgpuslice.so` is: `$GPUSLICE_LIBRARY` when set, else beside this binary, else in
/// `../lib` from it. The error says where it looked and what to do; callers exit 2 with it.
pub fn find_library() -> Result<PathBuf, LibraryError> {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|e| e.canonicalize().ok());
    library_from(std::env::var_os("GPUSLICE_LIBRARY"), exe.as_deref())
}

fn library_from(var: Option<OsString>, exe: Option<&Path>) -> Result<PathBuf, LibraryError> {
    if let Some(var) = var.filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&var);
        if p.is_file() {
            // Absolute, so LD_PRELOAD does not depend on the program's working directory.
            return Ok(p.canonicalize().unwrap_or(p));
        }
        return Err(LibraryError::NoSuchFile(p));
    }
    let mut looked = Vec::new();
    if let Some(dir) = exe.and_then(Path::parent) {
        for candidate in [
            dir.join(LIBRARY_NAME),
            dir.join("../lib").join(LIBRARY_NAME),
        ] {
            if candidate.is_file() {
                return Ok(candidate.canonicalize().unwrap_or(candidate));
            }
            looked.push(candidate);
        }
    }
    Err(LibraryError::NotFound {
        name: LIBRARY_NAME,
        looked,
    })
}

/// The program's path, found on `PATH` like `execvp` would; 127 when it is not there and 126
/// when it is not executable, before the monitor starts.
fn resolve_program(name: &OsStr) -> Result<PathBuf, (i32, String)> {
    let not_found = |why: &str| {
        (
            127,
            format!("run: cannot run {}: {why}", Path::new(name).display()),
        )
    };
    if name.is_empty() {
        return Err(not_found("empty program name"));
    }
    let candidates: Vec<PathBuf> = if name.as_bytes().contains(&b'/') {
        vec![PathBuf::from(name)]
    } else {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        std::env::split_paths(&path)
            .map(|d| {
                if d.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    d
                }
            })
            .map(|d| d.join(name))
            .collect()
    };
    let mut denied = None;
    for c in candidates {
        if !c.is_file() {
            continue;
        }
        if executable(&c) {
            return Ok(c);
        }
        denied.get_or_insert(c);
    }
    match denied {
        Some(c) => Err((
            126,
            format!("run: cannot run {}: permission denied", c.display()),
        )),
        None => Err(not_found("command not found")),
    }
}

fn executable(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call; access() only reads it.
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
}

/// `LD_PRELOAD` for the program: ours first (when given), then the user's entries in their
/// order; `None` when that leaves nothing. Entries naming any `libgpuslice.so` are dropped so
/// the shim is never loaded twice (two copies of the file would both intercept and count every
/// allocation twice; the loader folds only the same file).
pub fn preload_list(existing: Option<&OsStr>, library: Option<&Path>) -> Option<OsString> {
    let mut entries: Vec<&OsStr> = library.map(Path::as_os_str).into_iter().collect();
    for entry in existing
        .map(OsStr::as_bytes)
        .unwrap_or_default()
        .split(|b| b" :\t".contains(b))
    {
        let entry = OsStr::from_bytes(entry);
        if !entry.is_empty() && Path::new(entry).file_name() != Some(OsStr::new(LIBRARY_NAME)) {
            entries.push(entry);
        }
    }
    (!entries.is_empty()).then(|| entries.join(OsStr::new(":")))
}

/// The contents of `/etc/ld.so.preload`, if there is one.
fn read_system_preload() -> Option<String> {
    std::fs::read_to_string("/etc/ld.so.preload").ok()
}

/// The `libgpuslice.so` that an `/etc/ld.so.preload` text lists, if any (entries are separated
/// by whitespace or `:`, as the loader reads them).
pub fn system_shim(text: &str) -> Option<PathBuf> {
    text.split(|c: char| c.is_whitespace() || c == ':')
        .map(Path::new)
        .find(|p| p.file_name() == Some(OsStr::new(LIBRARY_NAME)))
        .map(Path::to_path_buf)
}

/// Start the node monitor in the background when none is running for this ledger, saying so
/// once. Failing to start it is a warning: enforcement works without it (only reaping of dead
/// processes and the audit wait for it).
fn ensure_monitor() {
    let dir = cli::runtime_dir();
    match crate::daemon::start_background(&dir) {
        Ok((_, false)) => {}
        Ok((pid, true)) => eprintln!(
            "gpuslice: started the node monitor in the background (pid {pid}, ledger {}, log \
             {}); it keeps running after this program",
            dir.display(),
            dir.join(crate::daemon::LOG_FILE).display()
        ),
        Err(e) => eprintln!(
            "gpuslice: warning: could not start the node monitor for {}: {e}; quotas still \
             apply, but memory of crashed processes is returned only once `gpuslice monitor` \
             runs",
            dir.display()
        ),
    }
}

fn spawn_and_wait(mut cmd: std::process::Command, name: &OsStr) -> Result<i32, Failure> {
    install_forwarding();
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // As a shell says: 127 not found, 126 found but not executable (ENOEXEC, EACCES).
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Ok(fail(
                code,
                &format!("run: cannot run {}: {e}", Path::new(name).display()),
            ));
        }
    };
    let pid = child.id() as libc::pid_t;
    CHILD.store(pid, Ordering::SeqCst);
    let early = PENDING.swap(0, Ordering::SeqCst);
    if early > 0 {
        // SAFETY: kill() on our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, early) };
    }
    wait_exited(pid);
    // The child is a zombie now: its pid cannot be reused until it is reaped below, so clearing
    // CHILD first means a late signal is never sent to a stranger.
    CHILD.store(0, Ordering::SeqCst);
    let mut child = child;
    let status = child
        .wait()
        .map_err(|e| Failure::Other(format!("run: waiting for the program: {e}")))?;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        _ => cli::EXIT_FAILURE,
    })
}

/// Block until `pid` has exited, without reaping it.
fn wait_exited(pid: libc::pid_t) {
    loop {
        // SAFETY: siginfo_t is plain data and all-zero is a valid value; waitid writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable siginfo_t for the duration of the call.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // Kernel-generated signals (si_code > 0: a terminal's Ctrl-C, Ctrl-\, hangup) went to the
    // whole foreground process group, the program included; sending them again would deliver
    // them twice. Signals from kill()/sigqueue() (si_code <= 0) were meant for us: pass them on.
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let from_kernel = !info.is_null() && unsafe { (*info).si_code } > 0;
    let pid = CHILD.load(Ordering::SeqCst);
    if pid == 0 {
        // Before the spawn (after the exit this is never read): nobody else got it either.
        PENDING.store(sig, Ordering::SeqCst);
    } else if !from_kernel {
        // SAFETY: kill() is async-signal-safe; errno is saved and restored around it so the
        // interrupted code does not see it change.
        unsafe {
            let errno = *libc::__errno_location();
            libc::kill(pid, sig);
            *libc::__errno_location() = errno;
        }
    }
}

/// Install [`forward`] for the forwarded signals. A signal that was ignored when we started
/// (`nohup`, a background job's SIGINT) stays ignored, and the program inherits that, as it
/// would without the wrapper.
fn install_forwarding() {
    for sig in FORWARDED {
        // SAFETY: sigaction is plain data; all-zero is a valid value, filled in by the calls.
        let (mut act, mut old): (libc::sigaction, libc::sigaction) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: a null new action only reads the current one into `old`, a valid pointer.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0
            && old.sa_sigaction == libc::SIG_IGN
        {
            continue;
        }
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = forward;
        act.sa_sigaction = handler as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // SAFETY: `act.sa_mask` is a valid sigset_t to initialise; the handler only reads an
        // atomic and calls async-signal-safe kill(). The program does not inherit the handler:
        // exec resets caught signals to their default action.
        unsafe {
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_keeps_user_entries_after_ours() {
        let lib = Some(Path::new("/opt/g/lib/libgpuslice.so"));
        let list = |existing: Option<&str>, lib| preload_list(existing.map(OsStr::new), lib);
        assert_eq!(list(None, lib), Some("/opt/g/lib/libgpuslice.so".into()));
        assert_eq!(
            list(Some("/a/liba.so /b/libb.so"), lib),
            Some("/opt/g/lib/libgpuslice.so:/a/liba.so:/b/libb.so".into())
        );
        assert_eq!(
            list(Some("libx.so:/usr/local/lib/libgpuslice.so::"), lib),
            Some("/opt/g/lib/libgpuslice.so:libx.so".into())
        );
        // Shim preloaded system-wide: only the user's entries, or no LD_PRELOAD at all.
        assert_eq!(
            list(Some("/a/liba.so /x/libgpuslice.so"), None),
            Some("/a/liba.so".into())
        );
        assert_eq!(list(Some("/x/libgpuslice.so"), None), None);
        assert_eq!(list(None, None), None);
    }

    #[test]
    fn system_wide_preload_is_recognised() {
        assert_eq!(system_shim(""), None);
        assert_eq!(system_shim("/usr/lib/libfoo.so\n"), None);
        assert_eq!(
            system_shim("/usr/lib/libfoo.so\n/usr/lib/gpuslice/libgpuslice.so\n"),
            Some(PathBuf::from("/usr/lib/gpuslice/libgpuslice.so"))
        );
    }

    #[test]
    fn library_var_wins_and_is_never_silently_replaced() {
        let dir = std::env::temp_dir().join(format!("gpuslice-runlib-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        let exe = dir.join("bin/gpuslice");
        // Nothing anywhere: a usage error naming both places looked at.
        let msg = library_from(None, Some(&exe)).unwrap_err().to_string();
        assert!(
            msg.contains("bin/libgpuslice.so") && msg.contains("lib/libgpuslice.so"),
            "{msg}"
        );
        // ../lib, then beside the binary (which wins).
        std::fs::write(dir.join("lib").join(LIBRARY_NAME), b"").unwrap();
        let found = library_from(None, Some(&exe)).unwrap();
        assert!(found.ends_with("lib/libgpuslice.so"), "{found:?}");
        std::fs::write(dir.join("bin").join(LIBRARY_NAME), b"").unwrap();
        let found = library_from(None, Some(&exe)).unwrap();
        assert!(found.ends_with("bin/libgpuslice.so"), "{found:?}");
        // A GPUSLICE_LIBRARY that does not exist is an error, not a fallback.
        let var = Some(OsString::from("/nonexistent/libgpuslice.so"));
        let msg = library_from(var, Some(&exe)).unwrap_err().to_string();
        assert!(
            msg.contains("GPUSLICE_LIBRARY=/nonexistent/libgpuslice.so"),
            "{msg}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
