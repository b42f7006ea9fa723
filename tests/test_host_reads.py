"""Views going to the host (csrc/bridge/copy.cpp, whole_storage_to_host): a view of a small
storage is read whole and its layout gathered on the host, with no program compiled for its
(shape, strides, offset); values, dtype, shape and conj bits as on CPU. Larger storages and
dtype-reinterpreting views still copy on the device first."""
import pytest
import torch

VIEWS = {
    "transpose": lambda x: x.transpose(0, 2),
    "slice-step-select": lambda x: x[1:4, ::2, 3],
    "expand": lambda x: x.expand(2, 6, 7, 5),
    "diagonal": lambda x: x.diagonal(dim1=0, dim2=1),
    "offset": lambda x: x[..., 2:],
    "unfold": lambda x: x.unfold(1, 3, 2),
    "flat-step": lambda x: x.flatten()[7::3],
    "zero-size": lambda x: x[:, 3:3],
}


@pytest.mark.parametrize("name", list(VIEWS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_view_to_host_matches_cpu_without_compiling(name, dtype):
    c = torch.randn(6, 7, 5).mul(4).to(dtype)
    t = c.to("tpu")
    torch.tpu.synchronize()
    m0 = torch.tpu.metrics()
    got = VIEWS[name](t).cpu()
    m1 = torch.tpu.metrics()
    exp = VIEWS[name](c)
    assert got.dtype == exp.dtype and got.shape == exp.shape and torch.equal(got, exp)
    assert m1["compiles"] == m0["compiles"]


def test_conj_and_neg_views_to_host():
    z = torch.randn(4, 3, dtype=torch.complex64)
    zt = z.to("tpu")
    assert torch.equal(zt.conj().t().cpu().resolve_conj(), z.conj().t().resolve_conj())
    assert torch.equal(zt.conj().imag.t().cpu().resolve_neg(), z.conj().imag.t().resolve_neg())


def test_dtype_reinterpreting_and_large_views_still_read_right():
    f = torch.randn(8, 4)
    ft = f.to("tpu")
    assert torch.equal(ft.view(torch.int32).t().cpu(), f.view(torch.int32).t())
    big = torch.randn(1200, 1000)  # 4.8 MB: above the whole-storage read bound
    bt = big.to("tpu")
    assert torch.equal(bt[::7, 3].cpu(), big[::7, 3])


def test_view_read_sees_pending_writes():
    t = torch.zeros(5, 4, device="tpu")
    v = t.t()
    t.add_(1)
    t[2].fill_(7)
    c = torch.zeros(5, 4)
    c.add_(1)
    c[2].fill_(7)
    assert torch.equal(v.cpu(), c.t())


def test_repeated_element_reads_see_every_write():
    # Reads of the same storage are served from a host snapshot from the second on
    # (whole_storage_to_host): a write in between must be seen, and a caller writing to what
    # it got must not change later reads.
    c = torch.arange(12.0).reshape(3, 4)
    t = c.to("tpu")
    assert [bool(v) for v in (t > 5).flatten()] == [bool(v) for v in (c > 5).flatten()]
    assert [float(v) for v in t.flatten()] == c.flatten().tolist()
    got = t[1].cpu()
    got += 100  # the caller's copy: later reads must not see it
    assert t[1].cpu().tolist() == c[1].tolist()
    t[1, 2] = -1.0
    c[1, 2] = -1.0
    assert t[1].cpu().tolist() == c[1].tolist() and t[1, 2].item() == -1.0
    t.add_(1)
    c.add_(1)
    assert [float(v) for v in t.flatten()] == c.flatten().tolist()
    assert all(t.flatten()[i].item() == c.flatten()[i].item() for i in range(12))
