"""Deuteron kernels inside jax.jit.

    softmax = deuteron.jax.op(deuteron.catalogue["softmax"])
    y = jax.jit(softmax)(x)

Two ways in, both on the CPU (README "From Python" has what each costs):

- ``via="ffi"`` (the default when the package was built with jax): an XLA FFI custom call.
  The compiled computation calls the kernel directly on XLA's buffers; the outputs are copied
  into XLA's result buffers. Errors arrive as JAX's (``JaxRuntimeError``) with the Deuteron
  error's text.
- ``via="pure_callback"``: ``jax.pure_callback``, which leaves the computation for Python and
  runs the kernel on the numpy arrays JAX hands over; it cannot take bfloat16 (numpy's
  ml_dtypes arrays do not travel by DLPack).

Either way the output shapes and dtypes JAX needs at trace time come from tracing the kernel
for the abstract arguments; scalar arguments are Python numbers and static (each value is part
of the traced function); there is no autodiff, and vmap calls the kernel once per element.
"""
import jax
import numpy as np

from . import _deuteron
from .errors import ArgumentError

#: Whether this build has the XLA FFI handler (cmake/deuteron_python.cmake).
HAS_FFI = hasattr(_deuteron, "jax_ffi_handler")
_TARGET = "deuteron_call"
if HAS_FFI:
    jax.ffi.register_ffi_target(_TARGET, _deuteron.jax_ffi_handler(), platform="cpu")


def _is_number(a):
    return isinstance(a, (int, float))


def _spec(a):
    if _is_number(a):
        return a
    shape = tuple(int(s) for s in a.shape)
    strides, step = [0] * len(shape), 1
    for d in reversed(range(len(shape))):  # JAX arrays are row-major
        strides[d], step = step, step * shape[d]
    return (shape, tuple(strides), np.dtype(a.dtype).name)


def op(kernel, via=None):
    """A function of JAX arrays (and Python numbers) that runs ``kernel``, under jit too."""
    via = via or ("ffi" if HAS_FFI else "pure_callback")
    if via not in ("ffi", "pure_callback") or (via == "ffi" and not HAS_FFI):
        raise ValueError(f"via must be 'pure_callback'{' or ffi' if HAS_FFI else ''} (this build has "
                         f"{'an' if HAS_FFI else 'no'} XLA FFI handler), not {via!r}")

    def call(*args):
        for i, a in enumerate(args):
            if isinstance(a, bool):
                raise ArgumentError(f"argument {i} of kernel '{kernel.name}' is a bool; scalar arguments are int or float")
        tensors = [a for a in args if not _is_number(a)]
        result = tuple(jax.ShapeDtypeStruct(shape, np.dtype(dtype))
                       for shape, dtype in kernel.output_specs([_spec(a) for a in args]))
        if via == "ffi":
            outs = jax.ffi.ffi_call(_TARGET, result, vmap_method="sequential")(
                *tensors, kernel=np.int64(kernel._native.address),
                layout="".join("f" if isinstance(a, float) else "i" if isinstance(a, int) else "T" for a in args),
                floats=np.array([a for a in args if isinstance(a, float)], np.float64),
                ints=np.array([a for a in args if isinstance(a, int)], np.int64))
        else:
            if any(np.dtype(a.dtype).name == "bfloat16" for a in tensors):
                raise ArgumentError(f"deuteron.jax.op({kernel.name}, via='pure_callback'): bfloat16 arrays cannot "
                                    "reach a kernel inside a pure_callback", "",
                                    "use via='ffi', call the kernel outside jax.jit, or cast to float32")

            def host(*arrays):
                it = iter(arrays)
                out = kernel(*[a if _is_number(a) else next(it) for a in args])
                return tuple(out) if isinstance(out, tuple) else (out,)

            outs = jax.pure_callback(host, result, *tensors, vmap_method="sequential")
        return outs[0] if len(outs) == 1 else tuple(outs)

    call.__name__ = call.__qualname__ = kernel.name
    call.__doc__ = f"Deuteron kernel {kernel.name} for JAX ({via})"
    call.via = via
    return call
