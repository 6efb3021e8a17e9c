//! `d4082055`: the start-up integrity check, an HMAC-MD2 ([`super::hmac_md2`]) over the
//! driver version, pid, thread, table addresses, time and each device's UUID and PCI location.
//! Apart because its message layout is a format of its own (`shared/reference/
//! cudart-export-tables.md`), tested field by field.

use super::md2::hmac_md2;
use super::{stub, Table, CUDART};
use crate::api::{device_attribute, guard};
use crate::runtime as rtm;
use gpuslice_abi::*;
use std::ffi::c_void;

/// The HMAC key of the integrity check.
pub(super) const INTEGRITY_KEY: [u8; 16] = [
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
    guard(|| {
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
                    let pci = |a| device_attribute(a, d);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
