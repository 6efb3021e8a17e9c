//! `gpuslice`: the node monitor daemon and the operator's command line.

fn main() {}
