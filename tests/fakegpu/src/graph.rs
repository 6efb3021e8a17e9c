//! CUDA graphs: what stream capture records (kernels, copies, memsets, host functions and
//! memory nodes), instantiated into an executable graph that `cuGraphLaunch` replays on a
//! stream. Memory nodes keep one address for the graph's life and take device memory only
//! from the launch that allocates it to the node (or free) that gives it back, as the driver's
//! graph memory does.

use crate::exec::{Op, Stream};
use crate::mem::{self, Kind};
use crate::runtime::{rt_unchecked, Ctx, CuResult};
use gpuslice_abi::*;
use std::sync::Mutex;

const GRAPH_MAGIC: u64 = 0x6EA9_0000_0000_FA4E;
const EXEC_MAGIC: u64 = 0x6E3C_0000_0000_FA4E;

/// A node.
#[derive(Clone, Debug)]
pub enum Node {
    /// Queued work.
    Op(Op),
    /// Allocate the graph range at `ptr` (`size` bytes, CUDA ordinal `dev`).
    Alloc { ptr: u64, size: u64, dev: usize },
    /// Free a range.
    Free(u64),
}

/// A graph under construction.
#[repr(C)]
pub struct Graph {
    magic: u64,
    nodes: Mutex<Vec<Node>>,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Graph {
    const MAGIC: u64 = GRAPH_MAGIC;
}

/// An instantiated graph.
#[repr(C)]
pub struct GraphExec {
    magic: u64,
    nodes: Vec<Node>,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for GraphExec {
    const MAGIC: u64 = EXEC_MAGIC;
}

impl Graph {
    /// `cuGraphCreate`.
    pub fn new() -> &'static Graph {
        Box::leak(Box::new(Graph {
            magic: GRAPH_MAGIC,
            nodes: Mutex::new(Vec::new()),
        }))
    }

    /// The graph a handle names.
    pub fn resolve(h: CUgraph) -> CuResult<&'static Graph> {
        crate::handle::resolve(h as *const std::ffi::c_void).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// Its handle.
    pub fn handle(&'static self) -> CUgraph {
        self as *const Graph as CUgraph
    }

    /// Append a node; its handle is its index + 1.
    pub fn push(&self, n: Node) -> CUgraphNode {
        let mut g = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        g.push(n);
        g.len() as CUgraphNode
    }

    /// Whether it has no nodes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// `cuGraphInstantiate`.
    /// `cuGraphDebugDotPrint`: the graph in Graphviz DOT, its nodes in capture order (the fake
    /// records a chain), each labelled with what it does.
    pub fn dot(&self) -> String {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let mut out =
            String::from("digraph dot {\n  subgraph cluster_1 {\n    label=\"graph_1\";\n");
        for (i, n) in nodes.iter().enumerate() {
            let what = match n {
                Node::Op(Op::Kernel(ns)) => format!("KERNEL {ns} ns"),
                Node::Op(Op::Copy(c)) => format!("MEMCPY {} bytes", c.width * c.height * c.depth),
                Node::Op(Op::Set(m)) => format!("MEMSET {} x {}", m.width, m.height),
                Node::Op(Op::Host(..) | Op::Callback(..)) => "HOST".to_string(),
                Node::Op(op) => format!("{op:?}"),
                Node::Alloc { size, .. } => format!("MEM_ALLOC {size} bytes"),
                Node::Free(_) => "MEM_FREE".to_string(),
            };
            out += &format!("    \"node_{i}\" [label=\"{i}: {what}\"];\n");
            if i > 0 {
                out += &format!("    \"node_{}\" -> \"node_{i}\";\n", i - 1);
            }
        }
        out += "  }\n}\n";
        out
    }

    /// An executable graph of its nodes.
    pub fn instantiate(&self) -> &'static GraphExec {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Box::leak(Box::new(GraphExec {
            magic: EXEC_MAGIC,
            nodes,
        }))
    }
}

/// Record a captured operation.
pub fn add_op(g: &Graph, op: Op) {
    g.push(Node::Op(op));
}

/// A graph memory node's range: an address reserved now, memory taken at launch.
pub fn add_alloc(g: &Graph, ctx: &'static Ctx, size: u64) -> CuResult<(CUgraphNode, u64)> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ptr = mem::alloc_host(Some(ctx), size, Kind::Graph(false))?;
    Ok((
        g.push(Node::Alloc {
            ptr,
            size,
            dev: ctx.dev,
        }),
        ptr,
    ))
}

impl GraphExec {
    /// The executable graph a handle names.
    pub fn resolve(h: CUgraphExec) -> CuResult<&'static GraphExec> {
        crate::handle::resolve(h as *const std::ffi::c_void).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// Its handle.
    pub fn handle(&'static self) -> CUgraphExec {
        self as *const GraphExec as CUgraphExec
    }

    /// `cuGraphLaunch`: memory nodes take their memory now (or the launch fails with
    /// `CUDA_ERROR_OUT_OF_MEMORY`, nothing taken), then the nodes run in order on `s`.
    pub fn launch(&self, s: &'static Stream) -> CuResult<()> {
        let node = rt_unchecked().node;
        let mut taken: Vec<(u64, mem::Range)> = Vec::new();
        for n in &self.nodes {
            if let Node::Alloc { ptr, .. } = n {
                let Some((_, r)) = mem::lookup(*ptr) else {
                    continue;
                };
                if r.kind != Kind::Graph(false) {
                    continue;
                }
                let phys = rt_unchecked().devices[r.dev].phys;
                if !node.reserve_or_reap(phys, r.size) {
                    for (p, r) in taken {
                        node.unreserve(rt_unchecked().devices[r.dev].phys, r.size);
                        mem::set_graph_live(p, false);
                    }
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                mem::set_graph_live(*ptr, true);
                taken.push((*ptr, r));
            }
        }
        for n in &self.nodes {
            match n {
                Node::Op(op) => s.submit(op.clone())?,
                Node::Free(p) => s.submit(Op::Free(*p))?,
                Node::Alloc { .. } => {}
            }
        }
        Ok(())
    }
}
