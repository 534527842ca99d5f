#!/usr/bin/env python3
"""Two configs of one kernel, paired: alternating rounds of `deuteron run --json`.

    python3 bench/config_ab.py matmul '<config A as JSON>' '<config B as JSON>' [--rounds 8] [--repeat 10]
    .venv/bin/python bench/config_ab.py matmul '<A>' '<B>' --in-process [--pairs 200]

Each round times both configs (`deuteron run KERNEL --config C --no-check --repeat N --json`,
its median), A first in even rounds and B first in odd ones, and prints B's time over A's. The
summary is the median of those per-round ratios and the rounds B won: on a shared machine whose
memory speed moves within minutes, only ratios taken side by side mean anything. Standard
library only.

--in-process pairs single calls instead, in one process, through the Python package (the
venv's; inputs from bench/kernels.py): call A then B (B then A in odd pairs), the ratio of each
pair, and the median of those. Where other tenants slow the host for seconds at a time (a Zen 3
in session 33: the same config 17-45 ms from one run of calls to the next), rounds of separate
processes straddle those phases and their ratios scatter; two calls a few ms apart mostly share one.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel")
    ap.add_argument("config_a")
    ap.add_argument("config_b")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=10, help="timed calls per run (default 10)")
    ap.add_argument("--shape", help="sizes (default: the kernel's bench shape)")
    ap.add_argument("--deuteron", default=str(REPO / "build" / "deuteron"))
    ap.add_argument("--in-process", action="store_true", help="pair single calls in this process (Python package)")
    ap.add_argument("--pairs", type=int, default=200, help="--in-process: pairs of calls (default 200)")
    args = ap.parse_args()
    if args.in_process:
        return in_process(args)

    def median_ms(config: str) -> float:
        cmd = [args.deuteron, "run", args.kernel, "--config", config, "--no-check", "--repeat", str(args.repeat), "--json"]
        if args.shape:
            cmd += ["--shape", args.shape]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"config_ab: {' '.join(cmd)} failed:\n{out.stderr}")
        return float(json.loads(out.stdout)["median_ms"])

    ratios = []
    for r in range(args.rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        ms = {side: median_ms(args.config_a if side == "a" else args.config_b) for side in order}
        ratios.append(ms["b"] / ms["a"])
        print(f"round {r}: A {ms['a']:.3f} ms, B {ms['b']:.3f} ms, B/A {ratios[-1]:.3f}", flush=True)
    wins = sum(x < 1 for x in ratios)
    print(f"median B/A {statistics.median(ratios):.3f}; B faster in {wins} of {len(ratios)} rounds")
    return 0


def in_process(args) -> int:
    import time

    import deuteron  # the venv's package: pip install . (scripts/test.sh installs it)

    sys.path.insert(0, str(REPO / "bench"))
    from kernels import SPECS

    if args.kernel not in SPECS:
        sys.exit(f"config_ab: no input recipe for {args.kernel!r} in bench/kernels.py")
    shape = args.shape
    if not shape:
        listing = subprocess.run([args.deuteron, "list", "--json"], capture_output=True, text=True, check=True)
        shape = next(e["bench_shape"] for e in json.loads(listing.stdout) if e["name"] == args.kernel)
    sizes = [int(x) for x in shape.split(",")] if isinstance(shape, str) else list(shape)
    kernel = deuteron.catalogue[args.kernel]
    inputs = SPECS[args.kernel].inputs(sizes)
    configs = [json.loads(args.config_a), json.loads(args.config_b)]
    for c in configs:  # compile, and warm the caches
        kernel.run(*inputs, config=c)
        kernel.run(*inputs, config=c)
    ms = ([], [])
    for p in range(args.pairs):
        for side in (0, 1) if p % 2 == 0 else (1, 0):
            t = time.perf_counter()
            kernel.run(*inputs, config=configs[side])
            ms[side].append((time.perf_counter() - t) * 1e3)
    ratios = [b / a for a, b in zip(*ms)]
    wins = sum(x < 1 for x in ratios)
    print(f"A median {statistics.median(ms[0]):.3f} ms, B median {statistics.median(ms[1]):.3f} ms "
          f"(single calls, each with the package's call overhead)")
    print(f"median B/A {statistics.median(ratios):.3f} over {len(ratios)} pairs; B faster in {wins}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
