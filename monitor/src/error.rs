//! The monitor's errors, kept as data and worded where they are shown: on the operator's
//! terminal ([`crate::cli::Failure`]), in the monitor's log, or (a [`RequestError`]) in the
//! refusal a process reads from `monitor.sock`.

use gpuslice_abi::CUresult;
use gpuslice_ledger::LedgerError;
use gpuslice_protocol::{Refusal, Why};
use std::fmt;
use std::path::PathBuf;

/// Why the monitor, or a command that starts or finds one, could not do its work.
#[derive(Debug)]
pub enum Error {
    /// The ledger refused a file or directory (its checks: owner, mode, no symbolic link).
    Ledger(LedgerError),
    /// The runtime directory is root's: only root runs its monitor.
    RootsDir(PathBuf),
    /// A monitor already runs for `dir` (`pid`, when it wrote it) and holds `lock`.
    AlreadyRunning {
        /// The runtime directory.
        dir: PathBuf,
        /// The running monitor's pid, when known.
        pid: Option<u32>,
        /// The lock file.
        lock: PathBuf,
    },
    /// A monitor started in the background did not take its lock in time.
    DidNotStart {
        /// The binary started.
        exe: PathBuf,
        /// Its log.
        log: PathBuf,
        /// The log's last lines.
        tail: Vec<String>,
    },
    /// A system call failed: `cannot {what}[ {path}]: {source}`.
    Os {
        /// What was being done (`lock`, `create the admission socket`).
        what: &'static str,
        /// On which path, if any.
        path: Option<PathBuf>,
        /// Why.
        source: std::io::Error,
    },
    /// `--metrics-listen ADDR`: cannot listen there.
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The socket's address could not be made.
    Protocol(gpuslice_protocol::ProtocolError),
    /// The CUDA driver the balloons need.
    Driver(DriverError),
}

impl Error {
    /// A failed system call.
    pub fn os(what: &'static str, path: Option<PathBuf>, source: std::io::Error) -> Error {
        Error::Os { what, path, source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Ledger(e) => write!(f, "{e}"),
            Error::RootsDir(dir) => write!(
                f,
                "the runtime directory {} belongs to root: only root runs its monitor \
                 (`sudo gpuslice monitor`, or the node's service); set GPUSLICE_RUNTIME_DIR to a \
                 directory of your own for a personal one",
                dir.display()
            ),
            Error::AlreadyRunning { dir, pid, lock } => {
                let who = pid.map_or("another process".to_string(), |p| format!("pid {p}"));
                write!(
                    f,
                    "a monitor is already running for {} ({who} holds {})",
                    dir.display(),
                    lock.display()
                )
            }
            Error::DidNotStart { exe, log, tail } => write!(
                f,
                "started `{} monitor` but it did not come up within 5 s; last lines of {}: {}",
                exe.display(),
                log.display(),
                tail.join(" | ")
            ),
            Error::Os {
                what,
                path: Some(p),
                source,
            } => write!(f, "cannot {what} {}: {source}", p.display()),
            Error::Os {
                what,
                path: None,
                source,
            } => write!(f, "cannot {what}: {source}"),
            Error::Listen { addr, source } => {
                write!(f, "--metrics-listen {addr}: cannot listen there: {source}")
            }
            Error::Protocol(e) => write!(f, "{e}"),
            Error::Driver(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<LedgerError> for Error {
    fn from(e: LedgerError) -> Error {
        Error::Ledger(e)
    }
}

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Error {
        Error::Driver(e)
    }
}

/// Why the CUDA driver cannot hold the balloons (the monitor warns and goes on without).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverError {
    /// `dlopen("libcuda.so.1")` failed.
    NotLoaded,
    /// The library lacks an entry point.
    Missing(&'static str),
    /// A call failed with this status.
    Failed {
        /// The entry point.
        call: &'static str,
        /// What it returned.
        code: CUresult,
    },
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriverError::NotLoaded => write!(f, "cannot load libcuda.so.1"),
            DriverError::Missing(name) => write!(f, "libcuda.so.1 has no {name}"),
            DriverError::Failed { call, code } => {
                write!(f, "{call}: {}", gpuslice_abi::describe_cu(*code))
            }
        }
    }
}

/// Why a request on `monitor.sock` is refused; its text is the refusal's message.
#[derive(Debug)]
pub enum RequestError {
    /// The asking process exited before it could be identified.
    Gone(u32),
    /// `class` is not a priority class.
    NotAClass,
    /// An operator request from someone who is not root nor in the operator group.
    NotOperator {
        /// The asker.
        uid: u32,
        /// The operator group's name.
        group: String,
    },
    /// The ledger refused (a slice that does not fit, a bad secret, …).
    Ledger(LedgerError),
    /// A device the monitor does not know.
    UnknownDevice(String),
    /// The asker is not an admitted process (what it asked to do).
    NotAdmitted(&'static str),
    /// A request that needs a descriptor came without one, or with something else.
    NoDescriptor,
    /// The asker's record names no such device.
    BadDeviceIndex,
    /// No live slice of that index.
    NoSuchSlice,
    /// The slice is another user's.
    NotYours {
        /// The slice's index.
        slice: usize,
        /// The asker.
        uid: u32,
    },
    /// The slice has no region yet.
    NoRegion,
    /// The region could not be opened again read-only.
    Reopen(std::io::Error),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Gone(pid) => write!(f, "cannot read /proc/{pid}: the process is gone"),
            RequestError::NotAClass => {
                write!(f, "bad request: field \"class\" is not a priority class")
            }
            RequestError::NotOperator { uid, group } => write!(
                f,
                "permission denied: `gpuslice slice` changes the node's policy; only root or \
                 members of the operator group ({group}) may use it (you are uid {uid})"
            ),
            RequestError::Ledger(e) => write!(f, "{e}"),
            RequestError::UnknownDevice(uuid) => {
                write!(f, "device {uuid:?} is not one the node's monitor knows")
            }
            RequestError::NotAdmitted(what) => {
                write!(f, "not admitted: only an admitted process may {what}")
            }
            RequestError::NoDescriptor => {
                write!(
                    f,
                    "bad request: no descriptor of an exported allocation came with it"
                )
            }
            RequestError::BadDeviceIndex => write!(f, "bad device index"),
            RequestError::NoSuchSlice => write!(f, "no such slice"),
            RequestError::NotYours { slice, uid } => {
                write!(f, "slice {slice} is not yours (uid {uid})")
            }
            RequestError::NoRegion => write!(f, "that slice has no region yet"),
            RequestError::Reopen(e) => write!(f, "cannot reopen a region: {e}"),
        }
    }
}

impl std::error::Error for RequestError {}

impl RequestError {
    /// Its reason, for the refusal the asker reads as data.
    pub fn why(&self) -> Why {
        match self {
            RequestError::NotAClass | RequestError::NoDescriptor => Why::BadRequest,
            RequestError::NotOperator { .. }
            | RequestError::NotAdmitted(_)
            | RequestError::NotYours { .. } => Why::Denied,
            RequestError::NoSuchSlice | RequestError::Ledger(LedgerError::NoSuchSlice(_)) => {
                Why::NoSuchSlice
            }
            RequestError::Ledger(e) if e.refuses_the_request() => Why::Asked,
            RequestError::Gone(_)
            | RequestError::Ledger(_)
            | RequestError::UnknownDevice(_)
            | RequestError::BadDeviceIndex
            | RequestError::NoRegion
            | RequestError::Reopen(_) => Why::Other,
        }
    }
}

impl From<RequestError> for Refusal {
    fn from(e: RequestError) -> Refusal {
        Refusal::new(e.why(), e.to_string())
    }
}

impl From<LedgerError> for RequestError {
    fn from(e: LedgerError) -> RequestError {
        RequestError::Ledger(e)
    }
}

/// A `gpuslice run`/`cdi` flag's value that the shim would refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingError {
    /// A size, fraction, cap or slice name (the settings grammar's message).
    Quantity(gpuslice_quantity::QuantityError),
    /// `--priority` that is not a class.
    Priority(String),
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingError::Quantity(e) => write!(f, "{e}"),
            SettingError::Priority(v) => write!(f, "--priority {v:?}: expected latency or normal"),
        }
    }
}

/// `libgpuslice.so` not found; the message says where it looked and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibraryError {
    /// `GPUSLICE_LIBRARY` names no file.
    NoSuchFile(PathBuf),
    /// Not beside the binary nor in `../lib`.
    NotFound {
        /// The library's file name.
        name: &'static str,
        /// The places looked at (none when the binary's path is unknown).
        looked: Vec<PathBuf>,
    },
}

impl fmt::Display for LibraryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HOW: &str = "install it beside this binary with `scripts/install.sh PREFIX` (which \
                           puts it in PREFIX/lib; cargo install users: `scripts/install.sh \
                           ~/.cargo`), or set GPUSLICE_LIBRARY=/path/to/libgpuslice.so";
        match self {
            LibraryError::NoSuchFile(p) => {
                write!(f, "GPUSLICE_LIBRARY={}: no such file; {HOW}", p.display())
            }
            LibraryError::NotFound { name, looked } => {
                let looked = if looked.is_empty() {
                    "nowhere: this binary's path is unknown".to_string()
                } else {
                    let l: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
                    l.join(" and ")
                };
                write!(
                    f,
                    "{name} not found (looked at {looked}; GPUSLICE_LIBRARY is unset); {HOW}"
                )
            }
        }
    }
}
