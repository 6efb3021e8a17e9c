//! The runtime directory, opened once as a directory descriptor and checked before anything in
//! it is used.
//!
//! Every file gpuslice uses in the directory (`ledger`, `monitor.lock`, `monitor.log`,
//! `monitor.sock`) is opened relative to that descriptor with `O_NOFOLLOW | O_CLOEXEC`, and its
//! owner and mode are checked on the open descriptor (`fstat`), so neither a symlink nor a file
//! planted by another user is ever followed, truncated or written.
//!
//! Who owns the directory decides how it may be used (docs/security.md):
//! - owned by the caller (root or not), not writable by group or others: the caller's own
//!   directory ([`Owner::Caller`]). A non-root user's own directory is *personal mode*: one
//!   shared ledger that trusts its one user. Root's own directory holds either root's personal
//!   ledger or the node policy, as the ledger's header says.
//! - owned by root, not writable by group or others, the caller not root: a *node* directory
//!   ([`Owner::Root`]): the caller is a tenant and only reads there.
//! - anything else is refused, with a message saying what is wrong and how to fix it: a
//!   symlink, not a directory, writable by group or others (the old mode 1777), or owned by
//!   another user.

use crate::error::LedgerError;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The default runtime directory of root and of the node (`/dev/shm/gpuslice`).
pub const DEFAULT_RUNTIME_DIR: &str = "/dev/shm/gpuslice";

/// `GPUSLICE_RUNTIME_DIR`, or the default, with the one rule every gpuslice program applies:
/// the value must be an absolute path.
///
/// The default is [`DEFAULT_RUNTIME_DIR`] for root, and for any user when that directory
/// exists and belongs to root (a node whose monitor runs). Otherwise a non-root user gets
/// `/dev/shm/gpuslice-<uid>`, their own personal-mode directory: a tenant's first CUDA process
/// never creates the node's directory, so it can never stand in the way of root's monitor.
pub fn runtime_dir_from_env() -> Result<PathBuf, LedgerError> {
    match runtime_dir_var() {
        Some(p) => {
            check_absolute(&p)?;
            Ok(p)
        }
        None => Ok(default_runtime_dir()),
    }
}

/// `GPUSLICE_RUNTIME_DIR` as set, unchecked (`None` when unset or empty): the one place the
/// variable is read. Programs that default otherwise (the DRA plugin: the node's directory)
/// or show a refused value take it from here.
pub fn runtime_dir_var() -> Option<PathBuf> {
    std::env::var_os("GPUSLICE_RUNTIME_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The directory used when `GPUSLICE_RUNTIME_DIR` is unset (see [`runtime_dir_from_env`]).
pub fn default_runtime_dir() -> PathBuf {
    let euid = euid();
    if euid == 0 {
        return PathBuf::from(DEFAULT_RUNTIME_DIR);
    }
    let node = CString::new(DEFAULT_RUNTIME_DIR).expect("no NUL in a constant");
    // SAFETY: plain data out-parameter.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: valid path and out-parameter; lstat never follows the last component.
    if unsafe { libc::lstat(node.as_ptr(), &mut st) } == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFDIR
        && st.st_uid == 0
    {
        return PathBuf::from(DEFAULT_RUNTIME_DIR);
    }
    PathBuf::from(format!("{DEFAULT_RUNTIME_DIR}-{euid}"))
}

/// Refuse a relative runtime directory (the same message in the shim and the CLI).
pub fn check_absolute(p: &Path) -> Result<(), LedgerError> {
    if p.is_absolute() {
        Ok(())
    } else {
        Err(LedgerError::RelativeRuntimeDir(p.into()))
    }
}

/// The effective uid of the calling process.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Who owns a runtime directory that passed the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The calling user (root or not): they may create and write files there.
    Caller,
    /// Root, and the caller is not root: a node directory; the caller only reads.
    Root,
}

/// An opened and checked runtime directory.
#[derive(Debug)]
pub struct RuntimeDir {
    fd: OwnedFd,
    path: PathBuf,
    owner_uid: u32,
    owner: Owner,
}

/// How [`RuntimeDir::open_file`] opens a file.
#[derive(Debug, Clone, Copy)]
pub struct OpenHow {
    /// Read-write (else read-only).
    pub write: bool,
    /// Create it with this mode when missing (`None`: it must exist).
    pub create: Option<u32>,
    /// Fail if it exists (with `create`).
    pub exclusive: bool,
    /// Every write goes to the end (`O_APPEND`).
    pub append: bool,
}

impl OpenHow {
    /// An existing file, read-only.
    pub const READ: OpenHow = OpenHow {
        write: false,
        create: None,
        exclusive: false,
        append: false,
    };
    /// An existing file, read-write.
    pub const WRITE: OpenHow = OpenHow {
        write: true,
        create: None,
        exclusive: false,
        append: false,
    };
}

fn cstr(s: &[u8]) -> Result<CString, LedgerError> {
    CString::new(s).map_err(|_| LedgerError::BadPath(String::from_utf8_lossy(s).into_owned()))
}

fn os_err(what: &str, path: &Path) -> LedgerError {
    LedgerError::Io {
        what: what.into(),
        path: path.into(),
        source: std::io::Error::last_os_error(),
    }
}

impl RuntimeDir {
    /// Open and check an existing runtime directory.
    pub fn open(path: &Path) -> Result<RuntimeDir, LedgerError> {
        check_absolute(path)?;
        let c = cstr(path.as_os_str().as_bytes())?;
        // SAFETY: valid path; O_NOFOLLOW refuses a symlink as the last component.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOENT) => LedgerError::NotFound(path.into()),
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => LedgerError::UnsafeDir {
                    path: path.into(),
                    problem: "is a symbolic link or not a directory".into(),
                    fix: "remove it; gpuslice creates the directory itself".into(),
                },
                _ => LedgerError::Io {
                    what: "open directory".into(),
                    path: path.into(),
                    source: e,
                },
            });
        }
        // SAFETY: fd was just opened and is ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = fstat(fd.as_raw_fd()).map_err(|_| os_err("stat", path))?;
        let owner = classify(path, &st, euid())?;
        Ok(RuntimeDir {
            fd,
            path: path.into(),
            owner_uid: st.st_uid,
            owner,
        })
    }

    /// Open the runtime directory, creating it (mode 0700 for a user, 0755 for root, whose
    /// node directory tenants read) when missing. Its parent is created as needed.
    pub fn open_or_create(path: &Path) -> Result<RuntimeDir, LedgerError> {
        check_absolute(path)?;
        match RuntimeDir::open(path) {
            Err(LedgerError::NotFound(_)) => {}
            other => return other,
        }
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let c = cstr(path.as_os_str().as_bytes())?;
        let mode = if euid() == 0 { 0o755 } else { 0o700 };
        // SAFETY: valid path. mkdir never follows a symlink in the last component; a
        // directory someone else created meanwhile is checked by `open` like any other.
        if unsafe { libc::mkdir(c.as_ptr(), mode) } != 0
            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
        {
            return Err(os_err("create directory", path));
        }
        RuntimeDir::open(path)
    }

    /// The directory's path (for messages, and for programs that need a path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whose directory it is.
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// The owner's uid.
    pub fn owner_uid(&self) -> u32 {
        self.owner_uid
    }

    /// Open `name` in the directory without following a symlink, then check on the open
    /// descriptor that it is a regular file owned by the directory's owner and not writable by
    /// group or others. A file that fails is never read or written.
    pub fn open_file(&self, name: &str, how: OpenHow) -> Result<OwnedFd, LedgerError> {
        let path = self.path.join(name);
        let c = cstr(name.as_bytes())?;
        let mut flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY;
        flags |= if how.write {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        if how.append {
            flags |= libc::O_APPEND;
        }
        let mode = how.create.unwrap_or(0);
        if how.create.is_some() {
            flags |= libc::O_CREAT;
            if how.exclusive {
                flags |= libc::O_EXCL;
            }
        }
        // SAFETY: valid dirfd and relative name; the mode is an integer vararg.
        let fd = unsafe { libc::openat(self.fd(), c.as_ptr(), flags, mode as libc::c_uint) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOENT) => LedgerError::NotFound(path),
                Some(libc::ELOOP) => LedgerError::UnsafeFile {
                    path,
                    problem: "is a symbolic link".into(),
                },
                _ => LedgerError::Io {
                    what: "open".into(),
                    path,
                    source: e,
                },
            });
        }
        // SAFETY: just opened, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = fstat(fd.as_raw_fd()).map_err(|_| os_err("stat", &path))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(LedgerError::UnsafeFile {
                path,
                problem: "is not a regular file".into(),
            });
        }
        if st.st_uid != self.owner_uid {
            return Err(LedgerError::UnsafeFile {
                path,
                problem: format!(
                    "is owned by uid {}, not by the directory's owner (uid {})",
                    st.st_uid, self.owner_uid
                ),
            });
        }
        if st.st_mode & 0o022 != 0 {
            return Err(LedgerError::UnsafeFile {
                path,
                problem: format!(
                    "is writable by group or others (mode {:o})",
                    st.st_mode & 0o7777
                ),
            });
        }
        Ok(fd)
    }

    /// Remove `name` from the directory (never follows anything).
    pub fn unlink(&self, name: &str) -> Result<(), LedgerError> {
        let c = cstr(name.as_bytes())?;
        // SAFETY: valid dirfd and name.
        if unsafe { libc::unlinkat(self.fd(), c.as_ptr(), 0) } != 0 {
            return Err(os_err("remove", &self.path.join(name)));
        }
        Ok(())
    }

    /// Give the file `from` the second name `to` (fails with `EEXIST` if `to` exists).
    pub fn link(&self, from: &str, to: &str) -> std::io::Result<()> {
        let (a, b) = (
            CString::new(from).map_err(std::io::Error::other)?,
            CString::new(to).map_err(std::io::Error::other)?,
        );
        // SAFETY: valid dirfd and names; flags 0 never follows a symlink `from`.
        if unsafe { libc::linkat(self.fd(), a.as_ptr(), self.fd(), b.as_ptr(), 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Device and inode of `name` now (without following a symlink), to notice a replaced file.
    pub fn identity(&self, name: &str) -> Option<(u64, u64)> {
        let c = CString::new(name).ok()?;
        // SAFETY: plain data out-parameter.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: valid dirfd, name and out-parameter.
        let r = unsafe { libc::fstatat(self.fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        (r == 0).then_some((st.st_dev, st.st_ino))
    }
}

/// `fstat` of a descriptor.
pub(crate) fn fstat(fd: RawFd) -> Result<libc::stat, ()> {
    // SAFETY: plain data out-parameter.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: valid fd and out-parameter.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(());
    }
    Ok(st)
}

/// The mode decision (see the module comment), pure so it is tested without other users.
fn classify(path: &Path, st: &libc::stat, euid: u32) -> Result<Owner, LedgerError> {
    let unsafe_dir = |problem: String, fix: String| LedgerError::UnsafeDir {
        path: path.into(),
        problem,
        fix,
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(unsafe_dir(
            "is not a directory".into(),
            "remove it; gpuslice creates the directory itself".into(),
        ));
    }
    let perm = st.st_mode & 0o7777;
    if perm & 0o022 != 0 {
        let fix = if st.st_uid == euid {
            format!("run `chmod 755 {}` (you own it)", path.display())
        } else {
            "its owner or root must remove it (or `chmod 755` it); until then set \
             GPUSLICE_RUNTIME_DIR to a directory of your own"
                .into()
        };
        return Err(unsafe_dir(
            format!(
                "is writable by group or others (mode {perm:o}, owner uid {}): another user \
                 could plant or replace files in it",
                st.st_uid
            ),
            fix,
        ));
    }
    if st.st_uid == euid {
        return Ok(Owner::Caller);
    }
    if st.st_uid == 0 {
        return Ok(Owner::Root);
    }
    let fix = if euid == 0 {
        "it is not the node's directory: remove it (`rm -r` it after checking what it holds), \
         then start `gpuslice monitor` as root, which creates it owned by root"
            .to_string()
    } else {
        "set GPUSLICE_RUNTIME_DIR to a directory of your own, or use the node's (owned by root)"
            .to_string()
    };
    Err(unsafe_dir(
        format!(
            "is owned by uid {}, neither you (uid {euid}) nor root: its owner controls every \
             file in it",
            st.st_uid
        ),
        fix,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(mode: u32, uid: u32) -> libc::stat {
        // SAFETY: plain data.
        let mut s: libc::stat = unsafe { core::mem::zeroed() };
        s.st_mode = mode;
        s.st_uid = uid;
        s
    }

    #[test]
    fn the_owner_decides_the_mode() {
        let p = Path::new("/dev/shm/x");
        let dir = libc::S_IFDIR;
        assert_eq!(
            classify(p, &st(dir | 0o700, 1000), 1000).unwrap(),
            Owner::Caller
        );
        assert_eq!(classify(p, &st(dir | 0o755, 0), 0).unwrap(), Owner::Caller);
        assert_eq!(classify(p, &st(dir | 0o755, 0), 1000).unwrap(), Owner::Root);
        for (mode, uid, me, want) in [
            (0o1777, 0, 1000, "writable by group or others"),
            (0o775, 1000, 1000, "chmod 755"),
            (0o755, 1001, 1000, "owned by uid 1001"),
            (0o700, 1000, 0, "start `gpuslice monitor` as root"),
        ] {
            let e = classify(p, &st(dir | mode, uid), me)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{mode:o} {uid} {me}: {e}");
            assert!(e.contains("/dev/shm/x"), "{e}");
        }
        let e = classify(p, &st(libc::S_IFREG | 0o644, 0), 0).unwrap_err();
        assert!(e.to_string().contains("not a directory"));
    }

    #[test]
    fn relative_dirs_are_refused_everywhere() {
        let e = check_absolute(Path::new("relative/dir")).unwrap_err();
        assert!(e.to_string().contains("absolute"), "{e}");
        assert!(RuntimeDir::open_or_create(Path::new("rel")).is_err());
    }
}
