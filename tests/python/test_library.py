"""A user's kernel library built with find_package(deuteron) and opened with deuteron.load()."""
import numpy as np
import pytest
import torch

import deuteron


def test_load_and_call(kernel_library, rng):
    assert set(kernel_library) == {"scale_shift", "row_stats", "mismatched"}
    scale_shift = kernel_library["scale_shift"]
    assert scale_shift.arg_names == ["x", "a", "b"] and "kernels.cpp" in scale_shift.defined_at
    x = rng.standard_normal((3, 130, 7)).astype(np.float32)
    got = scale_shift(torch.from_numpy(x), 2.5, -3)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), x.astype(np.float64) * 2.5 - 3, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 1), (130, 17)])
def test_two_outputs(kernel_library, shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    sums, maxes = kernel_library["row_stats"](x)
    np.testing.assert_allclose(sums, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(maxes, x.max(axis=1))


def test_library_kernel_errors_name_its_line(kernel_library):
    with pytest.raises(deuteron.ArgumentError) as e:
        kernel_library["row_stats"](np.ones(5, np.float32))
    assert "x must be 2-D" in e.value.message and "kernels.cpp" in e.value.where
    with pytest.raises(deuteron.KernelError) as e:
        kernel_library["mismatched"](np.ones((4, 5), np.float32), np.ones((4, 5), np.float32))
    source = open(__file__.replace("test_library.py", "kernel_library/kernels.cpp")).read().splitlines()
    line = next(i + 1 for i, text in enumerate(source) if "MISMATCHED_LINE" in text)
    assert e.value.where == f"kernels.cpp:{line}", str(e.value)


def test_emit_of_a_library_kernel(kernel_library):
    code = kernel_library["scale_shift"].emit("cpu", np.ones((4, 4), np.float32), 1.0, 2)
    assert "scale_shift" in code


def test_load_errors(tmp_path):
    with pytest.raises(deuteron.RuntimeError, match="cannot open the kernel library"):
        deuteron.load(tmp_path / "missing.so")
    with pytest.raises(deuteron.RuntimeError, match="has no deuteron_kernel_library") as e:
        deuteron.load("libm.so.6")
    assert "DEUTERON_KERNEL_LIBRARY" in e.value.hint
