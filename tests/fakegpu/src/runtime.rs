//! Process-wide state of the fake driver: initialisation, devices, contexts and the calling
//! thread's context stack. Every entry point starts from [`rt`] or [`cur_ctx`], which give the
//! driver's errors for "not initialised" and "no current context".

pub use crate::config::config;
use crate::config::{device_uuid, Config};
use crate::exec::{Executor, Stream};
use crate::shared::{self, Node};
use gpuslice_abi::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
use std::sync::{Mutex, OnceLock};

/// Result of an internal driver function: the error is the `CUresult` the export returns.
pub type CuResult<T> = Result<T, CUresult>;

/// What this process's fake driver knows after `cuInit`.
pub struct Runtime {
    /// The configuration it was started with.
    pub cfg: Config,
    /// The node-wide shared state.
    pub node: &'static Node,
    /// Devices in CUDA's order (after `CUDA_VISIBLE_DEVICES`).
    pub devices: Vec<Device>,
}

/// A device as this process sees it.
pub struct Device {
    /// Index on the node (NVML's index, the shared state's index).
    pub phys: usize,
    /// Its primary context.
    pub primary: &'static Ctx,
    /// Retain count of the primary context.
    pub primary_refs: Mutex<u32>,
    /// The execution engine client of this process for this device.
    pub exec: &'static Executor,
    /// The pool `cuMemAllocAsync` uses (`cuDeviceSetMemPool`), a `*const Pool`.
    pub mempool: std::sync::atomic::AtomicUsize,
    /// The device's default pool.
    pub default_pool: &'static crate::mem::Pool,
}

const CTX_MAGIC: u64 = 0xC0_47E7_0000_FA4E;

/// A context. Handles are pointers to leaked `Ctx`s; destroyed contexts keep their memory so
/// a stale handle is an error, never a crash.
#[repr(C)]
pub struct Ctx {
    magic: u64,
    /// CUDA ordinal of its device.
    pub dev: usize,
    /// Whether this is the device's primary context.
    pub primary: bool,
    /// Context flags.
    pub flags: AtomicU32,
    /// Cleared by destroy (or primary release to zero); retained primaries become active again.
    pub active: AtomicBool,
    /// Its legacy default stream.
    pub legacy: OnceLock<&'static Stream>,
    /// Per-thread default streams, by thread.
    pub ptds: Mutex<HashMap<std::thread::ThreadId, &'static Stream>>,
    /// The runtime's per-context storage (export table `c693336e`).
    pub storage: crate::ctx_storage::CtxStorage,
    /// Device memory it holds while active ([`context_bytes`]); 0 when not charged.
    charged: std::sync::atomic::AtomicU64,
    /// The device's [`crate::lost`] generation when it became active: a context does not
    /// outlive a loss of its device.
    born: AtomicU32,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Ctx {
    const MAGIC: u64 = CTX_MAGIC;
}

impl Ctx {
    fn new(dev: usize, primary: bool, active: bool) -> &'static Ctx {
        Box::leak(Box::new(Ctx {
            magic: CTX_MAGIC,
            dev,
            primary,
            flags: AtomicU32::new(0),
            active: AtomicBool::new(active),
            legacy: OnceLock::new(),
            ptds: Mutex::new(HashMap::new()),
            storage: crate::ctx_storage::CtxStorage::new(),
            charged: std::sync::atomic::AtomicU64::new(0),
            born: AtomicU32::new(0),
        }))
    }

    /// The context behind a handle, if it is one of ours.
    pub fn from_handle(h: CUcontext) -> Option<&'static Ctx> {
        crate::handle::resolve(h as *const std::ffi::c_void)
    }

    /// The handle of this context.
    pub fn handle(&'static self) -> CUcontext {
        self as *const Ctx as CUcontext
    }

    /// The device this context is on.
    pub fn device(&self) -> &'static Device {
        &rt_unchecked().devices[self.dev]
    }

    /// Its legacy default stream.
    pub fn legacy_stream(&'static self) -> &'static Stream {
        self.legacy.get_or_init(|| Stream::new(self, 0, 0, true))
    }

    /// The calling thread's per-thread default stream.
    pub fn thread_stream(&'static self) -> &'static Stream {
        let mut m = self.ptds.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(std::thread::current().id())
            .or_insert_with(|| Stream::new(self, CU_STREAM_DEFAULT, 0, false))
    }
}

static RT: OnceLock<Result<Runtime, CUresult>> = OnceLock::new();

/// `cuInit`.
pub fn init(flags: u32) -> CuResult<()> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match RT.get_or_init(build) {
        Ok(_) => Ok(()),
        Err(e) => Err(*e),
    }
}

fn build() -> Result<Runtime, CUresult> {
    let cfg = config().map_err(|_| CUDA_ERROR_INVALID_VALUE)?.clone();
    let node = shared::node(&cfg, at_exit).map_err(|e| {
        eprintln!("{e}");
        CUDA_ERROR_OPERATING_SYSTEM
    })?;
    let ndev = node.state.ndev.load(Relaxed) as usize;
    let visible: Vec<usize> = cfg.visible.iter().copied().filter(|&p| p < ndev).collect();
    if visible.is_empty() {
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    let devices = visible
        .iter()
        .enumerate()
        .map(|(ord, &phys)| {
            let default_pool = crate::mem::Pool::new(ord, phys, false);
            Device {
                phys,
                primary: Ctx::new(ord, true, false),
                primary_refs: Mutex::new(0),
                exec: Executor::new(phys, cfg.kernel_ns, cfg.timeslice_ns),
                mempool: std::sync::atomic::AtomicUsize::new(default_pool as *const _ as usize),
                default_pool,
            }
        })
        .collect();
    Ok(Runtime { cfg, node, devices })
}

/// Registered with `atexit` when the process attaches to the node (cuInit or nvmlInit).
pub extern "C" fn at_exit() {
    // A process that exits returns its device memory and engine token at once, as a real
    // driver's teardown does; a killed one is reaped by whoever notices. Called from C (exit),
    // so a panic must stop here: the slot is then reaped like a killed process's.
    let _ = std::panic::catch_unwind(|| {
        if let Some(n) = shared::attached() {
            crate::exec::shutdown();
            crate::mem::release_shared();
            if n.state.procs[n.slot]
                .pid
                .compare_exchange(std::process::id(), shared::RECLAIMING, AcqRel, Relaxed)
                .is_ok()
            {
                shared::release_slot(n.state, n.slot);
            }
        }
    });
}

/// The runtime, or `CUDA_ERROR_NOT_INITIALIZED`.
pub fn rt() -> CuResult<&'static Runtime> {
    match RT.get() {
        Some(Ok(r)) => Ok(r),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// The runtime when the caller already holds something only an initialised runtime hands out.
pub fn rt_unchecked() -> &'static Runtime {
    match RT.get() {
        Some(Ok(r)) => r,
        _ => unreachable!("fakegpu object used before cuInit"),
    }
}

/// The device at CUDA ordinal `d`.
pub fn device(d: CUdevice) -> CuResult<&'static Device> {
    let r = rt()?;
    usize::try_from(d)
        .ok()
        .and_then(|i| r.devices.get(i))
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

thread_local! {
    static STACK: RefCell<Vec<&'static Ctx>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's current context, or the driver's error for its absence.
pub fn cur_ctx() -> CuResult<&'static Ctx> {
    rt()?;
    let c = STACK
        .with(|s| s.borrow().last().copied())
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if !c.active.load(Acquire) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    usable(c)?;
    Ok(c)
}

/// `CUDA_ERROR_UNKNOWN` for a context whose device was lost since it became active (see
/// [`crate::lost`]), as the driver answers after a GPU fell off the bus.
pub fn usable(c: &Ctx) -> CuResult<()> {
    let now = crate::lost::generation(c.device().phys);
    if crate::lost::usable(now, c.born.load(Acquire)) {
        Ok(())
    } else {
        Err(CUDA_ERROR_UNKNOWN)
    }
}

/// `CUDA_ERROR_UNKNOWN` when physical device `phys` is lost: no context is made on it.
fn present(phys: usize) -> CuResult<()> {
    if crate::lost::is_lost(phys) {
        Err(CUDA_ERROR_UNKNOWN)
    } else {
        Ok(())
    }
}

/// `cuCtxGetCurrent`: null when none.
pub fn get_current() -> CuResult<Option<&'static Ctx>> {
    rt()?;
    Ok(STACK.with(|s| s.borrow().last().copied()))
}

/// `cuCtxSetCurrent`.
pub fn set_current(c: Option<&'static Ctx>) {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        match c {
            Some(c) => match s.last_mut() {
                Some(top) => *top = c,
                None => s.push(c),
            },
            None => {
                s.pop();
            }
        }
    })
}

/// `cuCtxPushCurrent`.
pub fn push_current(c: &'static Ctx) {
    STACK.with(|s| s.borrow_mut().push(c))
}

/// `cuCtxPopCurrent`.
pub fn pop_current() -> CuResult<&'static Ctx> {
    rt()?;
    STACK
        .with(|s| s.borrow_mut().pop())
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// Device memory one context takes on a device of `total` bytes: `FAKEGPU_CONTEXT_MEMORY`,
/// else 1/32 of the device, at most 512 MiB. A real context (code, stacks, the driver's
/// buffers) takes a few hundred MiB whatever the device's size (about 500 MiB on an H100 with
/// CUDA 12's lazy loading); the fake scales it down for the small devices tests use, so a
/// 1 GiB fake keeps most of its memory.
pub fn context_bytes(total: u64) -> u64 {
    match config().ok().and_then(|c| c.context_memory) {
        Some(b) => b.min(total),
        None => (total / 32).min(512 << 20),
    }
}

/// Take the device memory a context costs as it becomes active; none left is
/// `CUDA_ERROR_OUT_OF_MEMORY`, as the driver answers a context it cannot fit.
fn charge(c: &'static Ctx) -> CuResult<()> {
    if c.charged.load(Acquire) != 0 {
        return Ok(());
    }
    let node = rt()?.node;
    let phys = c.device().phys;
    let bytes = context_bytes(node.state.dev[phys].total.load(Relaxed));
    if bytes == 0 {
        return Ok(());
    }
    if !node.reserve_or_reap(phys, bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    if c.charged
        .compare_exchange(0, bytes, AcqRel, Acquire)
        .is_err()
    {
        node.unreserve(phys, bytes); // another thread charged it first
    }
    Ok(())
}

/// Give back what [`charge`] took (context destroyed, primary context released or reset).
fn uncharge(c: &'static Ctx) {
    let bytes = c.charged.swap(0, AcqRel);
    if bytes > 0 {
        rt_unchecked().node.unreserve(c.device().phys, bytes);
    }
}

/// `cuCtxCreate`: a new context, made current (pushed).
pub fn ctx_create(flags: u32, dev: CUdevice) -> CuResult<&'static Ctx> {
    present(device(dev)?.phys)?;
    let c = Ctx::new(dev as usize, false, false);
    c.flags.store(flags, Relaxed);
    charge(c)?;
    set_active(c, true);
    push_current(c);
    Ok(c)
}

/// Mark `c` active or not, and count it among the process's active contexts (which decide
/// how `CU_CTX_SCHED_AUTO` waits).
fn set_active(c: &Ctx, active: bool) {
    if active && !c.active.load(Acquire) {
        c.born
            .store(crate::lost::generation(c.device().phys), Release);
    }
    if c.active.swap(active, AcqRel) != active {
        crate::exec::context_active(active);
    }
}

/// `cuCtxDestroy`: waits for its work, frees what it allocated, removes it from this thread's stack.
pub fn ctx_destroy(c: &'static Ctx) -> CuResult<()> {
    if c.primary || !c.active.load(Acquire) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    teardown(c);
    STACK.with(|s| s.borrow_mut().retain(|x| !std::ptr::eq(*x, c)));
    Ok(())
}

fn teardown(c: &'static Ctx) {
    let _ = crate::exec::ctx_synchronize(c);
    // SAFETY: `c`'s own handle, for its own storage.
    unsafe { c.storage.run_dtors(c.handle()) };
    set_active(c, false);
    crate::mem::free_all_of(c);
    uncharge(c);
}

/// `cuDevicePrimaryCtxRetain`.
pub fn primary_retain(dev: CUdevice) -> CuResult<&'static Ctx> {
    let d = device(dev)?;
    present(d.phys)?;
    let mut refs = d.primary_refs.lock().unwrap_or_else(|e| e.into_inner());
    charge(d.primary)?;
    *refs += 1;
    set_active(d.primary, true);
    Ok(d.primary)
}

/// `cuDevicePrimaryCtxRelease`.
pub fn primary_release(dev: CUdevice) -> CuResult<()> {
    let d = device(dev)?;
    let mut refs = d.primary_refs.lock().unwrap_or_else(|e| e.into_inner());
    if *refs == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    *refs -= 1;
    if *refs == 0 {
        teardown(d.primary);
    }
    Ok(())
}

/// `cuDevicePrimaryCtxReset`.
pub fn primary_reset(dev: CUdevice) -> CuResult<()> {
    let d = device(dev)?;
    let mut refs = d.primary_refs.lock().unwrap_or_else(|e| e.into_inner());
    *refs = 0;
    if d.primary.active.load(Acquire) {
        teardown(d.primary);
    }
    Ok(())
}

/// The device's name, as `cuDeviceGetName` and NVML report it.
pub fn device_name(mem: u64) -> String {
    format!("Fake GPU H200-{}GB", mem.div_ceil(1 << 30))
}

/// The UUID of the device at CUDA ordinal `d`.
pub fn uuid_of(d: &Device) -> [u8; 16] {
    device_uuid(d.phys)
}
