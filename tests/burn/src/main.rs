//! `gpuslice-burn`: a driver-API load generator.

fn main() {}
