"""Deuteron kernels, called from Python on PyTorch, JAX and NumPy arrays.

    import deuteron, torch
    softmax = deuteron.catalogue["softmax"]
    y = softmax(torch.randn(4, 100))          # a torch.Tensor, on the CPU, no copies
    mine = deuteron.load("libmykernels.so")   # a user's kernels (include/deuteron/library.h)

A kernel's arguments are tensors (anything with ``__dlpack__`` on the CPU) and Python numbers;
its outputs come back as arrays of the first tensor argument's framework. The first call of a
shape picks its config (pinned, cached, tuned, or the default) and compiles, as in C++.
``deuteron.torch.op`` and ``deuteron.jax.op`` wrap a kernel for torch.compile and jax.jit.
"""
import json
import types

from . import _deuteron
from .errors import ArgumentError, CompileError, ConfigError, Error, KernelError, RuntimeError  # noqa: F401
from .errors import CLASSES as _ERROR_CLASSES

_deuteron._set_error_classes(_ERROR_CLASSES)

__all__ = ["Kernel", "catalogue", "load", "targets", "Error", "KernelError", "ArgumentError",
           "ConfigError", "CompileError", "RuntimeError"]


class Kernel:
    """One Deuteron kernel: call it on arrays; emit, tune or inspect its config per shape."""

    def __init__(self, native):
        self._native = native
        self.name = native.name
        self.arity = native.arity
        self.arg_names = list(native.arg_names) or [f"x{i}" for i in range(native.arity)]
        self.defined_at = native.defined_at
        self.summary = native.summary
        # "Tensor", "float" or "int" per argument, when known (the catalogue's, from its
        # example inputs): the torch wrapper's schema. None: every argument a tensor.
        self.arg_kinds = native.arg_kinds

    def __call__(self, *args):
        return self._native(*args)

    def run(self, *args, target="cpu", config=None):
        """Calls the kernel on ``target`` (cpu, pallas, triton), with ``config`` (a dict or
        JSON text) if given, else the pinned, cached, tuned or default one."""
        if isinstance(config, dict):
            config = json.dumps(config)
        return self._native.run_on(target, config or "", *args)

    def emit(self, target, *args):
        """The code ``target`` generates for these arguments' shapes and dtypes, with the config a
        call would use without tuning (pinned, cached, else the default)."""
        return self._native.emit(target, *args)

    def config(self, *args, target="cpu"):
        """``{"config": {...}, "origin": "pinned" | "cache" | "default"}``: the config a call on
        these arguments' shapes would use now, without tuning."""
        c = self._native.config(target, *args)
        return {"config": json.loads(c["config"]), "origin": c["origin"]}

    def tune(self, *args, effort="quick", target="cpu", budget_s=0.0, retune=False):
        """Autotunes for these arguments' shapes (or finds the cached result) and returns the best
        config, its time and the default's. ``effort``: none, quick or full; ``budget_s``: the
        time it may take (0: the effort's)."""
        r = self._native.tune(target, effort, float(budget_s), bool(retune), *args)
        r["config"], r["default"] = json.loads(r["config"]), json.loads(r["default"])
        return r

    def output_specs(self, specs):
        """[(shape, dtype name)] per output, from per-argument (shape, strides, dtype name) tuples
        or numbers: what a call returns, traced without running it."""
        return self._native.output_specs(list(specs))

    def __repr__(self):
        return f"<deuteron.Kernel {self.name}({', '.join(self.arg_names)}) defined at {self.defined_at}>"


#: The kernel catalogue (docs/KERNELS.md) by name.
catalogue = types.MappingProxyType({k.name: Kernel(k) for k in _deuteron.catalogue()})


def load(path):
    """Opens a library of kernels (a shared library that lists them with DEUTERON_KERNEL_LIBRARY,
    built with find_package(deuteron) against deuteron::headers) and returns them by name."""
    return types.MappingProxyType({k.name: Kernel(k) for k in _deuteron.load(str(path))})


def targets():
    """The targets built in, the default first."""
    return list(_deuteron.targets())
