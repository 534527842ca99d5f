"""Non-contiguous inputs are read as their logical values: transposed, sliced with a step, offset,
reversed (negative strides), broadcast (stride 0). Each is checked against the reference of a
contiguous copy of the same view."""
import numpy as np
import pytest
import torch

import deuteron
from conftest import softmax_ref

softmax = deuteron.catalogue["softmax"]


def views(rng):
    base = rng.uniform(-4, 4, (41, 67)).astype(np.float32)
    t = torch.from_numpy(base)
    return {
        "torch transposed": t.t(),
        "torch every other column": t[:, ::2],
        "torch offset block": t[3:, 5:60],
        "torch expanded row": t[:1].expand(9, 67),
        "numpy transposed": base.T,
        "numpy step 3 rows": base[::3],
        "numpy reversed columns": base[:, ::-1],
        "numpy reversed both": base[::-1, ::-1],
        "numpy broadcast": np.broadcast_to(base[4], (6, 67)),
        "numpy size-1 dim with odd stride": base[2:3, ::5],
    }


@pytest.mark.parametrize("name", list(views(np.random.default_rng(0))))
def test_strided_view(name, rng):
    x = views(rng)[name]
    want = softmax_ref(np.ascontiguousarray(np.asarray(x)))
    got = softmax(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=1e-7)


def test_strided_second_argument(rng):
    a = rng.standard_normal((23, 31)).astype(np.float32)
    b = rng.standard_normal((31, 23)).astype(np.float32)
    got = deuteron.catalogue["matmul"](a, b.T.T[:, ::1])  # contiguous
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    bt = np.ascontiguousarray(b.T)  # [23, 31]; its transpose is a strided [31, 23]
    got = deuteron.catalogue["matmul"](a, bt.T)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
