#!/usr/bin/env python3
"""Deuteron's catalogue against PyTorch eager, torch.compile (Inductor CPU) and jax.jit (XLA CPU).

    .venv/bin/python bench/run_bench.py [--kernels a,b,c] [--shapes small|bench] [--repeat N]
                                        [--rounds K] [--threads T] [--json] [--out results/]
                                        [--baseline-deuteron OLD_BUILD/deuteron]

For every catalogue kernel (`deuteron list --json`) at its CPU bench shape, in float32:
  * Deuteron: `deuteron tune KERNEL --shape S --time-budget B` first (instant when its cache has
    the config; reported separately; a failed tune leaves Deuteron on its default config), then
    `deuteron run KERNEL --shape S --dtype float32 --json --repeat N` in a subprocess per round;
    rounds after the first pass the first run's config with --config, so nothing is re-tuned.
    Its median_ms is in-process kernel time on preallocated outputs.
  * With --baseline-deuteron, a second deuteron binary the same way (system deuteron_before,
    its own DEUTERON_CACHE_DIR, tuned with the same budget), timed in the same rounds; the
    report adds after/before = this build's time over the baseline's.
  * PyTorch eager, torch.compile of the same function, jax.jit of the same function, and for
    attention torch's scaled_dot_product_attention, timed in this process (synchronous calls).
Fairness:
  * Inputs are bit-identical to Deuteron's: bench/deuteron_rand.py ports Tensor::rand (checked
    by bench/check_rand.sh) and bench/kernels.py repeats each catalogue entry's input recipe
    (seed 1, same ranges, same argument order).
  * Same thread count T (default 2) everywhere: OMP_NUM_THREADS=T for Deuteron (its configs
    carry num_threads, which the tuner may set lower), torch.set_num_threads(T), and for XLA the
    CPU affinity mask (XLA's intra-op pool, threads named tf_XLAEigen, is sized by the affinity
    mask; jaxlib 0.10 has no flag for it: `--intra_op_parallelism_threads` is rejected and the
    old bare `intra_op_parallelism_threads=N` is silently ignored). The pool size is recorded.
  * Warm-up excluded: each system's first call (compile) is timed and reported separately, and
    every round starts with one untimed call per system (as `deuteron run` does).
  * Rounds interleave the systems: each round runs Deuteron's subprocess for N repeats, then N
    calls of each framework; the starting system rotates between rounds. Medians over all runs
    (Deuteron: the median of its per-round medians until its JSON carries every run's time).
    A system whose calls would take more than --max-round-s per round runs fewer (at least 2).
  * Outputs of every framework are checked against the float64 evaluation of the same
    function on the same inputs before timing (|err| <= atol + rtol*|want| + ntol*max|want|,
    per kernel in bench/kernels.py). Deuteron: against its saved outputs when `deuteron run`
    can save them (--save-outputs), else its `correct` field or, where that is false, its
    max_abs_err against its own float64 reference under the harness's bound. A system whose
    outputs are wrong is flagged and left out of the speedups and geometric means.
  * Output allocation: Deuteron's timing loop reuses its outputs; PyTorch allocates per call and
    glibc would hand large blocks back to the kernel on free, so every call would page-fault
    its output in. This process keeps freed memory (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD
    1 GiB) so PyTorch reuses warm pages, as a caching allocator would; --cold-alloc turns that
    off. XLA allocates its buffers on its own path and still faults them in per call.
  * Huge pages: Deuteron puts tensors of 2 MiB or more on transparent huge pages
    (madvise), and this process sets THP_MEM_ALLOC_ENABLE=1 so PyTorch's allocator does the
    same. XLA has no such switch.
  * The machine may be shared: the CPU time other processes used while each kernel was timed
    is reported ("other load", in cores); --wait-quiet waits for a quiet machine first.
Writes bench.md, bench.csv, bench.json and bench_speedups.png under --out (default results/);
--json also prints the JSON object on stdout (progress goes to stderr).
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import datetime
import gc
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

# Memory-bound rows: after its timed runs, each of Deuteron's rounds but the first runs this many
# more, each followed by a pass of the roofline's copy (`deuteron run --paired-copy`), for its
# share of a copy bandwidth measured beside every run (the probes between rows can see another
# state of this host's memory than the rounds did).
PAIRED_COPIES = 5

SYSTEMS = ["deuteron", "deuteron_before", "torch_eager", "torch_compile", "jax_jit", "torch_sdpa"]
DEUTERONS = ["deuteron", "deuteron_before"]  # this build, and --baseline-deuteron
BASELINES = ["torch_eager", "torch_compile", "jax_jit", "torch_sdpa"]
LABEL = {"deuteron": "Deuteron", "deuteron_before": "Deuteron before", "torch_eager": "PyTorch eager", "torch_compile": "torch.compile",
         "jax_jit": "jax.jit", "torch_sdpa": "torch SDPA"}
GEOMEAN_FIELD = {"torch_eager": "geomean_vs_eager", "torch_compile": "geomean_vs_torch_compile",
                 "jax_jit": "geomean_vs_jax_jit", "torch_sdpa": "geomean_vs_torch_sdpa"}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- environment, before torch and jax are imported --------------------------------------------

# What `--isa avx2` sets, so that every system runs 256-bit code on an AVX-512 machine (as on a
# CPU that has AVX2 only): environment variables (oneDNN reads either spelling, by version) and an
# XLA flag, which reaches only the loops XLA generates: its library GEMMs (Eigen) still pick
# AVX-512 at run time.
ISA_LIMITS = {"avx2": {"env": {"DEUTERON_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2",
                               "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                               "DNNL_MAX_CPU_ISA": "AVX2"},
                       "xla_flag": "--xla_cpu_max_isa=AVX2"}}


def setup_process(threads: int, cold_alloc: bool, isa: str = "native") -> dict:
    env = {"isa": isa}
    limit = ISA_LIMITS.get(isa)
    if limit:
        os.environ.update(limit["env"])
        # Inductor's cache key leaves out ATEN_CPU_CAPABILITY: kernels it compiled for AVX-512 come
        # back from the cache and return wrong results (caught by the check). A cache of its own:
        user = os.environ.get("USER") or str(os.getuid())
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"torchinductor_{user}_{isa}"))
    cpus = sorted(os.sched_getaffinity(0))
    if threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])
        env["affinity"] = cpus[:threads]
    else:
        env["affinity"] = cpus
        if threads > len(cpus):
            log(f"warning: --threads {threads} but only {len(cpus)} CPUs are available")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
        flags = (flags + " --xla_cpu_multi_thread_eigen=true").strip()
    if limit:
        flags = f"{flags} {limit['xla_flag']}"
    os.environ["XLA_FLAGS"] = flags
    env["XLA_FLAGS"] = flags
    # Deuteron's tensors of 2 MiB or more sit on huge pages (THP "madvise"); torch's allocator
    # does the same when asked, so both stream through memory with the same TLB reach.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    env["THP_MEM_ALLOC_ENABLE"] = os.environ["THP_MEM_ALLOC_ENABLE"]
    env["malloc"] = "default (cold)"
    if not cold_alloc:
        try:
            libc = ctypes.CDLL("libc.so.6")
            M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
            if libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30):
                env["malloc"] = "M_MMAP_MAX=0, M_TRIM_THRESHOLD=1GiB (freed memory reused warm)"
        except OSError:
            pass
    return env


# ---- the deuteron CLI ---------------------------------------------------------------------------

def deuteron_json(cmd: list[str], timeout: float, env=None) -> tuple[dict | None, float, str]:
    """Runs a deuteron command expected to print one JSON object; (object or None, wall s, stderr)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t0, f"timed out after {timeout:.0f} s"
    except OSError as e:
        return None, time.perf_counter() - t0, f"cannot run {cmd[0]}: {e}"
    wall = time.perf_counter() - t0
    for line in reversed(p.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line), wall, p.stderr
            except json.JSONDecodeError:
                break
    err = (p.stderr.strip() or p.stdout.strip() or f"exit status {p.returncode}").splitlines()
    return None, wall, " | ".join(err[-3:])


def cli_features(deuteron: str) -> dict:
    def helps(*sub):
        p = subprocess.run([deuteron, *sub, "--help"], capture_output=True, text=True)
        return p.stdout + p.stderr if p.returncode == 0 else ""
    run_help = helps("run")
    tune_help = helps("tune")
    return {"save_outputs": "--save-outputs" in run_help, "save_inputs": "--save-inputs" in run_help,
            "no_check": "--no-check" in run_help, "tune": "--shape" in tune_help,
            "paired_copy": "--paired-copy" in run_help}


def default_cache_root() -> Path:
    """Where deuteron keeps its cache (the rule of src/runtime/disk_cache.h)."""
    if os.environ.get("DEUTERON_CACHE_DIR"):
        return Path(os.environ["DEUTERON_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deuteron"


def file_sha256(path) -> str:
    import hashlib
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def snapshot(name: str, path: str, snap_dir: Path, cache_dir: str | None) -> dict:
    """A private copy of the deuteron binary at `path` (so a rebuild during the run cannot change
    or break it), with its catalogue and CLI features: one `tool` of the Deuteron class. Retries
    for two minutes while `path` does not work: it may be being rebuilt."""
    binary = snap_dir / name / "deuteron"
    binary.parent.mkdir()
    env = dict(os.environ, **({"DEUTERON_CACHE_DIR": cache_dir} if cache_dir else {}))
    for attempt in range(12):
        try:
            if not os.access(path, os.X_OK):
                raise OSError(f"{path} is not an executable (build it: cmake --build build)")
            shutil.copy2(path, binary)
            cat = json.loads(subprocess.run([str(binary), "list", "--json"], capture_output=True, text=True,
                                            check=True, env=env).stdout)
            break
        except (OSError, subprocess.CalledProcessError, json.JSONDecodeError) as e:
            if attempt == 11:
                raise RuntimeError(f"{path} does not work: {e}") from e
            log(f"{path} does not work yet ({e}); it may be being rebuilt: retrying in 10 s")
            time.sleep(10)
    built = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(binary)))
    return {"name": name, "binary": str(binary), "cache_dir": cache_dir, "catalogue": cat,
            "kernels": {e["name"] for e in cat}, "features": cli_features(str(binary)),
            "info": f"{path} (copied at start; built {built})"
                    + (f"; DEUTERON_CACHE_DIR={cache_dir}" if cache_dir else "")}


# ---- measurement helpers ---------------------------------------------------------------------

def median(xs):
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def cpu_busy_jiffies() -> int:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4]  # all but idle and iowait


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def foreign_load(window: float = 1.0) -> float:
    """CPU cores used by other processes over the next `window` seconds."""
    hz = os.sysconf("SC_CLK_TCK")
    b0, o0, t0 = cpu_busy_jiffies(), own_cpu_seconds(), time.perf_counter()
    time.sleep(window)
    return max(0.0, ((cpu_busy_jiffies() - b0) / hz - (own_cpu_seconds() - o0)) / (time.perf_counter() - t0))


def wait_quiet(limit_s: float, threshold: float = 0.25) -> tuple[float, float]:
    """Waits up to limit_s for other processes to use under `threshold` cores (2 s windows).
    Returns (seconds waited, last load seen)."""
    t0 = time.perf_counter()
    load = foreign_load(2.0)
    while load >= threshold and time.perf_counter() - t0 < limit_s:
        load = foreign_load(2.0)
    return time.perf_counter() - t0, load


class BusyCore:
    """A competing process for the `with` block: a busy loop pinned to one CPU (as another user's
    single-threaded job on a shared machine would be)."""

    def __init__(self, cpu: int):
        self.cpu, self.proc = cpu, None

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                     preexec_fn=lambda: os.sched_setaffinity(0, {self.cpu}))
        time.sleep(0.2)  # let it start spinning
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def xla_pool_threads() -> int:
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().strip() == "tf_XLAEigen"
        except OSError:
            pass
    return n


# ---- one kernel ---------------------------------------------------------------------------------

class System:
    """A framework callable with its arguments and a way to wait for its results."""

    def __init__(self, name, fn, args, sync):
        self.name, self.fn, self.args, self.sync = name, fn, args, sync
        self.compile_s = None
        self.times = []
        self.busy_times = []  # the same calls with one core busy (--busy)
        self.error = None
        self.check = None  # {"ok": bool, "max_abs_err": float, ...}
        self.est_ms = None

    def call(self):
        r = self.fn(*self.args)
        self.sync(r)
        return r

    def timed(self, n, busy=False):
        times = self.busy_times if busy else self.times
        gc.disable()
        try:
            self.call()  # one untimed call per round, as `deuteron run` warms up
            for _ in range(n):
                t0 = time.perf_counter()
                r = self.call()
                t1 = time.perf_counter()
                del r
                times.append((t1 - t0) * 1e3)
        finally:
            gc.enable()


def as_tuple(r):
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


def compare(got, want, rtol, atol, ntol=0.0):
    """got, want: tuples of numpy arrays. Returns (ok, max_abs_err, why not)."""
    import numpy as np
    if len(got) != len(want):
        return False, float("inf"), f"{len(got)} outputs, expected {len(want)}"
    ok, max_err = True, 0.0
    for g, w in zip(got, want):
        g = np.asarray(g, dtype=np.float64).reshape(-1)
        w = np.asarray(w, dtype=np.float64).reshape(-1)
        if g.shape != w.shape:
            return False, float("inf"), f"shape {g.shape} vs {w.shape}"
        d = np.abs(g - w)
        if not np.all(np.isfinite(g)) and not np.array_equal(np.isfinite(g), np.isfinite(w)):
            return False, float("inf"), "non-finite values"
        max_err = max(max_err, float(np.nanmax(d)) if d.size else 0.0)
        scale = float(np.max(np.abs(w[np.isfinite(w)]), initial=0.0))
        ok = ok and bool(np.all(d <= atol + ntol * scale + rtol * np.abs(w)))
    return ok, max_err, ""


class Deuteron:
    """One deuteron binary on one kernel: `deuteron tune` once, then one `deuteron run` subprocess
    per round. `d` is its entry in row["systems"]; `tool` (from main) holds its binary, CLI
    features and cache folder, so each binary only ever reads configs it tuned itself."""

    def __init__(self, tool, row, shape_arg, args):
        self.name, self.tool, self.row, self.args = tool["name"], tool, row, args
        self.kernel, self.shape_arg = row["kernel"], shape_arg
        self.est_ms = None  # ms per call: the frameworks' until this binary's first round
        self.env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        if tool.get("cache_dir"):
            self.env["DEUTERON_CACHE_DIR"] = tool["cache_dir"]
        self.d = {"median_ms": None, "round_medians_ms": [], "runs": 0, "walls_s": [], "overheads_s": []}
        row["systems"][self.name] = self.d
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.name}-bench-{self.kernel}-"))

    def note(self, msg):
        self.row["notes"].append(f"{self.name} {msg}")

    # 1. Tuning: once per kernel and shape (deuteron caches the result), reported separately. A
    #    failed tune leaves `deuteron run` on its default config (and stops it from trying to tune
    #    again in every round).
    def tune(self):
        args, d, name = self.args, self.d, self.kernel
        if args.tune == "never":
            self.env["DEUTERON_AUTOTUNE_EFFORT"] = "none"
        if args.tune != "auto" or not self.tool["features"]["tune"]:
            return
        cmd = [self.tool["binary"], "tune", name, "--shape", self.shape_arg, "--dtype", "float32",
               "--progress", "quiet"]
        if args.tune_budget > 0:
            cmd += ["--time-budget", f"{args.tune_budget:g}"]
        log(f"{name} {self.row['shape']}: {self.name} tune"
            + (f" (budget {args.tune_budget:g} s)" if args.tune_budget > 0 else ""))
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=args.deuteron_timeout)
            rc, msg = p.returncode, (p.stderr.strip() or p.stdout.strip())
        except subprocess.TimeoutExpired:
            rc, msg = -1, f"timed out after {args.deuteron_timeout:.0f} s"
        except OSError as e:
            rc, msg = -1, f"cannot run {cmd[0]}: {e}"
        d["tune_s"] = time.perf_counter() - t0
        d["tune_ok"] = rc == 0
        if rc != 0:
            first_line = next((ln for ln in msg.splitlines() if "error" in ln.lower()), msg.splitlines()[-1] if msg else "")
            self.note(f"tune failed ({first_line.strip()[:160]}): default config")
            log(f"{name}: {self.name} tune failed: {first_line.strip()[:160]}")
            self.env["DEUTERON_AUTOTUNE_EFFORT"] = "none"

    # 4. One timed round. Round 0 is this binary's first run on the kernel: it compiles if needed
    #    (its in-process timing excludes that) and fixes the config, which later rounds pass
    #    explicitly (--config) so nothing is re-tuned.
    def run_round(self, k, reps, busy=False):
        d, name, tool = self.d, self.kernel, self.tool
        if (k > 0 or busy) and d.get("config") is None:
            return
        if busy:  # the quiet rounds' config, checked there; times kept apart
            cmd = [tool["binary"], "run", name, "--shape", self.shape_arg, "--dtype", "float32", "--json",
                   "--repeat", str(reps(self.est_ms)), "--config", json.dumps(d["config"], separators=(",", ":"))]
            if tool["features"]["no_check"]:
                cmd += ["--no-check"]
            j, _, err = deuteron_json(cmd, self.args.deuteron_timeout, self.env)
            if j is None or j.get("median_ms") is None:
                self.note(f"run failed with one core busy: {err}")
                return
            d.setdefault("busy_round_medians_ms", []).append(j["median_ms"])
            d.setdefault("busy_times_ms", []).extend(j.get("times_ms", []))
            return
        cmd = [tool["binary"], "run", name, "--shape", self.shape_arg, "--dtype", "float32", "--json",
               "--repeat", str(reps(self.est_ms))]
        if k == 0:
            if tool["features"]["save_outputs"]:
                cmd += ["--save-outputs", str(self.tmp / "out")]
            if tool["features"]["save_inputs"]:
                cmd += ["--save-inputs", str(self.tmp / "in")]
            log(f"{name} {self.row['shape']}: timing ({self.name}'s first run compiles if needed)")
        else:
            cmd += ["--config", json.dumps(d["config"], separators=(",", ":"))]
            if tool["features"]["no_check"]:
                cmd += ["--no-check"]  # checked in round 0; skip the float64 reference
            if tool["features"]["paired_copy"] and self.row.get("compute_bound") is False:
                cmd += ["--paired-copy", str(PAIRED_COPIES)]
        j, wall, err = deuteron_json(cmd, self.args.deuteron_timeout, self.env)
        if j is None or j.get("median_ms") is None:
            if k == 0:
                d["error"] = err
                log(f"{name}: {self.name} run failed: {err}")
            self.note(f"run failed{'' if k == 0 else f' in round {k}'}: {err}")
            return
        if k == 0:
            for f in ("config", "config_origin", "tuned", "compiled", "correct", "max_abs_err", "source"):
                d[f] = j.get(f)
            d["first_wall_s"] = wall
        if k == 0 and "bytes" not in self.row:
            med, gbps, gflops = j["median_ms"], j.get("gbps", 0.0), j.get("gflops", 0.0)
            # bytes and flops of the kernel's definition (Entry::bytes / flops), from the CLI's rates
            self.row["bytes"] = gbps * med * 1e6
            self.row["flops"] = gflops * med * 1e6
        if k == 0 and "roofline" in j and "compute_bound" not in self.row:
            # The roofline the kernel's catalogue entry is measured against, as `deuteron run` names
            # it (a --baseline-deuteron older than the field does not).
            self.row["compute_bound"] = j["roofline"] != "copy-bandwidth"
        runs = j.get("runs", self.args.repeat)
        d["round_medians_ms"].append(j["median_ms"])
        d["runs"] += runs
        d["walls_s"].append(wall)
        # the subprocess's time outside its timed runs (start, inputs, reference, check, compile,
        # warm-up), less its paired copies
        paired_s = (j.get("paired_copy") or {}).get("seconds", 0.0)
        d["overheads_s"].append(max(0.0, wall - (runs + 1) * j["median_ms"] * 1e-3 - paired_s))
        if "times_ms" in j:
            d.setdefault("times_ms", []).extend(j["times_ms"])
        if "paired_copy" in j:
            d.setdefault("paired_fractions", []).append(j["paired_copy"]["fraction"])
            d.setdefault("paired_copy_gbps", []).append(j["paired_copy"]["copy_gbps"])
        self.est_ms = median(d["round_medians_ms"])

    # 5. Checks and medians. Saved inputs must be bit-identical to the harness's (`inputs`), saved
    #    outputs within the kernel's tolerance of the float64 evaluation (`want`).
    def finish(self, inputs, want, spec, want_scale):
        import numpy as np
        d, tmp = self.d, self.tmp
        if (tmp / "in").is_dir():
            mism = []  # in{i}.npy: the tensor at argument position i
            for i, a in enumerate(inputs):
                if not isinstance(a, np.ndarray):
                    continue
                f = tmp / "in" / f"in{i}.npy"
                b = np.load(f) if f.exists() else None
                if b is None or b.dtype != a.dtype or b.shape != a.shape or \
                        not np.array_equal(b.view(np.uint8), a.view(np.uint8)):
                    mism.append(i)
            d["inputs_identical"] = not mism
            if mism:
                self.row["notes"].append(f"inputs differ from {self.name}'s saved inputs: arguments {mism}")
        if (tmp / "out").is_dir():
            errs, ok_all = [], True
            for i, w in enumerate(want):
                f = tmp / "out" / f"out{i}.npy"
                if not f.exists():
                    ok_all = False
                    continue
                ok, err, _ = compare((np.load(f),), (w,), spec.rtol, spec.atol, spec.ntol)
                errs.append(err)
                ok_all = ok_all and ok
            d["check"] = {"ok": ok_all, "max_abs_err": max(errs, default=float("inf")), "from": "saved outputs"}
        shutil.rmtree(tmp, ignore_errors=True)

        # Correctness under the harness's tolerance (the one the baselines pass): from the saved
        # outputs when the CLI can save them, else from the max abs error against deuteron's own
        # float64 reference on the same inputs (bounded by atol + ntol * max|output|, without the
        # per-element rtol term, so stricter than the baselines' check).
        if "check" not in d and d.get("max_abs_err") is not None:
            bound = spec.atol + spec.ntol * want_scale
            ok = bool(d.get("correct")) or d["max_abs_err"] <= bound
            d["check"] = {"ok": ok, "max_abs_err": d["max_abs_err"], "from": "deuteron run's max_abs_err"}
            if ok and not d.get("correct"):
                self.note(f"run reports WRONG (its own elementwise tolerance) but its max abs error "
                          f"{d['max_abs_err']:.3g} is within the harness's bound {bound:.3g}")

        if d["round_medians_ms"]:
            # median over all runs when the CLI gives them, else the median of the round medians
            d["median_ms"] = median(d["times_ms"]) if d.get("times_ms") else median(d["round_medians_ms"])
            if len(d["overheads_s"]) > 1:
                d["invocation_overhead_s"] = median(d["overheads_s"][1:])
                if d.get("compiled"):
                    d["compile_s"] = max(0.0, d["overheads_s"][0] - d["invocation_overhead_s"])
        if d.get("busy_round_medians_ms"):
            d["busy_median_ms"] = median(d["busy_times_ms"]) if d.get("busy_times_ms") else \
                median(d["busy_round_medians_ms"])
        if d["median_ms"] is not None and not (d.get("check") or {}).get("ok"):
            self.note("output is WRONG: left out of the speedups and geomeans")

def set_roofline_fractions(row, roof) -> None:
    """Compute-bound rows: of the run's FMA peak. Memory-bound rows: of the copy bandwidth probed
    beside their quiet rounds where there is one (row["copy_gbps_beside"]), else the run's."""
    copy = row.get("copy_gbps_beside") or roof["copy_gbps"]
    for sv in row["systems"].values():
        t = sv.get("median_ms")
        if not t or "bytes" not in row or "compute_bound" not in row:
            sv["roofline_fraction"] = None
        elif row["compute_bound"]:
            sv["roofline_fraction"] = row["flops"] / (t * 1e-3) / 1e9 / roof["peak_gflops"]
        else:
            sv["roofline_fraction"] = row["bytes"] / (t * 1e-3) / 1e9 / copy
            if row.get("copy_nt_gbps_after"):
                sv["nt_roofline_fraction"] = row["bytes"] / (t * 1e-3) / 1e9 / row["copy_nt_gbps_after"]
            if sv.get("paired_fractions"):
                sv["paired_roofline_fraction"] = median(sv["paired_fractions"])
                sv["paired_copy_gbps_median"] = median(sv["paired_copy_gbps"])


def probe_copy_bandwidth(row, ctx) -> None:
    """For a memory-bound row: the copy bandwidth `deuteron roofline --remeasure` finds right
    after its quiet rounds, and the better of it and the probe before them (the previous row's,
    or the run's first), kept as the row's roofline. This host's bandwidth moves by tens of
    percent within minutes, so a figure taken minutes away says little about these rounds."""
    if row.get("compute_bound", True) or ctx.get("copy_probe_gbps") is None:
        return
    try:
        probe = measure_roofline(ctx["deuterons"][0]["binary"], True)
        after = probe["copy_gbps"]
    except (subprocess.CalledProcessError, json.JSONDecodeError, KeyError) as e:
        log(f"{row['kernel']}: the copy bandwidth probe failed ({e}); the run's roofline is used")
        return
    row["copy_gbps_probes"] = [ctx["copy_probe_gbps"], after]
    row["copy_gbps_beside"] = max(ctx["copy_probe_gbps"], after)
    ctx["copy_probe_gbps"] = after
    # Streaming stores skip the read of each output line that plain stores make, so a kernel
    # that streams may pass 100% of the plain copy: the non-temporal copy is its limit.
    row["copy_nt_gbps_after"] = (probe.get("copy_nt") or {}).get("best_gbps")


def measure_roofline(binary, remeasure: bool) -> dict:
    return json.loads(subprocess.run([binary, "roofline", "--json"] + (["--remeasure"] if remeasure else []),
                                     capture_output=True, text=True, check=True).stdout)


def best_roofline(start: dict, end: dict) -> dict:
    """The run's roofline: the start's or the end's measurement, whichever shows more bandwidth
    (this machine's memory bandwidth drifts by tens of percent over minutes: a kernel timed in a
    fast minute must not exceed 100% of a figure measured in a slow one), with the best peak."""
    best = dict(end if end.get("copy_gbps", 0) > start.get("copy_gbps", 0) else start)
    best["peak_gflops"] = max(start.get("peak_gflops", 0), end.get("peak_gflops", 0))
    best["measurements"] = [{k: m.get(k) for k in ("copy_gbps", "read_gbps", "peak_gflops", "others_cores")}
                            for m in (start, end)]
    return best


def run_kernel(entry, spec, args, ctx) -> dict:
    import numpy as np
    import torch
    import jax

    name = entry["name"]
    shape = entry["small_shape"] if args.shapes == "small" else entry["bench_shape"]
    shape_arg = ",".join(map(str, shape))
    row = {"kernel": name, "shape": shape, "dtype": "float32", "systems": {}, "notes": []}
    R, K = args.repeat, args.rounds
    deuterons = []
    for tool in ctx["deuterons"]:
        if name in tool["kernels"]:
            deuterons.append(Deuteron(tool, row, shape_arg, args))
        else:
            row["notes"].append(f"{tool['name']}: not in its catalogue")
    d = row["systems"]["deuteron"]
    for dt in deuterons:
        dt.tune()

    # 2. Inputs, bit-identical to Deuteron's, and the frameworks' callables.
    t0 = time.perf_counter()
    inputs = spec.inputs(shape)
    row["input_gen_s"] = time.perf_counter() - t0
    tensor_pos = [i for i, a in enumerate(inputs) if isinstance(a, np.ndarray)]
    scalars = {i: a for i, a in enumerate(inputs) if not isinstance(a, np.ndarray)}

    def bind(fn):
        def call(*ts):
            full, it = [], iter(ts)
            for i in range(len(inputs)):
                full.append(scalars[i] if i in scalars else next(it))
            return as_tuple(fn(*full))
        return call

    np_tensors = [inputs[i] for i in tensor_pos]
    th = [torch.from_numpy(a) for a in np_tensors]
    jx = [jax.device_put(a) for a in np_tensors]
    jax.block_until_ready(jx)
    torch_fn = bind(spec.torch)
    systems = [System("torch_eager", torch_fn, th, lambda r: None)]
    if "torch_compile" in ctx["systems"]:
        torch._dynamo.reset()
        systems.append(System("torch_compile", torch.compile(torch_fn), th, lambda r: None))
    if "jax_jit" in ctx["systems"]:
        systems.append(System("jax_jit", jax.jit(bind(spec.jax)), jx, jax.block_until_ready))
    if spec.sdpa is not None and "torch_sdpa" in ctx["systems"]:
        systems.append(System("torch_sdpa", bind(spec.sdpa), th, lambda r: None))
    systems = [s for s in systems if s.name in ctx["systems"]]

    # The float64 evaluation of the same function on the same inputs: what every output is
    # checked against.
    t0 = time.perf_counter()
    with torch.no_grad():
        th64 = [t.double() if t.is_floating_point() else t for t in th]
        want = tuple(o.numpy() for o in torch_fn(*th64))
    del th64
    row["reference_s"] = time.perf_counter() - t0
    want_scale = max((float(np.max(np.abs(w), initial=0.0)) for w in want), default=0.0)

    # 3. Warm-up: the first call is the compile; outputs are checked before any timing; a second
    #    call estimates the time per call.
    from torch._dynamo.utils import counters
    hits0 = dict(counters["inductor"])
    for s in systems:
        try:
            t0 = time.perf_counter()
            r = s.call()
            s.compile_s = time.perf_counter() - t0
            got = tuple(np.asarray(o) for o in r)
            ok, err, why = compare(got, want, spec.rtol, spec.atol, spec.ntol)
            s.check = {"ok": ok, "max_abs_err": err}
            if not ok:
                row["notes"].append(f"{s.name} output differs from float64 evaluation "
                                    f"(max abs err {err:.3g}{', ' + why if why else ''})")
            s.outputs = got
            del r, got
            t0 = time.perf_counter()
            s.call()
            s.est_ms = (time.perf_counter() - t0) * 1e3
        except Exception as e:  # noqa: BLE001 - report and go on
            s.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            row["notes"].append(f"{s.name} failed: {s.error}")
            log(f"{name}: {s.name} failed: {s.error}")
    ind = {k: counters["inductor"].get(k, 0) - hits0.get(k, 0) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")}
    row["inductor_cache"] = "hit" if ind["fxgraph_cache_hit"] and not ind["fxgraph_cache_miss"] else \
        "miss" if ind["fxgraph_cache_miss"] else "?"
    live = [s for s in systems if s.error is None]
    # Pairwise agreement of the frameworks (max abs difference), for the record.
    pair = 0.0
    for a in range(len(live)):
        for b in range(a + 1, len(live)):
            for x, y in zip(live[a].outputs, live[b].outputs):
                pair = max(pair, float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)),
                                              initial=0.0)))
    row["max_pairwise_diff"] = pair
    for s in live:
        del s.outputs
    if any(s.name == "jax_jit" for s in live):
        ctx["xla_pool_threads"] = max(ctx.get("xla_pool_threads", 0), xla_pool_threads())

    def reps(est_ms):
        # at most about --max-round-s of calls per system per round, at least 2
        if not est_ms or est_ms <= 0:
            return R
        return max(min(R, 2), min(R, int(args.max_round_s * 1e3 / est_ms)))

    # 4. Timed rounds, interleaved; the starting system rotates.
    d_est = min((s.est_ms for s in live if getattr(s, "est_ms", None)), default=None)
    for dt in deuterons:
        dt.est_ms = d_est
    if args.wait_quiet > 0:
        waited, seen = wait_quiet(args.wait_quiet)
        row["waited_for_quiet_s"] = round(waited, 1)
        if seen >= 0.25:
            log(f"{name}: other processes still use {seen:.2f} cores after waiting {waited:.0f} s; timing anyway")
    order = deuterons + live

    def timed_rounds(busy):
        """K interleaved rounds; (seconds, cores other processes used meanwhile)."""
        busy0, own0, wall0 = cpu_busy_jiffies(), own_cpu_seconds(), time.perf_counter()
        for k in range(K):
            for s in order[k % len(order):] + order[:k % len(order)]:
                if isinstance(s, Deuteron):
                    s.run_round(k, reps, busy)
                else:
                    s.timed(reps(s.est_ms), busy)
        elapsed = time.perf_counter() - wall0
        hz = os.sysconf("SC_CLK_TCK")
        foreign = ((cpu_busy_jiffies() - busy0) / hz - (own_cpu_seconds() - own0)) / max(elapsed, 1e-9)
        return elapsed, max(0.0, foreign)

    row["timing_s"], row["foreign_load_cores"] = timed_rounds(False)
    probe_copy_bandwidth(row, ctx)
    if args.busy:
        # The same rounds again while a busy loop holds one core (the configs stay the quiet
        # rounds'): what a shared machine does to each system.
        with BusyCore(ctx["busy_cpu"]):
            row["busy_timing_s"], row["busy_foreign_load_cores"] = timed_rounds(True)

    for dt in deuterons:
        dt.finish(inputs, want, spec, want_scale)
    del inputs, np_tensors, th, jx
    for s in systems:
        row["systems"][s.name] = {"median_ms": median(s.times) if s.times else None, "runs": len(s.times),
                                  "busy_median_ms": median(s.busy_times) if s.busy_times else None,
                                  "min_ms": min(s.times) if s.times else None,
                                  "compile_s": s.compile_s, "error": s.error,
                                  "check": s.check}

    # Speedups (baseline time / Deuteron time: > 1 means Deuteron is faster) and roofline.
    dm = d["median_ms"]
    d_ok = dm is not None and bool((d.get("check") or {}).get("ok"))
    best = None
    for b in BASELINES:
        sb = row["systems"].get(b)
        if not sb or sb["median_ms"] is None:
            continue
        sb_ok = bool(sb["check"] and sb["check"]["ok"])
        sb["speedup"] = sb["median_ms"] / dm if (dm and d_ok and sb_ok) else None
        if sb_ok and (best is None or sb["median_ms"] < row["systems"][best]["median_ms"]):
            best = b
    row["best_baseline"] = best
    row["speedup_vs_best"] = (row["systems"][best]["median_ms"] / dm) if (best and dm and d_ok) else None
    # With one core busy (--busy): the same, from the busy rounds' medians.
    dbm = d.get("busy_median_ms")
    busy_best = None
    for b in BASELINES:
        sb = row["systems"].get(b)
        if not sb or not sb.get("busy_median_ms") or not (sb["check"] and sb["check"]["ok"]):
            continue
        sb["busy_speedup"] = sb["busy_median_ms"] / dbm if (dbm and d_ok) else None
        if busy_best is None or sb["busy_median_ms"] < row["systems"][busy_best]["busy_median_ms"]:
            busy_best = b
    row["busy_best_baseline"] = busy_best
    row["busy_speedup_vs_best"] = (row["systems"][busy_best]["busy_median_ms"] / dbm) \
        if (busy_best and dbm and d_ok) else None
    set_roofline_fractions(row, ctx["roofline"])
    # This build against the baseline build (--baseline-deuteron): < 1 means this one is faster.
    db = row["systems"].get("deuteron_before")
    if db is not None:
        db_ok = db["median_ms"] is not None and bool((db.get("check") or {}).get("ok"))
        row["after_over_before"] = dm / db["median_ms"] if (d_ok and db_ok) else None
    if not spec.verified:
        row["notes"].append("spec not yet checked against the kernel's examples/*.cpp")
    return row


# ---- reports -----------------------------------------------------------------------------------

def fmt_ms(x):
    return "-" if x is None else (f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.1f}")


def fmt_x(x):
    return "-" if x is None else f"{x:.2f}x"


def fmt_pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def summarize(rows, systems):
    out = {}
    for b in BASELINES:
        if b not in systems:
            continue
        g = geomean([r["systems"].get(b, {}).get("speedup") for r in rows])
        out[GEOMEAN_FIELD[b]] = g
    out["geomean_vs_best"] = geomean([r.get("speedup_vs_best") for r in rows])
    if any(r.get("busy_speedup_vs_best") for r in rows):
        for b in BASELINES:
            if b in systems:
                out["busy_" + GEOMEAN_FIELD[b]] = geomean([r["systems"].get(b, {}).get("busy_speedup") for r in rows])
        out["busy_geomean_vs_best"] = geomean([r.get("busy_speedup_vs_best") for r in rows])
    if "deuteron_before" in systems:
        out["geomean_after_over_before"] = geomean([r.get("after_over_before") for r in rows])
    return out


def write_markdown(path, result):
    rows, meta, gm = result["kernels"], result["meta"], result
    has_sdpa = any("torch_sdpa" in r["systems"] for r in rows)
    base = ["torch_eager", "torch_compile", "jax_jit"] + (["torch_sdpa"] if has_sdpa else [])
    base = [b for b in base if b in meta["systems"]]
    dsys = [s for s in DEUTERONS if s in meta["systems"]]
    before = "deuteron_before" in dsys
    busy = any(r.get("busy_speedup_vs_best") is not None or r.get("busy_timing_s") for r in rows)
    L = []
    L.append(f"# Deuteron vs PyTorch eager, torch.compile and jax.jit ({meta['shapes']} shapes, float32)")
    L.append("")
    isa = f", {meta['isa']} code only (`--isa`)" if meta.get("isa", "native") != "native" else ""
    L.append(f"{meta['date']} on {meta['cpu']} ({meta['threads']} threads everywhere{isa}); "
             f"torch {meta['torch']}, jax {meta['jax']}; Deuteron config per kernel in brackets. "
             f"Median ms over {meta['rounds']} interleaved rounds x {meta['repeat']} runs. "
             f"Speedup = baseline time / Deuteron time (> 1: Deuteron faster).")
    L.append("")
    hdr = ["kernel", "shape"] + [f"{LABEL[s]} ms" for s in dsys] + (["after / before"] if before else []) + \
          [f"{LABEL[b]} ms" for b in base] + [f"x {LABEL[b]}" for b in base] + ["x fastest"] + \
          (["x fastest, 1 core busy"] if busy else []) + \
          ["roofline D / " + " / ".join(LABEL[b] for b in base), "other load"]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|" + "---|" * len(hdr))
    for r in rows:
        S = r["systems"]
        cells = [r["kernel"], "x".join(map(str, r["shape"]))]
        for s in dsys:
            d = S.get(s) or {}
            c = fmt_ms(d.get("median_ms"))
            if d.get("median_ms") is not None:
                c += f" ({d.get('config_origin', '?')})"
                if not (d.get("check") or {}).get("ok"):
                    c += " WRONG"
            cells.append(c)
        if before:
            x = r.get("after_over_before")
            cells.append("-" if x is None else f"{x:.2f}")
        for b in base:
            sb = S.get(b)
            c = fmt_ms(sb.get("median_ms")) if sb else "-"
            if sb and sb.get("check") and not sb["check"]["ok"]:
                c += " WRONG"
            if sb and sb.get("error"):
                c = "failed"
            cells.append(c)
        for b in base:
            cells.append(fmt_x(S.get(b, {}).get("speedup")))
        cells.append(fmt_x(r.get("speedup_vs_best")))
        if busy:
            cells.append(fmt_x(r.get("busy_speedup_vs_best")))
        beside = ""
        if r.get("copy_gbps_beside") and not r.get("compute_bound"):
            beside = f", {r['copy_gbps_beside']:.1f} GB/s"
            nt = (S.get("deuteron") or {}).get("nt_roofline_fraction")
            if nt and r.get("copy_nt_gbps_after"):
                beside += f"; D {fmt_pct(nt)} of the non-temporal copy's {r['copy_nt_gbps_after']:.1f}"
            paired = (S.get("deuteron") or {}).get("paired_roofline_fraction")
            if paired:
                beside += (f"; D {fmt_pct(paired)} of a copy paired with its runs "
                           f"({S['deuteron']['paired_copy_gbps_median']:.1f})")
        cells.append(" / ".join(fmt_pct(S.get(s, {}).get("roofline_fraction")) for s in ["deuteron"] + base)
                     + (" (FMA)" if r.get("compute_bound") else f" (BW{beside})"))
        cells.append(f"{r.get('foreign_load_cores', 0):.2f}")
        L.append("| " + " | ".join(cells) + " |")
    gb = gm.get("geomean_after_over_before")
    gcells = ["**geomean**", ""] + [""] * len(dsys) + ([f"**{gb:.2f}**" if gb else "-"] if before else []) + \
             [""] * len(base) + [f"**{fmt_x(gm.get(GEOMEAN_FIELD[b]))}**" for b in base] + \
             [f"**{fmt_x(gm.get('geomean_vs_best'))}**"] + \
             ([f"**{fmt_x(gm.get('busy_geomean_vs_best'))}**"] if busy else []) + ["", ""]
    L.append("| " + " | ".join(gcells) + " |")
    L.append("")
    L.append(f"Geometric mean speedup of Deuteron over the fastest baseline per kernel: "
             f"{fmt_x(gm.get('geomean_vs_best'))}.")
    if before:
        L.append("")
        L.append(f"after / before: this build's time over the baseline build's ({meta.get('deuteron_before')}), "
                 "timed in the same rounds, each on its own tuned or default config (below 1: this build "
                 "is faster).")
    if busy:
        L.append("")
        L.append("With one core busy: " + ", ".join(
            f"{fmt_x(gm.get('busy_' + GEOMEAN_FIELD[b]))} over {LABEL[b]}" for b in base
            if gm.get('busy_' + GEOMEAN_FIELD[b])) + f", {fmt_x(gm.get('busy_geomean_vs_best'))} over the fastest "
            f"(quiet: {fmt_x(gm.get('geomean_vs_best'))}).")
    L.append("")
    roof = meta["roofline"]
    copy = roof.get("copy") or {}
    spread = (f": the best of {roof.get('samples')} samples, median {copy['median_gbps']:.1f}, slowest "
              f"{copy['min_gbps']:.1f}; read {roof.get('read_gbps', 0):.1f} GB/s; other processes kept "
              f"{roof.get('others_cores', 0):.2f} cores busy meanwhile" if copy.get("min_gbps") else "")
    L.append("Roofline: the kernel's bytes (BW) or flops (FMA; causal attention counts the unmasked half) "
             "from its catalogue definition over "
             f"`deuteron roofline`{measured_when(roof)} "
             f"({roof['copy_gbps']:.1f} GB/s copy{spread}; "
             f"{roof['peak_gflops']:.0f} GFLOP/s FMA on {meta['threads']} cores). "
             "A memory-bound row with a GB/s figure in its roofline cell is measured against that copy "
             "bandwidth instead: the better of two `deuteron roofline --remeasure` probes, one right after "
             "its quiet rounds and the one before them, since this machine's bandwidth moves within minutes; "
             "beside it, Deuteron's share of the non-temporal copy the second probe measured (a kernel that "
             "writes with streaming stores skips the read of each output line, and may pass 100% of the "
             "plain copy). "
             f"\"Paired\": Deuteron's rounds after the first ran {PAIRED_COPIES} more times, each followed by a pass "
             "of the same copy (`deuteron run --paired-copy`); the median over those pairs of the run's bytes "
             "per second over the pass's, and of the passes' GB/s: each pass sees the memory its run saw. "
             "\"other load\": CPU cores used by other processes while the kernel was timed "
             "(this machine is shared; > 0.2 means the timings are disturbed).")
    over = sorted({r["kernel"] for r in rows for v in r["systems"].values() if (v.get("roofline_fraction") or 0) > 1.0})
    if over:
        L.append("")
        L.append(f"Fractions above 100% ({', '.join(over)}): the `deuteron roofline` figures are below what "
                 "this machine can do (they were measured while it was busy, or the data stays in cache).")
    if busy:
        L.append("")
        L.append(f"## With one core busy ({meta.get('busy')})")
        L.append("")
        L.append("The same rounds, right after the quiet ones, with the same configs, while a busy loop held one "
                 "core. busy / quiet: a system's busy median over its quiet one (1: unaffected; 2: it waited for "
                 "the shared core). \"other load\" includes the busy loop (about 1 core).")
        L.append("")
        hdr = ["kernel", "Deuteron quiet ms", "Deuteron busy ms", "Deuteron busy / quiet",
               "fastest baseline, busy", "its ms", "its busy / quiet", "x fastest quiet", "x fastest busy",
               "other load"]
        L.append("| " + " | ".join(hdr) + " |")
        L.append("|" + "---|" * len(hdr))
        for r in rows:
            S = r["systems"]
            d, bb = S.get("deuteron") or {}, r.get("busy_best_baseline")
            sb = S.get(bb) or {}

            def ratio(v):
                return f"{v['busy_median_ms'] / v['median_ms']:.2f}" if v.get("busy_median_ms") and v.get("median_ms") else "-"
            L.append("| " + " | ".join([r["kernel"], fmt_ms(d.get("median_ms")), fmt_ms(d.get("busy_median_ms")), ratio(d),
                                        LABEL.get(bb, "-"), fmt_ms(sb.get("busy_median_ms")), ratio(sb),
                                        fmt_x(r.get("speedup_vs_best")), fmt_x(r.get("busy_speedup_vs_best")),
                                        f"{r.get('busy_foreign_load_cores', 0):.2f}"]) + " |")
        L.append(f"| **geomean** | | | | | | | **{fmt_x(gm.get('geomean_vs_best'))}** | "
                 f"**{fmt_x(gm.get('busy_geomean_vs_best'))}** | |")
    L.append("")
    L.append("## First calls (compile, tune) and checks")
    L.append("")
    L.append("Deuteron: `deuteron tune` wall time (cached afterwards), the compile time of its first run "
             "(that run's time outside its timed loop minus the same for later runs), and the time each "
             "`deuteron run` spends outside its timed loop (start, inputs, float64 reference, check, 0.1 s of warm-up runs). "
             "Frameworks: the first call (trace and compile). Errors: max abs difference from the "
             "float64 evaluation of the same function on the same inputs (Deuteron: from its own "
             "float64 reference).")
    L.append("")
    hdr = ["kernel"] + [f"{LABEL[s]} {c}" for s in dsys for c in ("tune s", "compile s", "run overhead s", "config")] + \
          [f"{LABEL[b]} first call s" for b in base] + \
          ["max abs err: " + " / ".join(LABEL[s] for s in dsys + base)]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|" + "---|" * len(hdr))

    def num(x, f="{:.1f}"):
        return "-" if x is None else f.format(x)
    for r in rows:
        S = r["systems"]
        cells = [r["kernel"]]
        for s in dsys:
            d = S.get(s) or {}
            tune = num(d.get("tune_s")) + ("" if d.get("tune_ok", True) else " (failed)")
            comp = num(d.get("compile_s"), "{:.2f}") if d.get("compiled") else ("cached" if d.get("config") else "-")
            cfg = json.dumps(d.get("config"), separators=(",", ":")) if d.get("config") else "-"
            cells += [tune, comp, num(d.get("invocation_overhead_s")), f"{d.get('config_origin', '-')}: `{cfg}`"]
        for b in base:
            sb = S.get(b)
            c = "-" if not sb or sb.get("compile_s") is None else f"{sb['compile_s']:.2f}"
            if b == "torch_compile" and sb and r.get("inductor_cache") in ("hit", "miss"):
                c += f" (cache {r['inductor_cache']})"
            cells.append(c)
        errs = []
        for sname in dsys + base:
            ch = (S.get(sname) or {}).get("check")
            errs.append("-" if not ch else f"{ch['max_abs_err']:.2g}" + ("" if ch["ok"] else " WRONG"))
        cells.append(" / ".join(errs))
        L.append("| " + " | ".join(cells) + " |")
    notes = [(r["kernel"], n) for r in rows for n in r["notes"]]
    if notes:
        L.append("")
        L.append("## Notes")
        L.append("")
        for k, n in notes:
            L.append(f"- {k}: {n}")
    L.append("")
    L.append("## Setup")
    L.append("")
    for k in ("command", "deuteron", "deuteron_before", "threads", "isa", "torch_cpu_capability", "affinity",
              "xla_pool_threads", "XLA_FLAGS", "malloc", "load_before", "load_after", "wall_s", "deuteron_outputs"):
        if k in meta:
            L.append(f"- {k}: {meta[k]}")
    Path(path).write_text("\n".join(L) + "\n")


def write_csv(path, result):
    rows = result["kernels"]
    # deuteron_before's columns only when --baseline-deuteron ran it
    dsys = [s for s in DEUTERONS if s == "deuteron" or s in result["meta"]["systems"]]
    systems = [s for s in SYSTEMS if s in dsys or s not in DEUTERONS]
    fields = ["kernel", "shape", "dtype"] + \
        [f"{s}_{c}" for s in dsys for c in ("config_origin", "correct", "tune_s", "config")] + \
        (["after_over_before"] if len(dsys) > 1 else []) + \
        ["best_baseline", "speedup_vs_best", "busy_best_baseline", "busy_speedup_vs_best", "bytes", "flops",
         "compute_bound", "copy_gbps_beside", "copy_nt_gbps_after", "deuteron_nt_roofline_fraction",
         "deuteron_paired_roofline_fraction", "deuteron_paired_copy_gbps",
         "foreign_load_cores", "busy_foreign_load_cores"]
    for s in systems:
        fields += [f"{s}_ms", f"{s}_busy_ms", f"{s}_min_ms", f"{s}_runs", f"{s}_roofline_fraction", f"{s}_first_call_s"]
        if s not in DEUTERONS:
            fields += [f"speedup_vs_{s}", f"{s}_max_abs_err"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            o = {"kernel": r["kernel"], "shape": "x".join(map(str, r["shape"])), "dtype": r["dtype"],
                 "best_baseline": r.get("best_baseline"), "speedup_vs_best": r.get("speedup_vs_best"),
                 "bytes": r.get("bytes"), "flops": r.get("flops"), "compute_bound": r.get("compute_bound"),
                 "copy_gbps_beside": r.get("copy_gbps_beside"), "copy_nt_gbps_after": r.get("copy_nt_gbps_after"),
                 "deuteron_nt_roofline_fraction": (r["systems"].get("deuteron") or {}).get("nt_roofline_fraction"),
                 "deuteron_paired_roofline_fraction": (r["systems"].get("deuteron") or {}).get("paired_roofline_fraction"),
                 "deuteron_paired_copy_gbps": (r["systems"].get("deuteron") or {}).get("paired_copy_gbps_median"),
                 "foreign_load_cores": r.get("foreign_load_cores"),
                 "busy_best_baseline": r.get("busy_best_baseline"), "busy_speedup_vs_best": r.get("busy_speedup_vs_best"),
                 "busy_foreign_load_cores": r.get("busy_foreign_load_cores")}
            if len(dsys) > 1:
                o["after_over_before"] = r.get("after_over_before")
            for s in dsys:
                d = r["systems"].get(s) or {}
                o.update({f"{s}_config_origin": d.get("config_origin"),
                          f"{s}_correct": (d.get("check") or {}).get("ok"), f"{s}_tune_s": d.get("tune_s"),
                          f"{s}_config": json.dumps(d["config"], separators=(",", ":")) if d.get("config") else None})
            for s in systems:
                sv = r["systems"].get(s)
                if not sv:
                    continue
                o[f"{s}_ms"] = sv.get("median_ms")
                o[f"{s}_busy_ms"] = sv.get("busy_median_ms")
                o[f"{s}_min_ms"] = sv.get("min_ms") if s not in DEUTERONS else \
                    (min(sv["round_medians_ms"]) if sv.get("round_medians_ms") else None)
                o[f"{s}_runs"] = sv.get("runs")
                o[f"{s}_roofline_fraction"] = sv.get("roofline_fraction")
                o[f"{s}_first_call_s"] = sv.get("compile_s")
                if s not in DEUTERONS:
                    o[f"speedup_vs_{s}"] = sv.get("speedup")
                    o[f"{s}_max_abs_err"] = (sv.get("check") or {}).get("max_abs_err")
            w.writerow(o)


def measured_when(roof: dict) -> str:
    if not roof.get("measured_in_this_run"):
        return " (cached)"
    m = roof.get("measurements")
    if not m:
        return " measured at the start of this run"
    return (f" measured at the start and the end of this run ({m[0]['copy_gbps']:.1f} and {m[1]['copy_gbps']:.1f} "
            "GB/s copy), the better kept")


def write_plot(path, result):
    try:
        import matplotlib
    except ImportError:
        log("no matplotlib (scripts/setup_python.sh --bench installs it): no chart")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["kernels"] if any(r["systems"].get(b, {}).get("speedup") for b in BASELINES)]
    if not rows:
        return False
    base = [b for b in BASELINES if any(r["systems"].get(b, {}).get("speedup") for r in rows)]
    colors = {"torch_eager": "#4C72B0", "torch_compile": "#DD8452", "jax_jit": "#55A868", "torch_sdpa": "#8172B3"}
    n = len(rows)
    width = 0.8 / len(base)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.95 * n + 3), 6.0))
    vals_all = []
    for i, b in enumerate(base):
        xs, ys = [], []
        for k, r in enumerate(rows):
            v = r["systems"].get(b, {}).get("speedup")
            if v:
                xs.append(k - 0.4 + width * (i + 0.5))
                ys.append(v)
        vals_all += ys
        g = result.get(GEOMEAN_FIELD[b])
        # bars grow from 1x: up where Deuteron is faster, down where it is slower
        ax.bar(xs, [y - 1.0 for y in ys], bottom=1.0, width=width * 0.95, color=colors[b],
               label=f"vs {LABEL[b]} (geomean {g:.2f}x)" if g else f"vs {LABEL[b]}")
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.2g}" if y < 10 else f"{y:.0f}", (x, y), ha="center",
                        va="bottom" if y >= 1 else "top", fontsize=7,
                        xytext=(0, 2 if y >= 1 else -2), textcoords="offset points", rotation=90)
    ax.set_yscale("log")
    lo, hi = min(vals_all + [1.0]), max(vals_all + [1.0])
    ax.set_ylim(lo / 2.2, hi * 2.2)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks(range(n))
    ax.set_xticklabels([r["kernel"] for r in rows], rotation=30, ha="right")
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel("Deuteron speedup (baseline time / Deuteron time), log scale")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    meta = result["meta"]
    ax.set_title(f"Deuteron speedup over each baseline, {meta['shapes']} shapes, float32, "
                 f"{meta['threads']} threads\n{meta['cpu']}, {meta['date']}  (above 1: Deuteron faster)",
                 fontsize=10)
    ax.legend(loc="upper left", fontsize=9, framealpha=0.9)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def write_reports(result, out: Path, no_plot: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    write_csv(out / "bench.csv", result)
    write_markdown(out / "bench.md", result)
    plotted = False if no_plot else write_plot(out / "bench_speedups.png", result)
    log(f"wrote {out / 'bench.md'}, bench.csv, bench.json" + (", bench_speedups.png" if plotted else "")
        + f" (run took {result['meta']['wall_s']:.0f} s)")
    g = {k: result.get(k) for k in ("geomean_vs_eager", "geomean_vs_torch_compile", "geomean_vs_jax_jit",
                                    "geomean_vs_torch_sdpa", "geomean_vs_best", "geomean_after_over_before",
                                    "busy_geomean_vs_eager", "busy_geomean_vs_torch_compile",
                                    "busy_geomean_vs_jax_jit", "busy_geomean_vs_best")
         if k in result}
    log("geomeans: " + ", ".join(f"{k} {fmt_x(v)}" for k, v in g.items()))


def append_scaling(args, out: Path) -> bool:
    """bench/scaling.py into `out` (scaling.md, .json, .png), its report appended to bench.md."""
    cmd = [sys.executable, str(REPO / "bench" / "scaling.py"), "--deuteron", args.deuteron, "--out", str(out)]
    if args.no_plot:
        cmd.append("--no-plot")
    log("scaling: " + " ".join(cmd[1:]))
    if subprocess.run(cmd).returncode != 0:
        log("scaling.py failed: bench.md has no scaling section")
        return False
    with open(out / "bench.md", "a") as f:
        f.write("\n" + (out / "scaling.md").read_text())
    log(f"appended {out / 'scaling.md'} to {out / 'bench.md'}")
    return True


# ---- main ----------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default="", help="comma-separated catalogue names (default: all)")
    ap.add_argument("--shapes", default="bench", choices=["small", "bench"])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per system per round (default 5)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="threads for every system (default 2)")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native",
                    help="avx2: every system runs as on an AVX2-only CPU (Deuteron via DEUTERON_CPU_ISA, "
                         "PyTorch via ATEN_CPU_CAPABILITY, MKL and oneDNN limits, XLA's --xla_cpu_max_isa)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--out", default=str(REPO / "results"), help="folder for bench.{md,csv,json,png}")
    ap.add_argument("--deuteron", default=str(REPO / "build" / "deuteron"), help="the deuteron binary")
    ap.add_argument("--baseline-deuteron", metavar="PATH",
                    help="a second deuteron binary (e.g. an older build), timed in the same rounds as "
                         "system deuteron_before; the report adds its times and after/before ratios")
    ap.add_argument("--baseline-cache-dir", metavar="DIR",
                    help="DEUTERON_CACHE_DIR for --baseline-deuteron (default: <deuteron's cache>-baseline-"
                         "<hash of the binary>), so neither binary reads the other's tuned configs")
    ap.add_argument("--systems", default="torch_eager,torch_compile,jax_jit,torch_sdpa",
                    help="baselines to run (default all)")
    ap.add_argument("--tune", choices=["auto", "never"], default="auto",
                    help="auto (default): `deuteron tune` each kernel first (instant when cached); "
                         "never: Deuteron's default configs (DEUTERON_AUTOTUNE_EFFORT=none)")
    ap.add_argument("--tune-budget", type=float, default=30.0, metavar="S",
                    help="seconds of search per kernel for `deuteron tune --time-budget` (default 30; "
                         "0: the tuner's own default, about a minute)")
    ap.add_argument("--max-round-s", type=float, default=5.0, metavar="S",
                    help="fewer runs per round (at least 2) for systems whose calls would take longer "
                         "than S seconds in all (default 5)")
    ap.add_argument("--deuteron-timeout", type=float, default=1200.0)
    ap.add_argument("--cold-alloc", action="store_true",
                    help="leave glibc's malloc alone (PyTorch outputs then page-fault in every call)")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before timing each kernel, wait up to S seconds until other processes use "
                         "< 0.25 cores (the machine is shared)")
    ap.add_argument("--busy", action=argparse.BooleanOptionalAction, default=True,
                    help="after each kernel's quiet rounds, time the same rounds again while a busy loop "
                         "holds the first CPU (default on; --no-busy: quiet rounds only)")
    ap.add_argument("--roofline", choices=["measure", "cached"], default="measure",
                    help="measure: `deuteron roofline --remeasure` at the start of this run (default; a few "
                         "seconds), so the roofline fractions are of this run's machine state; cached: its "
                         "cached figures")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--scaling", action="store_true",
                    help="after the table, run bench/scaling.py (softmax, matmul, attention at five sizes on "
                         "one core and two, about 5 minutes) into --out and append its report to bench.md")
    ap.add_argument("--from-json", metavar="FILE",
                    help="measure nothing: rewrite the reports under --out from an earlier bench.json")
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.rounds < 1:
        ap.error("--repeat and --rounds must be >= 1")
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        result.update(summarize(result["kernels"], result["meta"]["systems"]))
        write_reports(result, Path(args.out), args.no_plot)
        if args.json:
            print(json.dumps(result, default=str))
        return 0

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    penv = setup_process(args.threads, args.cold_alloc, args.isa)

    snap_dir = Path(tempfile.mkdtemp(prefix="deuteron-bench-bin-"))
    try:
        tools = [snapshot("deuteron", args.deuteron, snap_dir, None)]
        if args.baseline_deuteron:
            cache = args.baseline_cache_dir or \
                f"{default_cache_root()}-baseline-{file_sha256(args.baseline_deuteron)[:12]}"
            if Path(cache).resolve() == default_cache_root().resolve():
                ap.error("--baseline-cache-dir must differ from the cache of --deuteron "
                         "(each binary must only read configs it tuned itself)")
            tools.append(snapshot("deuteron_before", args.baseline_deuteron, snap_dir, cache))
        log("measuring the roofline (deuteron roofline --remeasure)" if args.roofline == "measure"
            else "reading the cached roofline")
        roofline = measure_roofline(tools[0]["binary"], args.roofline == "measure")
        roofline["measured_in_this_run"] = args.roofline == "measure"
    except (RuntimeError, subprocess.CalledProcessError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for t in tools:
        t["roofline"] = roofline
    cat = tools[0]["catalogue"]

    import numpy as np  # noqa: F401
    import torch
    import jax
    import kernels as K

    torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    jax.config.update("jax_platforms", "cpu")

    names = [e["name"] for e in cat]
    if args.kernels:
        want = [k.strip() for k in args.kernels.split(",") if k.strip()]
        unknown = [k for k in want if k not in names]
        if unknown:
            print(f"error: not in the catalogue: {', '.join(unknown)} (known: {', '.join(names)})",
                  file=sys.stderr)
            return 2
        entries = [e for e in cat if e["name"] in want]
    else:
        entries = cat
    systems = ["deuteron"] + [s.strip() for s in args.systems.split(",") if s.strip()]
    systems[1:1] = [t["name"] for t in tools[1:]]
    ctx = {"deuterons": tools, "roofline": roofline, "systems": systems,
           "busy_cpu": sorted(os.sched_getaffinity(0))[0],
           "copy_probe_gbps": roofline["copy_gbps"] if args.roofline == "measure" else None}

    rows, skipped = [], []
    for e in entries:
        if "float32" not in e.get("dtypes", ["float32"]):
            skipped.append((e["name"], "no float32"))
            continue
        spec = K.SPECS.get(e["name"])
        if spec is None:
            skipped.append((e["name"], "no PyTorch/JAX definition in bench/kernels.py"))
            log(f"skipping {e['name']}: no PyTorch/JAX definition in bench/kernels.py")
            continue
        if not spec.verified:
            log(f"warning: {e['name']}: spec not yet checked against examples/{e['name']}.cpp")
        t0 = time.perf_counter()
        row = run_kernel(e, spec, args, ctx)
        S = row["systems"]
        log(f"{e['name']}: " + ", ".join(f"{s} {fmt_ms(v.get('median_ms'))} ms" for s, v in S.items())
            + f" ({time.perf_counter() - t0:.0f} s)")
        rows.append(row)
        gc.collect()
    if args.roofline == "measure" and rows:
        log("measuring the roofline again (the run keeps the better of the two)")
        try:
            roofline = best_roofline(roofline, measure_roofline(tools[0]["binary"], True))
            roofline["measured_in_this_run"] = True
        except (subprocess.CalledProcessError, json.JSONDecodeError) as e:
            log(f"warning: the second roofline failed ({e}); keeping the first")
        for t in tools:
            t["roofline"] = roofline
        ctx["roofline"] = roofline
        for row in rows:
            set_roofline_fractions(row, roofline)

    meta = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else " ".join(argv),
        "shapes": args.shapes, "repeat": args.repeat, "rounds": args.rounds, "threads": args.threads,
        "busy": f"a busy loop (python) pinned to CPU {ctx['busy_cpu']}" if args.busy else None,
        "systems": systems, "cpu": roofline.get("cpu", platform.processor()), "roofline": roofline,
        "torch": torch.__version__, "jax": jax.__version__, "python": platform.python_version(),
        "deuteron": tools[0]["info"], "affinity": penv["affinity"], "XLA_FLAGS": penv["XLA_FLAGS"],
        "malloc": penv["malloc"], "torch_threads": torch.get_num_threads(), "isa": penv["isa"],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "xla_pool_threads": ctx.get("xla_pool_threads"),
        **({"deuteron_before": tools[1]["info"]} if len(tools) > 1 else {}),
        "deuteron_outputs": ("compared with the float64 evaluation (deuteron run --save-outputs)"
                             if tools[0]["features"]["save_outputs"] else
                             "checked by deuteron run's own `correct` field (its float64 reference on "
                             "the same inputs); the CLI cannot save its outputs yet"),
        "cli_features": tools[0]["features"], "skipped": skipped,
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    if ctx.get("xla_pool_threads") not in (None, args.threads):
        log(f"warning: XLA's intra-op pool has {ctx.get('xla_pool_threads')} threads, not {args.threads}")
    result = {"meta": meta, "kernels": rows}
    result.update(summarize(rows, systems))

    write_reports(result, Path(args.out), args.no_plot)
    shutil.rmtree(snap_dir, ignore_errors=True)
    if args.scaling and not append_scaling(args, Path(args.out)):
        return 1
    if args.json:
        print(json.dumps(result, default=str))
    bad = [r["kernel"] for r in rows
           if any(v.get("check") and not v["check"]["ok"] for v in r["systems"].values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
