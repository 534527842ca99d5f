#!/usr/bin/env python3
"""What the grid's schedule costs on a quiet machine and gains with one core busy.

    flock /tmp/deuteron-bench.lock python3 bench/schedule_ab.py [--rounds 5] [--kernels add,softmax,matmul]

Times each kernel at its bench shape on Deuteron's default config (two threads on two cores)
built two ways: the grid handed out in dynamic chunks (the default) and `schedule(static)`
(DEUTERON_CPU_SCHEDULE=static), plus the dynamic build under OMP_WAIT_POLICY=passive; each
quiet and while a busy loop holds the first CPU. All variants interleave, round by round; the
report gives medians of the per-run medians (`deuteron run --json --repeat`), each variant's
time over the static build's in the same condition, and the load average. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = {"add": "4096,4096", "softmax": "8192,2560", "matmul": "2048,2048,2048"}
# GOMP_SPINCOUNT=300000 is libgomp's default spin (OMP_WAIT_POLICY unset), spelled out so that the
# CLI keeps it (it chooses passive waiting when neither variable is set).
VARIANTS = {"static": {"DEUTERON_CPU_SCHEDULE": "static", "GOMP_SPINCOUNT": "300000"},
            "dynamic": {"DEUTERON_CPU_SCHEDULE": "dynamic", "GOMP_SPINCOUNT": "300000"},
            "static+passive": {"DEUTERON_CPU_SCHEDULE": "static", "OMP_WAIT_POLICY": "passive"},
            "dynamic+passive": {"DEUTERON_CPU_SCHEDULE": "dynamic", "OMP_WAIT_POLICY": "passive"}}


def busy_seconds():
    """CPU seconds the whole machine and this process with its children have used."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    t = os.times()
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"), t.user + t.system + t.children_user + t.children_system


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return None if not n else xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def run(binary, kernel, repeat, env, check=False):
    cmd = [binary, "run", kernel, "--shape", SHAPES[kernel], "--dtype", "float32", "--json",
           "--repeat", str(repeat)] + ([] if check else ["--no-check"])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    for line in reversed(p.stdout.strip().splitlines()):
        if line.startswith("{"):
            j = json.loads(line)
            if j["correct"] is False:
                raise RuntimeError(f"{' '.join(cmd)}: WRONG output")
            return j["median_ms"]
    raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()[-400:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", default="add,softmax,matmul")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--deuteron", default=str(REPO / "build" / "deuteron"))
    ap.add_argument("--out", default=str(REPO / "results"))
    args = ap.parse_args()
    kernels = [k for k in args.kernels.split(",") if k]
    cpu0 = sorted(os.sched_getaffinity(0))[0]
    base = dict(os.environ, DEUTERON_AUTOTUNE_EFFORT="none")
    base.pop("OMP_WAIT_POLICY", None)
    base.pop("GOMP_SPINCOUNT", None)
    reps = {"add": 20, "softmax": 20, "matmul": 6}
    load = [os.getloadavg()]
    times = {}  # (kernel, condition, variant) -> [median_ms per run]
    others = {"quiet": [], "busy": []}  # cores used by other processes (the busy loop included)
    for k in kernels:  # compile every variant first (not timed), checked against the reference
        for v, extra in VARIANTS.items():
            run(args.deuteron, k, 1, dict(base, **extra), check="passive" not in v)
    for r in range(args.rounds):
        for cond in ("quiet", "busy") if r % 2 == 0 else ("busy", "quiet"):
            spinner = None
            if cond == "busy":
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                           preexec_fn=lambda: os.sched_setaffinity(0, {cpu0}))
                time.sleep(0.2)
            m0, o0, w0 = *busy_seconds(), time.perf_counter()
            try:
                for k in kernels:
                    order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
                    for v in order:
                        t = run(args.deuteron, k, reps.get(k, 10), dict(base, **VARIANTS[v]))
                        times.setdefault((k, cond, v), []).append(t)
            finally:
                m1, o1 = busy_seconds()
                others[cond].append(max(0.0, ((m1 - m0) - (o1 - o0)) / (time.perf_counter() - w0)))
                if spinner:
                    spinner.kill()
                    spinner.wait()
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    load.append(os.getloadavg())

    L = ["# The grid's schedule: static against dynamic chunks, quiet and with one core busy", "",
         f"{time.strftime('%Y-%m-%d %H:%M')}; default configs (2 threads), {args.rounds} interleaved rounds, "
         f"medians of `deuteron run --repeat` medians; load average before {[round(x, 2) for x in load[0]]}, "
         f"after {[round(x, 2) for x in load[1]]}. Busy: a Python busy loop pinned to CPU {cpu0}. Cores other "
         f"processes used (median over rounds): quiet {median(others['quiet']):.2f}, busy {median(others['busy']):.2f} "
         "(the busy loop included).", "",
         "| kernel | condition | " + " | ".join(f"{v} ms" for v in VARIANTS) + " | " +
         " | ".join(f"{v} / static" for v in VARIANTS if v != "static") + " |",
         "|---|---|" + "---|" * (2 * len(VARIANTS) - 1)]
    result = []
    for k in kernels:
        for cond in ("quiet", "busy"):
            m = {v: median(times[(k, cond, v)]) for v in VARIANTS}
            result.append({"kernel": k, "condition": cond, "median_ms": m,
                           "runs_ms": {v: times[(k, cond, v)] for v in VARIANTS}})
            L.append(f"| {k} | {cond} | " + " | ".join(f"{m[v]:.2f}" for v in VARIANTS) + " | " +
                     " | ".join(f"{m[v] / m['static']:.2f}" for v in VARIANTS if v != "static") + " |")
    L.append("")
    for k in kernels:
        ratios = {v: median(times[(k, "busy", v)]) / median(times[(k, "quiet", v)]) for v in VARIANTS}
        L.append(f"- {k}: busy / quiet " + ", ".join(f"{r:.2f} {v}" for v, r in ratios.items()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "schedule_ab.md").write_text("\n".join(L) + "\n")
    (out / "schedule_ab.json").write_text(json.dumps({"rows": result, "load": load, "others_cores": others},
                                                     indent=1) + "\n")
    print("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
