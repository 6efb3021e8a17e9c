//! Node mode: join secrets of operator slices (docs/security.md, "Who may join a slice").
//!
//! An operator slice made without `--owner` is open to every uid that names it, and names are
//! not secret (a Kubernetes claim slice is `k8s-<claim uid>`). A slice made with a secret
//! (`gpuslice slice create --secret-file`, and every claim slice of `gpuslice-dra`) admits a
//! process only if its admission request carries the same secret (`GPUSLICE_SLICE_SECRET`),
//! compared in constant time ([`ct_eq`]); root joins without it.
//!
//! The policy is readable by every tenant, so no secret is in it. The secrets live in
//! [`SECRETS_FILE`] in the runtime directory: root's, mode 0600, opened through the
//! directory's descriptor without following a symlink, owner and mode checked on the open
//! descriptor, replaced whole by `rename` (never half-written). It survives a monitor restart
//! like the policy does. Every change and every check runs under the policy's mutex, so a
//! slice and its secret appear together: the secret is written before the slice exists and
//! removed only when no slice of that name is left.

use crate::dir::{OpenHow, RuntimeDir};
use crate::error::LedgerError;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The variable a process gives its slice's secret in.
pub const SECRET_VAR: &str = "GPUSLICE_SLICE_SECRET";
/// The monitor's root-only file of slice secrets, in the runtime directory.
pub const SECRETS_FILE: &str = "slice-secrets";
/// Shortest secret accepted (characters): 128 bits as hex, more as base64.
pub const MIN_LEN: usize = 32;
/// Longest secret accepted (characters).
pub const MAX_LEN: usize = 256;
/// Random bytes in a generated secret (256 bits; written as 64 hex digits).
const GENERATED_BYTES: usize = 32;
/// Largest secrets file read (bytes): every slice record with a longest secret, and room.
const MAX_FILE: usize = 1 << 20;

/// A slice's join secret: 32 to 256 printable ASCII characters without spaces. Its `Debug`
/// never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} characters)", self.0.len())
    }
}

/// Whether `b` may be in a secret (printable ASCII, no space: it travels in an environment
/// variable, a `key=value` line and a tab-separated file).
fn allowed(b: u8) -> bool {
    b.is_ascii_graphic()
}

/// Compare two byte strings in time that depends only on the longer one's length, never on
/// where they differ (a client probing the monitor learns nothing from how fast it refuses).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= core::hint::black_box((x ^ y) as u64);
    }
    core::hint::black_box(diff) == 0
}

impl Secret {
    /// Parse a secret given by `what` (a variable or a file, for the message).
    pub fn parse(what: &str, s: &str) -> Result<Secret, LedgerError> {
        let why = if s.len() < MIN_LEN || s.len() > MAX_LEN {
            format!("it has {} characters", s.len())
        } else if let Some(p) = s.bytes().position(|b| !allowed(b)) {
            format!(
                "character {} is a space, a control character or not ASCII",
                p + 1
            )
        } else {
            return Ok(Secret(s.to_string()));
        };
        // Never the value itself: a near miss is still most of a secret.
        Err(LedgerError::BadSecret(format!(
            "{what} is not a valid secret ({why}); accepted: {MIN_LEN} to {MAX_LEN} printable \
             ASCII characters without spaces (make one with `head -c 32 /dev/urandom | base64`, \
             or let `gpuslice slice create --new-secret-file PATH` make it)"
        )))
    }

    /// A new random secret: 256 bits from the kernel (`getrandom`), as 64 hex digits.
    pub fn generate() -> Result<Secret, LedgerError> {
        let mut b = [0u8; GENERATED_BYTES];
        let mut got = 0;
        while got < b.len() {
            // SAFETY: writes at most `b.len() - got` bytes into `b[got..]`, which we own.
            let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(LedgerError::BadSecret(format!(
                    "cannot get random bytes from the kernel (getrandom): {e}"
                )));
            }
            got += n as usize;
        }
        Ok(Secret(b.iter().map(|x| format!("{x:02x}")).collect()))
    }

    /// Read a secret from a file (one line; a trailing newline is dropped). The file must be the
    /// caller's own (a file another user wrote holds a secret that user chose) and neither
    /// readable nor writable by group or others: a secret anyone can read protects nothing.
    pub fn read_file(path: &std::path::Path) -> Result<Secret, LedgerError> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let what = path.display().to_string();
        let io = |e: std::io::Error| LedgerError::BadSecret(format!("{what}: {e}"));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(io)?;
        let md = f.metadata().map_err(io)?;
        if !md.is_file() {
            return Err(LedgerError::BadSecret(format!(
                "{what}: not a regular file"
            )));
        }
        // A file someone else owns (or may write) holds a secret that someone chose: a tenant
        // who planted it would join the slice with it.
        let me = crate::dir::euid();
        if md.uid() != me {
            return Err(LedgerError::BadSecret(format!(
                "{what}: owned by uid {}, not by you (uid {me}): a secret file must be your own, \
                 or whoever wrote it knows the secret; use --new-secret-file, or create the \
                 file yourself (mode 0600)",
                md.uid()
            )));
        }
        if md.mode() & 0o077 != 0 {
            return Err(LedgerError::BadSecret(format!(
                "{what}: mode {:o} lets group or others {} it; `chmod 600 {what}`",
                md.mode() & 0o7777,
                if md.mode() & 0o022 != 0 {
                    "write"
                } else {
                    "read"
                }
            )));
        }
        let mut s = String::new();
        Read::take(&mut f, MAX_LEN as u64 + 2)
            .read_to_string(&mut s)
            .map_err(io)?;
        let s = s
            .strip_suffix('\n')
            .map(|s| s.strip_suffix('\r').unwrap_or(s))
            .unwrap_or(&s);
        Secret::parse(&what, s)
    }

    /// Write a new secret to `path`, mode 0600, refusing a file that exists (never replaces
    /// another secret, never follows a symlink).
    pub fn write_new_file(&self, path: &std::path::Path) -> Result<(), LedgerError> {
        use std::os::unix::fs::OpenOptionsExt;
        let io = |e: std::io::Error| LedgerError::BadSecret(format!("{}: {e}", path.display()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(io)?;
        f.write_all(format!("{}\n", self.0).as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io)
    }

    /// The secret's text (to hand to the slice's processes).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `given` is this secret (constant time).
    pub fn matches(&self, given: &str) -> bool {
        ct_eq(self.0.as_bytes(), given.as_bytes())
    }
}

/// The secrets of a runtime directory, as read from [`SECRETS_FILE`]: slice name and secret.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Store {
    entries: Vec<(String, Secret)>,
}

fn bad_file(dir: &RuntimeDir, problem: String) -> LedgerError {
    LedgerError::UnsafeFile {
        path: dir.path().join(SECRETS_FILE),
        problem,
    }
}

impl Store {
    /// Read the directory's secrets (none when the file does not exist). The file must be the
    /// directory owner's, a regular file, mode 0600 or stricter; anything else is refused.
    pub(crate) fn load(dir: &RuntimeDir) -> Result<Store, LedgerError> {
        let fd = match dir.open_file(SECRETS_FILE, OpenHow::READ) {
            Ok(fd) => fd,
            Err(LedgerError::NotFound(_)) => return Ok(Store::default()),
            Err(e) => return Err(e),
        };
        let st = crate::dir::fstat(fd.as_raw_fd())
            .map_err(|_| bad_file(dir, "cannot be examined (fstat)".into()))?;
        if st.st_mode & 0o077 != 0 {
            return Err(bad_file(
                dir,
                format!(
                    "is readable by group or others (mode {:o}); only its owner may read it: \
                     `chmod 600` it, and replace the secrets of its slices (they may be known)",
                    st.st_mode & 0o7777
                ),
            ));
        }
        let mut text = String::new();
        std::fs::File::from(fd)
            .take(MAX_FILE as u64)
            .read_to_string(&mut text)
            .map_err(|e| bad_file(dir, format!("cannot be read: {e}")))?;
        Store::parse(&text).map_err(|line| bad_file(dir, format!("line {line} is not valid")))
    }

    /// The file's text: `name<TAB>secret` lines. A bad line is the error (its number).
    fn parse(text: &str) -> Result<Store, usize> {
        let mut s = Store::default();
        for (i, line) in text.lines().enumerate() {
            let (name, secret) = line.split_once('\t').ok_or(i + 1)?;
            if !gpuslice_quantity::valid_slice_name(name) {
                return Err(i + 1);
            }
            let secret = Secret::parse("", secret).map_err(|_| i + 1)?;
            s.set(name, Some(secret));
        }
        Ok(s)
    }

    fn text(&self) -> String {
        self.entries
            .iter()
            .map(|(n, s)| format!("{n}\t{}\n", s.0))
            .collect()
    }

    /// The secret of slice `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Secret> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    /// Set (or with `None` remove) the secret of `name`; whether anything changed.
    pub(crate) fn set(&mut self, name: &str, secret: Option<Secret>) -> bool {
        let i = self.entries.iter().position(|(n, _)| n == name);
        match (i, secret) {
            (Some(i), Some(s)) if self.entries[i].1 == s => false,
            (Some(i), Some(s)) => {
                self.entries[i].1 = s;
                true
            }
            (Some(i), None) => {
                self.entries.remove(i);
                true
            }
            (None, Some(s)) => {
                self.entries.push((name.into(), s));
                true
            }
            (None, None) => false,
        }
    }

    /// Keep only the secrets of the names `keep` says are still in use; whether any went.
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) -> bool {
        let n = self.entries.len();
        self.entries.retain(|(name, _)| keep(name));
        self.entries.len() != n
    }

    /// Replace the file with these secrets: written to a temporary file (mode 0600, created
    /// exclusively through the directory's descriptor, never following a symlink), synced, and
    /// renamed over the old one, so a reader sees the old file or the new one, never a part.
    pub(crate) fn save(&self, dir: &RuntimeDir) -> Result<(), LedgerError> {
        let tmp = format!("{SECRETS_FILE}.tmp");
        let _ = dir.unlink(&tmp);
        let how = OpenHow {
            write: true,
            create: Some(0o600),
            exclusive: true,
            append: false,
        };
        let fd: OwnedFd = dir.open_file(&tmp, how)?;
        // SAFETY: `fd` is an open descriptor we own; `File` takes it over.
        let mut f = unsafe { std::fs::File::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(fd)) };
        let io = |e: std::io::Error| LedgerError::Io {
            what: "write".into(),
            path: dir.path().join(&tmp),
            source: e,
        };
        f.write_all(self.text().as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io)?;
        let (a, b) = (
            std::ffi::CString::new(tmp.as_str()).expect("no NUL"),
            std::ffi::CString::new(SECRETS_FILE).expect("no NUL"),
        );
        // SAFETY: valid directory descriptor and NUL-terminated names; renameat never follows
        // a symlink (it renames the link itself), and only root writes this directory.
        if unsafe { libc::renameat(dir.fd(), a.as_ptr(), dir.fd(), b.as_ptr()) } != 0 {
            let e = std::io::Error::last_os_error();
            let _ = dir.unlink(&tmp);
            return Err(LedgerError::Io {
                what: "rename into place".into(),
                path: dir.path().join(SECRETS_FILE),
                source: e,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
