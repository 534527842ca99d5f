"""Catalogue kernels called on torch, jax and numpy arrays, against numpy references in float64:
ragged shapes (no multiple of any block size) and size 1; outputs of the caller's framework."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import deuteron
from conftest import rms_norm_ref, softmax_ref

SHAPES = [(1, 1), (1, 128), (7, 1), (37, 250), (130, 1000)]
FRAMEWORKS = {
    "numpy": (lambda a: a, np.ndarray, np.asarray),
    "torch": (torch.from_numpy, torch.Tensor, lambda t: t.numpy()),
    "jax": (jnp.asarray, jax.Array, np.asarray),
}


def test_catalogue_lists_kernels():
    assert {"softmax", "rms_norm", "cross_entropy", "matmul", "attention", "swiglu"} <= set(deuteron.catalogue)
    k = deuteron.catalogue["rms_norm"]
    assert k.arity == 3 and k.arg_names == ["x", "w", "eps"] and k.arg_kinds == ["Tensor", "Tensor", "float"]
    assert "rms_norm.cpp" in k.defined_at and "rsqrt" in k.summary
    assert deuteron.targets()[0] == "cpu"


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax(framework, shape, rng):
    make, kind, back = FRAMEWORKS[framework]
    x = rng.uniform(-4, 4, shape).astype(np.float32)
    y = deuteron.catalogue["softmax"](make(x))
    assert isinstance(y, kind)
    assert tuple(y.shape) == shape
    np.testing.assert_allclose(back(y), softmax_ref(x), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_rms_norm_two_outputs_and_a_float_scalar(framework, rng):
    make, kind, back = FRAMEWORKS[framework]
    x = rng.standard_normal((67, 333)).astype(np.float32)
    w = rng.standard_normal(333).astype(np.float32)
    y, rstd = deuteron.catalogue["rms_norm"](make(x), make(w), 1e-5)
    assert isinstance(y, kind) and isinstance(rstd, kind)
    want_y, want_rstd = rms_norm_ref(x, w, 1e-5)
    np.testing.assert_allclose(back(y), want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(back(rstd), want_rstd, rtol=1e-5)


@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_cross_entropy_int_scalar(ignore_index, rng):
    logits = rng.uniform(-3, 3, (29, 77)).astype(np.float32)
    labels = rng.integers(0, 77, 29)
    labels[::4] = ignore_index
    loss = deuteron.catalogue["cross_entropy"](torch.from_numpy(logits), torch.from_numpy(labels), ignore_index)
    keep = labels != ignore_index
    lse = np.log(np.exp(logits.astype(np.float64)).sum(axis=1))
    want = (lse - logits[np.arange(29), np.where(keep, labels, 0)])[keep].mean()
    assert loss.shape == (1,) and loss.dtype == torch.float32
    np.testing.assert_allclose(loss.numpy()[0], want, rtol=1e-5)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (13, 67, 29), (130, 70, 100)])
def test_matmul(m, k, n, rng):
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = rng.standard_normal((k, n)).astype(np.float32)
    got = deuteron.catalogue["matmul"](x, y)
    np.testing.assert_allclose(got, x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_bfloat16_torch(rng):
    x = torch.from_numpy(rng.uniform(-4, 4, (5, 300)).astype(np.float32)).to(torch.bfloat16)
    y = deuteron.catalogue["softmax"](x)
    assert y.dtype == torch.bfloat16
    np.testing.assert_allclose(y.float().numpy(), softmax_ref(x.float().numpy()), rtol=1e-2, atol=1e-3)


def test_outputs_are_not_copies_and_outlive_the_call(rng):
    x = torch.from_numpy(rng.uniform(-1, 1, (3, 5)).astype(np.float32))
    y = deuteron.catalogue["softmax"](x)
    view = np.from_dlpack(y)  # the same buffer, shared
    assert view.ctypes.data == y.data_ptr()
    del y
    np.testing.assert_allclose(view, softmax_ref(x.numpy()), rtol=2e-6)


def test_inputs_are_read_in_place(rng):
    x = torch.from_numpy(rng.uniform(-1, 1, (4, 9)).astype(np.float32))
    before = x.clone()
    deuteron.catalogue["softmax"](x)
    assert torch.equal(x, before)


def test_emit_config_and_tune(rng):
    softmax = deuteron.catalogue["softmax"]
    x = rng.uniform(-1, 1, (37, 250)).astype(np.float32)
    cpu = softmax.emit("cpu", x)
    assert "softmax" in cpu and "block_rows" in cpu
    assert "pallas_call" in softmax.emit("pallas", x)
    assert "@triton.jit" in softmax.emit("triton", x)
    before = softmax.config(x)  # the default, unless a run with this cache tuned it already
    assert before["origin"] in ("default", "cache") and "block_rows" in before["config"]
    r = softmax.tune(x, effort="quick", budget_s=5, retune=True)
    assert r["seconds"] > 0 and r["default_seconds"] > 0 and r["tried"] >= 1 and not r["from_cache"]
    if before["origin"] == "default":
        assert before["config"] == r["default"]
    assert softmax.config(x) == {"config": r["config"], "origin": "cache"}
    assert softmax.tune(x)["from_cache"]
    y = softmax.run(x, config=r["config"])
    np.testing.assert_allclose(y, softmax_ref(x), rtol=2e-6, atol=1e-7)


def test_run_on_another_target(rng):
    x = rng.uniform(-1, 1, (9, 20)).astype(np.float32)
    y = deuteron.catalogue["softmax"].run(x, target="pallas")  # TPU interpret mode here
    np.testing.assert_allclose(y, softmax_ref(x), rtol=1e-5, atol=1e-6)
