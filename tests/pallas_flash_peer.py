"""Deuteron's attention against JAX's own Pallas TPU flash attention, on the same inputs.

Usage: python pallas_flash_peer.py SRC_DIR ATTENTION.py CAUSAL.py B H S D  (SRC_DIR: the repository's src/)

Both run under TPU interpret mode on the CPU (JAX's kernel through
pltpu.force_tpu_interpret_mode, with races, out-of-bounds reads and uninitialised memory
detected); each is compared with the other and with a float64 numpy reference. Exit status 0
when all agree.
"""

import importlib.util
import sys

import numpy as np


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(q, k, v, causal):
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(axis=-1, keepdims=True), v.astype(np.float64))


def main():
    src, plain_path, causal_path = sys.argv[1:4]
    b, h, s, d = (int(x) for x in sys.argv[4:8])
    sys.path[:0] = [f"{src}/backends/pallas/runtime", f"{src}/backends/python/runtime"]
    import deuteron_pallas_runner as runner

    runner.install_cpu_tpu_info("v5e")
    import jax.numpy as jnp
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash

    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    params = pltpu.InterpretParams(detect_races=True, out_of_bounds_reads="raise", uninitialized_memory="nan")
    ok = True
    for causal, path in ((False, plain_path), (True, causal_path)):
        ours = np.asarray(load(path, "deuteron_attention").run(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)))
        with pltpu.force_tpu_interpret_mode(params):
            theirs = np.asarray(jax_flash.flash_attention(
                jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), causal=causal, sm_scale=1.0 / np.sqrt(d)))
        want = reference(q, k, v, causal)
        peer = float(np.abs(ours - theirs).max())
        ours_err = float(np.abs(ours - want).max())
        theirs_err = float(np.abs(theirs - want).max())
        agree = peer < 2e-5 and ours_err < 2e-5 and theirs_err < 2e-5
        ok = ok and agree
        print(f"{'causal' if causal else 'plain'} attention [{b}, {h}, {s}, {d}]: deuteron vs jax flash_attention "
              f"max |diff| {peer:.3g}; vs float64 reference: deuteron {ours_err:.3g}, jax {theirs_err:.3g}"
              f" -> {'agree' if agree else 'DISAGREE'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
