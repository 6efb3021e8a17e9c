//! `cuGetExportTable`: the driver's private tables that NVIDIA's CUDA runtime (libcudart),
//! cuDNN and cuBLASLt ask for by UUID, as recorded in `shared/reference/cudart-export-tables.md`.
//! Each table is a static array of pointer-sized words; word 0 is its size in bytes (except the
//! context-storage table). The slots the runtime calls do what the reference says; every other
//! slot is a stub that returns 0 and, with `FAKEGPU_DEBUG=1`, says which table and slot was
//! called. An unknown table is `CUDA_ERROR_NOT_SUPPORTED` (logged at debug), never a crash.
//!
//! The integrity table answers cudart's start-up check with an HMAC-MD2 ([`md2`], [`hmac_md2`])
//! over the process's and devices' identity; `FAKEGPU_BAD_INTEGRITY=1` answers it wrongly and
//! `FAKEGPU_WITHHOLD_TABLE=<uuid hex>` refuses one table, so tests can show both are needed.

#![allow(clippy::missing_safety_doc)]

use crate::runtime::{self as rtm, Ctx};
use gpuslice_abi::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Mutex;

/// One table: `N` pointer-sized words with static addresses.
#[repr(C)]
pub struct Table<const N: usize>(pub [*const c_void; N]);

// SAFETY: the words are function pointers and integers, never written after construction.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn addr(&'static self) -> *const c_void {
        self as *const Self as *const c_void
    }
}

fn debug_enabled() -> bool {
    rtm::config().map(|c| c.debug > 0).unwrap_or(false)
}

/// 0: not read yet; else the debug level + 1.
static TRACE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Trace a driver call (`FAKEGPU_DEBUG=2`); one relaxed load when tracing is off.
#[inline]
pub fn trace(name: &str) {
    let mut t = TRACE.load(Relaxed);
    if t == 0 {
        t = rtm::config().map(|c| c.debug).unwrap_or(0) + 1;
        TRACE.store(t, Relaxed);
    }
    if t > 2 {
        eprintln!("fakegpu: trace: {name}");
    }
}

/// Log at debug level (`FAKEGPU_DEBUG=1`): something the fake does not model was asked for.
fn debug(what: std::fmt::Arguments) {
    if debug_enabled() {
        eprintln!("fakegpu: debug: {what}");
    }
}

/// Log an entry point's error at debug level (`FAKEGPU_DEBUG=1`): the first thing to read when
/// a framework fails on the fake.
#[cold]
pub fn debug_error(name: &str, r: CUresult) {
    debug(format_args!(
        "{name} -> {r} ({})",
        cu_result_name(r).unwrap_or("?")
    ));
}

/// Log a `cuGetProcAddress` lookup that found nothing (`FAKEGPU_DEBUG=1`).
#[cold]
pub fn debug_missing(name: &str, version: i32, flags: u64, status: i32) {
    debug(format_args!(
        "cuGetProcAddress({name}, {version}, flags {flags}): not found (status {status})"
    ));
}

/// A stub slot: returns 0; with debug on, names the table and slot.
extern "C" fn stub<const T: usize, const S: usize>() -> CUresult {
    // No panic can cross: debug only formats two integers and the table's name.
    let _ = std::panic::catch_unwind(|| {
        debug(format_args!(
            "export table {} slot {S} called (a stub: returns 0)",
            NAMES[T]
        ))
    });
    CUDA_SUCCESS
}

/// Table names for the debug log, by the index used in `stub::<T, _>`.
const NAMES: [&str; 7] = [
    "6bd5fb6c (cudart interface)",
    "a094798c (static buffers)",
    "42d85a81",
    "c693336e (context storage)",
    "263e8860",
    "d4082055 (integrity)",
    "21318c60 (cuDNN/cuBLASLt)",
];

macro_rules! fp {
    ($f:expr) => {
        $f as *const c_void
    };
}
macro_rules! size {
    ($n:expr) => {
        ($n * std::mem::size_of::<usize>()) as *const c_void
    };
}
macro_rules! stubs {
    ($t:expr; $($s:literal)*) => { [$( fp!(stub::<$t, $s> as extern "C" fn() -> CUresult) ),*] };
}

// --- 6bd5fb6c: the cudart interface ----------------------------------------------------------

/// [2]: the device's primary context, retained.
unsafe extern "C" fn cudart_primary_ctx(out: *mut CUcontext, d: CUdevice) -> CUresult {
    crate::api::guard(|| {
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = rtm::primary_retain(d)?;
        // SAFETY: non-null, and the runtime passes a pointer to one CUcontext.
        unsafe { out.write(c.handle()) };
        Ok(())
    })
}

extern "C" fn zero() -> CUresult {
    CUDA_SUCCESS
}

pub static CUDART: Table<13> = Table([
    size!(13),
    fp!(stub::<0, 1> as extern "C" fn() -> CUresult),
    fp!(cudart_primary_ctx as unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult),
    fp!(stub::<0, 3> as extern "C" fn() -> CUresult),
    fp!(stub::<0, 4> as extern "C" fn() -> CUresult),
    fp!(stub::<0, 5> as extern "C" fn() -> CUresult),
    fp!(stub::<0, 6> as extern "C" fn() -> CUresult),
    fp!(stub::<0, 7> as extern "C" fn() -> CUresult),
    fp!(stub::<0, 8> as extern "C" fn() -> CUresult),
    fp!(stub::<0, 9> as extern "C" fn() -> CUresult),
    fp!(stub::<0, 10> as extern "C" fn() -> CUresult),
    fp!(stub::<0, 11> as extern "C" fn() -> CUresult),
    fp!(zero as extern "C" fn() -> CUresult),
]);

// --- a094798c: two writable zeroed buffers -----------------------------------------------------

const BUF_LEN: usize = 4096;
/// The buffers the runtime writes into; only their addresses are handed out.
struct Buffers([std::cell::UnsafeCell<[u8; BUF_LEN]>; 2]);
// SAFETY: the fake never reads or writes them; the runtime owns their contents.
unsafe impl Sync for Buffers {}
static BUFFERS: Buffers = Buffers([
    std::cell::UnsafeCell::new([0; BUF_LEN]),
    std::cell::UnsafeCell::new([0; BUF_LEN]),
]);

unsafe fn hand_buffer(i: usize, p: *mut *mut c_void, n: *mut usize) -> CUresult {
    if p.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the runtime passes valid out-pointers (n may be null).
    unsafe {
        p.write(BUFFERS.0[i].get() as *mut c_void);
        if !n.is_null() {
            n.write(BUF_LEN);
        }
    }
    CUDA_SUCCESS
}
unsafe extern "C" fn buffer_a(p: *mut *mut c_void, n: *mut usize) -> CUresult {
    // SAFETY: forwarded caller contract.
    unsafe { hand_buffer(0, p, n) }
}
unsafe extern "C" fn buffer_b(p: *mut *mut c_void, n: *mut usize) -> CUresult {
    // SAFETY: forwarded caller contract.
    unsafe { hand_buffer(1, p, n) }
}
type BufFn = unsafe extern "C" fn(*mut *mut c_void, *mut usize) -> CUresult;

pub static BUFFERS_TABLE: Table<7> = Table([
    size!(7),
    fp!(stub::<1, 1> as extern "C" fn() -> CUresult),
    fp!(buffer_a as BufFn),
    fp!(stub::<1, 3> as extern "C" fn() -> CUresult),
    fp!(stub::<1, 4> as extern "C" fn() -> CUresult),
    fp!(stub::<1, 5> as extern "C" fn() -> CUresult),
    fp!(buffer_b as BufFn),
]);

// --- 42d85a81: [2] is called once by cuBLASLt (no-op) -----------------------------------------

pub static T42D8: Table<4> = Table([
    size!(4),
    fp!(stub::<2, 1> as extern "C" fn() -> CUresult),
    fp!(zero as extern "C" fn() -> CUresult),
    fp!(stub::<2, 3> as extern "C" fn() -> CUresult),
]);

// --- c693336e: per-context storage -------------------------------------------------------------

/// A destructor the runtime registers with a value: `(ctx, key, value)`.
pub type Dtor = Option<unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void)>;

const SLOTS: usize = 16;

/// Per-context storage: a few (key, value, destructor) slots read without a lock. Writers
/// (`put`, `del`, teardown: rare) serialise on one mutex; `get` (nearly every runtime call)
/// is a scan of at most [`SLOTS`] atomics. A value is published before its key (Release), so a
/// reader that sees the key sees the value.
pub struct CtxStorage {
    keys: [AtomicUsize; SLOTS],
    values: [AtomicUsize; SLOTS],
    dtors: [AtomicUsize; SLOTS],
}

static WRITERS: Mutex<()> = Mutex::new(());

impl CtxStorage {
    pub const fn new() -> CtxStorage {
        CtxStorage {
            keys: [const { AtomicUsize::new(0) }; SLOTS],
            values: [const { AtomicUsize::new(0) }; SLOTS],
            dtors: [const { AtomicUsize::new(0) }; SLOTS],
        }
    }

    /// The value under `key`.
    pub fn get(&self, key: usize) -> Option<usize> {
        if key == 0 {
            return None;
        }
        for i in 0..SLOTS {
            if self.keys[i].load(Acquire) == key {
                return Some(self.values[i].load(Acquire));
            }
        }
        None
    }

    /// Store `value` under `key` (replacing an earlier one); `false` when every slot is taken.
    pub fn put(&self, key: usize, value: usize, dtor: usize) -> bool {
        if key == 0 {
            return false;
        }
        let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (0..SLOTS)
            .find(|&i| self.keys[i].load(Relaxed) == key)
            .or_else(|| (0..SLOTS).find(|&i| self.keys[i].load(Relaxed) == 0));
        let Some(i) = slot else { return false };
        self.values[i].store(value, Release);
        self.dtors[i].store(dtor, Release);
        self.keys[i].store(key, Release);
        true
    }

    /// Remove `key`; `false` if it was not there.
    pub fn del(&self, key: usize) -> bool {
        let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        match (0..SLOTS).find(|&i| key != 0 && self.keys[i].load(Relaxed) == key) {
            Some(i) => {
                self.keys[i].store(0, Release);
                true
            }
            None => false,
        }
    }

    /// Empty the storage, returning what was there as (key, value, destructor), for a context
    /// being destroyed: the caller runs the destructors without the lock held.
    pub fn drain(&self) -> Vec<(usize, usize, usize)> {
        let _w = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for i in 0..SLOTS {
            let k = self.keys[i].swap(0, AcqRel);
            if k != 0 {
                out.push((k, self.values[i].load(Acquire), self.dtors[i].load(Acquire)));
            }
        }
        out
    }
}

impl Default for CtxStorage {
    fn default() -> Self {
        Self::new()
    }
}

/// Run the destructors of a context's storage (called when the context is torn down).
pub fn run_dtors(c: &'static Ctx) {
    for (k, v, d) in c.storage.drain() {
        if d != 0 {
            // SAFETY: `d` was registered by the runtime as a destructor of this signature.
            let f: unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void) =
                unsafe { std::mem::transmute(d) };
            // SAFETY: the destructor's contract: the context, the key and the value it stored.
            unsafe { f(c.handle(), k as *mut c_void, v as *mut c_void) };
        }
    }
}

/// The context a storage call names: the given one, or the current one for null.
fn storage_ctx(ctx: CUcontext) -> Result<&'static Ctx, CUresult> {
    if ctx.is_null() {
        rtm::cur_ctx()
    } else {
        Ctx::from_handle(ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }
}

unsafe extern "C" fn storage_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Dtor,
) -> CUresult {
    crate::api::guard(|| {
        let c = storage_ctx(ctx)?;
        let d = dtor.map_or(0, |f| f as usize);
        if c.storage.put(key as usize, value as usize, d) {
            Ok(())
        } else {
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    })
}

unsafe extern "C" fn storage_del(ctx: CUcontext, key: *mut c_void) -> CUresult {
    crate::api::guard(|| {
        let c = storage_ctx(ctx)?;
        if c.storage.del(key as usize) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_HANDLE)
        }
    })
}

/// `get(void **value, ctx, key)`: on the runtime's path of nearly every call, so it takes no
/// lock and allocates nothing; a missing key fails (the runtime then calls `put`).
unsafe extern "C" fn storage_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    if value.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let c = match storage_ctx(ctx) {
        Ok(c) => c,
        Err(e) => return e,
    };
    match c.storage.get(key as usize) {
        Some(v) => {
            // SAFETY: non-null out-pointer from the runtime.
            unsafe { value.write(v as *mut c_void) };
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

type PutFn = unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void, Dtor) -> CUresult;
type DelFn = unsafe extern "C" fn(CUcontext, *mut c_void) -> CUresult;
type GetFn = unsafe extern "C" fn(*mut *mut c_void, CUcontext, *mut c_void) -> CUresult;

/// No size word: the three functions first.
pub static STORAGE: Table<6> = Table([
    fp!(storage_put as PutFn),
    fp!(storage_del as DelFn),
    fp!(storage_get as GetFn),
    fp!(stub::<3, 3> as extern "C" fn() -> CUresult),
    fp!(stub::<3, 4> as extern "C" fn() -> CUresult),
    fp!(stub::<3, 5> as extern "C" fn() -> CUresult),
]);

// --- 263e8860: asked by cudart 13.x ------------------------------------------------------------

unsafe extern "C" fn t263e_2(_ctx: CUcontext, out: *mut u32, _out2: *mut *mut c_void) -> CUresult {
    if !out.is_null() {
        // SAFETY: non-null out-pointer from the runtime.
        unsafe { out.write(0) };
    }
    CUDA_SUCCESS
}
extern "C" fn t263e_3() -> u32 {
    0
}

pub static T263E: Table<4> = Table([
    size!(4),
    fp!(stub::<4, 1> as extern "C" fn() -> CUresult),
    fp!(t263e_2 as unsafe extern "C" fn(CUcontext, *mut u32, *mut *mut c_void) -> CUresult),
    fp!(t263e_3 as extern "C" fn() -> u32),
]);

// --- d4082055: the integrity check -------------------------------------------------------------

/// The HMAC key of the integrity check.
const INTEGRITY_KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];

/// The message the check's third answer authenticates (see the reference file).
#[allow(clippy::too_many_arguments)]
pub fn integrity_message(
    driver: u32,
    ver: u32,
    pid: u32,
    thread_low: u32,
    cudart_table: u64,
    integrity_table: u64,
    check_fn: u64,
    secs: u64,
    devices: &[([u8; 16], i32, i32, i32)],
) -> Vec<u8> {
    let mut m = Vec::with_capacity(48 + 28 * devices.len());
    for w in [driver, ver, pid, thread_low] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    for w in [cudart_table, integrity_table, check_fn, secs] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    for (uuid, domain, bus, dev) in devices {
        m.extend_from_slice(uuid);
        for v in [domain, bus, dev] {
            m.extend_from_slice(&v.to_le_bytes());
        }
    }
    m
}

unsafe extern "C" fn integrity(ver: u32, secs: u64, out: *mut [u64; 2]) -> CUresult {
    crate::api::guard(|| {
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = rtm::rt()?;
        let mut answer = match ver % 10 {
            0 => [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8],
            1 => [0x1841181C03CB675C, 0x8ED383AA1F4CD1E8],
            _ => {
                let mut devs = Vec::with_capacity(r.devices.len());
                for d in &r.devices {
                    let pci = |a| crate::api::device_attribute(a, d);
                    devs.push((rtm::uuid_of(d), pci(50)?, pci(33)?, pci(34)?));
                }
                // SAFETY: getpid and pthread_self have no preconditions.
                let (pid, thread) = unsafe { (libc::getpid() as u32, libc::pthread_self() as u64) };
                let msg = integrity_message(
                    r.cfg.driver_version as u32,
                    ver,
                    pid,
                    thread as u32,
                    CUDART.addr() as u64,
                    INTEGRITY.addr() as u64,
                    INTEGRITY.0[1] as u64,
                    secs,
                    &devs,
                );
                let mac = hmac_md2(&INTEGRITY_KEY, &msg);
                [
                    u64::from_le_bytes(mac[..8].try_into().unwrap_or_default()),
                    u64::from_le_bytes(mac[8..].try_into().unwrap_or_default()),
                ]
            }
        };
        if r.cfg.bad_integrity {
            answer[0] ^= 1;
        }
        // SAFETY: non-null; the runtime passes room for two u64.
        unsafe { out.write_unaligned(answer) };
        Ok(())
    })
}

pub static INTEGRITY: Table<3> = Table([
    size!(3),
    fp!(integrity as unsafe extern "C" fn(u32, u64, *mut [u64; 2]) -> CUresult),
    fp!(stub::<5, 2> as extern "C" fn() -> CUresult),
]);

// --- 21318c60: cuDNN needs it to exist; cuBLASLt calls [4] ------------------------------------

unsafe extern "C" fn t2131_4(a: u64, out: *mut u64) -> CUresult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out-pointer from cuBLASLt.
    unsafe { out.write((a != 0) as u64) };
    CUDA_SUCCESS
}

pub static T2131: Table<95> = {
    let mut w: [*const c_void; 95] = stubs!(6;
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
        33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62
        63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92
        93 94);
    w[0] = size!(95);
    w[4] = fp!(t2131_4 as unsafe extern "C" fn(u64, *mut u64) -> CUresult);
    Table(w)
};

// --- the lookup ---------------------------------------------------------------------------------

/// The tables by UUID (raw bytes), with the hex the withhold knob matches.
fn lookup(id: &[u8; 16]) -> Option<*const c_void> {
    const fn u(s: &str) -> [u8; 16] {
        let b = s.as_bytes();
        let mut out = [0u8; 16];
        let mut i = 0;
        const fn h(c: u8) -> u8 {
            match c {
                b'0'..=b'9' => c - b'0',
                _ => c - b'a' + 10,
            }
        }
        while i < 16 {
            out[i] = h(b[2 * i]) << 4 | h(b[2 * i + 1]);
            i += 1;
        }
        out
    }
    const CUDART_ID: [u8; 16] = u("6bd5fb6c5bf4e74a8987d93912fd9df9");
    const BUFFERS_ID: [u8; 16] = u("a094798c2e742e7493f20800200c0a66");
    const T42D8_ID: [u8; 16] = u("42d85a8123f6cb478298f6e78a3aecdc");
    const STORAGE_ID: [u8; 16] = u("c693336e1121df11a8c368f355d89593");
    const T263E_ID: [u8; 16] = u("263e88607cd2614392f6bbd5006dfa7e");
    const INTEGRITY_ID: [u8; 16] = u("d4082055bde6704b8d34ba123c66e1f2");
    const T2131_ID: [u8; 16] = u("21318c60971432488ca641ff7324c8f2");
    Some(match *id {
        CUDART_ID => CUDART.addr(),
        BUFFERS_ID => BUFFERS_TABLE.addr(),
        T42D8_ID => T42D8.addr(),
        STORAGE_ID => STORAGE.addr(),
        T263E_ID => T263E.addr(),
        INTEGRITY_ID => INTEGRITY.addr(),
        T2131_ID => T2131.addr(),
        _ => return None,
    })
}

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// `cuGetExportTable(table, id)`.
///
/// # Safety
/// `table` must be null or valid for one pointer write, `id` null or valid for 16 bytes.
pub unsafe fn get_export_table(
    table: *mut *const c_void,
    id: *const CUuuid,
) -> Result<(), CUresult> {
    if table.is_null() || id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null; a CUuuid is 16 bytes.
    let id: [u8; 16] = unsafe { std::ptr::read_unaligned(id as *const [u8; 16]) };
    let withheld = rtm::config()
        .ok()
        .and_then(|c| c.withhold_table.as_deref())
        .is_some_and(|w| hex(&id).starts_with(w));
    let found = if withheld {
        debug(format_args!(
            "export table {} withheld (FAKEGPU_WITHHOLD_TABLE)",
            hex(&id)
        ));
        None
    } else {
        lookup(&id)
    };
    match found {
        Some(t) => {
            // SAFETY: non-null out-pointer.
            unsafe { table.write(t) };
            Ok(())
        }
        None => {
            if !withheld {
                debug(format_args!("unknown export table {} asked for", hex(&id)));
            }
            // SAFETY: non-null out-pointer.
            unsafe { table.write(std::ptr::null()) };
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
    }
}

// --- MD2 (RFC 1319) and HMAC-MD2 (RFC 2104, block size 16) ------------------------------------

/// The MD2 S-box: a permutation of 0..255 built from the digits of pi (RFC 1319).
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2 of `data` (RFC 1319).
pub fn md2(data: &[u8]) -> [u8; 16] {
    let pad = 16 - data.len() % 16;
    let mut msg = Vec::with_capacity(data.len() + pad + 16);
    msg.extend_from_slice(data);
    msg.extend(std::iter::repeat_n(pad as u8, pad));
    // The checksum block.
    let mut c = [0u8; 16];
    let mut l = 0u8;
    for block in msg.chunks_exact(16) {
        for j in 0..16 {
            c[j] ^= PI_SUBST[(block[j] ^ l) as usize];
            l = c[j];
        }
    }
    msg.extend_from_slice(&c);
    let mut x = [0u8; 48];
    for block in msg.chunks_exact(16) {
        for j in 0..16 {
            x[16 + j] = block[j];
            x[32 + j] = x[16 + j] ^ x[j];
        }
        let mut t = 0u8;
        for j in 0..18u8 {
            for b in x.iter_mut() {
                *b ^= PI_SUBST[t as usize];
                t = *b;
            }
            t = t.wrapping_add(j);
        }
    }
    x[..16].try_into().unwrap_or_default()
}

/// HMAC-MD2 (RFC 2104 with MD2's 16-byte block).
pub fn hmac_md2(key: &[u8], msg: &[u8]) -> [u8; 16] {
    let mut k = [0u8; 16];
    if key.len() > 16 {
        k = md2(key);
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Vec::with_capacity(16 + msg.len());
    inner.extend(k.iter().map(|b| b ^ 0x36));
    inner.extend_from_slice(msg);
    let ih = md2(&inner);
    let mut outer = Vec::with_capacity(32);
    outer.extend(k.iter().map(|b| b ^ 0x5c));
    outer.extend_from_slice(&ih);
    md2(&outer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(d: [u8; 16]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md2_rfc1319_test_suite() {
        let cases = [
            ("", "8350e5a3e24c153df2275c9f80692773"),
            ("a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"),
            ("abc", "da853b0d3f88d99b30283a69e6ded6bb"),
            ("message digest", "ab4f496bfb2a530b219ff33031fe06b0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "4e8ddff3650292ab5a4108c3aa47940b",
            ),
            (
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "da33def2a42df13975352846c30338cd",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "d5976f79d83d3a0dc9806c3c66f3efd8",
            ),
        ];
        for (msg, want) in cases {
            assert_eq!(h(md2(msg.as_bytes())), want, "MD2({msg:?})");
        }
    }

    #[test]
    fn hmac_md2_is_rfc2104_over_md2() {
        // HMAC's definition with a 16-byte key (the block size): H((K^opad) || H((K^ipad) || m)).
        let key = INTEGRITY_KEY;
        let msg = b"what the runtime sends";
        let mut inner: Vec<u8> = key.iter().map(|b| b ^ 0x36).collect();
        inner.extend_from_slice(msg);
        let mut outer: Vec<u8> = key.iter().map(|b| b ^ 0x5c).collect();
        outer.extend_from_slice(&md2(&inner));
        assert_eq!(hmac_md2(&key, msg), md2(&outer));
        // A different key or message changes the answer.
        assert_ne!(
            hmac_md2(&key, msg),
            hmac_md2(&key, b"what the runtime sent")
        );
        assert_ne!(hmac_md2(&[0; 16], msg), hmac_md2(&key, msg));
        // A key longer than the block is hashed first.
        let long = [7u8; 40];
        assert_eq!(hmac_md2(&long, msg), hmac_md2(&md2(&long), msg));
    }

    #[test]
    fn integrity_message_layout() {
        let m = integrity_message(
            13000,
            129002,
            42,
            0xdead_beef,
            0x1111,
            0x2222,
            0x3333,
            0x4444,
            &[([9; 16], 0, 1, 0), ([8; 16], 0, 2, 0)],
        );
        assert_eq!(m.len(), 48 + 2 * 28);
        assert_eq!(&m[..4], &13000u32.to_le_bytes());
        assert_eq!(&m[4..8], &129002u32.to_le_bytes());
        assert_eq!(&m[12..16], &0xdead_beefu32.to_le_bytes());
        assert_eq!(&m[40..48], &0x4444u64.to_le_bytes());
        assert_eq!(&m[48..64], &[9; 16]);
        assert_eq!(&m[68..72], &1i32.to_le_bytes());
        assert_eq!(&m[76..92], &[8; 16]);
    }

    #[test]
    fn storage_get_put_del() {
        let s = CtxStorage::new();
        assert_eq!(s.get(5), None);
        assert!(s.put(5, 50, 0));
        assert!(s.put(6, 60, 0));
        assert_eq!(s.get(5), Some(50));
        assert!(s.put(5, 51, 0));
        assert_eq!(s.get(5), Some(51));
        assert!(s.del(5));
        assert!(!s.del(5));
        assert_eq!(s.get(5), None);
        for k in 10..10 + SLOTS - 1 {
            assert!(s.put(k, k, 0));
        }
        assert!(!s.put(99, 1, 0), "full storage refuses");
        assert_eq!(s.drain().len(), SLOTS);
        assert_eq!(s.get(6), None);
    }

    #[test]
    fn tables_have_their_sizes_and_unknown_ids_fail() {
        assert_eq!(CUDART.0[0] as usize, 13 * 8);
        assert_eq!(T2131.0[0] as usize, 95 * 8);
        let mut t: *const c_void = std::ptr::dangling();
        let unknown = CUuuid { bytes: [0x5a; 16] };
        // SAFETY: both pointers are valid locals.
        let r = unsafe { get_export_table(&mut t, &unknown) };
        assert_eq!(r, Err(CUDA_ERROR_NOT_SUPPORTED));
        assert!(t.is_null());
    }
}
