#!/usr/bin/env python3
"""Deuteron against PyTorch eager on one kernel, paired: one process, alternating rounds.

On a shared machine the speed moves by 10-30% within minutes, more than the gaps this is for
(a few percent between two GEMMs). Each round times Deuteron (through the Python package, its
cached or default config) and then the same computation in PyTorch eager (bench/kernels.py),
a few runs each; the ratio of the two medians is taken per round, and the median of those
ratios is printed: drift between rounds cancels, as it does not between separate runs.

    .venv/bin/python bench/paired.py bmm --rounds 12
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel")
    ap.add_argument("--shape", help="sizes, e.g. 8,512,512,512 (default: the catalogue's bench shape)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each side per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--deuteron", default=str(HERE.parent / "build" / "deuteron"), help="the CLI, for the bench shape")
    a = ap.parse_args()

    import torch
    import deuteron
    from kernels import SPECS

    torch.set_num_threads(a.threads)
    if a.shape:
        shape = [int(s) for s in a.shape.split(",")]
    else:
        listing = json.loads(subprocess.run([a.deuteron, "list", "--json"], capture_output=True, text=True, check=True).stdout)
        shape = next(e["bench_shape"] for e in listing if e["name"] == a.kernel)
    spec = SPECS[a.kernel]
    args = [torch.from_numpy(x) if hasattr(x, "dtype") else x for x in spec.inputs(shape)]
    kernel = deuteron.catalogue[a.kernel]
    ours, theirs = (lambda: kernel(*args)), (lambda: spec.torch(*args))
    ours(), theirs()  # compile, warm up
    ratios = []
    for r in range(a.rounds):
        d, t = median_ms(ours, a.runs), median_ms(theirs, a.runs)
        ratios.append(t / d)
        print(f"round {r + 1}: deuteron {d:.3f} ms, torch eager {t:.3f} ms, eager / deuteron {t / d:.3f}")
    print(f"{a.kernel} {shape}: median of the per-round ratios {statistics.median(ratios):.3f} "
          f"(> 1: Deuteron faster; range {min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
