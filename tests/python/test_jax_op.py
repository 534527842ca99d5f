"""deuteron.jax.op inside jax.jit (a pure_callback), checked against numpy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deuteron
import deuteron.jax
from conftest import rms_norm_ref, softmax_ref

softmax = deuteron.jax.op(deuteron.catalogue["softmax"])
rms_norm = deuteron.jax.op(deuteron.catalogue["rms_norm"])


def test_jit_softmax(rng):
    x = rng.uniform(-4, 4, (37, 250)).astype(np.float32)
    f = jax.jit(lambda x: softmax(x * 2.0) + 1.0)
    got = f(jnp.asarray(x))
    assert isinstance(got, jax.Array) and got.shape == (37, 250)
    np.testing.assert_allclose(np.asarray(got), softmax_ref(x * 2.0) + 1.0, rtol=1e-5, atol=1e-6)


def test_jit_two_outputs_and_a_static_scalar(rng):
    x = rng.standard_normal((1, 129)).astype(np.float32)
    w = rng.standard_normal(129).astype(np.float32)
    y, rstd = jax.jit(lambda x, w: rms_norm(x, w, 1e-5))(jnp.asarray(x), jnp.asarray(w))
    want_y, want_rstd = rms_norm_ref(x, w, 1e-5)
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(rstd), want_rstd, rtol=1e-5)


def test_eval_shape_traces_without_running():
    out = jax.eval_shape(lambda x, w: rms_norm(x, w, 1e-5), jax.ShapeDtypeStruct((8, 33), jnp.float32),
                         jax.ShapeDtypeStruct((33,), jnp.float32))
    assert out[0].shape == (8, 33) and out[1].shape == (8,)


def test_bfloat16_outside_jit_and_a_clear_error_inside(rng):
    x = jnp.asarray(rng.uniform(-4, 4, (3, 130)).astype(np.float32)).astype(jnp.bfloat16)
    y = deuteron.catalogue["softmax"](x)
    assert isinstance(y, jax.Array) and y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), softmax_ref(np.asarray(x, np.float32)), rtol=1e-2, atol=1e-3)
    with pytest.raises(deuteron.ArgumentError, match="bfloat16 arrays cannot reach a kernel inside a pure_callback"):
        jax.jit(softmax)(x)
