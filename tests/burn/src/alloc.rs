//! Device memory through each allocation path of the driver API (`--alloc-path`), and back.
//!
//! Every path turns a requested size into one allocation and remembers what it needs to free
//! it. The size actually taken can differ from the request (pitch rounding, VMM granularity,
//! array shapes); reports carry both.

use core::ffi::c_uint;
use std::ptr::null_mut;

use gpuslice_abi::*;

use crate::cli::AllocPath;
use crate::driver::{cu, Driver, Failure};

/// Bytes per element of `--alloc-path array` arrays: four 32-bit float channels.
const ARRAY_ELEMENT: u64 = 16;
/// Widest 1D/2D array row burn asks for (every GPU since sm_30 allows 65536 elements).
const ARRAY_MAX_WIDTH: u64 = 65536;
/// Widest, tallest extent of `--alloc-path array3d` arrays (every GPU since sm_30 allows
/// 4096 in each dimension).
const ARRAY3D_MAX_EXTENT: u64 = 2048;
/// Levels of `--alloc-path mipmap` arrays.
const MIPMAP_LEVELS: u32 = 4;
/// Tallest `--alloc-path mipmap` level 0 (2D arrays allow 65535 rows on every GPU).
const MIPMAP_MAX_HEIGHT_LOG2: u32 = 15;
/// Row width of `--alloc-path pitch` allocations, before the driver's pitch rounding.
const PITCH_ROW: u64 = 1 << 20;

/// How an allocation is given back.
#[derive(Debug)]
enum Handle {
    /// `cuMemFree_v2` (plain, pitch and managed memory).
    Ptr(CUdeviceptr),
    /// `cuMemFreeAsync` on the allocator's stream (async and pool memory).
    Async(CUdeviceptr),
    /// Unmap, free the address range, release the physical handle.
    Vmm {
        ptr: CUdeviceptr,
        size: usize,
        handle: CUmemGenericAllocationHandle,
    },
    /// `cuArrayDestroy` (array and array3d).
    Array(CUarray),
    /// `cuMipmappedArrayDestroy`.
    Mipmap(CUmipmappedArray),
    /// `cuMemFreeAsync` of the graph's allocation, then the executable and the graph go.
    Graph {
        ptr: CUdeviceptr,
        graph: CUgraph,
        exec: CUgraphExec,
    },
}

/// One live allocation.
#[derive(Debug)]
pub struct Allocation {
    /// Bytes the path actually took (≥ the request, rounded as the path rounds).
    pub bytes: u64,
    handle: Handle,
}

/// Allocates through one path; owns the stream and pool the async paths need.
pub struct Allocator {
    path: AllocPath,
    device: CUdevice,
    touch: bool,
    stream: CUstream,
    pool: CUmemoryPool,
    granularity: usize,
}

impl Allocator {
    pub fn new(path: AllocPath, device: CUdevice, touch: bool) -> Allocator {
        Allocator {
            path,
            device,
            touch,
            stream: null_mut(),
            pool: null_mut(),
            granularity: 0,
        }
    }

    fn stream(&mut self, d: &Driver) -> Result<CUstream, Failure> {
        if self.stream.is_null() {
            cu!(d, cuStreamCreate(&mut self.stream, CU_STREAM_NON_BLOCKING))?;
        }
        Ok(self.stream)
    }

    fn device_location(&self) -> CUmemLocation {
        CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.device,
        }
    }

    /// Pinned device memory with the driver's defaults: the props of the explicit pool and of
    /// graph allocation nodes alike.
    fn pool_props(&self) -> CUmemPoolProps {
        CUmemPoolProps {
            allocType: CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: CU_MEM_HANDLE_TYPE_NONE,
            location: self.device_location(),
            win32SecurityAttributes: null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        }
    }

    fn pool(&mut self, d: &Driver) -> Result<CUmemoryPool, Failure> {
        if self.pool.is_null() {
            cu!(d, cuMemPoolCreate(&mut self.pool, &self.pool_props()))?;
        }
        Ok(self.pool)
    }

    fn vmm_prop(&self) -> CUmemAllocationProp {
        CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: CU_MEM_HANDLE_TYPE_NONE,
            location: self.device_location(),
            win32HandleMetaData: null_mut(),
            allocFlags: CUmemAllocationPropFlags::default(),
        }
    }

    /// Allocate `size` bytes through the configured path.
    pub fn alloc(&mut self, d: &Driver, size: u64) -> Result<Allocation, Failure> {
        let usize_size = usize::try_from(size).unwrap_or(usize::MAX);
        let a = match self.path {
            AllocPath::Plain => {
                let mut p: CUdeviceptr = 0;
                cu!(d, cuMemAlloc(&mut p, usize_size))?;
                Allocation {
                    bytes: size,
                    handle: Handle::Ptr(p),
                }
            }
            AllocPath::Pitch => {
                let width = size.clamp(1, PITCH_ROW);
                let height = size.div_ceil(width).max(1);
                let (mut p, mut pitch): (CUdeviceptr, usize) = (0, 0);
                cu!(
                    d,
                    cuMemAllocPitch(&mut p, &mut pitch, width as usize, height as usize, 16)
                )?;
                Allocation {
                    bytes: pitch as u64 * height,
                    handle: Handle::Ptr(p),
                }
            }
            AllocPath::Managed => {
                let mut p: CUdeviceptr = 0;
                cu!(
                    d,
                    cuMemAllocManaged(&mut p, usize_size, CU_MEM_ATTACH_GLOBAL)
                )?;
                Allocation {
                    bytes: size,
                    handle: Handle::Ptr(p),
                }
            }
            AllocPath::Async | AllocPath::Pool => {
                let stream = self.stream(d)?;
                let mut p: CUdeviceptr = 0;
                if self.path == AllocPath::Async {
                    cu!(d, cuMemAllocAsync(&mut p, usize_size, stream))?;
                } else {
                    let pool = self.pool(d)?;
                    cu!(d, cuMemAllocFromPoolAsync(&mut p, usize_size, pool, stream))?;
                }
                // Stream-ordered allocation may report running out only when it executes.
                cu!(d, cuStreamSynchronize(stream))?;
                Allocation {
                    bytes: size,
                    handle: Handle::Async(p),
                }
            }
            AllocPath::Vmm => self.alloc_vmm(d, size)?,
            AllocPath::Graph | AllocPath::Capture => self.alloc_graph(d, size)?,
            AllocPath::Array => {
                let elems = size.div_ceil(ARRAY_ELEMENT).max(1);
                let (width, height) = if elems <= ARRAY_MAX_WIDTH {
                    (elems, 0)
                } else {
                    (ARRAY_MAX_WIDTH, elems.div_ceil(ARRAY_MAX_WIDTH))
                };
                let desc = CUDA_ARRAY_DESCRIPTOR {
                    Width: width as usize,
                    Height: height as usize,
                    Format: CU_AD_FORMAT_FLOAT,
                    NumChannels: 4,
                };
                let mut a: CUarray = null_mut();
                cu!(d, cuArrayCreate(&mut a, &desc))?;
                let bytes = width * height.max(1) * ARRAY_ELEMENT;
                return Ok(Allocation {
                    bytes,
                    handle: Handle::Array(a),
                });
            }
            AllocPath::Array3d => {
                let (width, height, depth) = array3d_shape(size.div_ceil(ARRAY_ELEMENT).max(1));
                let desc = float4_array3d(width, height, depth);
                let mut a: CUarray = null_mut();
                cu!(d, cuArray3DCreate(&mut a, &desc))?;
                return Ok(Allocation {
                    bytes: width * height * depth * ARRAY_ELEMENT,
                    handle: Handle::Array(a),
                });
            }
            AllocPath::Mipmap => {
                let (width, height, elems) = mipmap_shape(size.div_ceil(ARRAY_ELEMENT).max(1));
                let desc = float4_array3d(width, height, 0);
                let mut a: CUmipmappedArray = null_mut();
                cu!(d, cuMipmappedArrayCreate(&mut a, &desc, MIPMAP_LEVELS))?;
                return Ok(Allocation {
                    bytes: elems * ARRAY_ELEMENT,
                    handle: Handle::Mipmap(a),
                });
            }
        };
        if self.touch {
            if let Err(e) = self.touch(d, &a) {
                let _ = self.free(d, a);
                return Err(e);
            }
        }
        Ok(a)
    }

    fn touch(&mut self, d: &Driver, a: &Allocation) -> Result<(), Failure> {
        let ptr = match a.handle {
            Handle::Ptr(p)
            | Handle::Async(p)
            | Handle::Vmm { ptr: p, .. }
            | Handle::Graph { ptr: p, .. } => p,
            Handle::Array(_) | Handle::Mipmap(_) => return Ok(()),
        };
        cu!(d, cuMemsetD8(ptr, 0xa5, a.bytes as usize))?;
        cu!(d, cuCtxSynchronize())
    }

    /// A graph holding one memory allocation node (`graph`: added with
    /// `cuGraphAddMemAllocNode`; `capture`: a captured `cuMemAllocAsync`), instantiated and
    /// launched once: graph memory is taken when the graph runs, and outlives the launch
    /// (there is no free node) until `cuMemFreeAsync`.
    fn alloc_graph(&mut self, d: &Driver, size: u64) -> Result<Allocation, Failure> {
        let stream = self.stream(d)?;
        let mut graph: CUgraph = null_mut();
        let mut exec: CUgraphExec = null_mut();
        if self.path == AllocPath::Capture {
            let mut ptr: CUdeviceptr = 0;
            cu!(
                d,
                cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            )?;
            let captured = cu!(d, cuMemAllocAsync(&mut ptr, size as usize, stream));
            // End the capture whatever happened, so the stream is usable again.
            let ended = cu!(d, cuStreamEndCapture(stream, &mut graph));
            let built = captured
                .and(ended)
                .and_then(|()| cu!(d, cuGraphInstantiateWithFlags(&mut exec, graph, 0)));
            if let Err(e) = built {
                if !graph.is_null() {
                    let _ = cu!(d, cuGraphDestroy(graph));
                }
                return Err(e);
            }
            return self.launch_graph(d, size, ptr, graph, exec);
        }
        cu!(d, cuGraphCreate(&mut graph, 0))?;
        let mut params = CUDA_MEM_ALLOC_NODE_PARAMS {
            poolProps: self.pool_props(),
            accessDescs: std::ptr::null(),
            accessDescCount: 0,
            bytesize: usize::try_from(size).unwrap_or(usize::MAX),
            dptr: 0,
        };
        let mut node: CUgraphNode = null_mut();
        let built = cu!(
            d,
            cuGraphAddMemAllocNode(&mut node, graph, std::ptr::null(), 0, &mut params)
        )
        .and_then(|()| cu!(d, cuGraphInstantiateWithFlags(&mut exec, graph, 0)));
        if let Err(e) = built {
            let _ = cu!(d, cuGraphDestroy(graph));
            return Err(e);
        }
        self.launch_graph(d, size, params.dptr, graph, exec)
    }

    /// Launch an instantiated allocating graph once; on failure nothing is left behind.
    fn launch_graph(
        &mut self,
        d: &Driver,
        size: u64,
        ptr: CUdeviceptr,
        graph: CUgraph,
        exec: CUgraphExec,
    ) -> Result<Allocation, Failure> {
        let stream = self.stream(d)?;
        // Out of memory may show at launch (the driver takes graph memory then) or when the
        // launch runs: synchronize to see either.
        let launched =
            cu!(d, cuGraphLaunch(exec, stream)).and_then(|()| cu!(d, cuStreamSynchronize(stream)));
        if let Err(e) = launched {
            let _ = cu!(d, cuGraphExecDestroy(exec));
            let _ = cu!(d, cuGraphDestroy(graph));
            return Err(e);
        }
        Ok(Allocation {
            bytes: size,
            handle: Handle::Graph { ptr, graph, exec },
        })
    }

    fn alloc_vmm(&mut self, d: &Driver, size: u64) -> Result<Allocation, Failure> {
        let prop = self.vmm_prop();
        if self.granularity == 0 {
            cu!(
                d,
                cuMemGetAllocationGranularity(
                    &mut self.granularity,
                    &prop,
                    CU_MEM_ALLOC_GRANULARITY_MINIMUM as c_uint
                )
            )?;
            self.granularity = self.granularity.max(1);
        }
        let g = self.granularity as u64;
        let bytes = size.max(1).div_ceil(g).saturating_mul(g);
        let size = usize::try_from(bytes).unwrap_or(usize::MAX);
        let mut handle: CUmemGenericAllocationHandle = 0;
        cu!(d, cuMemCreate(&mut handle, size, &prop, 0))?;
        let mut ptr: CUdeviceptr = 0;
        if let Err(e) = cu!(d, cuMemAddressReserve(&mut ptr, size, 0, 0, 0)) {
            let _ = cu!(d, cuMemRelease(handle));
            return Err(e);
        }
        let mapped = cu!(d, cuMemMap(ptr, size, 0, handle, 0)).and_then(|()| {
            let access = CUmemAccessDesc {
                location: self.device_location(),
                flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            cu!(d, cuMemSetAccess(ptr, size, &access, 1)).inspect_err(|_| {
                let _ = cu!(d, cuMemUnmap(ptr, size));
            })
        });
        if let Err(e) = mapped {
            let _ = cu!(d, cuMemAddressFree(ptr, size));
            let _ = cu!(d, cuMemRelease(handle));
            return Err(e);
        }
        Ok(Allocation {
            bytes,
            handle: Handle::Vmm { ptr, size, handle },
        })
    }

    /// Give an allocation back.
    pub fn free(&mut self, d: &Driver, a: Allocation) -> Result<(), Failure> {
        match a.handle {
            Handle::Ptr(p) => cu!(d, cuMemFree(p)),
            Handle::Async(p) => {
                cu!(d, cuMemFreeAsync(p, self.stream))?;
                cu!(d, cuStreamSynchronize(self.stream))
            }
            Handle::Vmm { ptr, size, handle } => {
                let r1 = cu!(d, cuMemUnmap(ptr, size));
                let r2 = cu!(d, cuMemAddressFree(ptr, size));
                let r3 = cu!(d, cuMemRelease(handle));
                r1.and(r2).and(r3)
            }
            Handle::Array(a) => cu!(d, cuArrayDestroy(a)),
            Handle::Mipmap(a) => cu!(d, cuMipmappedArrayDestroy(a)),
            Handle::Graph { ptr, graph, exec } => {
                let r1 = cu!(d, cuMemFreeAsync(ptr, self.stream))
                    .and_then(|()| cu!(d, cuStreamSynchronize(self.stream)));
                let r2 = cu!(d, cuGraphExecDestroy(exec));
                let r3 = cu!(d, cuGraphDestroy(graph));
                r1.and(r2).and(r3)
            }
        }
    }

    /// Destroy the pool and stream the async paths created. Call after every free.
    pub fn finish(&mut self, d: &Driver) -> Result<(), Failure> {
        let mut r = Ok(());
        if !self.pool.is_null() {
            r = r.and(cu!(d, cuMemPoolDestroy(self.pool)));
            self.pool = null_mut();
        }
        if !self.stream.is_null() {
            r = r.and(cu!(d, cuStreamDestroy(self.stream)));
            self.stream = null_mut();
        }
        r
    }
}

/// The descriptor of a 3D (or, `depth` 0, 2D) array of [`ARRAY_ELEMENT`]s: four float channels.
fn float4_array3d(width: u64, height: u64, depth: u64) -> CUDA_ARRAY3D_DESCRIPTOR {
    CUDA_ARRAY3D_DESCRIPTOR {
        Width: width as usize,
        Height: height as usize,
        Depth: depth as usize,
        Format: CU_AD_FORMAT_FLOAT,
        NumChannels: 4,
        Flags: 0,
    }
}

/// `array3d` extents for `n` elements: rows as wide as allowed, then the rows split into
/// height × depth with the fewest elements over `n` (none for any multiple of 64Ki elements
/// up to 2000 times that, nor for a power of two).
fn array3d_shape(n: u64) -> (u64, u64, u64) {
    let max = ARRAY3D_MAX_EXTENT;
    let width = n.min(max);
    let rows = n.div_ceil(width);
    if rows <= max {
        return (width, rows, 1);
    }
    let mut best = (rows.div_ceil(max), max); // (height, depth): too deep is the driver's call
    for depth in rows.div_ceil(max)..=max {
        let height = rows.div_ceil(depth);
        if height * depth < best.0 * best.1 {
            best = (height, depth);
        }
        if height * depth == rows {
            break;
        }
    }
    (width, best.0, best.1)
}

/// Elements in a 2D mip chain of [`MIPMAP_LEVELS`] levels, each halving both extents (floor,
/// at least 1), as the driver lays levels out and the shim charges them.
fn mip_chain_elems(mut width: u64, mut height: u64) -> u64 {
    let mut total = 0;
    for _ in 0..MIPMAP_LEVELS {
        total += width * height;
        width = (width / 2).max(1);
        height = (height / 2).max(1);
    }
    total
}

/// `mipmap` level-0 extents for `n` elements, and the chain's elements: over power-of-two
/// heights, the narrowest width whose chain holds `n`, keeping the shape with the fewest
/// elements over `n` (none for `n` a power of two from 64Ki to 2Gi elements).
fn mipmap_shape(n: u64) -> (u64, u64, u64) {
    let mut best: Option<(u64, u64, u64)> = None;
    for log2 in 0..40 {
        if best.is_some() && log2 > MIPMAP_MAX_HEIGHT_LOG2 {
            break;
        }
        let height = 1u64 << log2;
        if mip_chain_elems(ARRAY_MAX_WIDTH, height) < n {
            continue;
        }
        // The chain grows with the width: the narrowest that holds `n`.
        let (mut lo, mut hi) = (1, ARRAY_MAX_WIDTH);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if mip_chain_elems(mid, height) >= n {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let elems = mip_chain_elems(lo, height);
        if best.is_none_or(|b| elems < b.2) {
            best = Some((lo, height, elems));
        }
    }
    best.unwrap_or((1, 1, MIPMAP_LEVELS as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_shapes_hold_exactly_a_power_of_two() {
        for log2 in 16..=31 {
            let n = 1u64 << log2;
            let (w, h, d) = array3d_shape(n);
            assert_eq!(w * h * d, n, "array3d {n}");
            assert!(w <= ARRAY3D_MAX_EXTENT && h <= ARRAY3D_MAX_EXTENT);
            let (w, h, elems) = mipmap_shape(n);
            assert_eq!(elems, n, "mipmap {n}");
            assert_eq!(mip_chain_elems(w, h), n);
            assert!(w <= ARRAY_MAX_WIDTH && h <= 1 << MIPMAP_MAX_HEIGHT_LOG2);
        }
    }

    #[test]
    fn array_shapes_hold_at_least_what_is_asked() {
        for n in [1, 2, 3, 4, 5, 100, 2049, 65537, 4_194_305, 123_456_789] {
            let (w, h, d) = array3d_shape(n);
            assert!(w * h * d >= n, "array3d {n}");
            let (w, h, elems) = mipmap_shape(n);
            assert!(elems >= n && mip_chain_elems(w, h) == elems, "mipmap {n}");
        }
    }
}
