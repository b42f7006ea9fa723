"""Fake-tensor rules wider than CUDA's Meta kernels (torch_pjrt/fake_rules.py): torch.compile
traces torch._grouped_mm in float32 / float16 on tpu, as the eager tpu op runs it, with CPU's
values, gradients included; bfloat16 and CPU tensors keep the Meta kernel's rules."""
import pytest
import torch

import torch_pjrt  # noqa: F401

CASES = [((8, 8), (2, 8, 4), [3, 8]),      # 2-D x 3-D with offsets (MoE experts)
         ((2, 5, 8), (2, 8, 4), None),     # batched
         ((2, 8, 8), (8, 4), [3, 8])]      # 3-D x 2-D with offsets


@pytest.mark.parametrize("a_shape,b_shape,offs", CASES)
def test_grouped_mm_compiles_in_float32_like_cpu_eager(a_shape, b_shape, offs):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    a = torch.randn(*a_shape, generator=g)
    b = torch.randn(*b_shape, generator=g)
    o = torch.tensor(offs, dtype=torch.int32) if offs else None
    f = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, o).relu(), backend="tpu",
                      fullgraph=True)
    got = f(a.to("tpu"), b.to("tpu"), o.to("tpu") if o is not None else None)
    want = torch._grouped_mm(a, b, o).relu()
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_grouped_mm_training_gradients_match_cpu():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(8, 8, generator=g), torch.randn(2, 8, 4, generator=g)
    o = torch.tensor([3, 8], dtype=torch.int32)
    at, bt = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    a.requires_grad_(), b.requires_grad_()
    f = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, o).square().sum(), backend="tpu")
    f(at, bt, o.to("tpu")).backward()
    torch._grouped_mm(a, b, o).square().sum().backward()
    torch.testing.assert_close(at.grad.cpu(), a.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bt.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)


def test_other_dtypes_and_devices_keep_the_meta_kernel():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(8, 8, dtype=torch.int32, device="tpu")
        b = torch.empty(2, 8, 4, dtype=torch.int32, device="tpu")
        o = torch.empty(2, dtype=torch.int32, device="tpu")
        with pytest.raises(RuntimeError, match="BF16"):
            torch._grouped_mm(a, b, o)
        c = torch.empty(8, 8)
        with pytest.raises(RuntimeError, match="BF16"):
            torch._grouped_mm(c, torch.empty(2, 8, 4), torch.empty(2, dtype=torch.int32))
