//! Opaque handles (`CUcontext`, `CUstream`, `CUevent`, `CUmodule`, `CUfunction`, `CUgraph`,
//! `CUgraphExec`, `CUmemoryPool`, `CUarray`): each is the address of a leaked object of the fake, which is
//! never freed, so a stale handle still points at readable memory and is refused by the
//! object's own state (destroyed, inactive) rather than crashing.
//!
//! Every handle type is `#[repr(C)]` with a `u64` magic as its first field, distinct per type.
//! [`resolve`] reads that magic as a plain `u64` before it forms a reference, so a handle of
//! one type passed where another is expected is an error, not a misread object.

use std::ffi::c_void;

/// An object whose address is a handle.
///
/// # Safety
/// The type must be `#[repr(C)]` with a `u64` field holding [`Handle::MAGIC`] first, its
/// values must only ever be leaked (never freed), and `MAGIC` must differ from every other
/// handle type's.
pub unsafe trait Handle: Sized + 'static {
    /// The value of the object's first field.
    const MAGIC: u64;
}

/// The object of type `T` a handle names, or `None` when it is null, misaligned or names
/// something else.
pub fn resolve<T: Handle>(h: *const c_void) -> Option<&'static T> {
    if h.is_null() || !(h as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return None;
    }
    // SAFETY: by the API contract `h` is a handle this library gave out: the address of a
    // leaked handle object, which starts with a `u64` magic (trait contract), so eight bytes
    // are readable there whatever its type.
    let magic = unsafe { (h as *const u64).read() };
    // SAFETY: the magic says it is a leaked `T`, alive for the rest of the process.
    (magic == T::MAGIC).then(|| unsafe { &*(h as *const T) })
}
