"""deuteron.torch.op: a torch.library custom op with a fake implementation, traced by
torch.compile (fullgraph: no graph break) and checked against eager PyTorch."""
import numpy as np
import torch

import deuteron
import deuteron.torch

rms_norm = deuteron.torch.op(deuteron.catalogue["rms_norm"])
softmax = deuteron.torch.op(deuteron.catalogue["softmax"])


def block(x, w):
    y, _ = rms_norm(x * 2.0, w, 1e-6)
    return softmax(y @ y.t()) + 1.0


def eager_block(x, w):
    y = x * 2.0
    y = y * torch.rsqrt((y * y).mean(-1, keepdim=True) + 1e-6) * w
    return torch.softmax(y @ y.t(), dim=-1) + 1.0


def test_custom_op_is_registered():
    assert hasattr(torch.ops.deuteron, "rms_norm")
    assert deuteron.torch.op(deuteron.catalogue["rms_norm"]) is rms_norm
    x, w = torch.randn(5, 7), torch.randn(7)
    torch.library.opcheck(rms_norm.op, (x, w, 1e-6))


def test_fake_implementation_gives_shapes_without_running():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y, rstd = rms_norm(torch.empty(33, 250), torch.empty(250), 1e-6)
        assert y.shape == (33, 250) and rstd.shape == (33,) and rstd.dtype == torch.float32


def test_torch_compile_matches_eager():
    torch.manual_seed(0)
    compiled = torch.compile(block, fullgraph=True)
    for shape in [(17, 130), (1, 5)]:
        x, w = torch.randn(*shape), torch.randn(shape[1])
        got = compiled(x, w)
        np.testing.assert_allclose(got.numpy(), eager_block(x, w).numpy(), rtol=1e-4, atol=1e-5)
