"""Selection, sorting, scanning and indexing ops (csrc/ops/select.c, index_reduce in index.c) on
tpu against PyTorch on CPU: values, indices (CPU's tie-breaking: median's stable rank, the index
kthvalue's quickselect leaves, mode's last occurrence, cummax/cummin's latest extreme), NaN
handling, dtypes and shapes, and no CPU fallback.
"""
from __future__ import annotations

import math

import pytest
import torch

TPU = torch.device("tpu")
NAN = float("nan")


def _to(obj, dev):
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, dev) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, dev) for k, v in obj.items()}
    return obj


def _same(actual, expected):
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _same(a, e)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor)
        assert actual.device.type == "tpu"
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, rtol=1.3e-6,
                                   atol=1e-5)
        return
    assert actual == expected


def check(fn, *args, **kwargs):
    expected = fn(*args, **kwargs)
    actual = fn(*_to(args, TPU), **_to(kwargs, TPU))
    _same(actual, expected)


def _ties(*shape, lo=-3, hi=4, nans=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(lo, hi, shape, generator=g).float()
    flat = x.view(-1)
    for i in torch.randperm(flat.numel(), generator=g)[:nans]:
        flat[i] = NAN
    return x


X_NAN = _ties(5, 9, nans=6)
X_TIES = _ties(6, 7, seed=1)


@pytest.fixture(autouse=True)
def _no_fallback(fallbacks):
    yield
    fallbacks.assert_none()


@pytest.mark.parametrize("op", ["median", "nanmedian"])
@pytest.mark.parametrize("x", [X_NAN, X_TIES.long(), X_TIES.bfloat16()],
                         ids=["nan", "int64_ties", "bf16_ties"])
def test_median(op, x):
    check(lambda t: getattr(t, op)(), x)
    check(lambda t: getattr(t, op)(1), x)
    check(lambda t: getattr(t, op)(0, keepdim=True), x)


def test_median_all_nan_and_scalar():
    x = torch.full((3, 4), NAN)
    check(lambda t: t.nanmedian(1), x)
    check(lambda t: t.nanmedian(), x)
    check(lambda t: t.median(), torch.tensor(2.5))
    check(lambda t: t.median(0), torch.tensor(2.5))


# each k compiles its own program: a few k per case keep this fast
@pytest.mark.parametrize("x,k", [(X_NAN, 8), (_ties(4, 30, seed=3).long(), 11)],
                         ids=["nan", "int64_long_rows"])
def test_kthvalue(x, k):
    check(lambda t: torch.kthvalue(t, k, 1), x)


def test_mode():
    check(lambda t: torch.mode(t, 1), X_TIES)
    v, i = torch.empty(0).to(TPU), torch.empty(0, dtype=torch.int64).to(TPU)
    torch.mode(X_TIES.to(TPU), 1, out=(v, i))  # mode.values' own kernel refuses other devices
    _same((v, i), tuple(torch.mode(X_TIES, 1)))
    check(lambda t: torch.mode(t, 0, True), X_TIES.long())
    check(lambda t: torch.mode(t), torch.tensor(3.0))
    check(lambda t: torch.mode(t), torch.tensor([2, 2, 2, 1, 1, 3, 3, 3]))


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_nan_and_sorter(right):
    s = torch.tensor([1.0, 2, 2, 3, NAN])
    v = torch.tensor([NAN, 2.0, 0, 5, -math.inf, math.inf, 2.5])
    check(lambda a, b: torch.searchsorted(a, b, right=right), s, v)
    check(lambda a, b: torch.bucketize(b, a, right=right), s, v)
    check(lambda a, b: torch.searchsorted(a, b, side="right" if right else "left",
                                          out_int32=True), s, v)
    srt = torch.randn(9)
    check(lambda a, b, c: torch.searchsorted(a, b, right=right, sorter=c), srt, torch.randn(4, 3),
          srt.argsort())
    rows = torch.randint(0, 6, (3, 7)).sort(1)[0]
    check(lambda a, b: torch.searchsorted(a, b, right=right), rows, torch.randint(-1, 8, (3, 5)))
    check(lambda a: torch.searchsorted(a, 3, right=right), rows[0])


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
@pytest.mark.parametrize("x", [X_NAN, X_TIES.long(), X_TIES.bfloat16()],
                         ids=["nan", "int64", "bf16"])
def test_cummax_cummin(op, x):
    check(lambda t: op(t, 1), x)
    check(lambda t: op(t, 0), x)


def test_logcumsumexp():
    inf = math.inf
    x = torch.tensor([[0.0, -inf, 1, inf, 2, NAN, 1], [-inf] * 7, [inf, inf, -inf, 3, 3, 3, 3]])
    check(lambda t: torch.logcumsumexp(t, 1), x)
    check(lambda t: torch.logcumsumexp(t, 0), torch.randn(33, 3))


def test_nonzero_static():
    x = torch.tensor([[0, 1, 1], [1, 0, 1]])
    for size in (0, 2, 4, 9):
        check(lambda t: torch.nonzero_static(t, size=size), x)
        check(lambda t: torch.nonzero_static(t, size=size, fill_value=7), x.float())


def test_equal():
    a = torch.randn(3, 4)
    assert torch.equal(a.to(TPU), a.clone().to(TPU)) is True
    b = a.clone()
    b[1, 2] += 1
    assert torch.equal(a.to(TPU), b.to(TPU)) is False
    n = torch.tensor([NAN, 1.0]).to(TPU)
    assert torch.equal(n, n) is False
    assert torch.equal(torch.tensor([1, 2]).to(TPU), torch.tensor([1.0, 2.0]).to(TPU)) is True
    assert torch.equal(torch.tensor([1, 2]).to(TPU), torch.tensor([[1, 2]]).to(TPU)) is False


@pytest.mark.parametrize("reduce,dtype", [("prod", torch.float32), ("mean", torch.float32),
                                          ("amax", torch.float32), ("amin", torch.float32),
                                          ("mean", torch.int64), ("amax", torch.int64)])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self, dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-9, 10, (5, 4), generator=g).to(dtype)
    src = torch.randint(-9, 10, (5, 6), generator=g).to(dtype)
    idx = torch.tensor([0, 3, 0, 1, 3, 3])
    check(lambda a, i, s: a.index_reduce(1, i, s, reduce, include_self=include_self), x, idx, src)
    if dtype == torch.float32:
        xs = x.clone()
        xs[0, 0] = NAN
        check(lambda a, i, s: a.index_reduce(1, i, s, reduce, include_self=include_self), xs, idx,
              src)


def test_kthvalue_keepdim_dim0():
    check(lambda t: torch.kthvalue(t, 2, 0, True), X_NAN)


def test_unique():
    x = torch.tensor([[3.0, 1, NAN], [2, NAN, 1]])
    check(lambda t: torch.unique(t), x)
    check(lambda t: torch.unique(t, return_inverse=True, return_counts=True), x)
    check(lambda t: torch.unique(t, sorted=False, return_counts=True), torch.randint(0, 5, (20,)))
    check(lambda t: torch.unique(t), torch.tensor([], dtype=torch.int64))


def test_unique_consecutive():
    x = torch.tensor([1, 1, 2, 2, 2, 1, 3, 3])
    check(lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True), x)
    check(lambda t: torch.unique_consecutive(t), torch.tensor([1.0, NAN, NAN, 1]))
    check(lambda t: torch.unique_consecutive(t, return_inverse=True), x.view(2, 4))


def test_bincount():
    x = torch.tensor([1, 3, 1, 0])
    check(lambda t: torch.bincount(t), x)
    check(lambda t: torch.bincount(t, minlength=7), x)
    check(lambda t, w: torch.bincount(t, w), x, torch.tensor([0.5, 1, 2, 3]))
    check(lambda t, w: torch.bincount(t, w), x, torch.tensor([5, 1, 2, 3]))
    with pytest.raises(RuntimeError):
        torch.bincount(torch.tensor([1, -1]).to(TPU))


def test_repeat_interleave_tensor():
    check(lambda t: torch.repeat_interleave(t), torch.tensor([1, 0, 3, 2]))
    check(lambda t, r: torch.repeat_interleave(t, r, dim=1), torch.randn(2, 3),
          torch.tensor([2, 0, 1]))
    check(lambda t: torch.repeat_interleave(t, output_size=6), torch.tensor([1, 0, 3, 2]))


@pytest.mark.parametrize("reduce", ["max", "min", "sum", "mean", "prod"])
def test_segment_reduce(reduce):
    d = torch.tensor([1.0, 5, -2, 4, NAN, 3, 2])
    check(lambda t, n: torch.segment_reduce(t, reduce, lengths=n), d, torch.tensor([2, 0, 3, 1, 1]))
    check(lambda t, n: torch.segment_reduce(t, reduce, lengths=n, initial=2.0), d,
          torch.tensor([2, 0, 3, 1, 1]))
    check(lambda t, o: torch.segment_reduce(t, reduce, offsets=o), d,
          torch.tensor([0, 2, 2, 5, 6, 7]))
    d2 = torch.arange(12.0).view(2, 6)
    check(lambda t, n: torch.segment_reduce(t, reduce, lengths=n, axis=1), d2,
          torch.tensor([[2, 4], [3, 3]]))
    check(lambda t, n: torch.segment_reduce(t, reduce, lengths=n, axis=0), d2.view(6, 2),
          torch.tensor([2, 0, 4]))


@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_scatter_index_reduce_nan_source(reduce):
    # XLA's scatter drops a NaN update under stablehlo.maximum/minimum; CPU keeps it
    x, i, s = torch.tensor([1.0, 2, 3]), torch.tensor([0, 0, 1, 2]), torch.tensor([NAN, 5, -1, 4])
    check(lambda a, b, c: a.scatter_reduce(0, b, c, reduce), x, i, s)
    check(lambda a, b, c: a.index_reduce(0, b, c, reduce), x, i, s)


def test_histc():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(4)) * 3
    check(lambda t: torch.histc(t, bins=7, min=-2, max=2.5), x)
    check(lambda t: torch.histc(t, bins=10), x)  # range from the data
    check(lambda t: torch.histc(t, bins=6), x.bfloat16())  # counts past 256
    check(lambda t: torch.histc(t, bins=4), torch.tensor([2.0, 2, 2]))  # empty range widened
    check(lambda t: torch.histc(t, bins=5, min=1, max=10), torch.tensor([1.0, 2, 3, 10, 11, NAN]))


def test_histogram():
    x = torch.randn(500, generator=torch.Generator().manual_seed(5)) * 3
    check(lambda t: torch.histogram(t, bins=7, range=(-2.0, 2.5)), x)
    check(lambda t, w: torch.histogram(t, bins=9, weight=w, density=True), x, torch.rand(500))
    check(lambda t, b: torch.histogram(t, bins=b), x, torch.tensor([-3.0, -1, 0, 0.5, 4]))
    check(lambda t: torch.histogram(t, bins=4), torch.tensor([2.0, 2, 2]))
    check(lambda t: torch.histogram(t, bins=2), torch.tensor([]))


def test_histogramdd():
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(6))
    check(lambda t: torch.histogramdd(t, bins=[4, 3, 5], density=True), x)
    check(lambda t: torch.histogramdd(t, bins=3, range=[-1.0, 1.0, 0.0, 2.0, -2.0, 0.0]), x)
    edges = [torch.tensor([-1.0, 0, 1]), torch.tensor([-2.0, 0.0, 0.5, 3])]
    expected = torch.histogramdd(x[:, :2], bins=edges)
    actual = torch.histogramdd(x[:, :2].to(TPU), bins=[e.to(TPU) for e in edges])
    _same(actual.hist, expected.hist)
    _same(actual.bin_edges, expected.bin_edges)


@pytest.mark.parametrize("reduce", ["max", "min", "sum", "mean", "prod"])
def test_segment_reduce_backward(reduce):
    # ties (max/min split the gradient), zeros (prod's exclusive products), an empty segment
    d = torch.tensor([1.0, 5, 5, 0, 4, 3, 0, 0, 2, 7, 1])
    for kw in ({"lengths": torch.tensor([3, 0, 2, 4, 2])}, {"offsets": torch.tensor([0, 3, 3, 5, 9, 11])},
               {"lengths": torch.tensor([3, 0, 2, 4, 2]), "initial": 2.0}):
        w = torch.randn(5, generator=torch.Generator().manual_seed(7))
        d1 = d.clone().requires_grad_()
        (torch.segment_reduce(d1, reduce, **kw) * w).sum().backward()
        d2 = d.clone().to(TPU).requires_grad_()
        (torch.segment_reduce(d2, reduce, **_to(kw, TPU)) * w.to(TPU)).sum().backward()
        torch.testing.assert_close(d2.grad.cpu(), d1.grad)


def test_index_fill_backward_unique():
    # index_fill's backward deduplicates the index with aten::_unique
    x = torch.randn(4, 3)
    check(lambda t: torch.ops.aten._unique(t, True, True), torch.tensor([3, 1, 2, 1]))
    a = x.clone().to(TPU).requires_grad_()
    a.index_fill(0, torch.tensor([0, 2, 0]).to(TPU), 1.5).sum().backward()
    b = x.clone().requires_grad_()
    b.index_fill(0, torch.tensor([0, 2, 0]), 1.5).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), b.grad)


def test_logcumsumexp_complex():
    inf = math.inf
    # large imaginary parts: CPU's sequential order decides the multiple of 2*pi they carry
    z = torch.randn(5, 5, 5, dtype=torch.complex64, generator=torch.Generator().manual_seed(8)) * 5
    check(lambda t: torch.logcumsumexp(t, 0), z)
    check(lambda t: torch.logcumsumexp(t, 2), z)
    x = torch.tensor([[complex(-inf, 1), complex(-inf, 2), 1 + 1j, complex(inf, 1), complex(inf, 2),
                       complex(NAN, 0), 1j]], dtype=torch.complex64)
    check(lambda t: torch.logcumsumexp(t, 1), x)


def test_topk_ties_like_cpu():
    # CPU's nth_element + insertion sort leave ties in a particular order (k * 64 > n)
    x = _ties(6, 10, lo=0, hi=4, nans=4, seed=9)
    check(lambda t: torch.topk(t, 3, 1), x)
    check(lambda t: torch.topk(t, 7, 1, largest=False, sorted=False), x)
    check(lambda t: torch.topk(t, 3, 0, largest=False), x.long())
