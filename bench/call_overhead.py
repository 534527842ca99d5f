"""The cost of calling a small kernel from Python against the same call from C++: the
catalogue's softmax on a [1, 128] float32 tensor, in the same run.

    .venv/bin/python bench/call_overhead.py build/deuteron_call_overhead [--calls 2000 --rounds 21]

C++: bench/call_overhead.cpp (KernelBase::run, and the compiled kernel alone). Python: the
kernel called on a numpy array, a torch tensor and a jax array (each call imports the input by
DLPack and hands a new output to the caller's framework); then deuteron.torch.op (a torch custom
op) and deuteron.jax.op under jax.jit (an XLA FFI call, and a pure_callback) beside
torch.softmax and a jitted jax.nn.softmax. Medians over rounds of calls, in µs per call; prints one JSON object.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

os.environ.setdefault("DEUTERON_AUTOTUNE_EFFORT", "none")  # the same default config as the C++ side

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import deuteron  # noqa: E402
import deuteron.jax  # noqa: E402
import deuteron.torch  # noqa: E402


def median_us(fn, calls, rounds):
    fn()
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per_call)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cpp_program")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=21)
    a = p.parse_args()
    softmax = deuteron.catalogue["softmax"]
    x = np.random.default_rng(1).uniform(-1, 1, (1, 128)).astype(np.float32)
    xt, xj = torch.from_numpy(x), jnp.asarray(x)
    op_torch = deuteron.torch.op(softmax)
    jit_ffi = jax.jit(deuteron.jax.op(softmax, via="ffi"))
    jit_callback = jax.jit(deuteron.jax.op(softmax, via="pure_callback"))
    jit_jax = jax.jit(jax.nn.softmax)
    cpp = json.loads(subprocess.run([a.cpp_program, str(a.calls), str(a.rounds)], check=True,
                                    capture_output=True, text=True).stdout)
    r = {
        "cpp_call_us": cpp["call_us"],
        "cpp_kernel_only_us": cpp["kernel_us"],
        "python_numpy_us": median_us(lambda: softmax(x), a.calls, a.rounds),
        "python_torch_us": median_us(lambda: softmax(xt), a.calls, a.rounds),
        "python_jax_us": median_us(lambda: softmax(xj), a.calls, a.rounds),
        "torch_custom_op_us": median_us(lambda: op_torch(xt), a.calls, a.rounds),
        "torch_softmax_us": median_us(lambda: torch.softmax(xt, -1), a.calls, a.rounds),
        "jax_jit_ffi_us": median_us(lambda: jit_ffi(xj).block_until_ready(), a.calls // 4, a.rounds),
        "jax_jit_pure_callback_us": median_us(lambda: jit_callback(xj).block_until_ready(), a.calls // 4, a.rounds),
        "jax_jit_softmax_us": median_us(lambda: jit_jax(xj).block_until_ready(), a.calls // 4, a.rounds),
    }
    r = {k: round(v, 2) for k, v in r.items()}
    print(json.dumps(r))


if __name__ == "__main__":
    main()
