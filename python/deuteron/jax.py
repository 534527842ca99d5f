"""Deuteron kernels inside jax.jit, through jax.pure_callback.

    softmax = deuteron.jax.op(deuteron.catalogue["softmax"])
    y = jax.jit(softmax)(x)

The callback runs the kernel on the host arrays JAX hands it (on the CPU, without copies);
the output shapes and dtypes JAX needs at trace time come from tracing the kernel for the
abstract arguments. Scalar arguments (Python numbers) are static: each value is part of the
traced function, not a traced value. bfloat16 arrays are refused (the callback's numpy arrays
cannot carry them through DLPack; call such a kernel outside jit). A pure_callback is opaque to JAX: no autodiff, no
vmap beyond calling it once per element (vmap_method="sequential"), and each call crosses
back into Python (README: "JAX" has what it costs).
"""
import jax
import numpy as np

from .errors import ArgumentError


def _spec(a):
    if isinstance(a, (int, float)):
        return a
    shape = tuple(int(s) for s in a.shape)
    strides, step = [0] * len(shape), 1
    for d in reversed(range(len(shape))):  # JAX arrays are row-major
        strides[d], step = step, step * shape[d]
    return (shape, tuple(strides), np.dtype(a.dtype).name)


def op(kernel):
    """A function of JAX arrays (and Python numbers) that runs ``kernel`` under jit too."""

    def call(*args):
        tensors = [a for a in args if not isinstance(a, (int, float))]
        if any(np.dtype(a.dtype).name == "bfloat16" for a in tensors):
            # The callback's host arrays are numpy arrays, whose bfloat16 (ml_dtypes) DLPack
            # cannot carry.
            raise ArgumentError(f"deuteron.jax.op({kernel.name}): bfloat16 arrays cannot reach a kernel inside "
                                "a pure_callback", "", "call the kernel outside jax.jit, or cast to float32")
        specs = [_spec(a) for a in args]
        result = [jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for shape, dtype in kernel.output_specs(specs)]

        def host(*arrays):
            it = iter(arrays)
            full = [a if isinstance(a, (int, float)) else np.asarray(next(it)) for a in args]
            out = kernel(*full)
            return tuple(out) if isinstance(out, tuple) else (out,)

        outs = jax.pure_callback(host, tuple(result), *tensors, vmap_method="sequential")
        return outs[0] if len(outs) == 1 else tuple(outs)

    call.__name__ = call.__qualname__ = kernel.name
    call.__doc__ = f"Deuteron kernel {kernel.name} as a jax.pure_callback"
    return call
