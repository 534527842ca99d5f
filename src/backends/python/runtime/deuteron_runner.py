"""The half of a Deuteron runner that every Python-based target shares.

A target's runner script (the pallas target's deuteron_pallas_runner.py) defines a ``Target``
(how to pick the device, compile a module's ``run`` and wait for its results) and calls
``main(target)``. The library writes this file beside it (backends/python/runner.h), so the
script imports it as ``deuteron_runner``.

One run (the default): the generated module file is imported by path and its function
``run(*inputs, **scalars)`` is called; it returns one array or a tuple/list of arrays, written
in order to the ``--outputs`` files.

    python RUNNER.py MODULE.py --inputs a.npy b.npy --outputs out0.npy \
        [--dtypes bfloat16,float32] [--scalars '{"eps": 1e-5}'] [--time N] [target options]

bfloat16 convention (numpy has no bfloat16; ``np.save`` of an ml_dtypes bfloat16 array writes a
'|V2' void dtype that other readers cannot interpret):
  * The caller stores a bfloat16 input as a uint16 .npy holding the raw bf16 bits and names its
    logical dtype with ``--dtypes`` (comma-separated, one entry per input; an empty entry or "-"
    keeps the stored dtype). The runner reinterprets the bits (``view``) as bfloat16.
  * A bfloat16 output is written as a uint16 .npy holding the raw bits; the JSON line on stdout
    says so (``"dtype": "bfloat16", "stored": "uint16"``).
Any other dtype is stored as itself. Other ml_dtypes types (float8_*) follow the same rule with
uint8 storage.

stdout: exactly one JSON line, e.g.
  {"ok": true, "outputs": [{"path": "o.npy", "shape": [130, 300], "dtype": "float32",
   "stored": "float32"}], "device": "interpret"}
plus what the target adds. With ``--time N`` it also holds "median_ms", "min_ms", "mean_ms",
"runs", "warmup_ms" (the first call, which includes tracing and compiling): the median of N
calls after it, each timed up to the target's wait for the results (``block_until_ready``).

``--probe`` prints only the target's device report (one JSON line) and exits.

Exit status: 0 on success; 2 on any failure, with a one-line "<prog>: error: ..." message and
the Python traceback on stderr. Paths in that line are written as Python literals (repr), so a
newline in one cannot split it.

``--serve`` speaks the autotuner's runner protocol instead (backends/cpu/runner_source.h, whose
commands it reads on stdin and answers on stdout). The differences:
  * ``kernel <module> <spec>``: both fields %XX-encoded (runtime/text.h: encode_field); the
    spec is JSON, {"tensors": [{"dtype", "shape", "strides", "output"}...], "scalars":
    [{"name", "dtype"}...]}, the host tensors and scalar arguments in IR order (the arena's
    slots and ``scalar`` lines). Inputs are copied out of the arena and onto the device once;
    outputs are written back into it after the first timed call.
  * Each module is compiled and run once before "loaded", so compile time is never a sample.
  * ``memlimit`` is ignored: XLA reserves address space up front, which RLIMIT_AS would refuse.
  * ``inject crash`` raises SIGSEGV, ``hang`` sleeps, ``oom`` exits with status 3, ``wrong``
    corrupts the first output bytes after the runs (the tuner's test hooks).
Samples are seconds of one call each, waited for on the device.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
import urllib.parse

# The generated modules live in Deuteron's cache, which checks every file it keeps there: no
# __pycache__ beside them (a stale or planted .pyc would be run instead of the checked module).
sys.dont_write_bytecode = True

# Logical dtype name -> storage dtype name in .npy files and in the tuner's arena.
BITS_STORAGE = {
    "bfloat16": "uint16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e4m3b11fnuz": "uint8",
}


class RunnerError(Exception):
    """A failure to report with exit status 2 (or `status`)."""

    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status


class Target:
    """What a target's runner supplies. `start` runs before anything imports the target's
    framework, so it may still choose the platform."""

    prog = "deuteron_runner"
    narrow_int64 = False  # int64 inputs reach the module as int32 (range-checked)

    def add_arguments(self, parser):
        pass

    def start(self, args) -> dict:
        """Picks the device; returns the report's device fields ({"device": ...})."""
        return {}

    def compile(self, module, kwargs, args):
        """A callable of the input arrays running module.run(*arrays, **kwargs)."""
        return lambda *xs: module.run(*xs, **kwargs)

    def to_device(self, arrays):
        return arrays

    def wait(self, result):
        return result

    def timed(self, fn, inputs):
        """fn(*inputs) and its time in seconds, to wait()'s return (a target may time it itself)."""
        t0 = time.perf_counter()
        out = self.wait(fn(*inputs))
        return out, time.perf_counter() - t0

    def to_host(self, result):
        """run()'s result (one array or a tuple/list) as what numpy.asarray reads."""
        return result

    def finish(self, report):
        """Checks after the runs (raise RunnerError to fail)."""


def load_module(path: str):
    """Imports a Python file by path under a unique module name."""
    if not os.path.isfile(path):
        raise RunnerError(f"module file not found: {path!r}")
    name = "deuteron_generated_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RunnerError(f"cannot import {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise RunnerError(f"{path!r} defines no function run(*inputs, **scalars)")
    return module


def logical_dtype(name: str):
    import ml_dtypes
    import numpy as np

    if hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    try:
        return np.dtype(name)
    except TypeError as e:
        raise RunnerError(f"unknown dtype {name!r}") from e


def narrow_int64(a, what: str):
    """An int64 array as int32, refusing a value int32 cannot hold (never a wrap-around)."""
    import numpy as np

    if a.dtype != np.int64:
        return a
    info = np.iinfo(np.int32)
    bad = np.flatnonzero((a < info.min) | (a > info.max))
    if bad.size:
        at = np.unravel_index(bad[0], a.shape)
        raise RunnerError(f"{what}: element {int(bad[0])} {list(map(int, at))} = {int(a.flat[bad[0]])} "
                          "does not fit int32, in which the target computes integers")
    return a.astype(np.int32)


def load_inputs(paths, dtypes):
    import numpy as np

    if dtypes is not None and len(dtypes) != len(paths):
        raise RunnerError(f"--dtypes has {len(dtypes)} entries but there are {len(paths)} inputs")
    arrays = []
    for k, path in enumerate(paths):
        try:
            a = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise RunnerError(f"cannot read input {k} ({path!r}): {e}") from e
        want = dtypes[k].strip() if dtypes is not None else ""
        if want and want != "-":
            dt = logical_dtype(want)
            if dt != a.dtype:
                if a.dtype.itemsize != dt.itemsize or a.dtype.kind not in "uiV":
                    raise RunnerError(
                        f"input {k} ({path}): stored dtype {a.dtype} cannot be viewed as {want}; "
                        f"store {want} as {BITS_STORAGE.get(want, 'its own dtype')}")
                a = a.view(dt)
        elif a.dtype.kind == "V":
            raise RunnerError(f"input {k} ({path!r}) has void dtype {a.dtype}; "
                              "store bfloat16 as uint16 and pass --dtypes")
        arrays.append(a)
    return arrays


def results(result, count: int):
    """run()'s result as a list of numpy arrays, `count` of them."""
    import numpy as np

    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(outs) != count:
        raise RunnerError(f"run() returned {len(outs)} array(s) but {count} outputs are expected")
    return [np.asarray(o) for o in outs]


def stored(a):
    """An array as its storage dtype (bfloat16 as its uint16 bits)."""
    import numpy as np

    name = a.dtype.name
    return a.view(np.dtype(BITS_STORAGE[name])) if name in BITS_STORAGE else a


def write_outputs(arrays, paths):
    import numpy as np

    info = []
    for path, a in zip(paths, arrays):
        s = stored(a)
        np.save(path, s, allow_pickle=False)
        info.append({"path": path, "shape": list(s.shape), "dtype": a.dtype.name, "stored": s.dtype.name})
    return info


def median(samples):
    s = sorted(samples)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def summary(e: BaseException) -> str:
    """One line for an exception. Errors raised inside a simulator arrive wrapped (e.g.
    "JaxRuntimeError: INTERNAL: CpuCallback error calling callback: Traceback ..."); the
    interesting part is the last "SomeError: ..." line of that embedded traceback."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    if len(lines) > 1:
        for ln in reversed(lines):
            head = ln.split(":", 1)[0]
            if ":" in ln and head.replace(".", "").replace("_", "").isalnum() and (
                    head.endswith("Error") or head.endswith("Exception")):
                return f"{type(e).__name__}: {ln}"
    return f"{type(e).__name__}: {lines[0]}"


def _timed(target, fn, inputs):
    return target.timed(fn, inputs)


def _run_once(target, args, info):
    try:
        scalars = json.loads(args.scalars)
    except json.JSONDecodeError as e:
        raise RunnerError(f"--scalars is not valid JSON: {e}") from e
    if not isinstance(scalars, dict):
        raise RunnerError("--scalars must be a JSON object")
    if args.time < 0:
        raise RunnerError("--time must be >= 0")
    dtypes = args.dtypes.split(",") if args.dtypes is not None else None
    inputs = load_inputs(args.inputs, dtypes)
    if target.narrow_int64:
        inputs = [narrow_int64(a, f"input {k}") for k, a in enumerate(inputs)]
    fn = target.compile(load_module(args.module), scalars, args)
    inputs = target.to_device(inputs)
    result, first = _timed(target, fn, inputs)
    report = {"ok": True, **info}
    report["outputs"] = write_outputs(results(target.to_host(result), len(args.outputs)), args.outputs)
    if args.time > 0:
        samples = [_timed(target, fn, inputs)[1] * 1e3 for _ in range(args.time)]
        report.update(median_ms=median(samples), min_ms=min(samples), mean_ms=sum(samples) / len(samples),
                      runs=len(samples), warmup_ms=first * 1e3)
    target.finish(report)
    return report


def main(target: Target, argv=None) -> int:
    p = argparse.ArgumentParser(prog=target.prog, description=__doc__.split("\n\n")[0])
    p.add_argument("module", nargs="?", help="generated Python module file defining run(*inputs, **scalars)")
    p.add_argument("--inputs", nargs="*", default=[], metavar="NPY")
    p.add_argument("--outputs", nargs="*", default=[], metavar="NPY")
    p.add_argument("--dtypes", default=None, help="comma-separated logical dtype per input (e.g. bfloat16,float32)")
    p.add_argument("--scalars", default="{}", help="JSON object of keyword arguments for run()")
    p.add_argument("--time", type=int, default=0, metavar="N",
                   help="time N calls after a warm-up; report median ms on stdout")
    p.add_argument("--probe", action="store_true", help="print the device report and exit")
    p.add_argument("--serve", action="store_true", help="speak the autotuner's runner protocol on stdin/stdout")
    target.add_arguments(p)
    args = p.parse_args(argv)  # argparse exits with 2 on bad usage
    if args.serve:
        return serve(target, args)
    try:
        info = target.start(args)
        if args.probe:
            print(json.dumps(info), flush=True)
            return 0
        if args.module is None:
            raise RunnerError("no module file given")
        print(json.dumps(_run_once(target, args, info)), flush=True)
        return 0
    except Exception as e:  # noqa: BLE001 - every failure becomes exit status 2
        traceback.print_exc(file=sys.stderr)
        print(f"{target.prog}: error: {summary(e)}", file=sys.stderr, flush=True)
        return 2


# ---- the autotuner's runner protocol ------------------------------------------------------------


class _Request:
    """The commands before "run" (backends/cpu/runner_source.h)."""

    def __init__(self, lines):
        self.arena_fd, self.arena_bytes = -1, 0
        self.regions, self.tensors, self.scalars, self.kernels = [], [], [], []
        self.warmup_s, self.min_reps, self.max_reps, self.budget_s, self.cutoff_s, self.pause = (
            0.02, 3, 100, 0.1, 0.0, 0)
        self.inject = "none"
        for line in lines:
            word, _, rest = line.partition(" ")
            f = rest.split()
            if word == "arena":
                self.arena_fd, self.arena_bytes = int(f[0]), int(f[1])
            elif word == "region":
                self.regions.append((int(f[0]), int(f[1]), f[2] == "rw"))
            elif word == "tensor":
                self.tensors.append(int(f[0]))
            elif word == "scalar":  # "scalar i 9007199254740993" (exact) or "scalar f 0.5"
                self.scalars.append(int(f[1]) if f[0] == "i" else float(f[1]))
            elif word == "kernel":
                if len(f) != 2:
                    raise RunnerError(f"malformed kernel line {line!r}")
                module = urllib.parse.unquote(f[0], errors="strict")
                self.kernels.append((module, json.loads(urllib.parse.unquote(f[1], errors="strict"))))
            elif word == "timing":
                self.warmup_s, self.min_reps, self.max_reps = float(f[0]), int(f[1]), int(f[2])
                self.budget_s, self.cutoff_s, self.pause = float(f[3]), float(f[4]), int(f[5])
            elif word == "memlimit":
                pass  # see the module's docstring
            elif word == "inject":
                self.inject = f[0]
            elif word:
                raise RunnerError(f"unknown command {line!r}")


def _die_with_parent():
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(target: Target, args) -> int:
    import mmap

    import numpy as np

    # Answers go to the protocol's descriptor; anything a module prints goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    stdin = sys.stdin.buffer

    def say(text):
        answers.write(text + "\n")
        answers.flush()

    def read_line():
        line = stdin.readline()
        return line.decode(errors="replace").rstrip("\n") if line else None

    try:
        _die_with_parent()
        lines = []
        while (line := read_line()) is not None and line != "run":
            lines.append(line)
        if line != "run":
            raise RunnerError("request ended before 'run'")
        req = _Request(lines)
        if not req.kernels:
            raise RunnerError("no kernel to run")
        arena = mmap.mmap(req.arena_fd, req.arena_bytes) if req.arena_bytes > 0 else None
        for off, size, rw in req.regions:
            if off < 0 or off + size > req.arena_bytes:
                raise RunnerError("region outside the arena")
            if rw:
                arena[off:off + size] = b"\xff" * size

        def slot(off, t, strides=None):
            dt = logical_dtype(t["dtype"])
            store = np.dtype(BITS_STORAGE.get(dt.name, dt.name))
            if 0 in t["shape"]:
                return np.zeros(t["shape"], store).view(dt)
            st = None if strides is None else [s * store.itemsize for s in strides]
            return np.ndarray(t["shape"], store, buffer=arena, offset=off, strides=st).view(dt)

        info = target.start(args)
        kernels = []
        for module_path, spec in req.kernels:
            tensors = spec["tensors"]
            inputs, outputs = [], []
            for k, (off, t) in enumerate(zip(req.tensors, tensors)):
                if t["output"]:
                    outputs.append((off, t))
                else:
                    a = np.array(slot(off, t, t["strides"]))
                    inputs.append(narrow_int64(a, f"input {k}") if target.narrow_int64 else a)
            scalars = {s["name"]: (int(v) if s["dtype"].startswith("int") else v)
                       for s, v in zip(spec["scalars"], req.scalars)}
            fn = target.compile(load_module(module_path), scalars, args)
            inputs = target.to_device(inputs)
            target.wait(fn(*inputs))  # compiles: never a sample
            kernels.append({"fn": fn, "inputs": inputs, "outputs": outputs, "samples": []})
        say("loaded")
        if req.pause:
            say("ready")
            if read_line() != "go":
                raise RunnerError("expected 'go'")
        if req.inject == "crash":
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
        if req.inject == "hang":
            while True:
                time.sleep(3600)
        if req.inject == "oom":
            raise RunnerError("out of memory (injected)", status=3)

        def run(k):
            return _timed(target, k["fn"], k["inputs"])

        # The first timed call's outputs are what the tuner checks.
        for i, k in enumerate(kernels):
            result, k["first"] = run(k)
            for (off, t), a in zip(k["outputs"], results(target.to_host(result), len(k["outputs"]))):
                want = logical_dtype(t["dtype"])
                slot(off, t)[...] = a.astype(want) if a.dtype != want else a
            say(f"first {i} {k['first']:.9g}")

        def corrupt_if_injected():
            if req.inject == "wrong":
                for off, size, rw in req.regions:
                    if rw:
                        arena[off:off + min(size, 64)] = b"\x3f" * min(size, 64)
                        return

        if len(kernels) == 1 and req.cutoff_s > 0 and kernels[0]["first"] > req.cutoff_s:
            second = run(kernels[0])[1]
            if second > req.cutoff_s:  # far slower than the best so far: two samples rule it out
                corrupt_if_injected()
                say(f"samples 0 2 {kernels[0]['first']:.9g} {second:.9g}")
                say("done")
                return 0
        total = 0.0
        for k in kernels:
            start, best, n = time.perf_counter(), float("inf"), 0
            while True:
                best, n = min(best, run(k)[1]), n + 1
                if time.perf_counter() - start >= req.warmup_s or n >= 1000:
                    break
            total += best
        reps = int(min(req.max_reps, max(req.min_reps, req.budget_s / max(total, 1e-9))))
        sampling = time.perf_counter()
        for r in range(reps):
            for k in kernels:
                k["samples"].append(run(k)[1])
            if r + 1 >= req.min_reps and time.perf_counter() - sampling > 2 * req.budget_s:
                break
        target.finish({})
        corrupt_if_injected()
        for i, k in enumerate(kernels):
            say(f"samples {i} {len(k['samples'])} " + " ".join(f"{t:.9g}" for t in k["samples"]))
        say("done")
        return 0
    except Exception as e:  # noqa: BLE001 - every failure is an "error" line
        traceback.print_exc(file=sys.stderr)
        say("error " + summary(e).replace("\n", " "))
        return e.status if isinstance(e, RunnerError) else 2
