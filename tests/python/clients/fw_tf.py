"""TensorFlow (tensorflow[and-cuda]) on the fake GPU: `fw_tf.py fill STEP_MIB [growth|limit=MIB]`
configures the GPU (memory growth, or a logical device with a memory_limit), allocates tensors
until ResourceExhaustedError, and reports get_memory_info; `fw_tf.py hold MIB` holds a tensor and
serves `info` (for comparing with `gpuslice status`)."""
import ctypes
import glob
import os
import site
import sys

# TF's loader does not find libcusolver.so.11 among the pip wheels (it then registers no GPU)
# unless that library is already loaded.
for sp in site.getsitepackages():
    for lib in glob.glob(os.path.join(sp, "nvidia/cusolver/lib/libcusolver.so.11")):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)

import tensorflow as tf  # noqa: E402

from fw_common import MI, emit, failure, serve  # noqa: E402


def setup(how):
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise SystemExit("TensorFlow registered no GPU")
    if how == "growth":
        tf.config.experimental.set_memory_growth(gpus[0], True)
    elif how.startswith("limit="):
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=int(how[6:]))])
    return gpus


def info():
    i = tf.config.experimental.get_memory_info("GPU:0")
    return dict(current=i["current"], peak=i["peak"])


def fill(step_mib, how):
    setup(how)
    held, error = [], None
    with tf.device("/GPU:0"):
        while len(held) < 10_000:
            try:
                t = tf.zeros((step_mib * MI,), dtype=tf.uint8)
                _ = t.shape
                held.append(t)
                info()
            except Exception as e:
                error = failure(e, tf.errors.ResourceExhaustedError, "ResourceExhaustedError")
                break
    emit(allocated=len(held), error=error, info=info(), allocator=os.environ.get("TF_GPU_ALLOCATOR"))


def hold(mib):
    setup("growth")
    held = []
    with tf.device("/GPU:0"):
        held.append(tf.zeros((int(mib) * MI,), dtype=tf.uint8))
    emit(event="ready", **info())
    serve(dict(info=info))


if __name__ == "__main__":
    if sys.argv[1] == "fill":
        fill(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "default")
    else:
        hold(sys.argv[2])
