//! The fake GPU: one shared library that answers as `libcuda.so.1` and `libnvidia-ml.so.1`.
