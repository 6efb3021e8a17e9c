//! The exported wrappers: the table of symbols (`symbols.rs`) expanded into one
//! `#[no_mangle] extern "C"` wrapper per hooked row, which finds the real function
//! (`real.rs`), passes straight through under `GPUSLICE_DISABLE=1`, and otherwise calls the
//! handler named in the row with the real function as first argument, catching any panic;
//! and the two ways a program that looks functions up gets a wrapper: by name ([`find_hooked`],
//! for our `dlsym`) and by the real function's address (`cuGetProcAddress`, below). This is
//! the top of the shim: it imports the handlers, and nothing imports it but `dlsym.rs`.
//!
//! No row spells a signature: the function types are [`gpuslice_abi::pfn`]'s and the wrappers'
//! parameter lists come from [`gpuslice_abi::signature!`], both generated from NVIDIA's headers
//! (`abi/gen/pfn.py`). A handler whose parameters differ from the header's (a `c_uint` where
//! `cuda.h` has `size_t`) does not build.
//!
//! # The handler contract
//! Every handler named in a row is an `unsafe fn` called only by its wrapper, and may rely on:
//! - `real` is the real function of the same name, whose C signature is the row's `pfn` type;
//!   calling it with the program's own arguments is exactly the call the program made, under
//!   the driver's (or NVML's) contract;
//! - every argument is the program's, unchanged, so each pointer is what the header says it
//!   is: null, or valid for the reads (descriptors, `const` inputs) and writes (out-pointers)
//!   that function's documentation describes. A handler dereferences a pointer only after
//!   checking it non-null, and reads an out-pointer only after the real call succeeded (so
//!   the driver has written it).
//!
//! The SAFETY comments in the handlers name which of these they use.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use crate::log;
use crate::real::{self, hooked_by_address, Lib, Sym, COUNT, SYMBOLS};
use crate::{capture, contexts, init, launch, memory, nvml, report, sync};
use core::ffi::{c_char, c_int, c_void, CStr};
use gpuslice_abi::{pfn, CUDA_SUCCESS};

/// The address of an exported wrapper.
#[derive(Clone, Copy)]
pub struct Wrapper(pub *const ());

// SAFETY: a function address is immutable and valid from any thread.
unsafe impl Sync for Wrapper {}

macro_rules! hook_table {
    (
        hooks { $( $lib:ident $name:ident => $handler:path; )* }
        reals { $( $rlib:ident $rname:ident; )* }
    ) => {
        /// Per symbol of the table ([`Sym`]), its wrapper (`None` for real-only rows).
        static WRAPPERS: [Option<Wrapper>; COUNT] = {
            let mut w = [None; COUNT];
            $( w[Sym::$name as usize] = Some(Wrapper(exports::$name as *const ())); )*
            w
        };

        /// The exported wrappers, each with the header's signature.
        pub mod exports {
            use super::*;
            $( gpuslice_abi::signature!($name => export!($lib $name $handler;)); )*
        }
    };
}

/// One exported wrapper; `signature!` appends the C parameter list and return type.
macro_rules! export {
    ($lib:ident $name:ident $handler:path; ($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            let Some(real) = real::$name() else { return Lib::$lib.missing() };
            if crate::config::disabled() {
                // SAFETY: the real function of this signature, with the program's arguments.
                return unsafe { real($($arg),*) };
            }
            // SAFETY: the handler gets the caller's arguments unchanged and the real function
            // of the same signature; no panic crosses the C boundary.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { $handler(real, $($arg),*) })) {
                Ok(r) => r,
                Err(_) => Lib::$lib.internal_error(),
            }
        }
    };
}

crate::symbols::for_each_symbol!(hook_table);

/// The wrapper of the hooked symbol called `name` (no NUL), if any.
pub fn find_hooked(name: &[u8]) -> Option<Wrapper> {
    SYMBOLS
        .iter()
        .position(|s| s.hooked && &s.name.as_bytes()[..s.name.len() - 1] == name)
        .and_then(|i| WRAPPERS[i])
}

// `cuGetProcAddress` and `cuGetProcAddress_v2`: cudart, PyTorch and cuda-bindings find every
// driver function through these. We let the real driver choose (version, `_ptsz`/`_ptds`
// variant, per-thread flags), then swap the pointer it returns for our wrapper when that
// pointer is the real function of a hooked symbol. Matching by *address* rather than by name
// is what keeps the driver's choice: `cuMemAllocAsync` with the per-thread flag comes back as
// the real `cuMemAllocAsync_ptsz`, which maps to our `cuMemAllocAsync_ptsz` wrapper. Asked
// for `cuGetProcAddress` itself, the driver returns its own, which maps to ours the same way.

/// Swap the driver's answer in `*p` for our wrapper when it is a hooked function; at debug level,
/// log the lookup.
///
/// # Safety
/// Called after the real `cuGetProcAddress` succeeded with these arguments: `p` is null or the
/// caller's out-pointer the driver has just written; `symbol` is null or NUL-terminated.
unsafe fn swap_for_wrapper(
    how: &str,
    symbol: *const c_char,
    p: *mut *mut c_void,
    version: c_int,
    flags: u64,
) {
    if p.is_null() {
        return;
    }
    let mut ours = false;
    // SAFETY: p is non-null (checked above), written by the driver's successful call.
    let found = unsafe { *p };
    let mut answer = found;
    if let Some(i) = hooked_by_address(found) {
        if let Some(w) = WRAPPERS[i] {
            answer = w.0 as *mut c_void;
            // SAFETY: p is the caller's non-null out-pointer, valid for writes.
            unsafe { *p = answer };
            ours = true;
        }
    }
    if !symbol.is_null() && log::enabled(log::Level::Debug) {
        // SAFETY: the driver accepted `symbol` as a NUL-terminated name.
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        log::lookup(
            how,
            name,
            Some((version, flags)),
            log::answer_of(answer, ours),
        );
    }
}

/// `cuGetProcAddress` (CUDA 11.3–11.8 signature).
pub unsafe fn get_proc_address(
    real: pfn::cuGetProcAddress,
    symbol: *const c_char,
    p: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> u32 {
    // SAFETY: the handler contract (hooks.rs): `real` with the program's arguments.
    let r = unsafe { real(symbol, p, version, flags) };
    if r == CUDA_SUCCESS {
        // SAFETY: the real call succeeded with these arguments, as swap_for_wrapper needs.
        unsafe { swap_for_wrapper("cuGetProcAddress", symbol, p, version, flags) };
    }
    r
}

/// `cuGetProcAddress_v2` (CUDA 12: with the symbol status).
pub unsafe fn get_proc_address_v2(
    real: pfn::cuGetProcAddress_v2,
    symbol: *const c_char,
    p: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> u32 {
    // SAFETY: the handler contract (hooks.rs): `real` with the program's arguments.
    let r = unsafe { real(symbol, p, version, flags, status) };
    if r == CUDA_SUCCESS {
        // SAFETY: the real call succeeded with these arguments, as swap_for_wrapper needs.
        unsafe { swap_for_wrapper("cuGetProcAddress_v2", symbol, p, version, flags) };
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fake GPU's `cuGetProcAddress` table: what the driver the tests run on (a 13.0
    /// driver, see docs/fakegpu.md) answers, rows `base flags min_version symbol`.
    const PROCADDR: &str = include_str!("../../tests/fakegpu/src/procaddr.tsv");

    /// The base name of an exported symbol: `cuMemAllocAsync_ptsz` -> `cuMemAllocAsync`,
    /// `cuStreamBeginCapture_v2_ptsz` -> `cuStreamBeginCapture`.
    fn base(sym: &str) -> &str {
        let s = sym
            .strip_suffix("_ptsz")
            .or_else(|| sym.strip_suffix("_ptds"))
            .unwrap_or(sym);
        match s.rfind("_v") {
            Some(i) if s[i + 2..].chars().all(|c| c.is_ascii_digit()) && i + 2 < s.len() => &s[..i],
            _ => s,
        }
    }

    /// A CUDA 12.x or 13.x runtime asks for its own version: whatever the driver then hands
    /// out for a base name the shim hooks in any form must be a form the shim hooks, or that
    /// path escapes it (the driver's answer is matched to a wrapper by address).
    #[test]
    fn every_form_a_current_runtime_gets_of_a_hooked_entry_point_is_hooked() {
        let hooked: Vec<&str> = SYMBOLS
            .iter()
            .filter(|s| s.hooked && s.lib == Lib::Cuda)
            .map(|s| s.name.trim_end_matches('\0'))
            .collect();
        let bases: Vec<&str> = hooked.iter().map(|s| base(s)).collect();
        // (base, flags) -> [(min_version, symbol)], for the bases the shim hooks.
        let mut rows: std::collections::HashMap<(&str, &str), Vec<(u32, &str)>> =
            std::collections::HashMap::new();
        for line in PROCADDR.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            let [b, flags, ver, sym] = f[..] else {
                panic!("bad row {line:?}")
            };
            if bases.contains(&b) {
                rows.entry((b, flags))
                    .or_default()
                    .push((ver.parse().unwrap(), sym));
            }
        }
        let mut missing = Vec::new();
        let mut checked = 0;
        for ((b, flags), rows) in &rows {
            // What a 12.0+ runtime can be given: the row in force at 12000 and every later one.
            let from = rows
                .iter()
                .filter(|(v, _)| *v <= 12000)
                .map(|(v, _)| *v)
                .max()
                .unwrap_or(0);
            for (ver, sym) in rows.iter().filter(|(v, s)| *v >= from && *s != "-") {
                checked += 1;
                if !hooked.contains(sym) {
                    missing.push(format!("{b} (flags {flags}) -> {sym} from {ver}"));
                }
            }
        }
        assert!(checked > 50, "only {checked} rows checked");
        assert!(
            missing.is_empty(),
            "the driver hands out forms the shim does not hook:\n{}",
            missing.join("\n")
        );
    }
}
