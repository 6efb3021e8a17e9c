//! The real driver's and NVML's functions: the table's symbols (`symbols.rs`) by index, name
//! and library, a typed accessor each (`real::cuMemAlloc_v2()`), and their resolution: the
//! real `dlsym` (found with `dlvsym`, since ours shadows it), the real libraries' handles, and
//! each function pointer, resolved on its first use. (Everywhere in the shim, "real" is the
//! function this finds: an accessor here, or a handler's `real` parameter.) Every handler
//! imports this module; it imports no handler.
//!
//! Nothing here runs inside our `dlsym` except [`real_dlsym_addr`], which only resolves one
//! pointer with `dlvsym` and caches it. Each table entry is resolved by whichever thread needs
//! it first and published with one compare-and-swap; no thread ever waits for another's
//! resolution. That matters because resolving takes the dynamic loader's lock (`dlopen`,
//! `dlsym`): a thread that waited on a resolution in progress elsewhere could be the one
//! holding that lock (a library constructor calling CUDA from inside `dlopen`), and neither
//! would ever go on.

#![allow(non_snake_case)]

use core::ffi::{c_char, c_void};
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};
use gpuslice_abi::pfn;

/// One symbol of the table.
pub struct Symbol {
    /// NUL-terminated export name.
    pub name: &'static str,
    /// The library that defines the real one.
    pub lib: Lib,
    /// Whether gpuslice exports a wrapper of it (`hooks.rs`).
    pub hooked: bool,
}

macro_rules! real_table {
    (
        hooks { $( $lib:ident $name:ident => $handler:path; )* }
        reals { $( $rlib:ident $rname:ident; )* }
    ) => {
        /// Index of each symbol in [`SYMBOLS`]: hooked ones first, then real-only ones.
        #[allow(non_camel_case_types, clippy::enum_variant_names, dead_code)]
        #[derive(Clone, Copy)]
        #[repr(usize)]
        pub enum Sym { $($name,)* $($rname,)* }

        /// How many symbols the table holds.
        pub const COUNT: usize = [$(Sym::$name,)* $(Sym::$rname,)*].len();

        /// Every symbol: name, library, whether it is hooked.
        pub static SYMBOLS: [Symbol; COUNT] = [
            $( Symbol { name: concat!(stringify!($name), "\0"), lib: Lib::$lib, hooked: true }, )*
            $( Symbol { name: concat!(stringify!($rname), "\0"), lib: Lib::$rlib, hooked: false }, )*
        ];

        $( real_table!(@accessor $name); )*
        $( real_table!(@accessor $rname); )*
    };
    (@accessor $name:ident) => {
        /// The real function (resolved on first use; `None` when the library lacks it).
        #[inline]
        pub fn $name() -> Option<pfn::$name> {
            let p = get(Sym::$name as usize);
            // SAFETY: p was returned by the real dlsym for this exact name, whose C signature
            // is pfn's, generated from the header.
            (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, pfn::$name>(p) })
        }
    };
}

crate::symbols::for_each_symbol!(real_table);

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
    // Ask for the baseline version first: it exists in every glibc of the architecture (on
    // 2.34 and later as the same function, kept for old binaries), so the first lookup
    // succeeds and nothing fails inside someone else's dlsym (a failing dlvsym formats an
    // error message, which allocates). GLIBC_2.34 is the fallback for a libc without it.
    for v in BASELINE_DLSYM_VERSIONS
        .iter()
        .chain([&b"GLIBC_2.34\0"[..]].iter())
    {
        // SAFETY: NUL-terminated constant strings; RTLD_NEXT finds the definition after ours.
        let p = unsafe { libc::dlvsym(RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr().cast()) } as usize;
        if p != 0 {
            REAL_DLSYM.store(p, Relaxed);
            return p;
        }
    }
    0
}

/// The version glibc first gave `dlsym` on this architecture.
#[cfg(target_arch = "x86_64")]
const BASELINE_DLSYM_VERSIONS: &[&[u8]] = &[b"GLIBC_2.2.5\0"];
#[cfg(target_arch = "aarch64")]
const BASELINE_DLSYM_VERSIONS: &[&[u8]] = &[b"GLIBC_2.17\0"];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const BASELINE_DLSYM_VERSIONS: &[&[u8]] = &[];

/// The real `dlsym`.
pub fn real_dlsym() -> Option<DlsymFn> {
    let p = real_dlsym_addr();
    // SAFETY: p is glibc's dlsym.
    (p != 0).then(|| unsafe { core::mem::transmute::<usize, DlsymFn>(p) })
}

/// Per table entry: null until looked up, [`MISSING`] when the library or symbol is absent,
/// else the real function.
static PTRS: [AtomicPtr<c_void>; COUNT] = [const { AtomicPtr::new(core::ptr::null_mut()) }; COUNT];
/// Per library: its handle once found (null until then).
static HANDLES: [AtomicPtr<c_void>; 2] = [const { AtomicPtr::new(core::ptr::null_mut()) }; 2];
/// "Looked up, not there": address 1 (`c_void` is 1-aligned), never a function.
const MISSING: *mut c_void = core::ptr::dangling_mut::<c_void>();

/// The real function of table entry `i` (null when the library or symbol is missing).
#[inline]
pub fn get(i: usize) -> *mut c_void {
    let p = PTRS[i].load(Acquire);
    // One comparison on the hot path: every real function lies above both markers (0, 1).
    if p.addr() > MISSING.addr() {
        return p;
    }
    if p.is_null() {
        resolve(i)
    } else {
        core::ptr::null_mut()
    }
}

/// Look entry `i` up and publish it. Two threads may both look it up; the first to publish
/// wins and both return its answer (the same one: `dlsym` of one name in one library).
#[cold]
fn resolve(i: usize) -> *mut c_void {
    let s = &SYMBOLS[i];
    let handle = handle(s.lib);
    let p = match real_dlsym() {
        // SAFETY: a valid handle and a NUL-terminated name.
        Some(dlsym) if !handle.is_null() => unsafe { dlsym(handle, s.name.as_ptr().cast()) },
        _ => core::ptr::null_mut(),
    };
    // Never take a function of our own library (a wrapper) for the real one: it would call
    // itself.
    let found = if p.is_null() || ours(p) { MISSING } else { p };
    let published = match PTRS[i].compare_exchange(core::ptr::null_mut(), found, AcqRel, Acquire) {
        Ok(_) => found,
        Err(earlier) => earlier,
    };
    if published == MISSING {
        core::ptr::null_mut()
    } else {
        published
    }
}

/// Resolve every entry of `lib` now (start-up calls this before taking its lock, so that no
/// thread holds that lock while it waits for the loader's: see the module comment).
#[cold]
pub fn resolve_all(lib: Lib) {
    for (i, s) in SYMBOLS.iter().enumerate() {
        if s.lib == lib {
            get(i);
        }
    }
}

/// The real library's handle, found once (a lost race stores the same handle again).
fn handle(lib: Lib) -> *mut c_void {
    let h = HANDLES[lib.index()].load(Acquire);
    if !h.is_null() {
        return h;
    }
    let h = library_handle(lib);
    if !h.is_null() {
        HANDLES[lib.index()].store(h, Release);
    }
    h
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

/// Whether `p` lies in gpuslice's own library (`dladdr`; a cold path, once per symbol).
fn ours(p: *mut c_void) -> bool {
    let base = |addr: *const c_void| {
        // SAFETY: plain data, filled by dladdr.
        let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables for `addr`; `info` is a valid local.
        let found = unsafe { libc::dladdr(addr, &mut info) } != 0;
        found.then_some(info.dli_fbase)
    };
    let own = base(ours as *const c_void);
    own.is_some() && base(p) == own
}

/// The table index whose real function is at `addr` (hooked symbols only).
pub fn hooked_by_address(addr: *mut c_void) -> Option<usize> {
    if addr.is_null() {
        return None;
    }
    (0..COUNT).find(|&i| SYMBOLS[i].hooked && get(i) == addr)
}
