"""A transformer block's attention + rms_norm + swiglu through Deuteron kernels, from PyTorch.

    .venv/bin/python examples/python/transformer_block.py [--batch 1 --seq 256 --dim 512 --heads 8]
                                                          [--effort none|quick|full] [--rounds 15]

Pre-norm block:  h = x + attention(rms_norm(x)) @ wo;  out = h + swiglu(rms_norm(h) @ w1, rms_norm(h) @ w3) @ w2.
Every step is a catalogue kernel (matmul, rms_norm, attention, swiglu, add) called on torch tensors;
the same block in PyTorch (F.scaled_dot_product_attention, F.silu) is the reference. It checks the
two agree, then times each (median over interleaved rounds, same inputs, both on all cores,
OMP_WAIT_POLICY=passive unless set).
The first call of each shape picks its config: with --effort quick (the default) it tunes, which
takes a few minutes once; the configs are cached for the next run.
"""
import argparse
import os
import statistics
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1408, help="the feed-forward width")
    p.add_argument("--effort", default="quick", choices=["none", "quick", "full"])
    p.add_argument("--rounds", type=int, default=15)
    return p.parse_args()


args = parse()
os.environ["DEUTERON_AUTOTUNE_EFFORT"] = args.effort  # read by each kernel's first call of a shape
# Deuteron's kernels and PyTorch each run their own OpenMP thread pool. With OpenMP's default
# (active) waiting, one pool's threads spin on the cores after each call while the other's
# want them: interleaved, both measured 4-5x slower here. Passive waiting (read when OpenMP
# loads, so before the imports) lets each have the cores in turn.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import deuteron  # noqa: E402

K = deuteron.catalogue
EPS = 1e-6


def deuteron_block(x, p):
    b, s, d = x.shape
    hd = d // args.heads
    rows = x.reshape(b * s, d)
    h, _ = K["rms_norm"](rows, p["norm1"], EPS)
    qkv = K["matmul"](h, p["wqkv"])                                         # [b*s, 3d]
    # q, k, v as strided views [b, heads, s, hd] of qkv: Deuteron reads them in place.
    q, k, v = qkv.view(b, s, 3, args.heads, hd).permute(2, 0, 3, 1, 4).unbind(0)
    att = K["attention"](q, k, v)                                           # [b, heads, s, hd]
    att = att.permute(0, 2, 1, 3).reshape(b * s, d)
    h1 = K["add"](rows, K["matmul"](att, p["wo"]))
    n2, _ = K["rms_norm"](h1, p["norm2"], EPS)
    ff = K["swiglu"](K["matmul"](n2, p["w1"]).view(1, b * s, -1), K["matmul"](n2, p["w3"]).view(1, b * s, -1))
    out = K["add"](h1, K["matmul"](ff.view(b * s, -1), p["w2"]))
    return out.view(b, s, d)


def rms_norm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w


def torch_block(x, p):
    b, s, d = x.shape
    hd = d // args.heads
    rows = x.reshape(b * s, d)
    qkv = rms_norm(rows, p["norm1"]) @ p["wqkv"]
    q, k, v = qkv.view(b, s, 3, args.heads, hd).permute(2, 0, 3, 1, 4).unbind(0)
    att = F.scaled_dot_product_attention(q, k, v).permute(0, 2, 1, 3).reshape(b * s, d)
    h1 = rows + att @ p["wo"]
    n2 = rms_norm(h1, p["norm2"])
    out = h1 + (F.silu(n2 @ p["w1"]) * (n2 @ p["w3"])) @ p["w2"]
    return out.view(b, s, d)


def timed(fn, x, p, times):
    t0 = time.perf_counter()
    fn(x, p)
    times.append((time.perf_counter() - t0) * 1e3)


def main():
    torch.manual_seed(0)
    d, f = args.dim, args.hidden
    scale = d ** -0.5
    p = {
        "norm1": 1 + 0.1 * torch.randn(d), "norm2": 1 + 0.1 * torch.randn(d),
        "wqkv": torch.randn(d, 3 * d) * scale, "wo": torch.randn(d, d) * scale,
        "w1": torch.randn(d, f) * scale, "w3": torch.randn(d, f) * scale, "w2": torch.randn(f, d) * f ** -0.5,
    }
    x = torch.randn(args.batch, args.seq, d)
    print(f"block: batch {args.batch}, seq {args.seq}, dim {d}, heads {args.heads}, hidden {f}; "
          f"float32 on the CPU, {torch.get_num_threads()} torch threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}; "
          f"effort {args.effort}")

    t0 = time.perf_counter()
    got = deuteron_block(x, p)  # first calls: configs picked, kernels compiled
    print(f"first Deuteron call (tune/compile/load): {time.perf_counter() - t0:.1f} s")
    with torch.no_grad():
        want = torch_block(x, p)
    err = (got - want).abs().max().item()
    ok = torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    print(f"max |deuteron - torch| = {err:.3g} (scale {want.abs().max().item():.3g}): {'correct' if ok else 'WRONG'}")

    ours, theirs = [], []
    with torch.no_grad():
        for _ in range(args.rounds):  # interleaved, so both see the same machine load
            timed(deuteron_block, x, p, ours)
            timed(torch_block, x, p, theirs)
    mo, mt = statistics.median(ours), statistics.median(theirs)
    print(f"median over {args.rounds} rounds: deuteron {mo:.2f} ms (min {min(ours):.2f}, max {max(ours):.2f}), "
          f"pytorch eager {mt:.2f} ms (min {min(theirs):.2f}, max {max(theirs):.2f}); ratio {mo / mt:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
