//! The environment as the shim may read it anywhere, also before start-up (inside `dlsym`, for
//! a log line): [`getenv`] neither allocates nor locks, and a secure-execution process
//! ([`secure_execution`]) takes nothing from it. Below `config.rs` and `log.rs`, which both
//! read it.

/// Whether this process runs in secure-execution mode (`AT_SECURE`: setuid, setgid or with
/// file capabilities), whose environment its less privileged caller chose.
pub fn secure_execution() -> bool {
    // SAFETY: getauxval only reads the auxiliary vector; it neither allocates nor locks.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// A variable read before start-up (inside `dlsym`, for a log line): `getenv`, which neither
/// allocates nor locks, and unset in a [`secure_execution`] process, as glibc's
/// `secure_getenv` would answer. The string is the environment's: use it at once.
pub fn getenv(name: &core::ffi::CStr) -> Option<&core::ffi::CStr> {
    if secure_execution() {
        return None;
    }
    // SAFETY: NUL-terminated name; getenv returns null or a NUL-terminated string owned by the
    // environment, which the caller reads at once and does not keep.
    let v = unsafe { libc::getenv(name.as_ptr()) };
    // SAFETY: non-null, so a NUL-terminated string getenv returned.
    (!v.is_null()).then(|| unsafe { core::ffi::CStr::from_ptr(v) })
}
