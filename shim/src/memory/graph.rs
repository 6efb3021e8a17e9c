//! Graph memory: memory allocation nodes (`cuGraphAddMemAllocNode`, `cuGraphAddNode(_v2)`)
//! and stream-ordered allocations captured into a graph are charged when the node is made and
//! held by the graph and every executable instantiated from it; they come back when the last
//! of them is destroyed. Its state: the list of charges and their holders (a mutex, cold
//! paths only) and the count of open captures (one atomic load on the async allocation path).

use super::{balloon, reserved};
use crate::admit::DevState;
use gpuslice_abi::pfn;
use gpuslice_abi::*;
use std::sync::Mutex;

/// Who keeps a graph memory charge alive: the graph its nodes belong to, and every executable
/// instantiated from it (an executable takes the graph's memory at each launch, even after its
/// graph is destroyed). Kinds are tagged so a graph and an exec handle never alias.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Holder {
    Graph(usize),
    Exec(usize),
}

/// Graph memory charged on one device, returned when the last of its holders is destroyed.
/// One charge per instantiation generation: nodes added to a graph that is not instantiated
/// join its charge; nodes added after an instantiation get a charge the executable does not
/// hold.
#[derive(Debug)]
struct GraphCharge {
    bytes: u64,
    ordinal: i32,
    holders: Vec<Holder>,
}

/// All graph memory charges. Graph building, instantiation and destruction are cold paths
/// (a lock is fine); `cuGraphLaunch` looks here only once the driver said out of memory.
static GRAPHS: Mutex<Vec<GraphCharge>> = Mutex::new(Vec::new());

fn graphs() -> std::sync::MutexGuard<'static, Vec<GraphCharge>> {
    GRAPHS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Record `bytes` of graph memory on `ordinal`, held by `graph`.
fn graph_charge_add(t: &mut Vec<GraphCharge>, graph: usize, ordinal: i32, bytes: u64) {
    let only = [Holder::Graph(graph)];
    match t
        .iter_mut()
        .find(|c| c.ordinal == ordinal && c.holders[..] == only[..])
    {
        Some(c) => c.bytes += bytes,
        None => t.push(GraphCharge {
            bytes,
            ordinal,
            holders: only.to_vec(),
        }),
    }
}

/// `exec` was instantiated from `graph`: it holds every charge the graph holds.
fn graph_charge_share(t: &mut [GraphCharge], graph: usize, exec: usize) {
    for c in t.iter_mut() {
        if c.holders.contains(&Holder::Graph(graph)) && !c.holders.contains(&Holder::Exec(exec)) {
            c.holders.push(Holder::Exec(exec));
        }
    }
}

/// `h` is destroyed: drop it from every charge; the charges nobody holds any more are removed
/// and handed to `give_back(ordinal, bytes)`.
fn graph_charge_release(t: &mut Vec<GraphCharge>, h: Holder, mut give_back: impl FnMut(i32, u64)) {
    t.retain_mut(|c| {
        c.holders.retain(|&x| x != h);
        if c.holders.is_empty() {
            give_back(c.ordinal, c.bytes);
            return false;
        }
        true
    });
}

/// `to` now holds what `from` held (`from` itself no longer does).
fn graph_charge_rehold(t: &mut [GraphCharge], from: Holder, to: Holder) {
    for c in t.iter_mut() {
        if let Some(i) = c.holders.iter().position(|&h| h == from) {
            if c.holders.contains(&to) {
                c.holders.swap_remove(i);
            } else {
                c.holders[i] = to;
            }
        }
    }
}

/// Graph memory of `bytes` on `dev` for a node of `graph`, around `add` (the driver call that
/// makes the node): charged first, refused with `CUDA_ERROR_OUT_OF_MEMORY` over the quota,
/// held by the graph (and later its executables) once the driver made the node.
///
/// # Safety
/// As `charge`: `dev` is a device of the started state.
#[cold]
pub(super) unsafe fn graph_alloc(
    dev: &DevState,
    graph: CUgraph,
    bytes: u64,
    mut add: impl FnMut() -> CUresult,
) -> CUresult {
    // SAFETY: dev is a device of the started state (this function's contract).
    if let Err(r) = unsafe { reserved(dev, bytes, || (add(), ())) } {
        return r;
    }
    graph_charge_add(&mut graphs(), graph as usize, dev.ordinal, bytes);
    CUDA_SUCCESS
}

/// A memory allocation node described by `p`, on a device: see [`graph_alloc`].
///
/// # Safety
/// `p` is null or the program's node parameters, valid for reads (handler contract).
unsafe fn mem_alloc_node(
    graph: CUgraph,
    p: *const CUDA_MEM_ALLOC_NODE_PARAMS,
    mut add: impl FnMut() -> CUresult,
) -> CUresult {
    let st = ready!();
    if p.is_null() {
        return add();
    }
    // SAFETY: p is non-null (checked above) and readable (this function's contract).
    let (location, bytes) = unsafe { ((*p).poolProps.location, (*p).bytesize as u64) };
    if location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return add();
    }
    match st.device(location.id) {
        // SAFETY: dev is a device of the started state.
        Some(dev) => unsafe { graph_alloc(dev, graph, bytes, add) },
        None => add(),
    }
}

/// `cuGraphAddMemAllocNode`: charged when added (the node's memory is taken at any launch of
/// an executable made from the graph), returned when the graph and all its executables are
/// destroyed.
pub unsafe fn graph_add_mem_alloc_node(
    real: pfn::cuGraphAddMemAllocNode,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    // SAFETY: the handler contract: `real` and `params` are the program's.
    unsafe { mem_alloc_node(graph, params, || real(node, graph, deps, ndeps, params)) }
}

/// `cuGraphAddNode` (CUDA 12.2) and `_v2`: a memory allocation node is charged as by
/// `cuGraphAddMemAllocNode`; a child graph moved into its parent (the only way a graph with
/// memory nodes can be a child) hands its graph memory to the parent.
///
/// # Safety
/// `params` is null or the program's node parameters, valid for reads (handler contract).
unsafe fn graph_add_any_node(
    graph: CUgraph,
    params: *mut CUgraphNodeParams,
    mut add: impl FnMut() -> CUresult,
) -> CUresult {
    if params.is_null() {
        return add();
    }
    // SAFETY: params is non-null (checked above) and readable (this function's contract).
    match unsafe { (*params).type_ } {
        CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
            // SAFETY: the type says the union holds `alloc`; the pointer stays within the
            // program's readable parameters.
            unsafe { mem_alloc_node(graph, core::ptr::addr_of!((*params).u.alloc), add) }
        }
        CU_GRAPH_NODE_TYPE_GRAPH => {
            // SAFETY: the type says the union holds `graph`; params is readable.
            let child = unsafe { (*params).u.graph };
            let r = add();
            if r == CUDA_SUCCESS && child.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE {
                graph_charge_rehold(
                    &mut graphs(),
                    Holder::Graph(child.graph as usize),
                    Holder::Graph(graph as usize),
                );
            }
            r
        }
        _ => add(),
    }
}

/// `cuGraphAddNode`.
pub unsafe fn graph_add_node(
    real: pfn::cuGraphAddNode,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    // SAFETY: the handler contract: `real` and `params` are the program's.
    unsafe { graph_add_any_node(graph, params, || real(node, graph, deps, ndeps, params)) }
}

/// `cuGraphAddNode_v2` (CUDA 12.3: with edge data, passed through unread).
pub unsafe fn graph_add_node_v2(
    real: pfn::cuGraphAddNode_v2,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const core::ffi::c_void,
    ndeps: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    // SAFETY: the handler contract: `real` and `params` are the program's.
    unsafe {
        graph_add_any_node(graph, params, || {
            real(node, graph, deps, edges, ndeps, params)
        })
    }
}

/// After a successful instantiation: the executable holds the graph's memory charges.
///
/// # Safety
/// `r` is the status of the real instantiation given `exec`, the program's out-pointer (or
/// null).
unsafe fn instantiated(r: CUresult, exec: *mut CUgraphExec, graph: CUgraph) -> CUresult {
    if r == CUDA_SUCCESS && !exec.is_null() {
        // SAFETY: non-null (checked above), written by the driver's successful call.
        let exec = unsafe { *exec };
        graph_charge_share(&mut graphs(), graph as usize, exec as usize);
    }
    r
}

/// `cuGraphInstantiateWithFlags`.
pub unsafe fn graph_instantiate_with_flags(
    real: pfn::cuGraphInstantiateWithFlags,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments; `r` is its status
    // for `exec`.
    unsafe { instantiated(real(exec, graph, flags), exec, graph) }
}

/// `cuGraphInstantiate` (the exported symbol keeps the CUDA 10 signature) and `_v2`.
pub unsafe fn graph_instantiate(
    real: pfn::cuGraphInstantiate_v2,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    err: *mut CUgraphNode,
    log: *mut core::ffi::c_char,
    len: usize,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments; `r` is its status
    // for `exec`.
    unsafe { instantiated(real(exec, graph, err, log, len), exec, graph) }
}

/// `cuGraphInstantiateWithParams(_ptsz)`: the parameters pass through unread.
pub unsafe fn graph_instantiate_with_params(
    real: pfn::cuGraphInstantiateWithParams,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut core::ffi::c_void,
) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments; `r` is its status
    // for `exec`.
    unsafe { instantiated(real(exec, graph, params), exec, graph) }
}

/// Return the charges `h` was the last holder of.
fn graph_released(h: Holder) {
    let Some(st) = crate::init::state_if_ready() else {
        return;
    };
    graph_charge_release(&mut graphs(), h, |ord, bytes| {
        if let Some(dev) = st.device(ord) {
            dev.account.uncharge(bytes);
        }
    });
}

/// `cuGraphLaunch` of `exec` said `r`, out of memory: the driver takes graph memory at launch,
/// charged to the slice since its node was made, so on a full device the monitor may hold it
/// in this slice's balloon. Take the balloons' slow path for what `exec` holds on each device,
/// with `launch` (the program's launch again) as its retry; the charges stay with `exec`.
#[cold]
#[inline(never)]
pub fn launch_refused(
    exec: CUgraphExec,
    mut launch: impl FnMut() -> CUresult,
    r: CUresult,
) -> CUresult {
    let Some(st) = crate::init::state_if_ready() else {
        return r;
    };
    let held: Vec<(i32, u64)> = graphs()
        .iter()
        .filter(|c| c.holders.contains(&Holder::Exec(exec as usize)))
        .map(|c| (c.ordinal, c.bytes))
        .collect();
    let mut r = r;
    for (ordinal, bytes) in held {
        let Some(dev) = st.device(ordinal) else {
            continue;
        };
        match balloon::refused(dev, bytes, 0, || (launch(), ()), r) {
            Ok(()) => return CUDA_SUCCESS,
            Err(again) => r = again,
        }
    }
    r
}

/// `cuGraphDestroy`: the graph's memory goes back unless an executable still holds it.
pub unsafe fn graph_destroy(real: pfn::cuGraphDestroy, graph: CUgraph) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(graph) };
    if r == CUDA_SUCCESS {
        graph_released(Holder::Graph(graph as usize));
    }
    r
}

/// `cuGraphExecDestroy`: as `cuGraphDestroy`, for the executable's hold.
pub unsafe fn graph_exec_destroy(real: pfn::cuGraphExecDestroy, exec: CUgraphExec) -> CUresult {
    // SAFETY: the handler contract: `real` with the program's arguments.
    let r = unsafe { real(exec) };
    if r == CUDA_SUCCESS {
        graph_released(Holder::Exec(exec as usize));
    }
    r
}

/// A capture into graph `captured` ended (`cuStreamEndCapture`): `made` is the graph the driver
/// returned, null when the capture failed (invalidated: the driver keeps no graph, so the
/// memory captured into it goes back).
pub fn capture_ended(captured: CUgraph, made: CUgraph) {
    if made.is_null() {
        graph_released(Holder::Graph(captured as usize));
    } else if made != captured {
        // The driver named the finished graph differently from the one it captured into.
        graph_charge_rehold(
            &mut graphs(),
            Holder::Graph(captured as usize),
            Holder::Graph(made as usize),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_memory_is_held_by_the_graph_and_its_executables() {
        let mut t = Vec::new();
        let mut back = Vec::new();
        graph_charge_add(&mut t, 1, 0, 100);
        graph_charge_add(&mut t, 1, 0, 50);
        graph_charge_share(&mut t, 1, 7);
        graph_charge_share(&mut t, 1, 7);
        // Added after the instantiation: the executable cannot take it.
        graph_charge_add(&mut t, 1, 0, 10);
        graph_charge_release(&mut t, Holder::Graph(1), |o, b| back.push((o, b)));
        assert_eq!(back, [(0, 10)], "the executable still holds the first 150");
        graph_charge_release(&mut t, Holder::Graph(7), |o, b| back.push((o, b)));
        assert_eq!(back.len(), 1, "a graph handle is not an exec handle");
        graph_charge_release(&mut t, Holder::Exec(7), |o, b| back.push((o, b)));
        assert_eq!(back, [(0, 10), (0, 150)]);
        assert!(t.is_empty());
    }

    #[test]
    fn graph_memory_goes_back_with_the_last_of_several_executables() {
        let mut t = Vec::new();
        let mut back = Vec::new();
        graph_charge_add(&mut t, 1, 1, 64);
        graph_charge_share(&mut t, 1, 7);
        graph_charge_share(&mut t, 1, 8);
        graph_charge_release(&mut t, Holder::Exec(7), |o, b| back.push((o, b)));
        graph_charge_release(&mut t, Holder::Graph(1), |o, b| back.push((o, b)));
        assert!(back.is_empty(), "executable 8 still holds it");
        graph_charge_release(&mut t, Holder::Exec(8), |o, b| back.push((o, b)));
        assert_eq!(back, [(1, 64)], "charged once, returned once");
    }

    #[test]
    fn a_moved_child_graph_hands_its_memory_to_the_parent() {
        let mut t = Vec::new();
        let mut back = Vec::new();
        graph_charge_add(&mut t, 2, 0, 32);
        graph_charge_rehold(&mut t, Holder::Graph(2), Holder::Graph(1));
        graph_charge_share(&mut t, 1, 9);
        graph_charge_release(&mut t, Holder::Graph(1), |o, b| back.push((o, b)));
        assert!(back.is_empty(), "the parent's executable holds it");
        graph_charge_release(&mut t, Holder::Exec(9), |o, b| back.push((o, b)));
        assert_eq!(back, [(0, 32)]);
    }
}
