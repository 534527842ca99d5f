#!/usr/bin/env python3
"""Two configs of one kernel, paired: alternating rounds of `deuteron run --json`.

    python3 bench/config_ab.py matmul '<config A as JSON>' '<config B as JSON>' [--rounds 8] [--repeat 10]

Each round times both configs (`deuteron run KERNEL --config C --no-check --repeat N --json`,
its median), A first in even rounds and B first in odd ones, and prints B's time over A's. The
summary is the median of those per-round ratios and the rounds B won: on a shared machine whose
memory speed moves within minutes, only ratios taken side by side mean anything. Standard
library only.
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
    args = ap.parse_args()

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


if __name__ == "__main__":
    sys.exit(main())
