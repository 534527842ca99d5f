#!/usr/bin/env python3
"""The performance model against measured CPU times (issue 12, item 3).

For every catalogue kernel at its CPU bench shape (or --shapes small), the model's prediction
(`deuteron model --json`, no compile) and the measured median (`deuteron run --json`, checked
against the kernel's reference) of: the default config, the tuned config (`deuteron tune`:
the cache, else a measured pattern search), and --others configs drawn from the space with a
fixed seed (`deuteron model --sample N --seed S`: they lower, i.e. they fit the target). The
configs of a kernel are timed in interleaved rounds; each row's time is the median of its rounds.

Writes results/model_validation.md and .json: per row the predicted/measured ratio; over all
rows the median and worst ratio (worst: furthest from 1 either way); per kernel Spearman's rank
correlation of predicted and measured times and the pairwise concordance (the share of config
pairs the model orders as measured; above 0.5: right more often than not). The load other
processes put on the machine while each kernel was timed is reported with it.

Runs with the system's python3 (nothing beyond the standard library; Spearman's rho is a
dozen lines here rather than a dependency of a fresh clone).
"""
from __future__ import annotations

import argparse
import atexit
import datetime
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
from run_bench import deuteron_json, foreign_load, median  # noqa: E402  (the suite's own helpers)


def log(msg: str) -> None:
    print(f"[model-validation {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- statistics ----------------------------------------------------------------------------------

def ranks(xs):
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a, b):
    """Spearman's rank correlation (Pearson's r of the ranks); None when either side is constant."""
    if len(a) < 2:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else None


def concordance(pred, meas):
    """Share of pairs the prediction orders as the measurement does (a predicted tie: half)."""
    good = pairs = 0.0
    for i in range(len(pred)):
        for j in range(i + 1, len(pred)):
            if meas[i] == meas[j]:
                continue
            pairs += 1
            if pred[i] == pred[j]:
                good += 0.5
            elif (pred[i] < pred[j]) == (meas[i] < meas[j]):
                good += 1
    return good / pairs if pairs else None


def off_by(ratio):
    """How far a ratio is from 1, either way (2.0 for 0.5 and for 2)."""
    return max(ratio, 1 / ratio)


# ---- one kernel ----------------------------------------------------------------------------------

def model_of(args, kernel, shape_args, config=None):
    cmd = [args.deuteron, "model", kernel, *shape_args, "--json"]
    if config is not None:
        cmd += ["--config", json.dumps(config)]
    j, _, err = deuteron_json(cmd, 120)
    if j is None or not j.get("fits"):
        raise RuntimeError(f"deuteron model {kernel}: {err if j is None else j.get('why')}")
    return j


def validate_kernel(args, kernel, env):
    shape_args = ["--shapes", args.shapes]
    rows = [dict(model_of(args, kernel, shape_args), which="default")]
    shape = rows[0]["shape"]
    notes = []
    if args.tune != "never":
        cmd = [*args.timed_prefix, args.deuteron, "tune", kernel, *shape_args, "--json", "--search", "pattern",
               "--time-budget", str(args.tune_budget)]
        j, wall, err = deuteron_json(cmd, args.tune_budget * 3 + 120, env)
        if j is None:
            notes.append(f"tune failed: {err}")
        else:
            how = f"cache ({j.get('search')} search)" if j["from_cache"] else f"{j['search']} search, {wall:.0f} s"
            if j["best"] == rows[0]["config"]:
                notes.append(f"the tuned config is the default ({how})")
            else:
                rows.append(dict(model_of(args, kernel, shape_args, j["best"]), which=f"tuned: {how}"))
    sample, _, err = deuteron_json([args.deuteron, "model", kernel, *shape_args, "--sample", str(args.others),
                                    "--seed", str(args.seed), "--json"], 120)
    if sample is None:
        raise RuntimeError(f"deuteron model --sample: {err}")
    seen = {json.dumps(r["config"], sort_keys=True) for r in rows}
    for i, s in enumerate(sample["samples"]):
        if json.dumps(s["config"], sort_keys=True) not in seen:
            rows.append(dict(s, which=f"sample {i + 1}"))

    # Interleaved rounds: each config once per round, so that a burst of load hits them alike.
    load = []
    for r in rows:
        r["round_ms"] = []
    for rnd in range(args.rounds):
        load.append(foreign_load(0.5))
        for r in rows:
            if "error" in r:
                continue
            # Round 1 runs each config once (after `deuteron run`'s warm-up): a drawn config may take
            # seconds. Later rounds repeat it for about a second; one that took over 3 s is not run again.
            if rnd == 0:
                repeat = 1
            elif r["round_ms"][0] > 3000:
                continue
            else:
                repeat = max(1, min(args.repeat, int(1000 / r["round_ms"][0])))
            cmd = [*args.timed_prefix, args.deuteron, "run", kernel, *shape_args, "--config", json.dumps(r["config"]),
                   "--json", "--repeat", str(repeat)]
            j, _, err = deuteron_json(cmd, args.run_timeout, env)
            if j is None:
                r["error"] = err
                continue
            if not j["correct"]:
                r["error"] = f"wrong answer (max abs error {j['max_abs_err']:.3g})"
            r["round_ms"].append(j["median_ms"])
    load.append(foreign_load(0.5))
    out = []
    for r in rows:
        row = {"kernel": kernel, "shape": shape, "which": r["which"], "config": r["config"],
               "predicted_ms": r["predicted_ms"], "bound": r["bound"], "breakdown_ms": r["breakdown_ms"],
               "threads": r["config"].get("num_threads"),
               "round_ms": r["round_ms"], "measured_ms": median(r["round_ms"]) if r["round_ms"] else None}
        if "error" in r:
            row["error"] = r["error"]
        if row["measured_ms"] and "error" not in r:
            row["ratio"] = row["predicted_ms"] / row["measured_ms"]
        out.append(row)
    return out, kernel_summary(kernel, shape, out, median(load), notes)


def kernel_summary(kernel, shape, rows, load, notes):
    good = [r for r in rows if "ratio" in r]
    pred, meas = [r["predicted_ms"] for r in good], [r["measured_ms"] for r in good]
    return {"kernel": kernel, "shape": shape, "configs": len(good), "spearman": spearman(pred, meas),
            "concordance": concordance(pred, meas), "median_ratio": median([r["ratio"] for r in good]) if good else None,
            "other_load_cores": load, "notes": notes, "errors": [f"{x['which']}: {x['error']}" for x in rows if "error" in x]}


def rescore(args, saved):
    """The saved measurements against what the model predicts now (the same configs and shapes)."""
    rows, summaries = [], []
    for s in saved["kernels"]:
        mine = [r for r in saved["rows"] if r["kernel"] == s["kernel"] and r["shape"] == s["shape"]]
        for r in mine:
            j = model_of(args, r["kernel"], ["--shape", ",".join(map(str, r["shape"]))], r["config"])
            r.update(predicted_ms=j["predicted_ms"], bound=j["bound"], breakdown_ms=j["breakdown_ms"])
            if "ratio" in r:
                r["ratio"] = r["predicted_ms"] / r["measured_ms"]
        rows += mine
        summaries.append(kernel_summary(s["kernel"], s["shape"], mine, s["other_load_cores"], s["notes"]) if mine else s)
    return rows, summaries


# ---- reports -------------------------------------------------------------------------------------

def fmt(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def write_reports(out_dir: Path, result):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "model_validation.json").write_text(json.dumps(result, indent=1) + "\n")
    t = result["totals"]
    lines = [f"# The performance model against measured CPU times ({result['meta']['shapes']} shapes)", "",
             f"{result['meta']['date']}, {result['meta']['cpu']}, command: `{result['meta']['command']}`"
             + (f"; {result['meta']['measured']}" if "measured" in result["meta"] else ""), "",
             f"- rows: {t['rows']} (configs measured correctly), kernels: {t['kernels']}",
             f"- predicted / measured: median **{fmt(t['median_ratio'])}**, geometric mean {fmt(t['geomean_ratio'])}, "
             f"worst {fmt(t['worst_ratio'])} ({t['worst_row']}); within 1.25x either way: "
             f"{t['rows_within_1_25']} of {t['rows']} rows; goal (median within 1.25x): "
             f"{'met' if t['median_goal_met'] else 'NOT met'}",
             f"- rows at one thread (least disturbed by other processes): {t['rows_1_thread']}, median ratio "
             f"{fmt(t['median_ratio_1_thread'])}",
             f"- ranking: the model orders a kernel's configs right more often than not (concordance > 0.5) for "
             f"{t['kernels_ranked_right']} of {t['kernels_ranked']} kernels; median Spearman {fmt(t['median_spearman'])}",
             f"- other processes' load while timing: median {fmt(t['median_load'], '.2f')} cores, "
             f"max {fmt(t['max_load'], '.2f')} (of {os.cpu_count()})"
             + ("; timed at real-time priority (--realtime), so that load could not preempt the kernels"
                if result["meta"].get("realtime") else ""), "",
             "## Per kernel", "",
             "| kernel | shape | configs | median ratio | Spearman | concordance | other load | notes |",
             "|---|---|---|---|---|---|---|---|"]
    for s in result["kernels"]:
        lines.append(f"| {s['kernel']} | {'x'.join(map(str, s['shape']))} | {s['configs']} | {fmt(s['median_ratio'])} | "
                     f"{fmt(s['spearman'], '.2f')} | {fmt(s['concordance'], '.2f')} | "
                     f"{fmt(s['other_load_cores'], '.2f')} | {'; '.join(s['notes'] + s.get('errors', []))} |")
    lines += ["", "## Every row", "",
              "| kernel | config | threads | predicted ms | measured ms | ratio | bound | config JSON |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['kernel']} | {r['which']} | {r['threads'] or '-'} | {fmt(r['predicted_ms'], '.4g')} | "
                     f"{fmt(r['measured_ms'], '.4g')} | "
                     f"{fmt(r.get('ratio'))} | {r['bound']} | `{json.dumps(r['config'], sort_keys=True)}`"
                     f"{' ' + r['error'] if 'error' in r else ''} |")
    (out_dir / "model_validation.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", default="", help="comma-separated catalogue kernels (default: all)")
    ap.add_argument("--shapes", default="bench", choices=["small", "bench"])
    ap.add_argument("--others", type=int, default=3, help="configs drawn from the space besides default and tuned")
    ap.add_argument("--seed", type=int, default=1, help="seed of the drawn configs")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per config per round after the first (at most)")
    ap.add_argument("--run-timeout", type=float, default=300, help="seconds one `deuteron run` may take")
    ap.add_argument("--tune", default="auto", choices=["auto", "never"],
                    help="auto: also validate the tuned config (cached, else a pattern search of --tune-budget s)")
    ap.add_argument("--tune-budget", type=float, default=30)
    ap.add_argument("--realtime", action="store_true",
                    help="time at real-time priority (chrt -f 1, needs root or CAP_SYS_NICE), so other processes on a "
                    "shared machine cannot preempt the kernel's threads; the kernel still shares caches and memory")
    ap.add_argument("--deuteron", default=str(REPO / "build" / "deuteron"))
    ap.add_argument("--out", default=str(REPO / "results"))
    ap.add_argument("--rescore", metavar="JSON[,JSON...]", help="re-predict the rows of earlier model_validation.json "
                    "files (one table of them all) with this build's model, keeping their measured times (nothing is run)")
    args = ap.parse_args(argv)
    # A private copy of the binary: a rebuild during the run cannot change the model half way.
    snap = Path(tempfile.mkdtemp(prefix="deuteron-model-validation-")) / "deuteron"
    atexit.register(shutil.rmtree, snap.parent, ignore_errors=True)
    shutil.copy2(args.deuteron, snap)
    args.deuteron = str(snap)
    measured_at = None
    args.timed_prefix = []
    if args.realtime:
        args.timed_prefix = ["chrt", "-f", "1"]
        if shutil.which("chrt") is None or subprocess.run([*args.timed_prefix, "true"]).returncode != 0:
            ap.error("--realtime: `chrt -f 1` is not permitted here (it needs root or CAP_SYS_NICE); run without it")

    env = dict(os.environ)
    roofline = None
    if not args.rescore:
        # The model's CPU figures come from the roofline: measure it now, as the kernels will be.
        roofline, _, err = deuteron_json([*args.timed_prefix, args.deuteron, "roofline", "--remeasure", "--json"], 600, env)
        if roofline is None:
            log(f"deuteron roofline --remeasure failed ({err}); the model uses the cached figures")
    args.roofline = roofline
    listed = json.loads(subprocess.run([args.deuteron, "list", "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    kernels = [e["name"] for e in listed]
    if args.kernels:
        want = args.kernels.split(",")
        unknown = [k for k in want if k not in kernels]
        if unknown:
            ap.error(f"unknown kernels {unknown}; `deuteron list` names {kernels}")
        kernels = want

    rows, summaries = [], []
    if args.rescore:
        files = [json.loads(Path(f).read_text()) for f in args.rescore.split(",")]
        saved = {"kernels": [k for f in files for k in f["kernels"]], "rows": [r for f in files for r in f["rows"]]}
        rows, summaries = rescore(args, saved)
        kernels = []
        measured_at = ", ".join(f["meta"]["date"] for f in files)
    for k in kernels:
        log(f"{k}: predicting and timing {2 + args.others} configs x {args.rounds} rounds")
        try:
            r, s = validate_kernel(args, k, env)
        except RuntimeError as e:
            log(f"{k}: {e}")
            summaries.append({"kernel": k, "shape": [], "configs": 0, "spearman": None, "concordance": None,
                              "median_ratio": None, "other_load_cores": None, "notes": [str(e)]})
            continue
        rows += r
        summaries.append(s)
        log(f"{k}: median ratio {fmt(s['median_ratio'])}, Spearman {fmt(s['spearman'], '.2f')}, "
            f"concordance {fmt(s['concordance'], '.2f')}, other load {fmt(s['other_load_cores'], '.2f')} cores")
        write_all(args, argv, rows, summaries, measured_at)  # after each kernel: an interrupted run keeps its rows
    totals = write_all(args, argv, rows, summaries, measured_at)
    log(f"median ratio {fmt(totals['median_ratio'])}, worst {fmt(totals['worst_ratio'])} ({totals['worst_row']}); "
        f"{totals['kernels_ranked_right']} of {totals['kernels_ranked']} kernels ranked right; "
        f"wrote {args.out}/model_validation.md and .json")
    return 0


def write_all(args, argv, rows, summaries, measured_at):
    """The totals over `rows`, and the reports; returns the totals."""
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    worst = max((r for r in rows if "ratio" in r), key=lambda r: off_by(r["ratio"]), default=None)
    ranked = [s for s in summaries if s["concordance"] is not None]
    loads = [s["other_load_cores"] for s in summaries if s["other_load_cores"] is not None]
    spear = [s["spearman"] for s in summaries if s["spearman"] is not None]
    med = median(ratios) if ratios else None
    # One thread: the rows other processes disturb least (a 2-thread kernel waits for its slower thread).
    ratios_1 = [r["ratio"] for r in rows if "ratio" in r and r["threads"] == 1]
    totals = {"rows": len(ratios), "kernels": len(summaries), "median_ratio": med,
              "geomean_ratio": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
              "worst_ratio": worst["ratio"] if worst else None,
              "worst_row": f"{worst['kernel']} {worst['which']}" if worst else "-",
              "rows_within_1_25": sum(1 for x in ratios if off_by(x) <= 1.25),
              "rows_1_thread": len(ratios_1), "median_ratio_1_thread": median(ratios_1) if ratios_1 else None,
              "median_goal_met": med is not None and off_by(med) <= 1.25,
              "kernels_ranked": len(ranked), "kernels_ranked_right": sum(1 for s in ranked if s["concordance"] > 0.5),
              "median_spearman": median(spear) if spear else None,
              "median_load": median(loads) if loads else None, "max_load": max(loads) if loads else None}
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": platform.processor() or platform.machine(), "shapes": args.shapes,
            "command": "python3 bench/model_validation.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "deuteron": args.deuteron, "realtime": bool(getattr(args, "realtime", False)),
            "roofline": getattr(args, "roofline", None)}
    if measured_at:
        meta["measured"] = f"times measured {measured_at} (rescored: predictions of this build)"
    try:
        with open("/proc/cpuinfo") as f:
            meta["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    result = {"meta": meta, "totals": totals, "kernels": summaries, "rows": rows}
    write_reports(Path(args.out), result)
    return totals


if __name__ == "__main__":
    sys.exit(main())
