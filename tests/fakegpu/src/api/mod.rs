//! The driver API: [`EXPORTS`], the one table of exported entry points (`exports.rs`, generated
//! by its `exports!` macro, which `cuGetProcAddress` resolves from), and the bodies several
//! exports share, one file a job:
//!
//! - `exports.rs`: the exports themselves, each a thin wrapper, and [`EXPORTS`];
//! - `args.rs`: the C boundary: [`guard`], out-parameters, strings, structs read by value, and
//!   the arguments several exports resolve alike;
//! - `copy.rs`: copies and memsets, and the decoding of 2D/3D copy descriptors;
//! - `launch.rs`: kernel launches, their simulated duration, launch configurations, occupancy;
//! - `stream.rs`: queueing work on a stream, stream creation, callbacks, capture state,
//!   stream-ordered allocation;
//! - `mem_op.rs`: stream memory operations (waits and writes on device words) and prefetches;
//! - `attributes.rs`: the fake's answers about itself: [`driver_version`],
//!   `device_attribute`, function and pointer attributes;
//! - `errors.rs`: the names and descriptions of result codes.

mod args;
mod attributes;
mod copy;
mod errors;
mod exports;
mod launch;
mod mem_op;
mod stream;

pub use args::guard;
pub(crate) use attributes::device_attribute;
pub use attributes::driver_version;
pub use exports::*;
