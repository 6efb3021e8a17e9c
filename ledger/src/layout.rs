//! The ledger file's `#[repr(C)]` layout, defined once.
//!
//! The file is `Header`, then `[Device; MAX_DEVICES]`, `[Slice; MAX_SLICES]`,
//! `[Proc; MAX_PROCS]`, `[Allowance; MAX_ALLOWANCES]`, `[Shared; MAX_SHARED]`, each array starting on a
//! 4 KiB boundary. A freshly created file is all
//! zeroes except the header, so every all-zero record is a valid *free* record. Everything that
//! changes after creation is an atomic; cold-path fields change only under the header's robust
//! mutex, hot-path counters (`Slice::memory_used`, `Device::best_effort_used`, `ProcDevice`)
//! only through `account.rs`.
//!
//! Any change to these structs (or to the records of `gpuslice-sched`, `sched/src/records.rs`)
//! must bump [`LAYOUT_VERSION`]: processes of different versions then refuse each other's file
//! with a clear error instead of misreading it.

use core::cell::UnsafeCell;
use core::mem::size_of;
use core::sync::atomic::{AtomicU32, AtomicU64};
use gpuslice_sched::{SchedDevice, SchedProc, SchedSlice};

/// The first 8 bytes of every ledger file.
pub const MAGIC: [u8; 8] = *b"GPUSLICE";
/// Bumped on every layout change (including `gpuslice-sched`'s records).
pub const LAYOUT_VERSION: u32 = 9;
/// Devices per node.
pub const MAX_DEVICES: usize = 16;
/// Slice records per node (a slice is per device: `(name, device)`). Sized so that every
/// process slot can hold a private slice on every device: 512 unnamed processes on 16 GPUs.
pub const MAX_SLICES: usize = MAX_PROCS * MAX_DEVICES;
/// Attached processes per node.
pub const MAX_PROCS: usize = 512;
/// Node mode: best-effort allowances, one per (device, uid) with best-effort processes.
pub const MAX_ALLOWANCES: usize = 256;
/// `ProcDevice::account` of a node-mode best-effort process: this plus its allowance's index.
pub const ALLOWANCE_ACCOUNT_BASE: u32 = 0x4000_0000;
/// Exported VMM allocations whose charge may outlive their exporter (`Shared`): when full, an
/// export is charged to its exporter until it exits, as without the table.
pub const MAX_SHARED: usize = 256;
/// Node mode: `Shared` records one user's exports may hold, so no tenant fills the table.
pub const SHARED_PER_UID: usize = MAX_SHARED / 4;
/// Importing processes one `Shared` record remembers; further importers are not counted.
pub const SHARED_IMPORTERS: usize = 16;
/// `Shared::exporter` once the exporter let go (released it, or died), and a free importer
/// entry.
pub const NO_SLOT: u32 = u32::MAX;
/// Longest slice name, in bytes (names are NUL-padded, not NUL-terminated when full).
pub const NAME_LEN: usize = 64;
// The settings grammar refuses any name the record cannot hold.
const _: () = assert!(gpuslice_quantity::MAX_SLICE_NAME < NAME_LEN);
/// Room for a device UUID as text (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` is 40 bytes).
pub const UUID_LEN: usize = 48;
/// Room for a slice's claim label (Kubernetes `namespace/name`: 63 + 1 + 253 bytes, rounded).
pub const CLAIM_LEN: usize = 320;
/// Room for a device's marketing name.
pub const DEVICE_NAME_LEN: usize = 96;

/// `ProcDevice::account` when the process has not joined anything on that device.
pub const ACCOUNT_NONE: u32 = u32::MAX;
/// `ProcDevice::account` when the process is charged to the device's best-effort allowance.
pub const ACCOUNT_BEST_EFFORT: u32 = u32::MAX - 1;
/// `Slice::memory_limit` of a slice without a quota (its processes are best effort).
pub const NO_LIMIT: u64 = u64::MAX;
/// Compute fractions are stored in parts per million (the settings grammar's unit).
pub use gpuslice_quantity::{Cap, Share, PPM};

/// Record states (`Device::state`, `Slice::state`, `Proc::state`).
pub const STATE_FREE: u32 = 0;
/// In use.
pub const STATE_ACTIVE: u32 = 1;
/// A process found dead whose memory could not be reclaimed yet (a neighbour was mid-update);
/// the next reap finishes it.
pub const STATE_DYING: u32 = 2;
/// A shared-allocation record (`Shared::state`) nobody is charged for any more while a
/// descriptor of it may still be imported: its device, identity and size stay, so the next
/// importer is charged for it (`ledger/src/ledger/shared.rs`); reused when the table is full.
pub const STATE_ORPHAN: u32 = 3;

/// Set in `Header::ready` once the creator has initialised everything.
pub const READY: u32 = 0x5245_4459; // "READ"

/// Byte offset, in the ledger file, of the OFD lock that proves process slot 0 alive; slot `i`
/// locks byte `LIVENESS_LOCK_BASE + i` (far past the end of the file: locks need no data there).
pub const LIVENESS_LOCK_BASE: i64 = 1 << 40;

/// A process-shared robust pthread mutex, living in the mapped file.
#[repr(C, align(64))]
pub struct SharedMutex(pub UnsafeCell<libc::pthread_mutex_t>);

/// The file header: identification, size checks, the cold-path lock.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// `size_of::<Header>()` of the creator.
    pub header_size: u32,
    /// `size_of::<Device>()` of the creator.
    pub device_size: u32,
    /// `size_of::<Slice>()` of the creator.
    pub slice_size: u32,
    /// `size_of::<Proc>()` of the creator.
    pub proc_size: u32,
    /// [`MAX_DEVICES`] of the creator.
    pub max_devices: u32,
    /// [`MAX_SLICES`] of the creator.
    pub max_slices: u32,
    /// [`MAX_PROCS`] of the creator.
    pub max_procs: u32,
    /// Total file size.
    pub total_size: u64,
    /// [`READY`] once initialised (files appear under their final name only when ready; this
    /// is a second guard).
    pub ready: AtomicU32,
    /// Number of times the cold-path mutex was found abandoned by a dead holder and repaired.
    pub mutex_recoveries: AtomicU32,
    /// Bumped on every cold-path change (attach, slice create/remove, reap): lets a reader
    /// notice that something moved.
    pub generation: AtomicU64,
    /// The one lock of the cold paths.
    pub mutex: SharedMutex,
    /// [`MODE_PERSONAL`] or [`MODE_NODE`]: who may write this file (set by its creator).
    pub mode: AtomicU32,
    /// pid of the current holder of `mutex` (0: none), to name it when the lock times out.
    pub lock_holder: AtomicU32,
    /// Node mode: the monitor's turns thread's heartbeat (CLOCK_MONOTONIC ns). Older than
    /// `sched::MONITOR_STALE_NS`: nobody grants compute turns, processes launch unthrottled.
    pub monitor_beat_ns: AtomicU64,
    /// Node mode: the turns thread sleeps on this futex word; a process handing a turn back
    /// wakes it (`FUTEX_WAKE` needs no write access). Nobody writes it.
    pub turns_bell: AtomicU32,
    /// One past the highest slice record ever made active (records are taken lowest first):
    /// the scheduler looks at these, not all [`MAX_SLICES`]. Only grows; read clamped.
    pub slice_hwm: AtomicU32,
}

/// `Header::mode` of a personal ledger: one user's processes share it read-write.
pub const MODE_PERSONAL: u32 = 0;
/// `Header::mode` of a node policy: written only by the root monitor, read-only for tenants.
pub const MODE_NODE: u32 = 0x4e4f_4445; // "NODE"
/// `Slice::owner_uid` of a slice any user may join (operator slices unless restricted).
pub const ANY_UID: u32 = u32::MAX;

/// One GPU, keyed by its UUID so processes with different `CUDA_VISIBLE_DEVICES` agree.
#[repr(C, align(64))]
pub struct Device {
    /// [`STATE_FREE`] or [`STATE_ACTIVE`].
    pub state: AtomicU32,
    /// Non-zero while a reaper settles this device's best-effort allowance: hot-path updates pause
    /// (briefly, bounded) so it can find a quiet moment. Correctness never depends on it.
    pub reaping: AtomicU32,
    /// UUID as text, `GPU-...`, NUL-padded.
    pub uuid: Text<UUID_LEN>,
    /// Marketing name, NUL-padded.
    pub name: Text<DEVICE_NAME_LEN>,
    /// Physical memory of the device in bytes.
    pub memory_total: AtomicU64,
    /// Sum of `memory_limit` of the slices with a quota on this device.
    pub memory_reserved: AtomicU64,
    /// Sum of what best-effort processes (no quota) hold on this device. Hot-path counter,
    /// capped at `memory_total - memory_reserved`.
    pub best_effort_used: AtomicU64,
    /// Sum of compute guarantees of slices on this device, in ppm (≤ [`PPM`]).
    pub compute_reserved: AtomicU64,
    /// Allocations refused on this device's best-effort allowance.
    pub best_effort_denied_total: AtomicU64,
    /// Scheduler state (compute).
    pub sched: SchedDevice,
    /// Node mode: bytes one CUDA context is charged to its slice on this device (the monitor's
    /// `--context-memory`, by default what its own context took); 0: contexts are not charged
    /// (personal mode). Written by the monitor only.
    pub context_bytes: AtomicU64,
}

/// A slice on one device: a quota shared by the processes that joined it.
#[repr(C, align(64))]
pub struct Slice {
    /// [`STATE_FREE`] or [`STATE_ACTIVE`].
    pub state: AtomicU32,
    /// Index of the device record.
    pub device: AtomicU32,
    /// 1 when created by an operator (`gpuslice slice create`): persists when empty, and
    /// processes cannot change its values.
    pub operator_defined: AtomicU32,
    /// Number of live processes attached.
    pub attached: AtomicU32,
    /// 1 for a process's private slice (`GPUSLICE_SLICE` unset): never joined by name.
    pub private: AtomicU32,
    /// Non-zero while a reaper settles this slice's counter (see `Device::reaping`).
    pub reaping: AtomicU32,
    /// Name, NUL-padded.
    pub name: Text<NAME_LEN>,
    /// Quota in bytes, [`NO_LIMIT`] for a best-effort slice (charged to the device allowance).
    pub memory_limit: AtomicU64,
    /// Guaranteed compute share, ppm (0: best effort): [`Slice::share`].
    pub compute_share_ppm: AtomicU32,
    /// Compute ceiling, ppm ([`PPM`]: no cap): [`Slice::cap`].
    pub compute_cap_ppm: AtomicU32,
    /// Allocations refused for the quota.
    pub alloc_denied_total: AtomicU64,
    /// Allocations charged (count).
    pub alloc_total: AtomicU64,
    /// Bytes held by the slice's processes: the hot-path word, alone on its cache line.
    /// Never above `memory_limit`. Unused (0) for best-effort slices.
    pub memory_used: CacheLine<AtomicU64>,
    /// Scheduler state (compute).
    pub sched: SchedSlice,
    /// The operator's label for the slice (Kubernetes `namespace/name`), NUL-padded; empty
    /// for none.
    pub claim: Text<CLAIM_LEN>,
    /// Node mode: the uid whose processes may join it ([`ANY_UID`]: anyone).
    pub owner_uid: AtomicU32,
    /// The monitor's audit: 1 while NVML reports more for the slice's processes than its quota.
    pub over_quota: AtomicU32,
    /// The audit: bytes NVML last reported for the slice's processes.
    pub audit_observed: AtomicU64,
    /// The audit: times the slice went over its quota.
    pub violations_total: AtomicU64,
    /// Node mode: bytes of the slice's unused reservation the monitor holds on the device
    /// (balloons, docs/security.md): free to the slice's processes though the driver does not
    /// count them free, so `cuMemGetInfo` and NVML add them back. Written by the monitor only.
    pub balloon_held: AtomicU64,
    /// Node mode: bytes of `memory_used` that are the CUDA contexts of the slice's live
    /// processes (the rest is allocations), mirrored from the region by the monitor.
    pub context_used: AtomicU64,
}

impl Slice {
    /// Its guaranteed compute share (a value past [`PPM`], which only a scribbler writes, is
    /// the whole device).
    pub fn share(&self) -> Share {
        Share::from_ppm(
            self.compute_share_ppm
                .load(core::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Its compute cap.
    pub fn cap(&self) -> Cap {
        Cap::from_ppm(
            self.compute_cap_ppm
                .load(core::sync::atomic::Ordering::Relaxed),
        )
    }
}

/// Keeps a hot atomic alone on its cache line so neighbours do not false-share it.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct CacheLine<T>(pub T);

impl<T> core::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// What one process holds on one device.
#[repr(C)]
pub struct ProcDevice {
    /// Slice index the process joined on this device, [`ACCOUNT_NONE`] if none.
    pub slice: AtomicU32,
    /// Which counter its allocations are charged to: the slice index (quota), or
    /// [`ACCOUNT_BEST_EFFORT`] (the device's best-effort allowance), or [`ACCOUNT_NONE`].
    pub account: AtomicU32,
    /// Bytes this process holds on this device (its part of the account's counter).
    pub charged: AtomicU64,
}

/// An attached process.
#[repr(C, align(64))]
pub struct Proc {
    /// [`STATE_FREE`], [`STATE_ACTIVE`] or [`STATE_DYING`].
    pub state: AtomicU32,
    /// pid in the attaching process's own PID namespace (display only).
    pub pid: AtomicU32,
    /// Start time of that pid (`/proc/<pid>/stat` field 22), against pid reuse.
    pub start_time: AtomicU64,
    /// Hot-path updates begun by this process's threads. With `ops_ended`, lets the reaper
    /// take an exact snapshot of an account (see `account.rs`).
    pub ops_begun: AtomicU64,
    /// Hot-path updates finished.
    pub ops_ended: AtomicU64,
    /// Slice name requested by the process (display), NUL-padded.
    pub slice_name: Text<NAME_LEN>,
    /// Per ledger device index.
    pub devices: [ProcDevice; MAX_DEVICES],
    /// Scheduler state (compute).
    pub sched: SchedProc,
    /// Inode of the process's PID namespace (`/proc/self/ns/pid`), 0 if unknown. With `pid`
    /// and `start_time` it lets a reader in another namespace find the process in its own
    /// `/proc` (see `view.rs`).
    pub pid_ns: AtomicU64,
    /// The first `NSpid` entry of `/proc/self/status`: the pid in the namespace of the
    /// process's `/proc` mount (the host's pid when that is the host's `/proc`, else `pid`).
    /// A hint for readers; never trusted without checking it in their own `/proc`.
    pub outer_pid: AtomicU32,
    /// Node mode: the uid the monitor saw (`SO_PEERCRED`).
    pub uid: AtomicU32,
    /// Node mode: the pid in the monitor's PID namespace (`SO_PEERCRED`), which the monitor
    /// checks with `start_time` for liveness. `pid` stays the process's own view (`NSpid`).
    pub host_pid: AtomicU32,
}

/// Node mode: the best-effort allowance of one user on one device. Its processes charge into the
/// allowance's own region against `grant`, which only the monitor sets: it splits what no slice
/// reserved among the device's allowances (each keeps what it uses, the rest is shared equally),
/// so one user's best-effort processes can never starve another's, whatever they write.
#[repr(C, align(64))]
pub struct Allowance {
    /// [`STATE_FREE`] or [`STATE_ACTIVE`].
    pub state: AtomicU32,
    /// Ledger device index.
    pub device: AtomicU32,
    /// The user.
    pub uid: AtomicU32,
    /// Processes charged to it.
    pub members: AtomicU32,
    /// Bytes the allowance may hold now (the monitor's grant; the hot path's limit).
    pub grant: AtomicU64,
    /// Bytes it held at the monitor's last look (display, admission without regions).
    pub used: AtomicU64,
}

/// A VMM allocation exported as a POSIX file descriptor (`cuMemExportToShareableHandle`),
/// charged to its exporter's account for as long as the driver keeps it: while the exporter
/// holds it the bytes are in the exporter's `ProcDevice::charged`; once the exporter let go
/// (released and unmapped it, or died) while an importer still holds it, the record itself
/// holds them (`held`) in the same account's counter, until the last importer lets go or dies.
/// In node mode only the monitor writes it, for the processes that ask over `monitor.sock`.
/// Written only under the cold-path lock (`ledger/src/ledger/shared.rs`).
#[repr(C, align(64))]
pub struct Shared {
    /// [`STATE_FREE`], [`STATE_ACTIVE`] or [`STATE_ORPHAN`].
    pub state: AtomicU32,
    /// Ledger device index of the memory.
    pub device: AtomicU32,
    /// The exporter's account on that device (`ProcDevice::account`): where the bytes are
    /// counted, whoever holds them.
    pub account: AtomicU32,
    /// The exporter's process slot while it holds the memory, [`NO_SLOT`] once it let go.
    pub exporter: AtomicU32,
    /// The shareable handle's identity: `st_dev` of the exported descriptor.
    pub key_dev: AtomicU64,
    /// `st_ino` of the exported descriptor (a real driver's descriptors: see
    /// docs/architecture.md, what is unverified).
    pub key_ino: AtomicU64,
    /// Bytes of the allocation, as charged at its creation.
    pub bytes: AtomicU64,
    /// Bytes the record holds in its account's counter itself (0 while the exporter holds
    /// them).
    pub held: AtomicU64,
    /// 1 once any process imported it.
    pub imported: AtomicU32,
    /// Process slots holding an import ([`NO_SLOT`]: free entry).
    pub importers: [AtomicU32; SHARED_IMPORTERS],
    /// The exporter's uid (node mode: the per-user bound, [`SHARED_PER_UID`]).
    pub uid: AtomicU32,
    /// The exporter's PID namespace (its `Proc::pid_ns`, 0 if unknown): with `uid`, whose
    /// processes may still hold a descriptor the monitor cannot see (node mode, the monitor's
    /// descriptor scan).
    pub pid_ns: AtomicU64,
}

const fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Offset of the device array in the file.
pub const DEVICES_OFFSET: usize = align_up(size_of::<Header>(), 4096);
/// Offset of the slice array.
pub const SLICES_OFFSET: usize = align_up(DEVICES_OFFSET + MAX_DEVICES * size_of::<Device>(), 4096);
/// Offset of the process array.
pub const PROCS_OFFSET: usize = align_up(SLICES_OFFSET + MAX_SLICES * size_of::<Slice>(), 4096);
/// Offset of the best-effort allowance array (node mode).
pub const ALLOWANCES_OFFSET: usize = align_up(PROCS_OFFSET + MAX_PROCS * size_of::<Proc>(), 4096);
/// Offset of the shared-allocation array (personal mode).
pub const SHARED_OFFSET: usize = align_up(
    ALLOWANCES_OFFSET + MAX_ALLOWANCES * size_of::<Allowance>(),
    4096,
);
/// Total size of the file.
pub const FILE_SIZE: usize = align_up(SHARED_OFFSET + MAX_SHARED * size_of::<Shared>(), 4096);

/// A NUL-padded fixed text field, written only under the cold-path lock before its record is
/// published (or by the record's owner), read by anyone.
#[repr(transparent)]
pub struct Text<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: writes happen under the ledger lock while the record is unpublished; readers copy
// bytes and tolerate a torn read (display only), so sharing across threads is sound.
unsafe impl<const N: usize> Sync for Text<N> {}

impl<const N: usize> Text<N> {
    /// The text (lossy UTF-8).
    pub fn get(&self) -> String {
        // SAFETY: plain bytes; see the Sync impl for why a concurrent write is harmless here.
        let bytes = unsafe { core::ptr::read_volatile(self.0.get()) };
        get_str(&bytes)
    }

    /// The raw bytes (NUL-padded), copied: compare names without allocating.
    pub fn bytes(&self) -> [u8; N] {
        // SAFETY: as in `get`.
        unsafe { core::ptr::read_volatile(self.0.get()) }
    }

    /// Whether the text is exactly `s` (no allocation; a torn read compares unequal).
    pub fn eq_bytes(&self, s: &[u8]) -> bool {
        let b = self.bytes();
        let n = b.iter().position(|&c| c == 0).unwrap_or(N);
        &b[..n] == s
    }

    /// Replace the text.
    ///
    /// # Safety
    /// Only under the ledger lock, on a record nobody else writes.
    pub unsafe fn set(&self, s: &str) {
        let mut bytes = [0u8; N];
        put_str(&mut bytes, s);
        // SAFETY: the pointer is our own cell, valid and aligned; the caller holds the ledger
        // lock on a record nobody else writes, so no write races this one.
        unsafe { core::ptr::write_volatile(self.0.get(), bytes) };
    }
}

// The whole ledger stays small: mapped by every CUDA process on the node (tmpfs pages are
// only allocated where records were used).
const _: () = assert!(FILE_SIZE < 12 << 20, "ledger file grew past 12 MiB");

/// Copy `s` into a NUL-padded fixed field (truncated on a char boundary when too long).
pub fn put_str(field: &mut [u8], s: &str) {
    field.fill(0);
    let mut n = s.len().min(field.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// The text of a NUL-padded fixed field.
pub fn get_str(field: &[u8]) -> String {
    let n = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..n]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of};

    #[test]
    fn layout_is_pinned() {
        // A failure here means the layout changed: bump LAYOUT_VERSION and update these.
        assert_eq!(offset_of!(Header, magic), 0);
        assert_eq!(offset_of!(Header, layout_version), 8);
        assert_eq!(offset_of!(Header, total_size), 40);
        assert_eq!(offset_of!(Header, mutex), 64);
        assert_eq!(offset_of!(Device, uuid), 8);
        assert_eq!(offset_of!(Device, memory_total), 152);
        assert_eq!(offset_of!(Slice, name), 24);
        assert_eq!(offset_of!(Slice, memory_limit), 88);
        assert_eq!(offset_of!(Slice, memory_used) % 64, 0);
        assert_eq!(size_of::<ProcDevice>(), 16);
        assert_eq!(offset_of!(Proc, devices), 96);
        assert_eq!(align_of::<Proc>(), 64);
        // Layout 2 added pid_ns and outer_pid in what was Proc's tail padding.
        assert_eq!(offset_of!(Proc, pid_ns), 416);
        assert_eq!(offset_of!(Proc, outer_pid), 424);
        assert_eq!(size_of::<Proc>(), 448);
        // Layout 4 added the monitor's heartbeat in what was Header's tail padding.
        assert_eq!(offset_of!(Header, monitor_beat_ns), 136);
        assert_eq!(offset_of!(Header, turns_bell), 144);
        assert_eq!(offset_of!(Header, slice_hwm), 148);
        assert_eq!(size_of::<Header>(), 192);
        // Layout 5 added the shared-allocation table after the pools.
        assert_eq!(offset_of!(Shared, importers), 52);
        assert_eq!(offset_of!(Shared, uid), 116);
        // Layout 9 added the exporter's PID namespace in what was Shared's tail padding.
        assert_eq!(offset_of!(Shared, pid_ns), 120);
        assert_eq!(size_of::<Shared>(), 128);
        assert_eq!(SHARED_OFFSET % 4096, 0);
        // Layout 6: issue 20's words in the scheduler's records (`SchedDevice::charged_until_ns`
        // and `overrun_until_ns` out of its reserved room, `SchedSlice::turn_queued_ns` and the
        // turn words before it), which the ledger embeds; pinned here so a change to them
        // trips this test too.
        use gpuslice_sched::GrantProc;
        assert_eq!(size_of::<SchedDevice>(), 136);
        assert_eq!(offset_of!(SchedDevice, charged_until_ns), 96);
        assert_eq!(size_of::<SchedSlice>(), 144);
        assert_eq!(offset_of!(SchedSlice, turn_queued_ns), 136);
        assert_eq!(size_of::<SchedProc>(), 64);
        assert_eq!(size_of::<GrantProc>(), 64);
        assert_eq!(size_of::<Device>(), 384);
        assert_eq!(size_of::<Slice>(), 704);
        for s in [
            size_of::<Header>(),
            size_of::<Device>(),
            size_of::<Slice>(),
            size_of::<Proc>(),
        ] {
            assert_eq!(s % 64, 0);
        }
        assert_eq!(DEVICES_OFFSET % 4096, 0);
        assert_eq!(FILE_SIZE % 4096, 0);
    }

    #[test]
    fn fixed_strings_round_trip() {
        let mut f = [0u8; 8];
        put_str(&mut f, "abc");
        assert_eq!(get_str(&f), "abc");
        put_str(&mut f, "0123456789");
        assert_eq!(get_str(&f), "01234567");
        put_str(&mut f, "ééééé"); // 10 bytes: cut on a char boundary
        assert_eq!(get_str(&f), "éééé");
    }
}
