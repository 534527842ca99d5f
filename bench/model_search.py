#!/usr/bin/env python3
"""Model-guided search against a full search (issue 12, item 4).

For each kernel: `deuteron tune --effort full` (the search it picks: exhaustive when the valid
space fits its 400 candidates, else pattern; --full-budget bounds it) and `deuteron tune --effort
quick --search model` (the model ranks every valid config, the top 8 and the default are
compiled and timed), each from a fresh cache folder (no compiled kernel or tuned config carried
over; the runner and the precompiled header are built first, outside the timings). Then the two
best configs are timed side by side (`deuteron run`, interleaved rounds, medians).

Reported per kernel: each search's wall time, compiles and timed runs; the time until it first
timed a config within 5% of its own best (from the candidates' `finished_s`); whether the model's
best is within 5% of the full search's best side by side; and the compiles and runs saved.
Writes results/model_search.md and .json. Standard library only.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from run_bench import deuteron_json, foreign_load, median  # noqa: E402


def log(msg: str) -> None:
    print(f"[model-search {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fresh_cache(args) -> str:
    """A cache folder of its own with the runner and precompiled header built (a tiny tune)."""
    d = tempfile.mkdtemp(prefix="deuteron-model-search-")
    env = dict(os.environ, DEUTERON_CACHE_DIR=d)
    roofline = Path(os.environ.get("DEUTERON_CACHE_DIR") or Path.home() / ".cache" / "deuteron")
    for f in roofline.glob("roofline-*.json"):  # the machine's measured roofline, so the model agrees
        shutil.copy(f, d)
    deuteron_json([args.deuteron, "tune", "add", "--shapes", "small", "--search", "random", "--max-candidates", "1",
                   "--json", "--no-warm-start"], 300, env)
    return d


def tune(args, kernel, cache, extra):
    cmd = [args.deuteron, "tune", kernel, "--shapes", args.shapes, "--json", "--retune", "--no-warm-start", *extra]
    j, wall, err = deuteron_json(cmd, args.full_budget * 3 + 300, dict(os.environ, DEUTERON_CACHE_DIR=cache))
    if j is None:
        raise RuntimeError(f"{' '.join(cmd)}: {err}")
    ok = [c for c in j["candidates"] if c["status"] == "ok"]
    best = min(c["median_s"] for c in ok)
    # The first time a config within 5% of this run's best screening median was known.
    first = min(c["finished_s"] for c in ok if c["median_s"] <= 1.05 * best)
    return {"search": j["search"], "note": j.get("search_note", ""), "elapsed_s": j["elapsed_s"], "wall_s": wall,
            "compiles": sum(1 for c in j["candidates"] if c["compiled"]), "runs": j["tried"], "pruned": j["pruned"],
            "best": j["best"], "best_s": j["best_s"], "time_to_5pct_s": first,
            "best_found_s": next(c["finished_s"] for c in j["candidates"] if c["config"] == j["best"])}


def side_by_side(args, kernel, configs):
    times = [[] for _ in configs]
    for _ in range(args.rounds):
        for i, c in enumerate(configs):
            j, _, err = deuteron_json([args.deuteron, "run", kernel, "--shapes", args.shapes, "--config", json.dumps(c),
                                       "--json", "--repeat", "5"], 600)
            if j is None or not j["correct"]:
                raise RuntimeError(f"deuteron run {kernel} --config {json.dumps(c)}: {err if j is None else 'wrong'}")
            times[i].append(j["median_ms"])
    return [median(t) for t in times]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", default="softmax,layer_norm,matmul,attention")
    ap.add_argument("--shapes", default="bench", choices=["small", "bench"])
    ap.add_argument("--full-budget", type=float, default=600, help="seconds the full search may take (its effort's 600)")
    ap.add_argument("--rounds", type=int, default=3, help="side-by-side rounds of the two best configs")
    ap.add_argument("--deuteron", default=str(REPO / "build" / "deuteron"))
    ap.add_argument("--out", default=str(REPO / "results"))
    args = ap.parse_args(argv)
    # A private copy of the binary: a rebuild during the run cannot change the model half way.
    snap = Path(tempfile.mkdtemp(prefix="deuteron-model-search-")) / "deuteron"
    shutil.copy2(args.deuteron, snap)
    args.deuteron = str(snap)

    rows = []
    for k in args.kernels.split(","):
        load0 = foreign_load(1.0)
        log(f"{k}: full search (at most {args.full_budget:.0f} s)")
        caches = [fresh_cache(args), fresh_cache(args)]
        try:
            full = tune(args, k, caches[0], ["--effort", "full", "--time-budget", str(args.full_budget)])
            log(f"{k}: full: {full['search']}, {full['elapsed_s']:.0f} s, {full['compiles']} compiles; model search")
            model = tune(args, k, caches[1], ["--effort", "quick", "--search", "model"])
            log(f"{k}: model: {model['elapsed_s']:.0f} s, {model['compiles']} compiles; side by side")
            full_ms, model_ms = side_by_side(args, k, [full["best"], model["best"]])
        except RuntimeError as e:
            log(f"{k}: {e}")
            rows.append({"kernel": k, "error": str(e)})
            continue
        finally:
            for c in caches:
                shutil.rmtree(c, ignore_errors=True)
        ratio = model_ms / full_ms
        row = {"kernel": k, "shapes": args.shapes, "full": full, "model": model, "full_best_ms": full_ms,
               "model_best_ms": model_ms, "model_over_full": ratio, "model_within_5pct": ratio <= 1.05,
               "compiles_saved": full["compiles"] - model["compiles"], "runs_saved": full["runs"] - model["runs"],
               "other_load_cores": max(load0, foreign_load(1.0))}
        rows.append(row)
        log(f"{k}: model best / full best = {ratio:.3f}; model {model['elapsed_s']:.0f} s vs full "
            f"{full['elapsed_s']:.0f} s (full within 5% of its best after {full['time_to_5pct_s']:.0f} s)")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python3 bench/model_search.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    (out / "model_search.json").write_text(json.dumps({"meta": meta, "kernels": rows}, indent=1) + "\n")
    lines = [f"# Model-guided search (`--search model`, quick) against the full search ({args.shapes} shapes)", "",
             f"{meta['date']}, command: `{meta['command']}`", "",
             "| kernel | full search | full: s, compiles, runs | full: s to within 5% of its best | model: s, compiles, "
             "runs | model: s to its best | model best / full best (side by side) | compiles saved | runs saved | "
             "other load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kernel']} | error: {r['error']} |||||||||")
            continue
        f, m = r["full"], r["model"]
        lines.append(f"| {r['kernel']} | {f['search']} | {f['elapsed_s']:.0f}, {f['compiles']}, {f['runs']} | "
                     f"{f['time_to_5pct_s']:.0f} | {m['elapsed_s']:.0f}, {m['compiles']}, {m['runs']} | "
                     f"{m['best_found_s']:.0f} | {r['model_over_full']:.3f} ({r['model_best_ms']:.4g} / "
                     f"{r['full_best_ms']:.4g} ms){'' if r['model_within_5pct'] else ' NOT within 5%'} | "
                     f"{r['compiles_saved']} | {r['runs_saved']} | {r['other_load_cores']:.2f} |")
    (out / "model_search.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {out}/model_search.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
