#!/usr/bin/env python3
"""How Deuteron's CPU kernels scale: time against problem size, on one core and on two.

    python3 bench/scaling.py [--kernels softmax,matmul,attention] [--rounds 3] [--repeat 5]
                             [--tune never|auto] [--deuteron build/deuteron] [--out results/]

For softmax, matmul and attention, five sizes, each twice the work of the one before (16x from
the first to the last; none a multiple of a block size), timed with `deuteron run --json` on one
core (the process pinned to the first CPU, so the config is the one Deuteron picks for one core)
and on two, the two interleaved in --rounds rounds. Reports, per kernel and size, the median
time, the time per unit of work relative to the smallest size (1.0 everywhere: time grows as the
work does), the two-thread speedup, and any step where the time per unit of work jumps by more
than 1.3x (a cliff: a block that stopped fitting a cache). Then matmul 2048^3 in bf16 against f32
on two cores (--no-bf16 leaves it out), with the CPU's bf16 instructions (AVX512_BF16, AMX).
Writes scaling.md and scaling.json
under --out, and scaling.png when matplotlib is importable. Standard library otherwise; run
timing under the shared lock on a shared machine (`flock /tmp/deuteron-bench.lock ...`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# shape(size) and the work it does (flops; softmax: elements). Sizes double the work per step.
KERNELS = {
    "softmax": {"sizes": [1000, 2000, 4000, 8000, 16000],  # rows of 2560: 2.56M .. 41M elements
                "shape": lambda r: [r, 2560], "work": lambda s: s[0] * s[1], "unit": "element"},
    "matmul": {"sizes": [636, 801, 1009, 1271, 1602],  # n^3 doubles per step (x 2^(1/3))
               "shape": lambda n: [n, n, n], "work": lambda s: 2.0 * s[0] * s[1] * s[2], "unit": "flop"},
    "attention": {"sizes": [509, 720, 1019, 1441, 2037],  # S^2 doubles per step (x sqrt 2)
                  "shape": lambda q: [1, 8, q, 128], "work": lambda s: 4.0 * s[0] * s[1] * s[2] * s[2] * s[3],
                  "unit": "flop"},
}
CLIFF = 1.3
BF16_SHAPE = [2048, 2048, 2048]  # matmul, the catalogue's bench shape


def log(msg: str) -> None:
    print(f"[scaling {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return None if not n else xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def run(binary, kernel, shape, cpus, repeat, env, config=None, dtype="float32"):
    """One `deuteron run` pinned to `cpus`; its JSON object (or raises with its stderr)."""
    cmd = [binary, "run", kernel, "--shape", ",".join(map(str, shape)), "--dtype", dtype, "--json",
           "--repeat", str(repeat)]
    if config is not None:  # a timed run of the config the first (checked) run used
        cmd += ["--config", json.dumps(config, separators=(",", ":")), "--no-check"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800,
                       preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    for line in reversed(p.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()[-400:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", default="softmax,matmul,attention")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per deuteron run (default 5)")
    ap.add_argument("--tune", choices=["never", "auto"], default="never",
                    help="never (default): Deuteron's default configs; auto: tuned ones (tunes each size "
                         "and core count once, about a minute each)")
    ap.add_argument("--deuteron", default=str(REPO / "build" / "deuteron"))
    ap.add_argument("--out", default=str(REPO / "results"))
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="also time matmul 2048^3 in bf16 against f32 on two cores (default: yes)")
    args = ap.parse_args(argv)
    names = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = [k for k in names if k not in KERNELS]
    if unknown:
        ap.error(f"unknown kernels {unknown} (known: {', '.join(KERNELS)})")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error("needs two CPUs (one-thread and two-thread runs)")
    threads = {1: {cpus[0]}, 2: set(cpus[:2])}
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if args.tune == "never":
        env["DEUTERON_AUTOTUNE_EFFORT"] = "none"
    load_before = os.getloadavg()
    t_start = time.perf_counter()

    rows = []
    for k in names:
        spec = KERNELS[k]
        for size in spec["sizes"]:
            shape = spec["shape"](size)
            row = {"kernel": k, "shape": shape, "work": spec["work"](shape), "unit": spec["unit"], "threads": {}}
            configs, correct = {}, {}
            for t, cpu_set in threads.items():  # the first run compiles each config
                j = run(args.deuteron, k, shape, cpu_set, 2, env)
                configs[t], correct[t] = j["config"], j["correct"]
            times = {1: [], 2: []}
            for r in range(args.rounds):
                for t in ([1, 2] if r % 2 == 0 else [2, 1]):
                    times[t].append(run(args.deuteron, k, shape, threads[t], args.repeat, env, configs[t])["median_ms"])
            for t in threads:
                row["threads"][t] = {"median_ms": median(times[t]), "round_medians_ms": times[t],
                                     "config": configs[t], "correct": correct[t]}
            log(f"{k} {shape}: 1 thread {row['threads'][1]['median_ms']:.2f} ms, "
                f"2 threads {row['threads'][2]['median_ms']:.2f} ms")
            rows.append(row)

    # Time per unit of work, relative to the kernel's smallest size; cliffs between neighbours.
    for k in names:
        mine = [r for r in rows if r["kernel"] == k]
        for t in threads:
            base = mine[0]["threads"][t]["median_ms"] / mine[0]["work"]
            prev = None
            for r in mine:
                per = r["threads"][t]["median_ms"] / r["work"]
                r["threads"][t]["per_work_rel"] = per / base
                r["threads"][t]["cliff"] = prev is not None and per > CLIFF * prev
                prev = per
        for r in mine:
            r["speedup_2_over_1"] = r["threads"][1]["median_ms"] / r["threads"][2]["median_ms"]

    bf16 = bf16_against_f32(args, env, threads[2]) if args.bf16 else None
    result = {"rows": rows, "bf16": bf16, "meta": {
        "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv), "rounds": args.rounds,
        "repeat": args.repeat, "tune": args.tune, "cpus": cpus,
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.perf_counter() - t_start, 1)}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(result, indent=1) + "\n")
    plotted = not args.no_plot and write_plot(out / "scaling.png", result)
    write_markdown(out / "scaling.md", result, plotted)
    log(f"wrote {out / 'scaling.md'}, scaling.json" + (", scaling.png" if plotted else ""))
    correct = [v["correct"] for r in rows for v in r["threads"].values()]
    correct += [v["correct"] for v in bf16["dtypes"].values()] if bf16 else []
    return 0 if all(correct) else 1


def cpu_flags() -> set:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bf16_against_f32(args, env, cpus):
    """matmul at BF16_SHAPE in float32 and in bfloat16 on `cpus`, interleaved rounds."""
    out = {"kernel": "matmul", "shape": BF16_SHAPE, "dtypes": {}}
    for d in ("float32", "bfloat16"):
        j = run(args.deuteron, "matmul", BF16_SHAPE, cpus, 2, env, dtype=d)
        out["dtypes"][d] = {"config": j["config"], "correct": j["correct"], "round_medians_ms": []}
    for r in range(args.rounds):
        for d in (["float32", "bfloat16"] if r % 2 == 0 else ["bfloat16", "float32"]):
            v = out["dtypes"][d]
            v["round_medians_ms"].append(run(args.deuteron, "matmul", BF16_SHAPE, cpus, args.repeat, env,
                                             v["config"], dtype=d)["median_ms"])
    for v in out["dtypes"].values():
        v["median_ms"] = median(v["round_medians_ms"])
    out["bf16_speedup"] = out["dtypes"]["float32"]["median_ms"] / out["dtypes"]["bfloat16"]["median_ms"]
    flags = cpu_flags()
    out["avx512_bf16"], out["amx_bf16"] = "avx512_bf16" in flags, "amx_bf16" in flags
    log(f"matmul {BF16_SHAPE}: f32 {out['dtypes']['float32']['median_ms']:.2f} ms, "
        f"bf16 {out['dtypes']['bfloat16']['median_ms']:.2f} ms ({out['bf16_speedup']:.2f}x)")
    return out


def write_markdown(path, result, plotted):
    meta = result["meta"]
    L = ["# Deuteron CPU scaling: time against work, one and two threads", "",
         f"{meta['date']}; {meta['rounds']} interleaved rounds of `deuteron run --repeat {meta['repeat']}`, "
         f"medians; configs: {'tuned' if meta['tune'] == 'auto' else 'defaults'}; load average before "
         f"{meta['load_before']}, after {meta['load_after']}. \"time / work\": the time per unit of work over "
         f"the smallest size's (1.00: time grows exactly as the work does); **bold**: more than {CLIFF}x the "
         "size before it (a cliff).", "",
         "| kernel | shape | work | 1 thread ms | time / work | 2 threads ms | time / work | 2 threads speedup |",
         "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = [r["kernel"], "x".join(map(str, r["shape"])), f"{r['work']:.3g} {r['unit']}s"]
        for t in (1, 2):
            v = r["threads"][t]
            rel = f"{v['per_work_rel']:.2f}"
            cells += [f"{v['median_ms']:.2f}" + ("" if v["correct"] else " WRONG"),
                      f"**{rel}**" if v["cliff"] else rel]
        cells.append(f"{r['speedup_2_over_1']:.2f}x")
        L.append("| " + " | ".join(cells) + " |")
    b = result.get("bf16")
    if b:
        flops = 2.0 * b["shape"][0] * b["shape"][1] * b["shape"][2]
        yes = lambda f: "yes" if f else "no"
        L += ["", f"## bf16 against f32: matmul {'x'.join(map(str, b['shape']))}, two threads", "",
              "| dtype | ms | GFLOP/s |", "|---|---|---|"]
        for d, v in b["dtypes"].items():
            L.append(f"| {d} | {v['median_ms']:.2f}{'' if v['correct'] else ' WRONG'} | "
                     f"{flops / v['median_ms'] / 1e6:.0f} |")
        L += ["", f"bf16 runs **{b['bf16_speedup']:.2f}x** the speed of f32 (AVX512_BF16: {yes(b['avx512_bf16'])}, "
                  f"AMX-BF16: {yes(b['amx_bf16'])}; the bar where the CPU has AVX512_BF16: 1.8x)."]
    L += ["", f"Command: `{meta['command']}` ({meta['wall_s']:.0f} s)."]
    if plotted:
        L += ["", "![time against work, one and two threads](scaling.png)"]
    Path(path).write_text("\n".join(L) + "\n")


def write_plot(path, result):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return False
    kernels = list(dict.fromkeys(r["kernel"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(kernels), figsize=(4.5 * len(kernels), 4.2), squeeze=False)
    for ax, k in zip(axes[0], kernels):
        mine = [r for r in result["rows"] if r["kernel"] == k]
        work = [r["work"] for r in mine]
        for t, style in ((1, "o-"), (2, "s-")):
            ax.plot(work, [r["threads"][t]["median_ms"] for r in mine], style, label=f"{t} thread{'s' * (t > 1)}")
        # time proportional to work, through the smallest one-thread point
        w0, t0 = work[0], mine[0]["threads"][1]["median_ms"]
        ax.plot(work, [t0 * w / w0 for w in work], ":", color="gray", label="proportional to work")
        ax.set_xscale("log")
        ax.set_yscale("log")
        # Labels at the decades only: matplotlib's minor labels overlap on a short log axis.
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"work ({mine[0]['unit']}s)")
        ax.set_ylabel("median ms")
        ax.set_title(k)
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Deuteron CPU scaling, {result['meta']['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


if __name__ == "__main__":
    sys.exit(main())
