"""Deuteron kernels as PyTorch custom ops, so that torch.compile can trace code that calls them.

    rms_norm = deuteron.torch.op(deuteron.catalogue["rms_norm"])
    y = torch.compile(lambda x, w: rms_norm(x, w, 1e-6))(x, w)

``op`` registers ``deuteron::<kernel name>`` with torch.library: the real implementation calls
the kernel (on CPU tensors, without copies), and the fake (meta) one traces the kernel for the
fake tensors' shapes and dtypes and makes empty outputs of the shapes it would return, so the
compiler sees the outputs without running anything.
"""
import torch

_ops = {}


def _spec(a):
    if isinstance(a, torch.Tensor):
        return (tuple(int(s) for s in a.shape), tuple(int(s) for s in a.stride()), str(a.dtype).removeprefix("torch."))
    return a


def op(kernel, arg_kinds=None, namespace="deuteron"):
    """A callable that runs ``kernel`` as the custom op ``namespace::kernel.name``.

    ``arg_kinds``: "Tensor", "float" or "int" per argument (the op's schema); default: the
    kernel's own (the catalogue's are known), else every argument a tensor. Registering the same
    kernel again returns the op made the first time."""
    kinds = list(arg_kinds or kernel.arg_kinds or ["Tensor"] * kernel.arity)
    if len(kinds) != kernel.arity:
        raise ValueError(f"kernel '{kernel.name}' takes {kernel.arity} arguments; arg_kinds names {len(kinds)}")
    qualname = f"{namespace}::{kernel.name}"
    if qualname in _ops:
        return _ops[qualname]
    params = ", ".join(f"{kind} {name}" for kind, name in zip(kinds, kernel.arg_names))
    # Tensor[]: how many outputs a kernel returns is known only from a trace.
    schema = f"({params}) -> Tensor[]"

    def real(*args):
        out = kernel(*args)
        return list(out) if isinstance(out, tuple) else [out]

    custom = torch.library.custom_op(qualname, real, mutates_args=(), schema=schema)

    @custom.register_fake
    def _(*args):
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        return [torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                for shape, dtype in kernel.output_specs([_spec(a) for a in args])]

    def call(*args):
        outs = custom(*args)
        return outs[0] if len(outs) == 1 else tuple(outs)

    call.__name__ = call.__qualname__ = kernel.name
    call.__doc__ = f"Deuteron kernel {kernel.name} as the custom op torch.ops.{namespace}.{kernel.name}"
    call.op = custom
    _ops[qualname] = call
    return call
