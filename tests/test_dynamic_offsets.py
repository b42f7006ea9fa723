"""Views at a nonzero storage offset pass the offset as a runtime argument
(pj_tensor_desc_t.dyn_offset): one program serves x[i] at every i, for reads, writes through
the view and both in one op. Values and aliasing must be CPU's."""
import pytest
import torch

TPU = torch.device("tpu")


def _compiles(fn):
    torch.tpu.synchronize()
    before = torch.tpu.metrics()["compiles"]
    fn()
    torch.tpu.synchronize()
    return torch.tpu.metrics()["compiles"] - before


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
def test_a_loop_over_rows_compiles_once_and_matches_cpu(mode):
    g = torch.Generator().manual_seed(0)
    src, w = torch.randn(31, 5, generator=g), torch.randn(31, 5, generator=g)
    idx = torch.randint(7, (31,), generator=g)

    def run(dev):
        s, ww, ix = src.clone().to(dev), w.to(dev), idx.to(dev)  # run() writes into s
        out = torch.zeros(7, 5, device=dev)
        acc = torch.zeros(7, device=dev)
        for i in range(1, 31):
            out[ix[i]] += s[i] * ww[i]        # read views and an indexed write at offset i
            acc[ix[i]] += s[i].sum()
            s[i - 1].mul_(0.5)                # an in-place write through a view at offset i-1
        return out, acc, s

    want = run("cpu")
    with torch.tpu.eager_mode(mode):
        run(TPU)  # the first pass compiles one program per op kind
        n = _compiles(lambda: run(TPU))
        got = run(TPU)
    for w_, g_ in zip(want, got):
        torch.testing.assert_close(g_.cpu(), w_)
    if mode != "defer_and_fuse":  # fused graphs differ by where the loop is cut
        assert n == 0


def test_strided_and_dtype_views_at_offsets():
    base = torch.arange(60, dtype=torch.float32)
    t = base.to(TPU)
    for off in (1, 7, 13):
        for make in (lambda x: x[off:off + 12].view(3, 4).t(),
                     lambda x: x[off::5][:6],
                     lambda x: x[off:off + 8].view(torch.int32),
                     lambda x: x[off:off + 9].as_strided((3, 3), (1, 2), off)):
            torch.testing.assert_close(make(t).cpu(), make(base))
            assert (make(t) * 2).cpu().equal(make(base) * 2)
    # a write through a transposed view at an offset keeps the rest of the storage
    a, b = base.clone(), base.clone().to(TPU)
    for off in (2, 9):
        a[off:off + 12].view(3, 4).t().add_(100)
        b[off:off + 12].view(3, 4).t().add_(100)
    assert b.cpu().equal(a)


def test_offset_views_alias_their_storage():
    x = torch.zeros(10, device=TPU)
    v = x[3:6]
    v.fill_(2.0)
    v += 1
    assert x.cpu().tolist() == [0, 0, 0, 3, 3, 3, 0, 0, 0, 0]
    assert v.data_ptr() == x.data_ptr() + 3 * 4
