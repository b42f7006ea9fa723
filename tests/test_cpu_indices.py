"""Advanced indexing of tpu tensors with index tensors on the CPU, as CUDA allows: aten::index
(x[idx]), index_put_ (x[idx] = v, accumulate too) and the boolean-mask forms move CPU indices to
the device (csrc/bridge/dispatch.cpp, indices_to_device), with no CPU fallback. Values, dtypes
and shapes against the same indexing on CPU, autograd through it, and the ops CUDA device-checks
(index_select, gather, scatter, take, masked_select, ...), which must still raise the
same-device RuntimeError."""
from __future__ import annotations

import pytest
import torch

TPU = torch.device("tpu")


def rnd(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def same(out: torch.Tensor, ref: torch.Tensor):
    assert out.device.type == "tpu"
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.cpu(), ref, atol=0, rtol=0)


I = torch.tensor  # noqa: E741  (short for index literals)

# (label, x shape, index tuple builder over a tpu-or-cpu "dev" for the mixed entries)
GETS = [
    ("long_2d", (6, 3), lambda d: (I([[0, 2], [4, 1]]),)),
    ("negative", (6, 3), lambda d: (I([-1, 0, -6]),)),
    ("int32", (6, 3), lambda d: (I([5, 1, 1], dtype=torch.int32),)),
    ("two_dims", (5, 4), lambda d: (I([0, 4, 2]), I([3, 0, 1]))),
    ("broadcast", (5, 4), lambda d: (I([[0], [4]]), I([1, 2, 3]))),
    ("slice_first", (3, 5, 4), lambda d: (slice(None), I([4, 0]))),
    ("slice_between", (3, 5, 4), lambda d: (I([2, 0]), slice(1, 4), I([3, 1]))),
    ("none_between", (3, 5), lambda d: (I([1, 2]), None, I([0, 4]))),
    ("none_first", (3, 5), lambda d: (None, I([2, 2, 0]))),
    ("ellipsis", (2, 3, 4), lambda d: (Ellipsis, I([3, 0]))),
    ("zero_d", (4, 3), lambda d: (I(2), I([0, 1]))),
    ("empty", (4, 3), lambda d: (I([], dtype=torch.long),)),
    ("mixed_cpu_tpu", (5, 4), lambda d: (I([0, 4, 2]), I([3, 0, 1]).to(d))),
    ("mixed_tpu_cpu_slice", (3, 5, 4), lambda d: (I([2, 0]).to(d), slice(None), I([3, 1]))),
    ("mask", (6, 3), lambda d: (I([True, False, True, True, False, True]),)),
    ("mask_2d", (3, 4), lambda d: (I([[True, False, False, True], [False] * 4,
                                      [True, True, False, True]]),)),
    ("mask_after_slice", (3, 4), lambda d: (slice(None), I([False, True, True, False]))),
    ("mask_none_true", (4, 2), lambda d: (I([False] * 4),)),
    ("mask_and_index", (4, 5), lambda d: (I([True, False, True, True]), I([0, 4, 2]))),
    ("mask_cpu_index_tpu", (4, 5), lambda d: (I([True, False, True, True]),
                                              I([0, 4, 2]).to(d))),
    ("tpu_mask_and_index", (4, 5), lambda d: (I([True, False, True, True]).to(d),
                                              I([0, 4, 2]).to(d))),
    ("tpu_mask_slice_index", (4, 3, 5), lambda d: (I([False, True, True, True]).to(d),
                                                   slice(None), I([[1], [4], [0]]).to(d))),
]


@pytest.mark.parametrize("case", GETS, ids=[c[0] for c in GETS])
def test_index_get(case, fallbacks):
    _, shape, build = case
    x = rnd(*shape)
    same(x.to(TPU)[build(TPU)], x[build("cpu")])
    fallbacks.assert_none()


def test_index_get_every_eager_mode(mode, fallbacks):
    x = rnd(6, 4)
    idx, mask = I([[5, 0], [2, 2]]), I([True, False, False, True, True, False])
    same(x.to(TPU)[idx], x[idx])
    same(x.to(TPU)[mask, 1:], x[mask, 1:])
    same(torch.ops.aten.index(x.to(TPU), [None, I([3, 1])]), torch.ops.aten.index(x, [None, I([3, 1])]))
    fallbacks.assert_none()


def test_index_out_and_unsafe_index(fallbacks):
    x, idx = rnd(5, 3), I([4, 0, 4])
    out = torch.empty(0, device=TPU)
    torch.ops.aten.index.Tensor_out(x.to(TPU), [idx], out=out)
    same(out, x[idx])
    same(torch.ops.aten._unsafe_index(x.to(TPU), [None, I([2, 0])]),
         torch.ops.aten._unsafe_index(x, [None, I([2, 0])]))
    fallbacks.assert_none()


def test_caller_indices_stay_on_cpu(fallbacks):
    idx, mask = I([1, 0]), I([True, False, True])
    x = rnd(3, 2).to(TPU)
    x[idx]
    x[mask] = 1.0
    assert idx.device.type == "cpu" and mask.device.type == "cpu"
    assert idx.tolist() == [1, 0] and mask.tolist() == [True, False, True]
    fallbacks.assert_none()


# (label, x shape, index tuple, value builder(shape of x[idx]) or a Python number)
PUTS = [
    ("long", (6, 3), (I([4, 0, 2]),), "tensor"),
    ("long_scalar", (6, 3), (I([4, 0, 2]),), 2.5),
    ("two_dims", (5, 4), (I([0, 4, 2]), I([3, 0, 1])), "tensor"),
    ("broadcast_value", (5, 4), (I([1, 3]),), "row"),
    ("slice_between", (3, 5, 4), (I([2, 0]), slice(1, 4), I([3, 1])), "tensor"),
    ("none_between", (3, 5), (I([1, 2]), None, I([0, 4])), "tensor"),
    ("ellipsis", (2, 3, 4), (Ellipsis, I([3, 0])), 7.0),
    ("mask", (6, 3), (I([True, False, True, True, False, True]),), "tensor"),
    ("mask_scalar", (6, 3), (I([True, False, True, True, False, True]),), -1.0),
    ("mask_2d_scalar", (3, 4), (I([[True, False, False, True], [False] * 4,
                                   [True, True, False, True]]),), 3.0),
    ("mask_after_slice", (3, 4), (slice(None), I([False, True, True, False])), "tensor"),
    ("mask_and_index", (4, 5), (I([True, False, True, True]), I([0, 4, 2])), "tensor"),
]


def value_for(spec, x, idx):
    if not isinstance(spec, str):
        return spec, spec
    shape = x[idx].shape
    v = rnd(*(shape[-1:] if spec == "row" else shape), seed=3)
    return v, v.to(TPU)


@pytest.mark.parametrize("case", PUTS, ids=[c[0] for c in PUTS])
def test_index_put(case, fallbacks):
    _, shape, idx, spec = case
    x = rnd(*shape)
    vc, vd = value_for(spec, x, idx)
    xd = x.to(TPU)
    x[idx] = vc
    xd[idx] = vd
    same(xd, x)
    fallbacks.assert_none()


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_tpu_mask_beside_other_indices(accumulate, mode, fallbacks):
    # the mask becomes its nonzero columns before the lowering, as CPU's expandTensors does
    x, v = rnd(4, 3, 5), rnd(3, 3, seed=1)
    m, j = I([True, False, True, True]), I([4, 0, 4])
    xd = x.to(TPU)
    torch.ops.aten.index_put_(xd, [m.to(TPU), None, j.to(TPU)], v.to(TPU), accumulate)
    torch.ops.aten.index_put_(x, [m, None, j], v, accumulate)
    same(xd, x)
    with pytest.raises(IndexError, match="could not be broadcast"):
        xd[m.to(TPU), :, I([1, 2]).to(TPU)] = 1.0
    fallbacks.assert_none()


def test_index_put_mixed_cpu_and_tpu_indices(fallbacks):
    x, v = rnd(5, 4), rnd(3, seed=1)
    i0, i1 = I([0, 4, 2]), I([3, 0, 1])
    xd = x.to(TPU)
    xd[i0, i1.to(TPU)] = v.to(TPU)
    x[i0, i1] = v
    same(xd, x)
    fallbacks.assert_none()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_index_put_accumulate(dtype, fallbacks):
    # repeated indices add up (or for bool); values on tpu or a CPU scalar tensor
    x = (rnd(6, 3) * 4).to(dtype)
    idx = (I([0, 5, 0, 2, 5, 0]),)
    v = (rnd(6, 3, seed=1) * 4).to(dtype)
    same(x.to(TPU).index_put_(idx, v.to(TPU), accumulate=True),
         x.clone().index_put_(idx, v, accumulate=True))
    s = torch.tensor(1, dtype=dtype)
    same(x.to(TPU).index_put_(idx, s, accumulate=True), x.clone().index_put_(idx, s, accumulate=True))
    mask = (I([True, False, True, False, False, True]),)
    same(x.to(TPU).index_put(mask, v[:3].to(TPU), accumulate=True),
         x.index_put(mask, v[:3], accumulate=True))
    fallbacks.assert_none()


def test_index_put_every_eager_mode(mode, fallbacks):
    x, v = rnd(6, 4), rnd(3, 4, seed=1)
    idx, mask = I([5, 1, 5]), I([True, False, False, True, True, False])
    xd = x.to(TPU)
    xd[idx] = v.to(TPU)
    xd[mask] = 0.5
    w = rnd(6, 2, seed=2)
    torch.ops.aten.index_put_(xd, [None, I([0, 3])], w.to(TPU), True)
    x[idx] = v
    x[mask] = 0.5
    torch.ops.aten.index_put_(x, [None, I([0, 3])], w, True)
    same(xd, x)
    fallbacks.assert_none()


def test_unsafe_index_put(fallbacks):
    x, v = rnd(5, 3), rnd(2, 3, seed=1)
    same(torch.ops.aten._unsafe_index_put(x.to(TPU), [I([3, 1])], v.to(TPU), True),
         torch.ops.aten._unsafe_index_put(x, [I([3, 1])], v, True))
    fallbacks.assert_none()


@pytest.mark.parametrize("kind", ["long", "duplicates", "mask", "two_dims_slice", "mask_and_index"])
def test_autograd_through_cpu_indices(kind, fallbacks):
    idx = {
        "long": (I([3, 0, 2]),),
        "duplicates": (I([[1, 1], [4, 1]]),),
        "mask": (I([True, False, True, True, False]),),
        "two_dims_slice": (I([4, 0]), slice(None), I([2, 1])),
        "mask_and_index": (I([True, False, True, True, False]), slice(None), I([0, 2, 2])),
    }[kind]
    x = rnd(5, 2, 3)
    xc, xd = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    yc, yd = (xc * 2)[idx], (xd * 2)[idx]
    same(yd.detach(), yc.detach())
    g = rnd(*yc.shape, seed=5)
    yc.backward(g)
    yd.backward(g.to(TPU))
    assert xd.grad.device.type == "tpu"
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)
    fallbacks.assert_none()


def test_autograd_through_index_put_with_cpu_indices(fallbacks):
    x, v = rnd(5, 3), rnd(3, 3, seed=1)
    idx = (I([4, 0, 4]),)
    grads = []
    for dev in ("cpu", TPU):
        xx, vv = x.to(dev, copy=True).requires_grad_(), v.to(dev, copy=True).requires_grad_()
        (xx * 1).index_put(idx, vv * 3, accumulate=True).square().sum().backward()
        grads.append((xx.grad.cpu(), vv.grad.cpu()))
    torch.testing.assert_close(grads[1], grads[0])
    fallbacks.assert_none()


def test_errors_like_cpu():
    # errors the indexing itself raises: the same exception type as on CPU
    x = rnd(4, 3)
    cases = [
        lambda t: t[I([True, False])],                       # mask shape mismatch
        lambda t: t[:, I([True, False, True, True])],        # ... in a later dim
        lambda t: t[I([0]), I([0]), I([0])],                 # too many indices
        lambda t: t[I([0, 1]), I([0, 1, 2])],                # indices that do not broadcast
        lambda t: t[I([0.0])],                               # float index
    ]
    for f in cases:
        with pytest.raises(Exception) as cpu_err:
            f(x)
        with pytest.raises(type(cpu_err.value)):
            f(x.to(TPU))


def test_put_value_on_cpu_raises():
    # a CPU value tensor with elements is a device mismatch on CUDA as well (only a 0-d one
    # travels as a scalar)
    x = rnd(4, 3).to(TPU)
    with pytest.raises(RuntimeError, match="same device"):
        x[I([0, 2])] = rnd(2, 3)


def test_debug_mode_checks_cpu_index_bounds():
    x = rnd(4, 3)
    torch.tpu.set_eager_mode("debug")
    try:
        with pytest.raises(IndexError):
            x.to(TPU)[I([0, 4])].cpu()
        with pytest.raises(IndexError):
            x.to(TPU)[I([-5])] = 1.0
    finally:
        torch.tpu.set_eager_mode("strict")


# Ops whose index or mask argument CUDA device-checks (their schemas have the generated device
# check, or their kernels compare devices): a CPU index raises there, so it raises here.
MUST_RAISE = [
    ("index_select", lambda x, i, m: torch.index_select(x, 0, i)),
    ("gather", lambda x, i, m: torch.gather(x, 0, i[:, None].expand(2, 3).contiguous())),
    ("scatter", lambda x, i, m: x.scatter(0, i[:, None].expand(2, 3).contiguous(), 1.0)),
    ("scatter_add", lambda x, i, m: x.scatter_add(0, i[:, None].expand(2, 3).contiguous(),
                                                  torch.ones(2, 3, device=x.device))),
    ("take", lambda x, i, m: torch.take(x, i)),
    ("put_", lambda x, i, m: x.put_(i, torch.ones(2, device=x.device))),
    ("index_add_", lambda x, i, m: x.index_add_(0, i, torch.ones(2, 3, device=x.device))),
    ("index_copy_", lambda x, i, m: x.index_copy_(0, i, torch.ones(2, 3, device=x.device))),
    ("index_fill_", lambda x, i, m: x.index_fill_(0, i, 2.0)),
    ("masked_select", lambda x, i, m: torch.masked_select(x, m)),
    ("masked_fill", lambda x, i, m: x.masked_fill(m, 2.0)),
    ("masked_scatter", lambda x, i, m: x.masked_scatter(m, torch.ones(4, 3, device=x.device))),
]


@pytest.mark.parametrize("case", MUST_RAISE, ids=[c[0] for c in MUST_RAISE])
def test_device_checked_ops_still_raise(case, fallbacks):
    _, f = case
    i, m = I([3, 1]), rnd(4, 3) > 0
    f(rnd(4, 3), i, m)  # valid on CPU: only the device differs
    with pytest.raises(RuntimeError, match="same device"):
        f(rnd(4, 3).to(TPU), i, m)
    fallbacks.assert_none()


@pytest.mark.parametrize("accumulate", [False, True])
def test_cpu_mask_put_one_program_for_every_count(accumulate):
    # x[cpu_mask] = v with a device value: the mask goes over whole, so masks with different
    # true counts share one program (its nonzero columns would key one program per count).
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 7, generator=g)
    xt = x.to(TPU)
    v = torch.tensor(2.5)
    vt = v.to(TPU)
    compiles = []
    for i in range(6):
        mask = torch.rand(5, 7, generator=g) > (i + 1) / 8
        x.index_put_((mask,), v, accumulate=accumulate)
        xt.index_put_((mask,), vt, accumulate=accumulate)
        same(xt, x)
        compiles.append(torch.tpu.metrics()["compiles"])
    assert compiles[1:] == [compiles[1]] * 5
