//! Lines on stderr, prefixed `gpuslice:`, filtered by `GPUSLICE_LOG`; formatted into a stack
//! buffer and written with one `write(2)`, so logging never allocates and never interleaves
//! mid-line with other threads.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// Severity, most severe first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[repr(u8)]
pub enum Level {
    /// Something failed.
    Error = 0,
    /// Something the user should know (default threshold).
    Warn = 1,
    /// What gpuslice decided (slice joined, quota).
    Info = 2,
    /// Every refusal and detail.
    Debug = 3,
}

impl Level {
    /// The `GPUSLICE_LOG` spelling of a level; unset or empty means the default, `warn`.
    pub fn parse(v: Option<&str>) -> Option<Level> {
        match v.map(str::trim) {
            None | Some("") | Some("warn") => Some(Level::Warn),
            Some("error") => Some(Level::Error),
            Some("info") => Some(Level::Info),
            Some("debug") => Some(Level::Debug),
            Some(_) => None,
        }
    }
}

/// Not read from the environment yet.
const UNSET: u8 = u8::MAX;
static THRESHOLD: AtomicU8 = AtomicU8::new(UNSET);

/// Set the threshold (from the validated configuration, at start-up).
pub fn set_level(l: Level) {
    THRESHOLD.store(l as u8, Relaxed);
}

/// Whether `l` would be printed. Lines can be due before start-up (the `dlsym` and
/// `cuGetProcAddress` lookups a client makes before `cuInit`), so the first call reads
/// `GPUSLICE_LOG` itself: `getenv` neither allocates nor locks. A bad value counts as the
/// default here; start-up reports it.
#[inline]
pub fn enabled(l: Level) -> bool {
    let mut t = THRESHOLD.load(Relaxed);
    if t == UNSET {
        t = level_from_env() as u8;
        // A racing set_level (the validated value) wins over this early guess.
        let _ = THRESHOLD.compare_exchange(UNSET, t, Relaxed, Relaxed);
    }
    l as u8 <= t
}

#[cold]
fn level_from_env() -> Level {
    // SAFETY: a NUL-terminated name; getenv returns null or a NUL-terminated string owned by
    // the environment, read at once and not kept.
    let v = unsafe { libc::getenv(c"GPUSLICE_LOG".as_ptr()) };
    let v = (!v.is_null())
        .then(|| unsafe { core::ffi::CStr::from_ptr(v) }.to_str().ok())
        .flatten();
    Level::parse(v).unwrap_or(Level::Warn)
}

struct Buf {
    b: [u8; 1024],
    n: usize,
}

impl Write for Buf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.b.len() - 1 - self.n; // keep one byte for the newline
        let k = s.len().min(room);
        self.b[self.n..self.n + k].copy_from_slice(&s.as_bytes()[..k]);
        self.n += k;
        Ok(())
    }
}

/// Write one line if `l` passes the threshold.
pub fn line(l: Level, args: fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    let mut buf = Buf { b: [0; 1024], n: 0 };
    let _ = buf.write_str("gpuslice: ");
    let _ = buf.write_fmt(args);
    buf.b[buf.n] = b'\n';
    // SAFETY: writing our own initialised buffer to fd 2.
    unsafe { libc::write(2, buf.b.as_ptr().cast(), buf.n + 1) };
}

/// `log!(Warn, "...", args)`.
macro_rules! log {
    ($lvl:ident, $($t:tt)*) => {
        $crate::log::line($crate::log::Level::$lvl, format_args!($($t)*))
    };
}
pub(crate) use log;
