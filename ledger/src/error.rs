//! Errors of the ledger, worded for the person who has to act on them.

use std::fmt;
use std::path::PathBuf;

/// Why the ledger could not be opened or changed.
#[derive(Debug)]
pub enum LedgerError {
    /// A system call on the ledger file or directory failed.
    Io {
        /// What was being done.
        what: String,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `Ledger::open` found no ledger in the directory.
    NotFound(PathBuf),
    /// The file is not a gpuslice ledger, or one of another layout version.
    Incompatible {
        /// The file.
        path: PathBuf,
        /// What did not match.
        detail: String,
    },
    /// The creator never finished initialising the file.
    NotReady(PathBuf),
    /// The cold-path lock could not be taken in time.
    LockTimeout {
        /// The file.
        path: PathBuf,
        /// How long we waited, in milliseconds.
        waited_ms: u64,
        /// pid of the holder as it recorded itself (0: unknown).
        holder: u32,
    },
    /// A fixed-size table is full.
    Full(&'static str),
    /// A fixed-size table is full; says who holds its records.
    TableFull {
        /// Which table (`process`, `slice`).
        table: &'static str,
        /// Its size.
        size: usize,
        /// Who holds the records (`uid 1000 holds 300, uid 0 holds 212`).
        holders: String,
    },
    /// A slice or device named by the caller does not exist.
    NoSuchSlice(String),
    /// A slice of that name already exists on the device.
    Exists(String),
    /// A device named by index or UUID is not in the ledger.
    NoSuchDevice(String),
    /// A slice name that cannot be stored.
    BadName(String),
    /// A new slice does not fit what its device has left (the fit rule, `ledger/join.rs`).
    DoesNotFit(FitError),
    /// `GPUSLICE_RUNTIME_DIR` is not an absolute path.
    RelativeRuntimeDir(PathBuf),
    /// The runtime directory fails the ownership/mode checks.
    UnsafeDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        fix: String,
    },
    /// A file in the runtime directory fails the checks (symlink, owner, mode).
    UnsafeFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A path that cannot be passed to the OS (holds a NUL byte).
    BadPath(String),
    /// A node-mode slice region could not be made, passed or used.
    Region(String),
    /// The node's monitor refused or could not be asked (its message, for the user).
    Monitor(String),
    /// A record of the ledger holds a value that makes no sense (named): it was not used.
    Corrupt(&'static str),
    /// The ledger is mapped read-only here (root's node directory seen by another user).
    ReadOnly(PathBuf),
    /// A slice's join secret that cannot be used, or a join without the right one (the
    /// message, for the user; never the secret itself).
    BadSecret(String),
    /// Node mode: a user already holds as many records of a table as the operator allows.
    UserLimit {
        /// The user.
        uid: u32,
        /// How many records of the table it holds.
        holds: usize,
        /// Which records (`process`, `slice`).
        table: &'static str,
        /// The monitor's flag that sets the limit.
        flag: &'static str,
    },
}

impl LedgerError {
    /// Whether this refuses what a process asked for (its slice does not fit, a per-user
    /// limit) rather than failing around it: a refused process's `cuInit` returns
    /// `CUDA_ERROR_INVALID_VALUE` for these, `CUDA_ERROR_OPERATING_SYSTEM` for the rest.
    pub fn refuses_the_request(&self) -> bool {
        matches!(
            self,
            LedgerError::DoesNotFit(_) | LedgerError::UserLimit { .. }
        )
    }
}

/// A slice that does not fit on its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitError {
    /// The setting that asked for it (a variable like `GPUSLICE_MEMORY`, or a flag).
    pub setting: String,
    /// Device UUID.
    pub device: String,
    /// What was requested, rendered for a person (`2.0 GiB`, `0.60`).
    pub requested: String,
    /// What is left, rendered the same way.
    pub available: String,
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: requested {}, available {} on {}",
            self.setting, self.requested, self.available, self.device
        )
    }
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerError::Io { what, path, source } => {
                write!(f, "cannot {what} {}: {source}", path.display())
            }
            LedgerError::NotFound(p) => write!(
                f,
                "no ledger at {} (no gpuslice process has started there; is GPUSLICE_RUNTIME_DIR right?)",
                p.display()
            ),
            LedgerError::Incompatible { path, detail } => write!(
                f,
                "{} is not a ledger this gpuslice can use ({detail}); stop the processes using it, \
                 remove it, or use the same gpuslice version everywhere",
                path.display()
            ),
            LedgerError::NotReady(p) => {
                write!(f, "ledger {} was never completely initialised; remove it", p.display())
            }
            LedgerError::LockTimeout {
                path,
                waited_ms,
                holder,
            } => write!(
                f,
                "ledger {} stayed locked for {waited_ms} ms: the process holding it (pid {holder}, \
                 as it sees itself) is stuck or stopped; resume or end it",
                path.display()
            ),
            LedgerError::Full(what) => write!(f, "the ledger's {what} table is full"),
            LedgerError::TableFull {
                table,
                size,
                holders,
            } => write!(
                f,
                "the ledger's {table} table is full ({size} records; {holders}); a record comes \
                 back when its process exits"
            ),
            LedgerError::NoSuchSlice(n) => write!(f, "no slice named {n:?}"),
            LedgerError::Exists(n) => write!(f, "a slice named {n:?} already exists on that device"),
            LedgerError::NoSuchDevice(d) => write!(f, "no device {d:?} in the ledger"),
            LedgerError::BadName(n) => write!(
                f,
                "slice name {n:?} is not accepted: 1 to 63 bytes of letters, digits, '-', '_', '.', ':' or '/'"
            ),
            LedgerError::DoesNotFit(a) => a.fmt(f),
            LedgerError::RelativeRuntimeDir(p) => write!(
                f,
                "GPUSLICE_RUNTIME_DIR={:?} is not valid; accepted: an absolute directory path",
                p.display().to_string()
            ),
            LedgerError::UnsafeDir { path, problem, fix } => write!(
                f,
                "refusing the runtime directory {}: it {problem}; to fix: {fix}",
                path.display()
            ),
            LedgerError::UnsafeFile { path, problem } => write!(
                f,
                "refusing {}: it {problem}; gpuslice never uses such a file (remove it; the \
                 directory's owner recreates it)",
                path.display()
            ),
            LedgerError::Region(m) => write!(f, "slice region: {m}"),
            LedgerError::Monitor(m) => f.write_str(m),
            LedgerError::UserLimit {
                uid,
                holds,
                table,
                flag,
            } => {
                let verb = if *table == "slice" { "owns" } else { "holds" };
                write!(
                    f,
                    "uid {uid} already {verb} {holds} of the node's {table} records, its limit \
                     (the operator sets it with `gpuslice monitor {flag}`)"
                )
            }
            LedgerError::BadSecret(m) => f.write_str(m),
            LedgerError::Corrupt(what) => write!(
                f,
                "the ledger holds an impossible {what} (scribbled over?); it was not used"
            ),
            LedgerError::ReadOnly(p) => write!(
                f,
                "{} belongs to root and is read-only for you: only root (through the node's \
                 monitor) changes it",
                p.display()
            ),
            LedgerError::BadPath(p) => write!(f, "path {p:?} holds a NUL byte"),
        }
    }
}

impl std::error::Error for LedgerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LedgerError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<FitError> for LedgerError {
    fn from(a: FitError) -> Self {
        LedgerError::DoesNotFit(a)
    }
}

/// Render a byte count for a person: `1 GiB`, `1.50 GiB`, `512 MiB`, `1000 B`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, unit) in UNITS {
        if b >= unit {
            return if b.is_multiple_of(unit) {
                format!("{} {name}", b / unit)
            } else {
                format!("{:.2} {name}", b as f64 / unit as f64)
            };
        }
    }
    format!("{b} B")
}
