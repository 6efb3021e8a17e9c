//! Helpers for gpuslice's system tests: where the built artifacts are, and how to start
//! wrapped processes on the fake GPU with a private ledger and fake-GPU state.
