//! Lines on stderr, prefixed `gpuslice:`, filtered by `GPUSLICE_LOG`; formatted into a stack
//! buffer and written with one `write(2)`, so logging never allocates and never interleaves
//! mid-line with other threads.

use crate::process::{LOG_UNSET as UNSET, THRESHOLD};
use core::fmt::{self, Write};
use core::sync::atomic::Ordering::Relaxed;

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
    let v = crate::env::getenv(c"GPUSLICE_LOG").and_then(|v| v.to_str().ok());
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

impl Buf {
    /// The line as written: `gpuslice: `, `args` (cut to fit), a newline.
    fn render(args: fmt::Arguments<'_>) -> Buf {
        let mut buf = Buf { b: [0; 1024], n: 0 };
        let _ = buf.write_str("gpuslice: ");
        let _ = buf.write_fmt(args);
        buf.b[buf.n] = b'\n';
        buf.n += 1;
        buf
    }

    fn bytes(&self) -> &[u8] {
        &self.b[..self.n]
    }
}

/// Write one line if `l` passes the threshold.
pub fn line(l: Level, args: fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    let buf = Buf::render(args);
    let b = buf.bytes();
    // SAFETY: writing our own initialised buffer of b.len() bytes to fd 2.
    unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
}

/// What a panic inside gpuslice prints: `internal error: <message> at <file>:<line>`.
struct InternalError<'a> {
    message: &'a str,
    location: Option<(&'a str, u32)>,
}

impl<'a> InternalError<'a> {
    /// The message and place of a panic, borrowed from it (nothing allocated here).
    fn of(info: &'a std::panic::PanicHookInfo<'_>) -> InternalError<'a> {
        let p = info.payload();
        let message = p
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| p.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(a panic without a message)");
        InternalError {
            message,
            location: info.location().map(|l| (l.file(), l.line())),
        }
    }
}

impl fmt::Display for InternalError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "internal error: {}", self.message)?;
        match self.location {
            Some((file, line)) => write!(f, " at {file}:{line}"),
            None => Ok(()),
        }
    }
}

/// Replace Rust's panic message (several lines, a thread name, a backtrace hint) with one
/// `gpuslice: internal error: ...` line at error level; the wrappers already turn the panic
/// itself into an error status (`hooks.rs`). Installs once; later calls do nothing.
///
/// Only gpuslice's own panics reach this hook: a `cdylib` links its own copy of `std`, and
/// exports nothing but its `#[no_mangle]` functions (`nm -D --defined-only libgpuslice.so`
/// lists only the hooks and `dlsym`), so the hook table set here is not the one a Rust host
/// program's `std` uses: the host's panics keep its own hook and message.
///
/// The hook formats into [`line()`]'s stack buffer and allocates nothing itself; a panic with a
/// formatted message has had its `String` built by `std` before any hook runs.
pub fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            line(Level::Error, format_args!("{}", InternalError::of(info)))
        }))
    });
}

/// `log!(Warn, "...", args)`.
macro_rules! log {
    ($lvl:ident, $($t:tt)*) => {
        $crate::log::line($crate::log::Level::$lvl, format_args!($($t)*))
    };
}
pub(crate) use log;

/// Who answered a lookup, for [`lookup`].
pub(crate) fn answer_of(p: *mut core::ffi::c_void, ours: bool) -> &'static str {
    match (p.is_null(), ours) {
        (true, _) => "not found",
        (false, true) => "gpuslice wrapper",
        (false, false) => "driver (not hooked)",
    }
}

/// One debug line per driver/NVML lookup: what was asked and who answers it (the record of
/// which entry points real clients resolve, and how). Only reached at `GPUSLICE_LOG=debug`.
pub(crate) fn lookup(how: &str, name: &[u8], version_flags: Option<(i32, u64)>, who: &str) {
    let name = core::str::from_utf8(name).unwrap_or("<non-UTF-8 name>");
    match version_flags {
        Some((v, f)) => log!(Debug, "{how}({name}, version {v}, flags {f}) -> {who}"),
        None => log!(Debug, "{how}({name}) -> {who}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_prefixed_cut_to_fit_and_end_in_a_newline() {
        let b = Buf::render(format_args!("quota {} MiB", 512));
        assert_eq!(b.bytes(), b"gpuslice: quota 512 MiB\n");
        let long = "x".repeat(5000);
        let b = Buf::render(format_args!("{long}"));
        assert_eq!(b.bytes().len(), 1024);
        assert!(b.bytes().starts_with(b"gpuslice: xxx"));
        assert_eq!(b.bytes().last(), Some(&b'\n'));
    }

    #[test]
    fn an_internal_error_is_one_line_with_message_and_place() {
        let e = InternalError {
            message: "index out of bounds",
            location: Some(("shim/src/memory/pools.rs", 42)),
        };
        let b = Buf::render(format_args!("{e}"));
        assert_eq!(
            core::str::from_utf8(b.bytes()).unwrap(),
            "gpuslice: internal error: index out of bounds at shim/src/memory/pools.rs:42\n"
        );
        let e = InternalError {
            message: "m",
            location: None,
        };
        assert_eq!(e.to_string(), "internal error: m");
    }

    /// What a real panic gives the hook: a literal message, a formatted one, and a payload
    /// that is not a string, each with the panic's file and line.
    #[test]
    fn internal_error_reads_real_panics() {
        use std::sync::Mutex;
        static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
        // Serialise with any other test that panics: the hook is process-wide.
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|info| {
            SEEN.lock()
                .unwrap()
                .push(InternalError::of(info).to_string())
        }));
        let line = line!();
        let _ = std::panic::catch_unwind(|| panic!("plain"));
        let n = 7;
        let _ = std::panic::catch_unwind(|| panic!("formatted {n}"));
        let _ = std::panic::catch_unwind(|| std::panic::panic_any(3u8));
        std::panic::set_hook(prev);
        let seen = SEEN.lock().unwrap().clone();
        let expect = [
            "internal error: plain at ",
            "internal error: formatted 7 at ",
            "internal error: (a panic without a message) at ",
        ];
        assert_eq!(seen.len(), expect.len(), "{seen:?}");
        let mut last = line;
        for (s, e) in seen.iter().zip(expect) {
            let place = s.strip_prefix(e).unwrap_or_else(|| panic!("{s:?}"));
            let (f, l) = place.rsplit_once(':').unwrap();
            let l: u32 = l.parse().unwrap();
            assert_eq!(f, file!());
            // Each panic is on a later line of this test than the one before.
            assert!(l > last && l < line + 10, "{s:?}");
            last = l;
        }
    }
}
