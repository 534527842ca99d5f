"""The catalogue kernels written as PyTorch and JAX functions, with Deuteron's exact inputs.

One `Spec` per catalogue entry (examples/*.cpp). For each:
  inputs(shape)  the arguments `deuteron run` makes (Entry::inputs with seed 1), bit for bit,
                 in the same order: numpy arrays for tensors, Python floats for scalars;
  torch(*args)   the same computation as ordinary PyTorch ops (the eager baseline; the same
                 function is given to torch.compile);
  jax(*args)     the same computation in jax.numpy (given to jax.jit);
  sdpa(*args)    attention only: torch's fused scaled_dot_product_attention.
Scalar arguments (eps) are bound as constants before compiling, as Deuteron specialises on them.
Functions return a tuple of outputs, in the order of the kernel's outputs.

`verified` says whether the spec was checked against the kernel's examples/*.cpp (input order,
ranges, seeds, semantics). The harness warns about unverified specs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from deuteron_rand import rand

SEED = 1  # tools/deuteron/main.cpp: e.inputs(shape, dt, 1)


@dataclass
class Spec:
    name: str
    inputs: Callable[[list[int]], list[Any]]
    torch: Callable[..., tuple]
    jax: Callable[..., tuple]
    sdpa: Optional[Callable[..., tuple]] = None
    # Tolerance for comparing an f32 output with the float64 evaluation of the same function:
    # |got - want| <= atol + rtol * |want| + ntol * max|want| (Deuteron's f32 default is rtol 1e-4,
    # atol 1e-5; ntol, relative to the output's largest value, covers long f32 sums whose
    # rounding error grows with the magnitude of the terms, not of the result).
    rtol: float = 1e-4
    atol: float = 1e-5
    ntol: float = 0.0
    verified: bool = True
    note: str = ""


SPECS: dict[str, Spec] = {}


def _register(spec: Spec) -> None:
    SPECS[spec.name] = spec


def _t():
    import torch
    return torch


def _F():
    import torch.nn.functional as F
    return F


def _jnp():
    import jax.numpy as jnp
    return jnp


def _jax():
    import jax
    return jax


# ---- add ----------------------------------------------------------------------------------

_register(Spec(
    name="add",
    inputs=lambda s: [rand(s, "float32", SEED), rand(s, "float32", SEED + 1)],
    torch=lambda x, y: (x + y,),
    jax=lambda x, y: (x + y,),
))

# ---- softmax family (examples/softmax.cpp, batch_softmax.cpp) -----------------------------
# The eager baseline is torch.softmax (PyTorch's own softmax op) for every variant: the
# variants differ in how Deuteron's kernel walks the row, not in what they compute.


def _softmax_inputs(s):
    return [rand(s, "float32", SEED, -4.0, 4.0)]


for _name in ("softmax", "softmax_decomposed", "softmax_two_pass", "batch_softmax"):
    _register(Spec(
        name=_name,
        inputs=_softmax_inputs,
        torch=lambda x: (_t().softmax(x, dim=-1),),
        jax=lambda x: (_jax().nn.softmax(x, axis=-1),),
    ))

# ---- cumsum (examples/cumsum.cpp) -----------------------------------------------------------

_register(Spec(
    name="cumsum",
    inputs=lambda s: [rand(s, "float32", SEED, 0.0, 1.0)],
    torch=lambda x: (_t().cumsum(x, dim=-1),),
    jax=lambda x: (_jnp().cumsum(x, axis=-1),),
))

# ---- layer norm, welford (examples/layer_norm.cpp, welford.cpp) ---------------------------


def _ln_torch(x, w, b, eps):
    return (_F().layer_norm(x, (x.shape[-1],), w, b, eps),)


def _ln_jax(x, w, b, eps):
    jnp, lax = _jnp(), _jax().lax
    mean = jnp.mean(x, axis=-1, keepdims=True)
    c = x - mean
    var = jnp.mean(c * c, axis=-1, keepdims=True)  # biased, as torch's layer_norm
    return (c * lax.rsqrt(var + eps) * w + b,)


_register(Spec(
    name="layer_norm",
    # x in [-1, 3), weight in [0.5, 1.5), bias in [-1, 1), eps = 1e-5
    inputs=lambda s: [rand(s, "float32", SEED, -1.0, 3.0), rand([s[1]], "float32", SEED + 1, 0.5, 1.5),
                      rand([s[1]], "float32", SEED + 2), 1e-5],
    torch=_ln_torch,
    jax=_ln_jax,
))

_register(Spec(
    name="welford",
    # argument order weight, bias, x; x in [3, 5); eps 1e-5 is a constant of the kernel
    inputs=lambda s: [rand([s[1]], "float32", SEED + 1, 0.5, 1.5), rand([s[1]], "float32", SEED + 2),
                      rand(s, "float32", SEED, 3.0, 5.0)],
    torch=lambda w, b, x: _ln_torch(x, w, b, 1e-5),
    jax=lambda w, b, x: _ln_jax(x, w, b, 1e-5),
))

# ---- rms_norm, rms_norm_bwd (examples/rms_norm.cpp) ---------------------------------------


def _rms_torch(x, w, eps):
    torch = _t()
    rstd = torch.rsqrt((x * x).mean(dim=-1) + eps)
    return (x * rstd.unsqueeze(-1) * w, rstd)


def _rms_jax(x, w, eps):
    jnp, lax = _jnp(), _jax().lax
    rstd = lax.rsqrt(jnp.mean(x * x, axis=-1) + eps)
    return (x * rstd[:, None] * w, rstd)


def _rms_bwd_inputs(s):
    import numpy as np
    x = rand(s, "float32", SEED)
    # rstd as the forward computes it, in double precision, rounded once to float32
    xd = x.astype(np.float64)
    rstd = (1.0 / np.sqrt((xd * xd).sum(axis=1) / s[1] + 1e-5)).astype(np.float32)
    return [rand(s, "float32", SEED + 1), x, rand([s[1]], "float32", SEED + 2, 0.5, 1.5), rstd]


def _rms_bwd_torch(gy, x, w, rstd):
    r = rstd.unsqueeze(1)
    c = (gy * w * x).mean(dim=1, keepdim=True)
    return (r * w * gy - x * (r * r * r) * c, (gy * x * r).sum(dim=0))


def _rms_bwd_jax(gy, x, w, rstd):
    jnp = _jnp()
    r = rstd[:, None]
    c = jnp.mean(gy * w * x, axis=1, keepdims=True)
    return (r * w * gy - x * (r * r * r) * c, jnp.sum(gy * x * r, axis=0))


_register(Spec(
    name="rms_norm",
    inputs=lambda s: [rand(s, "float32", SEED), rand([s[1]], "float32", SEED + 1, 0.5, 1.5), 1e-5],
    torch=_rms_torch,
    jax=_rms_jax,
))

_register(Spec(
    name="rms_norm_bwd",
    inputs=_rms_bwd_inputs,
    torch=_rms_bwd_torch,
    jax=_rms_bwd_jax,
    # grad_w sums 8192 rows: allow for f32 accumulation order
    rtol=1e-4, atol=1e-5, ntol=2e-5,
    note="the analytic gradient, as the kernel computes it (not autograd)",
))

# ---- swiglu, geglu (examples/glu.cpp) -----------------------------------------------------


def _glu_inputs(s):
    return [rand(s, "float32", SEED, -6.0, 6.0), rand(s, "float32", SEED + 1)]


_register(Spec(
    name="swiglu",
    inputs=_glu_inputs,
    torch=lambda a, b: (_F().silu(a) * b,),
    jax=lambda a, b: (_jax().nn.silu(a) * b,),
))

_register(Spec(
    name="geglu",
    inputs=_glu_inputs,
    torch=lambda a, b: (_F().gelu(a, approximate="tanh") * b,),
    jax=lambda a, b: (_jax().nn.gelu(a, approximate=True) * b,),
))

# ---- cross_entropy (examples/cross_entropy.cpp) -------------------------------------------


def _ce_inputs(s):
    labels = rand([s[0]], "int64", SEED + 1, 0.0, float(s[1]))
    labels[5::7] = -100  # padding rows, ignored (the catalogue's inputs do the same)
    return [rand(s, "float32", SEED, -4.0, 4.0), labels, -100]


def _ce_jax(logits, labels, ignore_index):
    jnp, jax = _jnp(), _jax()
    used = labels != ignore_index
    lse = jax.nn.logsumexp(logits, axis=-1)
    safe = jnp.where(used, labels, 0).astype(jnp.int32)
    picked = jnp.take_along_axis(logits, safe[:, None], axis=-1)[:, 0]
    return ((jnp.sum(jnp.where(used, lse - picked, 0.0)) / jnp.sum(used)).reshape(1),)


_register(Spec(
    name="cross_entropy",
    inputs=_ce_inputs,
    torch=lambda logits, labels, ignore_index: (
        _F().cross_entropy(logits, labels, ignore_index=ignore_index).reshape(1),),
    jax=_ce_jax,
    rtol=1e-4, atol=1e-4,
    note="JAX runs without x64, so its labels are int32 (V = 32000 fits)",
))

# ---- the matmul family (examples/matmul.cpp) -----------------------------------------------
# Shapes {M, K, N} or {B, M, K, N}; inputs in [-1, 1) with seeds in argument order (layer norm
# weight in [0.5, 1.5)); epilogue_subtiling's gelu is the exact (erf) one. Tolerances allow for
# f32 accumulation over K.
_MM_TOL = dict(rtol=1e-4, atol=1e-5, ntol=2e-5)

_register(Spec(
    name="matmul",
    inputs=lambda s: [rand([s[0], s[1]], "float32", SEED), rand([s[1], s[2]], "float32", SEED + 1)],
    torch=lambda x, y: (x @ y,),
    jax=lambda x, y: (_jnp().matmul(x, y, precision="highest"),),
    **_MM_TOL,
))

_register(Spec(
    name="bmm",
    inputs=lambda s: [rand([s[0], s[1], s[2]], "float32", SEED), rand([s[0], s[2], s[3]], "float32", SEED + 1)],
    torch=lambda a, b: (_t().bmm(a, b),),
    jax=lambda a, b: (_jnp().matmul(a, b, precision="highest"),),
    **_MM_TOL,
))

_register(Spec(
    name="broadcast_matmul",
    inputs=lambda s: [rand([s[0], s[1], s[2]], "float32", SEED), rand([s[2], s[3]], "float32", SEED + 1)],
    torch=lambda x, w: (x @ w,),
    jax=lambda x, w: (_jnp().matmul(x, w, precision="highest"),),
    **_MM_TOL,
))

_register(Spec(
    name="epilogue_subtiling",
    inputs=lambda s: [rand([s[0], s[1]], "float32", SEED), rand([s[1], s[2]], "float32", SEED + 1),
                      rand([s[2]], "float32", SEED + 2), rand([s[0], s[2]], "float32", SEED + 3)],
    torch=lambda x, w, bias, res: (_F().gelu(x @ w + bias + res),),
    jax=lambda x, w, bias, res: (_jax().nn.gelu(_jnp().matmul(x, w, precision="highest") + bias + res,
                                                approximate=False),),
    **_MM_TOL,
))

_register(Spec(
    name="matmul_layernorm",
    inputs=lambda s: [rand([s[0], s[1]], "float32", SEED), rand([s[1], s[2]], "float32", SEED + 1),
                      rand([s[2]], "float32", SEED + 2, 0.5, 1.5), rand([s[2]], "float32", SEED + 3)],
    torch=lambda x, y, w, b: _ln_torch(x @ y, w, b, 1e-5),
    jax=lambda x, y, w, b: _ln_jax(_jnp().matmul(x, y, precision="highest"), w, b, 1e-5),
    **_MM_TOL,
))

# ---- attention (examples/attention.cpp) ---------------------------------------------------
# q, k, v [B, H, S, D] in [-1, 1) (seeds 1, 2, 3); causal: key j <= query i. Eager is the plain
# composition (matmul, softmax, matmul); SDPA is PyTorch's fused kernel, an extra column.


def _attn_torch(q, k, v, causal=False):
    torch = _t()
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v,)


def _attn_jax(q, k, v, causal=False):
    jnp, jax = _jnp(), _jax()
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision="highest") * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[-2]
        s = jnp.where(jnp.triu(jnp.ones((n, n), dtype=bool), 1), -jnp.inf, s)
    return (jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v, precision="highest"),)


def _attn_sdpa(q, k, v, causal=False):
    return (_F().scaled_dot_product_attention(q, k, v, is_causal=causal),)


def _attn_inputs(s):
    return [rand(s, "float32", SEED), rand(s, "float32", SEED + 1), rand(s, "float32", SEED + 2)]


for _name, _causal in (("attention", False), ("attention_causal", True)):
    _register(Spec(
        name=_name,
        inputs=_attn_inputs,
        torch=(lambda c: lambda q, k, v: _attn_torch(q, k, v, c))(_causal),
        jax=(lambda c: lambda q, k, v: _attn_jax(q, k, v, c))(_causal),
        sdpa=(lambda c: lambda q, k, v: _attn_sdpa(q, k, v, c))(_causal),
        rtol=1e-4, atol=1e-5, ntol=2e-5,
    ))
