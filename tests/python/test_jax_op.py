"""deuteron.jax.op inside jax.jit, both ways in (an XLA FFI custom call, a pure_callback),
checked against numpy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deuteron
import deuteron.jax
from conftest import rms_norm_ref, softmax_ref

VIAS = ["ffi", "pure_callback"]


def test_this_build_has_the_ffi_handler():
    # The package is built by a venv that has jax (python/requirements-pallas.txt).
    assert deuteron.jax.HAS_FFI and deuteron.jax.op(deuteron.catalogue["softmax"]).via == "ffi"


@pytest.mark.parametrize("via", VIAS)
def test_jit_softmax(via, rng):
    softmax = deuteron.jax.op(deuteron.catalogue["softmax"], via=via)
    x = rng.uniform(-4, 4, (37, 250)).astype(np.float32)
    got = jax.jit(lambda x: softmax(x * 2.0) + 1.0)(jnp.asarray(x))
    assert isinstance(got, jax.Array) and got.shape == (37, 250)
    np.testing.assert_allclose(np.asarray(got), softmax_ref(x * 2.0) + 1.0, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("via", VIAS)
def test_jit_two_outputs_and_a_static_scalar(via, rng):
    rms_norm = deuteron.jax.op(deuteron.catalogue["rms_norm"], via=via)
    x = rng.standard_normal((1, 129)).astype(np.float32)
    w = rng.standard_normal(129).astype(np.float32)
    for eps in (1e-5, 0.5):  # two values: two traced functions
        y, rstd = jax.jit(lambda x, w: rms_norm(x, w, eps))(jnp.asarray(x), jnp.asarray(w))
        want_y, want_rstd = rms_norm_ref(x, w, eps)
        np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(rstd), want_rstd, rtol=1e-5)


def test_jit_int_tensors(rng):
    add = deuteron.jax.op(deuteron.catalogue["add"])
    a = rng.integers(-1000, 1000, (5, 33)).astype(np.int32)
    b = rng.integers(-1000, 1000, (5, 33)).astype(np.int32)
    got = jax.jit(lambda a, b: add(a, b) * 2)(jnp.asarray(a), jnp.asarray(b))
    np.testing.assert_array_equal(np.asarray(got), (a.astype(np.int64) + b) * 2)


@pytest.mark.parametrize("via", VIAS)
def test_jit_int_scalar_with_int64_labels(via, rng):
    cross_entropy = deuteron.jax.op(deuteron.catalogue["cross_entropy"], via=via)
    logits = rng.uniform(-3, 3, (21, 40)).astype(np.float32)
    labels = rng.integers(0, 40, 21)
    labels[::3] = 7
    keep = labels != 7
    lse = np.log(np.exp(logits.astype(np.float64)).sum(axis=1))
    want = (lse - logits[np.arange(21), labels])[keep].mean()
    with jax.enable_x64(True):  # int64 labels
        loss = jax.jit(lambda l, t: cross_entropy(l, t, 7))(jnp.asarray(logits), jnp.asarray(labels, jnp.int64))
    np.testing.assert_allclose(np.asarray(loss)[0], want, rtol=1e-5)


def test_eval_shape_traces_without_running():
    rms_norm = deuteron.jax.op(deuteron.catalogue["rms_norm"])
    out = jax.eval_shape(lambda x, w: rms_norm(x, w, 1e-5), jax.ShapeDtypeStruct((8, 33), jnp.float32),
                         jax.ShapeDtypeStruct((33,), jnp.float32))
    assert out[0].shape == (8, 33) and out[1].shape == (8,)


def test_bfloat16(rng):
    x = jnp.asarray(rng.uniform(-4, 4, (3, 130)).astype(np.float32)).astype(jnp.bfloat16)
    want = softmax_ref(np.asarray(x, np.float32))
    kernel = deuteron.catalogue["softmax"]
    for y in (kernel(x), jax.jit(deuteron.jax.op(kernel, via="ffi"))(x)):
        assert isinstance(y, jax.Array) and y.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=1e-2, atol=1e-3)
    with pytest.raises(deuteron.ArgumentError, match="bfloat16 arrays cannot reach a kernel inside a pure_callback"):
        jax.jit(deuteron.jax.op(kernel, via="pure_callback"))(x)


def test_errors_at_trace_time_are_deuteron_errors():
    add = deuteron.jax.op(deuteron.catalogue["add"])
    with pytest.raises(deuteron.ArgumentError, match="same shape"):
        jax.jit(add)(jnp.ones((2, 3)), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="via must be"):
        deuteron.jax.op(deuteron.catalogue["add"], via="xla")
