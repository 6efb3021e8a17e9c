//! The execution model: streams, events, and one executor thread per (process, device) that
//! runs the queued work of every stream of that device on the node-wide execution engine.
//!
//! Work is asynchronous and takes simulated time: each executor keeps a simulated cursor,
//! completions and event timestamps are simulated end times, and waiters sleep until real time
//! reaches them. The engine is one per device for the whole node, time-sliced between
//! processes. One file a job:
//!
//! - `ops.rs`: the work a stream queues ([`Op`]) and the byte movers of copies and memsets;
//! - `executor.rs`: the [`Executor`], one per (process, device): the queues of its streams,
//!   the planning of their work on the simulated clock, and the waits of synchronizing calls;
//! - `engine.rs`: the node-wide engine token, taken, handed on round-robin after a time
//!   slice, and taken over from a dead or stopped holder;
//! - `stream.rs`: [`Stream`] handles and the stream calls, and [`ctx_synchronize`];
//! - `capture.rs`: stream capture into graphs;
//! - `event.rs`: [`Event`]s, their records, waits and timing;
//! - `ipc_event.rs`: interprocess events, mirrored through a node-wide file;
//! - `host_wait.rs`: how a synchronizing thread waits for the end, by the context's
//!   `CU_CTX_SCHED_*` flag.

mod capture;
mod engine;
mod event;
mod executor;
mod host_wait;
mod ipc_event;
mod ops;
mod stream;

pub use event::Event;
pub use executor::{shutdown, Executor, HORIZON_NS, QUEUE_DEPTH};
pub use host_wait::{context_active, HostWait};
pub use ipc_event::{get_event_handle, open_event_handle};
pub use ops::{Copy3D, Memset, Op, StreamCallback};
pub use stream::{ctx_synchronize, Stream};
