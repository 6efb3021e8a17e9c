//! `cuGetExportTable`: the driver's private tables that NVIDIA's CUDA runtime (libcudart),
//! cuDNN and cuBLASLt ask for by UUID, as recorded in `shared/reference/cudart-export-tables.md`.
//! Each table is a static array of pointer-sized words; word 0 is its size in bytes (except the
//! context-storage table). The slots the runtime calls do what the reference says; every other
//! slot is a stub that returns 0 and, with `FAKEGPU_DEBUG=1`, says which table and slot was
//! called. An unknown table is `CUDA_ERROR_NOT_SUPPORTED` (logged at debug), never a crash.
//!
//! The integrity table answers cudart's start-up check with an HMAC-MD2 ([`md2()`], [`hmac_md2`])
//! over the process's and devices' identity; `FAKEGPU_BAD_INTEGRITY=1` answers it wrongly and
//! `FAKEGPU_WITHHOLD_TABLE=<uuid hex>` refuses one table, so tests can show both are needed.
//!
//! One file a table whose slots keep state or reasoning of their own:
//!
//! - this file: [`Table`], the stub slots, the small tables (the cudart interface, the static
//!   buffers, `42d85a81`, `263e8860`, `21318c60`) and the lookup by UUID;
//! - `storage.rs`: the per-context storage table, over each context's
//!   [`crate::ctx_storage::CtxStorage`] (read without a lock on cudart's path of nearly every
//!   call);
//! - `integrity.rs`: the start-up integrity check and the message it authenticates;
//! - `md2.rs`: MD2 (RFC 1319) and HMAC-MD2, checked against the RFC's test suite.

#![allow(clippy::missing_safety_doc)]

use crate::debug::debug;
use crate::runtime as rtm;
use gpuslice_abi::*;
use std::ffi::c_void;

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

// The slot macros come before the `mod`s so that the tables in them can use them too.
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

mod integrity;
mod md2;
mod storage;

pub use integrity::{integrity_message, INTEGRITY};
pub use md2::{hmac_md2, md2};
pub use storage::STORAGE;

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

#[cfg(test)]
mod tests {
    use super::*;

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
