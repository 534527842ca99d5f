"""Errors reach Python as deuteron.Error subclasses with the C++ error's message, kernel line and
hint: wrong dtype, rank, arity, argument type and device; bad configs; kernel mistakes."""
import ctypes

import numpy as np
import pytest
import torch

import deuteron

softmax = deuteron.catalogue["softmax"]


def test_hierarchy():
    for cls in (deuteron.KernelError, deuteron.ArgumentError, deuteron.ConfigError, deuteron.CompileError,
                deuteron.RuntimeError):
        assert issubclass(cls, deuteron.Error)
    assert issubclass(deuteron.ArgumentError, ValueError)
    e = deuteron.KernelError("bad", "k.cpp:3", "fix it")
    assert str(e) == "error: bad\n  at k.cpp:3\n  hint: fix it" and e.where == "k.cpp:3"


def test_unsupported_dtype():
    with pytest.raises(deuteron.ArgumentError) as e:
        softmax(np.ones((2, 3), dtype=np.float64))
    assert "argument 0 ('x') of kernel 'softmax' has dtype float64" in e.value.message
    assert "float32" in e.value.hint


def test_numpy_bfloat16_is_refused_by_name():
    import ml_dtypes

    with pytest.raises(deuteron.ArgumentError, match="of dtype bfloat16 that does not hand itself over through DLPack"):
        softmax(np.ones((2, 3), dtype=ml_dtypes.bfloat16))


def test_tensor_that_requires_grad_is_read_without_autograd():
    x = torch.ones(2, 3, requires_grad=True)
    y = softmax(x)  # kernels have no backward: the output is a plain tensor
    assert not y.requires_grad and torch.allclose(y, torch.full((2, 3), 1 / 3))


def test_complex_dtype():
    with pytest.raises(deuteron.ArgumentError, match="dtype complex64"):
        softmax(torch.ones(2, 3, dtype=torch.complex64))


def test_wrong_rank():
    with pytest.raises(deuteron.KernelError) as e:
        deuteron.catalogue["matmul"](np.ones(3, np.float32), np.ones((3, 2), np.float32))
    assert "size(1) of a tensor with 1 dims" in e.value.message and "matmul.cpp:" in e.value.where


def test_mismatched_shapes():
    with pytest.raises(deuteron.ArgumentError) as e:
        deuteron.catalogue["matmul"](np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    assert "y's first dim is not x's second" in e.value.message and "matmul.cpp:" in e.value.where


def test_wrong_arity():
    with pytest.raises(deuteron.ArgumentError, match="kernel 'softmax' takes 1 arguments, got 2"):
        softmax(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))


def test_wrong_argument_type():
    with pytest.raises(deuteron.ArgumentError, match=r"argument 0 \('x'\) of kernel 'softmax' is a <class 'list'>"):
        softmax([[1.0, 2.0]])
    with pytest.raises(deuteron.ArgumentError, match="is a bool"):
        deuteron.catalogue["rms_norm"](np.ones((2, 3), np.float32), np.ones(3, np.float32), True)


def test_argument_check_of_the_kernel():
    # add: hl::expect(x.sizes() == y.sizes(), ...) in its host code
    with pytest.raises(deuteron.ArgumentError) as e:
        deuteron.catalogue["add"](np.ones((2, 3), np.float32), np.ones((3, 2), np.float32))
    assert "same shape" in e.value.message and "add.cpp" in e.value.where


def test_bad_config():
    with pytest.raises(deuteron.ConfigError) as e:
        softmax.run(np.ones((5, 7), np.float32), config={"block_rows": 3})
    assert "block_rows" in str(e.value)
    with pytest.raises(deuteron.ConfigError):
        softmax.run(np.ones((5, 7), np.float32), config={"no_such_tunable": 1})


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", ctypes.c_uint8 * 4), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class FakeCudaArray:
    """A DLPack producer that says its float32 [2, 3] lives on cuda:1 (no GPU is needed)."""

    def __init__(self):
        self.shape = (ctypes.c_int64 * 2)(2, 3)
        self.managed = _DLManaged()
        t = self.managed.dl_tensor
        t.data, t.device, t.ndim = 0x1000, _DLDevice(2, 1), 2
        t.dtype[:] = [2, 32, 1, 0]
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))

    def __dlpack_device__(self):
        return (2, 1)

    def __dlpack__(self, **kwargs):
        make = ctypes.pythonapi.PyCapsule_New
        make.restype, make.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return make(ctypes.addressof(self.managed), b"dltensor", None)


def test_device_that_is_not_the_cpu():
    with pytest.raises(deuteron.ArgumentError) as e:
        softmax(FakeCudaArray())
    assert "is on cuda (device 1)" in e.value.message and ".cpu()" in e.value.hint
