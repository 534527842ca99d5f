#!/usr/bin/env python3
"""The catalogue on the triton target, beside PyTorch eager and torch.compile, on one GPU.

    python3 bench/triton_gpu.py --deuteron build/deuteron [--shapes bench|small] [--kernels a,b]
                                [--tune-budget 6] [--out results/triton_gpu] [--interpret]
                                [--fresh-cache]

Prepared on the CPU, meant for one short run on a GPU machine (a few minutes for the catalogue
at its bench shapes). For every catalogue kernel the triton target runs, in float32:
  1. default  the module `deuteron emit K --target triton` writes for the default config
              (tuning off, an empty cache);
  2. tuned    `deuteron tune K --target triton --time-budget B --json`: on a GPU the triton
              runner compiles each candidate and times it with CUDA events; then the module for
              the config it chose. Tuning runs in a background thread, one kernel at a time,
              while this process compiles the torch.compile baselines on the CPU;
  3. eager, torch.compile  bench/kernels.py's PyTorch function of the kernel on the same inputs
              (bench/kernels.py makes them bit for bit as `deuteron run` does).
Every output is checked against the float64 evaluation of the same function (on the device,
with bench/kernels.py's tolerances), then timed: a warm-up call, then the median of up to
--repeat calls (about 0.3 s of them), each between two CUDA events (under the interpreter: one
call). All four systems allocate
their outputs per call and see the same (warm) L2.

--interpret runs the same modules, unchanged, under Triton's interpreter on CPU tensors
(TRITON_INTERPRET=1; the tuner through DEUTERON_TRITON_DEVICE=interpret): that checks the
script and the modules on a machine without a GPU. Its times are wall clock and only say that
it ran. The Python that runs this script is the one the triton runner uses (DEUTERON_VENV).

Writes triton_gpu.md (the table) and triton_gpu.json under --out, and the emitted modules
under --out/modules. Exit status 1 when an output is wrong or a kernel failed.
"""
from __future__ import annotations

import argparse
import atexit
import importlib.util
import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SYSTEMS = ["default", "tuned", "torch_eager", "torch_compile"]
LABEL = {"default": "Deuteron default", "tuned": "Deuteron tuned", "torch_eager": "PyTorch eager",
         "torch_compile": "torch.compile"}


def log(msg: str) -> None:
    print(f"[triton_gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs):
    s = sorted(xs)
    n = len(s)
    return None if n == 0 else s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def deuteron(cmd: list[str], env: dict, timeout: float) -> tuple[int, str, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout:.0f} s"


def first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    hit = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "no output")
    return hit[:240]


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call_module(run, tensors, scalars):
    """The module's run() takes the tensors positionally and the scalars by keyword, in order."""
    params = inspect.signature(run).parameters.values()
    names = [p.name for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY]
    if len(names) != len(scalars):
        raise ValueError(f"run() takes scalars {names}, the inputs have {len(scalars)}")
    kwargs = dict(zip(names, scalars))
    return lambda: run(*tensors, **kwargs)


def as_tuple(r):
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


class Timer:
    """Median milliseconds of a call: CUDA events on a GPU, wall clock otherwise."""

    def __init__(self, torch, gpu: bool, repeat: int):
        self.torch, self.gpu, self.repeat = torch, gpu, repeat

    def one(self, fn) -> float:
        torch = self.torch
        if not self.gpu:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)

    def median_ms(self, fn) -> tuple[float, int]:
        if not self.gpu:  # the interpreter: one call (the check's call compiled it) says it runs
            return self.one(fn), 1
        fn()  # warm-up
        first = self.one(fn)
        n = max(5, min(self.repeat, int(300.0 / max(first, 1e-3))))
        samples = [first] + [self.one(fn) for _ in range(n - 1)]
        return median(samples), len(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deuteron", default=str(HERE.parent / "build" / "deuteron"), help="the deuteron binary")
    ap.add_argument("--shapes", choices=["bench", "small"], default="bench")
    ap.add_argument("--kernels", default="", help="comma-separated subset (default: every triton kernel)")
    ap.add_argument("--tune-budget", type=float, default=6.0, help="seconds of tuning per kernel (0: no tuning)")
    ap.add_argument("--repeat", type=int, default=100, help="timed calls per system at most")
    ap.add_argument("--out", default=str(HERE.parent / "results" / "triton_gpu"))
    ap.add_argument("--interpret", action="store_true", help="Triton's interpreter on the CPU (no GPU)")
    ap.add_argument("--fresh-cache", action="store_true", help="tune into an empty cache, not the user's")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per deuteron command")
    args = ap.parse_args(argv)

    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (by the modules)
    import numpy as np
    import torch
    from kernels import SPECS
    from run_bench import compare

    gpu = not args.interpret and torch.cuda.is_available()
    if not gpu and not args.interpret:
        log("no GPU visible to torch: run with --interpret to check the modules on the CPU")
        return 2
    device = "cuda" if gpu else "cpu"
    out = Path(args.out)
    (out / "modules").mkdir(parents=True, exist_ok=True)

    env = dict(os.environ, DEUTERON_VENV=os.environ.get("DEUTERON_VENV", sys.prefix))
    if args.interpret:
        env["DEUTERON_TRITON_DEVICE"] = "interpret"
    def scratch_cache(prefix: str) -> str:  # removed when the run ends
        path = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        return path

    if args.fresh_cache:
        env["DEUTERON_CACHE_DIR"] = scratch_cache("deuteron-tune-cache-")
    default_env = dict(env, DEUTERON_AUTOTUNE_EFFORT="none", DEUTERON_CACHE_DIR=scratch_cache("deuteron-default-cache-"))

    rc, listing, err = deuteron([args.deuteron, "list", "--json"], env, args.timeout)
    if rc != 0:
        log(f"deuteron list failed: {first_error(err)}")
        return 2
    entries = [e for e in json.loads(listing) if "triton" in e["targets"]]
    if args.kernels:
        wanted = args.kernels.split(",")
        unknown = sorted(set(wanted) - {e["name"] for e in entries})
        if unknown:
            log(f"not triton catalogue kernels: {', '.join(unknown)}")
            return 2
        entries = [e for e in entries if e["name"] in wanted]

    rows = []
    for e in entries:
        shape = e["small_shape"] if args.shapes == "small" else e["bench_shape"]
        rows.append({"kernel": e["name"], "shape": shape, "systems": {s: {} for s in SYSTEMS}, "notes": []})

    def shape_args(row):
        return ["--target", "triton", "--shape", ",".join(map(str, row["shape"])), "--dtype", "float32"]

    def emit(row, which, config=None) -> Path | None:
        cmd = [args.deuteron, "emit", row["kernel"], *shape_args(row)]
        if config is not None:
            cmd += ["--config", json.dumps(config, separators=(",", ":"))]
        rc, src, err = deuteron(cmd, default_env if config is None else env, args.timeout)
        if rc != 0:
            row["systems"][which]["error"] = f"emit failed: {first_error(err)}"
            return None
        path = out / "modules" / f"{row['kernel']}_{which}.py"
        path.write_text(src)
        return path

    # Tuning, in the background: one kernel at a time, so candidates' timings do not share the GPU.
    def tune_all():
        for row in rows:
            d = row["systems"]["tuned"]
            if args.tune_budget <= 0:
                d["error"] = "not tuned (--tune-budget 0)"
                continue
            t0 = time.perf_counter()
            cmd = [args.deuteron, "tune", row["kernel"], *shape_args(row), "--time-budget", f"{args.tune_budget:g}",
                   "--progress", "quiet", "--json"]
            rc, text, err = deuteron(cmd, env, args.timeout + args.tune_budget)
            d["tune_s"] = time.perf_counter() - t0
            if rc != 0:
                d["error"] = f"tune failed: {first_error(err)}"
                continue
            j = json.loads(text)
            d.update(config=j["best"], tried=j["tried"], tuner_best_ms=j["best_s"] * 1e3,
                     tuner_default_ms=j["default_s"] * 1e3, from_cache=j["from_cache"])
            log(f"{row['kernel']}: tuned in {d['tune_s']:.1f} s ({j['tried']} candidates)")

    tuner = threading.Thread(target=tune_all, daemon=True)
    tuner.start()

    # Inputs, references, default modules and the torch.compile warm-up, while the tuner works.
    prepared = {}
    for row in rows:
        name, spec = row["kernel"], SPECS.get(row["kernel"])
        if spec is None:
            row["notes"].append("no PyTorch spec in bench/kernels.py")
            continue
        log(f"{name} {row['shape']}: inputs, float64 reference, default module, torch.compile")
        host = spec.inputs(row["shape"])
        tensors = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in host if isinstance(a, np.ndarray)]
        scalars = [a for a in host if not isinstance(a, np.ndarray)]
        ordered = [torch.from_numpy(np.ascontiguousarray(a)).to(device) if isinstance(a, np.ndarray) else a for a in host]
        wide = [a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in ordered]
        with torch.no_grad():
            want = [w.cpu().numpy() for w in as_tuple(spec.torch(*wide))]
        compiled = torch.compile(spec.torch)
        d = row["systems"]["torch_compile"]
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                compiled(*ordered)
            d["compile_s"] = time.perf_counter() - t0
        except Exception as ex:  # a baseline that cannot compile is reported, not fatal
            d["error"] = f"torch.compile failed: {type(ex).__name__}: {str(ex)[:200]}"
        prepared[name] = dict(spec=spec, ordered=ordered, tensors=tensors, scalars=scalars, want=want,
                              compiled=compiled, default=emit(row, "default"))

    tuner.join()

    # Checks and timings, one system at a time on the device.
    timer = Timer(torch, gpu, args.repeat)
    failed = False
    for row in rows:
        p = prepared.get(row["kernel"])
        if p is None:
            continue
        spec = p["spec"]
        tuned = row["systems"]["tuned"]
        tuned_path = emit(row, "tuned", tuned["config"]) if "config" in tuned else None
        calls = {}
        for which, path in (("default", p["default"]), ("tuned", tuned_path)):
            if path is not None:
                try:
                    module = load_module(path, f"{row['kernel']}_{which}")
                    calls[which] = call_module(module.run, p["tensors"], p["scalars"])
                    row["systems"][which]["config"] = json.loads(
                        next(ln for ln in path.read_text().splitlines() if ln.startswith("# config: "))[10:])
                except Exception as ex:
                    row["systems"][which]["error"] = f"module failed to load: {type(ex).__name__}: {ex}"[:240]
        calls["torch_eager"] = lambda: spec.torch(*p["ordered"])
        if "error" not in row["systems"]["torch_compile"]:
            calls["torch_compile"] = lambda: p["compiled"](*p["ordered"])
        for which, fn in calls.items():
            d = row["systems"][which]
            try:
                with torch.no_grad():
                    got = [g.cpu().numpy() for g in as_tuple(fn())]
                    ok, err, why = compare(got, p["want"], spec.rtol, spec.atol, spec.ntol)
                    d.update(correct=ok, max_abs_err=err)
                    if why:
                        d["why"] = why
                    d["median_ms"], d["runs"] = timer.median_ms(fn)
            except Exception as ex:
                d["error"] = f"{type(ex).__name__}: {str(ex)[:240]}"
            failed = failed or (which in ("default", "tuned") and not d.get("correct", False)
                                and not (which == "tuned" and "not tuned" in d.get("error", "")))
            state = "error" if "error" in d else ("correct" if d["correct"] else "WRONG")
            log(f"{row['kernel']}: {which} {state}" + (f", {d['median_ms']:.4f} ms" if "median_ms" in d else ""))

    result = {
        "device": torch.cuda.get_device_name(0) if gpu else "Triton interpreter on the CPU",
        "interpret": args.interpret, "shapes": args.shapes, "tune_budget_s": args.tune_budget,
        "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__,
                     "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": rows,
    }
    (out / "triton_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "triton_gpu.md").write_text(markdown(result))
    print(markdown(result))
    return 1 if failed else 0


def markdown(result) -> str:
    def ms(d):
        if "error" in d:
            return "-" if d["error"].startswith("not tuned") else "error"
        if "median_ms" not in d:
            return "-"
        return f"{d['median_ms']:.4f}" + ("" if d.get("correct") else " WRONG")

    lines = [f"# The catalogue on the triton target: {result['device']}", "",
             f"float32, {result['shapes']} shapes, tuning budget {result['tune_budget_s']:g} s per kernel; "
             f"torch {result['versions']['torch']}, triton {result['versions']['triton']}; {result['date']}.",
             "Times are medians in ms" + (" (interpreter wall clock: they only say it ran)" if result["interpret"]
                                           else " between CUDA events") + ".", "",
             "| kernel | shape | " + " | ".join(LABEL[s] for s in SYSTEMS) + " | tuned vs eager | tuned vs compile |",
             "|---" * (len(SYSTEMS) + 4) + "|"]
    notes = []
    for r in result["rows"]:
        s = r["systems"]

        def ratio(base):
            a, b = s["tuned"].get("median_ms"), s[base].get("median_ms")
            good = s["tuned"].get("correct") and s[base].get("correct") and not result["interpret"]
            return f"{b / a:.2f}x" if a and b and good else "-"
        lines.append(f"| {r['kernel']} | {'x'.join(map(str, r['shape']))} | "
                     + " | ".join(ms(s[k]) for k in SYSTEMS) + f" | {ratio('torch_eager')} | {ratio('torch_compile')} |")
        for k in SYSTEMS:
            if "error" in s[k]:
                notes.append(f"- {r['kernel']}, {LABEL[k]}: {s[k]['error']}")
        notes += [f"- {r['kernel']}: {n}" for n in r["notes"]]
    lines.append("")
    lines.append("Tuned configs: " + "; ".join(f"{r['kernel']} {json.dumps(r['systems']['tuned'].get('config'))}"
                                               for r in result["rows"] if r["systems"]["tuned"].get("config")))
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
