"""JAX (jax[cuda12]) on the fake GPU: `fw_jax.py fill STEP_MIB` reports the device's
memory_stats (bytes_limit), allocates arrays until RESOURCE_EXHAUSTED, and what the fake says
the process holds (cudaMemGetInfo through the runtime, for the preallocation check)."""
import sys

from jax._src import hardware_utils

# JAX only tries CUDA when /dev/nvidia0, /dev/nvidiactl or /dev/dxg exists; a machine with the
# fake GPU has none, and none may be created on it: answer the check inside this process.
hardware_utils.has_visible_nvidia_gpu = lambda: True

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from fw_common import MI, emit, failure  # noqa: E402


def stats():
    s = jax.devices()[0].memory_stats() or {}
    return {k: s.get(k) for k in ("bytes_limit", "bytes_in_use", "bytes_reserved", "pool_bytes")}


def fill(step_mib):
    dev = jax.devices()[0]
    before = stats()
    held, error = [jnp.zeros((1024,), dtype=jnp.uint8).block_until_ready()], None
    first = stats()
    while len(held) < 10_000:
        try:
            held.append(jnp.zeros((step_mib * MI,), dtype=jnp.uint8).block_until_ready())
        except Exception as e:
            error = dict(failure(e), resource_exhausted="RESOURCE_EXHAUSTED" in str(e))
            break
    emit(platform=dev.platform, before=before, first=first, allocated=len(held) - 1, error=error,
         after=stats())


if __name__ == "__main__":
    fill(int(sys.argv[2]))
