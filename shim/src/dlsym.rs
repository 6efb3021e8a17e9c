//! Our `dlsym`: clients find driver functions with `dlsym(libcuda_handle, "cuMemAlloc_v2")`,
//! so we answer with our wrapper whenever the real `dlsym` finds a hooked name.
//!
//! `dlsym(RTLD_NEXT, ..)` means "after the caller", and glibc finds the caller from the return
//! address. So the exported entry is a tiny assembly stub: for `RTLD_NEXT` it *jumps* to the
//! real `dlsym` with the caller's return address intact (other interposers, sanitizers and
//! allocators keep working); for any other handle it jumps to [`dlsym_hooked`]. Nothing here
//! allocates, locks, or initialises CUDA: it runs in every process of a node that preloads us.

use crate::hooks::find_hooked;
use crate::log;
use crate::real::{real_dlsym, real_dlsym_addr};
use core::ffi::{c_char, c_void, CStr};

/// The handle-other-than-`RTLD_NEXT` path of our `dlsym`.
///
/// # Safety
/// `symbol` is null or NUL-terminated (the caller's `dlsym` contract).
pub unsafe extern "C" fn dlsym_hooked(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return core::ptr::null_mut();
    };
    // SAFETY: the real dlsym, with the caller's arguments.
    let p = unsafe { real(handle, symbol) };
    if p.is_null() || symbol.is_null() || crate::config::disabled() {
        return p;
    }
    // Cheap filter before comparing names: every hooked name starts with "cu" or "nvml".
    // SAFETY: symbol is non-null (checked above) and NUL-terminated, so its first byte exists.
    let first = unsafe { *symbol } as u8;
    if first != b'c' && first != b'n' {
        return p;
    }
    // SAFETY: symbol is NUL-terminated (checked non-null above).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let answer = find_hooked(name).map_or(p, |w| w.0 as *mut c_void);
    if log::enabled(log::Level::Debug) {
        log::lookup("dlsym", name, None, log::answer_of(answer, answer != p));
    }
    answer
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
/// The exported `dlsym` (see the module comment).
///
/// # Safety
/// As `dlsym(3)`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {hooked}",
        // RTLD_NEXT: find the real dlsym (keeping the arguments), then tail-jump to it.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "xor eax, eax",
        "ret",
        hooked = sym dlsym_hooked,
        resolve = sym real_dlsym_addr,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
/// The exported `dlsym` (see the module comment).
///
/// # Safety
/// As `dlsym(3)`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmn x0, #1",
        "b.ne {hooked}",
        "stp x0, x1, [sp, #-32]!",
        "str x30, [sp, #16]",
        "bl {resolve}",
        "mov x16, x0",
        "ldr x30, [sp, #16]",
        "ldp x0, x1, [sp], #32",
        "cbz x16, 2f",
        "br x16",
        "2:",
        "mov x0, #0",
        "ret",
        hooked = sym dlsym_hooked,
        resolve = sym real_dlsym_addr,
    )
}

// The entry stub keeps the caller's return address for `RTLD_NEXT`; a Rust function here would
// resolve `RTLD_NEXT` relative to gpuslice instead, so other architectures get no stand-in.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("gpuslice's dlsym entry stub exists for x86_64 and aarch64 only");
