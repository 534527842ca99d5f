"""Deuteron's errors as Python exceptions, one class per C++ class (include/deuteron/error.h).

Each carries what the C++ error carries: ``message`` (what went wrong), ``where`` (the
"file:line" in the kernel's source, when known) and ``hint`` (what to do); ``str(e)`` is the
C++ error's full text.
"""
import builtins


class Error(Exception):
    """Base of every error Deuteron raises."""

    def __init__(self, message, where="", hint="", text=None):
        if text is None:
            text = "error: " + message
            text += "\n  at " + where if where else ""
            text += "\n  hint: " + hint if hint else ""
        super().__init__(text)
        self.message, self.where, self.hint = message, where, hint


class KernelError(Error):
    """A mistake in the kernel, found while tracing or lowering it (names its line)."""


class ArgumentError(Error, ValueError):
    """Arguments the kernel cannot take: dtype, rank, shape, device, type."""


class ConfigError(Error):
    """A config that is illegal for the kernel or does not fit the target."""


class CompileError(Error):
    """The target's toolchain failed (the C++ compiler, the Python interpreter)."""


class RuntimeError(Error, builtins.RuntimeError):
    """A failure at run time outside the caller's control (I/O, dlopen, worker processes)."""


CLASSES = {c.__name__: c for c in (Error, KernelError, ArgumentError, ConfigError, CompileError, RuntimeError)}
