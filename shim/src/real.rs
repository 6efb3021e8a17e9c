//! The real driver's functions: the real `dlsym` (found with `dlvsym`, since ours shadows it),
//! the real libraries' handles, and the table's function pointers, resolved once on first use.
//!
//! Nothing here runs inside our `dlsym` except [`real_dlsym`], which only resolves one
//! pointer with `dlvsym` and caches it; the table is resolved on the first hooked call (never
//! from a constructor), with the resolving thread recorded so a re-entrant call cannot spin on
//! itself.

use crate::hooks::{COUNT, SYMBOLS};
use core::ffi::{c_char, c_void};
use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};

/// glibc's `RTLD_NEXT`.
pub const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

/// The library a real symbol lives in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    /// `libcuda.so.1`.
    Cuda,
    /// `libnvidia-ml.so.1`.
    Nvml,
}

impl Lib {
    fn soname(self) -> &'static [u8] {
        match self {
            Lib::Cuda => b"libcuda.so.1\0",
            Lib::Nvml => b"libnvidia-ml.so.1\0",
        }
    }

    /// What a wrapper returns when the real function is missing.
    pub fn missing(self) -> u32 {
        match self {
            Lib::Cuda => gpuslice_abi::CUDA_ERROR_NOT_FOUND,
            Lib::Nvml => gpuslice_abi::NVML_ERROR_FUNCTION_NOT_FOUND,
        }
    }

    /// What a wrapper returns when gpuslice itself failed (a caught panic).
    pub fn internal_error(self) -> u32 {
        match self {
            Lib::Cuda => gpuslice_abi::CUDA_ERROR_UNKNOWN,
            Lib::Nvml => gpuslice_abi::NVML_ERROR_UNKNOWN,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// `dlsym`'s signature.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// The real `dlsym` (glibc's), as an address; 0 if it cannot be found. Called from the
/// `dlsym` entry stub, so it must stay `extern "C"` and allocation-free.
pub extern "C" fn real_dlsym_addr() -> usize {
    let p = REAL_DLSYM.load(Relaxed);
    if p != 0 {
        return p;
    }
    // glibc 2.34 moved dlsym into libc with a new version; older ones have only 2.2.5 (x86_64)
    // or 2.17 (aarch64).
    for v in [&b"GLIBC_2.34\0"[..], b"GLIBC_2.2.5\0", b"GLIBC_2.17\0"] {
        // SAFETY: NUL-terminated constant strings; RTLD_NEXT finds the definition after ours.
        let p = unsafe { libc::dlvsym(RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr().cast()) } as usize;
        if p != 0 {
            REAL_DLSYM.store(p, Relaxed);
            return p;
        }
    }
    0
}

/// The real `dlsym`.
pub fn real_dlsym() -> Option<DlsymFn> {
    let p = real_dlsym_addr();
    // SAFETY: p is glibc's dlsym.
    (p != 0).then(|| unsafe { core::mem::transmute::<usize, DlsymFn>(p) })
}

static PTRS: [AtomicPtr<c_void>; COUNT] = [const { AtomicPtr::new(core::ptr::null_mut()) }; COUNT];
/// Per library: 0 unresolved, 1 resolving, 2 resolved.
static STATE: [AtomicU8; 2] = [AtomicU8::new(0), AtomicU8::new(0)];
static RESOLVER: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];

fn tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The real function of table entry `i` (null when the library or symbol is missing).
#[inline]
pub fn get(i: usize) -> *mut c_void {
    let lib = SYMBOLS[i].lib.index();
    if STATE[lib].load(Acquire) != 2 {
        resolve(SYMBOLS[i].lib);
    }
    PTRS[i].load(Relaxed)
}

#[cold]
fn resolve(lib: Lib) {
    let li = lib.index();
    loop {
        match STATE[li].compare_exchange(0, 1, AcqRel, Acquire) {
            Ok(_) => break,
            Err(2) => return,
            Err(_) => {
                if RESOLVER[li].load(Relaxed) == tid() {
                    return; // re-entered from our own resolution: answer "missing" for now
                }
                std::thread::yield_now();
            }
        }
    }
    RESOLVER[li].store(tid(), Relaxed);
    let handle = library_handle(lib);
    if let (Some(dlsym), false) = (real_dlsym(), handle.is_null()) {
        for (i, s) in SYMBOLS.iter().enumerate().filter(|(_, s)| s.lib == lib) {
            // SAFETY: valid handle and NUL-terminated name.
            let p = unsafe { dlsym(handle, s.name.as_ptr().cast()) };
            // Never take our own wrapper for the real function (it would call itself).
            let own = s.wrapper.is_some_and(|w| w.0 as *mut c_void == p);
            PTRS[i].store(if own { core::ptr::null_mut() } else { p }, Relaxed);
        }
    }
    RESOLVER[li].store(0, Relaxed);
    STATE[li].store(2, Release);
}

/// The handle of the real library: the already loaded one if any, else load it.
pub fn library_handle(lib: Lib) -> *mut c_void {
    let name = lib.soname().as_ptr().cast();
    // SAFETY: NUL-terminated name.
    let h = unsafe { libc::dlopen(name, libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if !h.is_null() {
        return h;
    }
    // SAFETY: as above.
    unsafe { libc::dlopen(name, libc::RTLD_NOW | libc::RTLD_GLOBAL) }
}

/// The table index whose real function is at `addr` (hooked symbols only).
pub fn hooked_by_address(addr: *mut c_void) -> Option<usize> {
    if addr.is_null() {
        return None;
    }
    (0..COUNT).find(|&i| SYMBOLS[i].wrapper.is_some() && PTRS[i].load(Relaxed) == addr)
}
