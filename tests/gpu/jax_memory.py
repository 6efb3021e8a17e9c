"""JAX under a VRAM quota (run under the shim with GPUSLICE_MEMORY): XLA sizes its default
preallocation from the free memory the driver reports, so it must land within the quota; a
computation needing more than the quota must fail with XLA's RESOURCE_EXHAUSTED error, not
crash, and the process must still compute afterwards."""

from common import GiB, emit, skip

try:
    import jax
    import jax.numpy as jnp
except ImportError as e:
    skip(f"jax not importable: {e}")

try:
    gpus = jax.devices("gpu")
except RuntimeError as e:
    skip(f"jax has no GPU backend: {str(e).splitlines()[0][:200]}")
if not gpus:
    skip("jax has no GPU device")

d = gpus[0]
r = {"jax": jax.__version__, "device": str(d)}
x = jax.device_put(jnp.ones((1024, 1024), jnp.float32), d)
r["small_ok"] = float((x @ x).block_until_ready()[0, 0]) == 1024.0
stats = d.memory_stats() or {}
r["bytes_limit"] = stats.get("bytes_limit")
r["bytes_reserved"] = stats.get("bytes_reserved")
r["pool_bytes"] = stats.get("pool_bytes")

big = 6 * GiB // 4  # float32 elements: 6 GiB, beyond a 4 GiB quota and any preallocation in it
try:
    y = jax.device_put(jnp.ones((big,), jnp.float32), d)
    y = (y * 2).block_until_ready()
    r["big_error"] = None
    del y
except Exception as e:  # XlaRuntimeError and friends: judged by message
    r["big_error"] = {"type": type(e).__qualname__, "message": str(e).splitlines()[0][:300]}
z = jax.device_put(jnp.ones((1024, 1024), jnp.float32), d)
r["after_ok"] = float((z @ z).block_until_ready()[0, 0]) == 1024.0
emit(r)
