"""Sparse COO and per-tensor affine quantized tensors on tpu (csrc/bridge/sparse_layout.cpp,
csrc/bridge/quantized_layout.cpp), each compared with the same calls on CPU: values, dtypes,
shapes, strides, layouts, aliasing of views, and the error types CPU raises."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

from conftest import TPU

# PyTorch warns that quantized dtypes are deprecated and that sparse invariant checks are off.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

QDTYPES = [torch.quint8, torch.qint8, torch.qint32]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sparse_parts_equal(dev: torch.Tensor, cpu: torch.Tensor) -> None:
    assert dev.device.type == "tpu" and dev.layout == torch.sparse_coo == cpu.layout
    assert dev.dtype == cpu.dtype and dev.shape == cpu.shape
    assert dev.sparse_dim() == cpu.sparse_dim() and dev.dense_dim() == cpu.dense_dim()
    assert dev._nnz() == cpu._nnz() and dev.is_coalesced() == cpu.is_coalesced()
    assert dev._indices().device.type == "tpu" and dev._values().device.type == "tpu"
    assert torch.equal(dev._indices().cpu(), cpu._indices())
    assert torch.equal(dev._values().cpu(), cpu._values())


# ---------------------------------------------------------------------------------- sparse COO


def _dense_sample(shape, dtype, seed=0):
    g = _gen(seed)
    x = torch.randint(-3, 4, shape, generator=g).to(dtype)
    keep = torch.rand(shape, generator=g) < 0.4
    return torch.where(keep, x, torch.zeros((), dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("shape", [(4, 3, 8, 8), (5, 7), (6,), ()], ids=str)
def test_to_sparse_matches_cpu(shape, dtype, fallbacks):
    x = _dense_sample(shape, dtype)
    got = x.to(TPU).to_sparse()
    _sparse_parts_equal(got, x.to_sparse())
    assert torch.equal(got.to_dense().cpu(), x)
    fallbacks.assert_none()


@pytest.mark.parametrize("sparse_dim", [1, 2])
def test_to_sparse_with_dense_dims(sparse_dim, fallbacks):
    x = _dense_sample((4, 3, 5), torch.float32, seed=1)
    x[1] = 0  # a slice with no nonzero: no entry for it
    got = x.to(TPU).to_sparse(sparse_dim)
    _sparse_parts_equal(got, x.to_sparse(sparse_dim))
    assert torch.equal(got.to_dense().cpu(), x)
    fallbacks.assert_none()


def test_to_sparse_of_zeros(fallbacks):
    _sparse_parts_equal(torch.zeros(3, 4, device=TPU).to_sparse(), torch.zeros(3, 4).to_sparse())
    _sparse_parts_equal(torch.zeros(3, 4, device=TPU).to_sparse(1),
                        torch.zeros(3, 4).to_sparse(1))
    fallbacks.assert_none()


def _uncoalesced(dense_shape=()):
    i = torch.tensor([[0, 1, 0, 1, 0], [2, 0, 2, 1, 2]])
    v = torch.arange(1, 6, dtype=torch.float32).reshape(5, *([1] * len(dense_shape)))
    v = v.expand(5, *dense_shape).contiguous() if dense_shape else v.reshape(5)
    return i, v, (2, 3, *dense_shape)


@pytest.mark.parametrize("dense_shape", [(), (2,)], ids=str)
def test_constructor_coalesce_to_dense_match_cpu(dense_shape, fallbacks):
    i, v, size = _uncoalesced(dense_shape)
    cpu = torch.sparse_coo_tensor(i, v, size)
    dev = torch.sparse_coo_tensor(i.to(TPU), v.to(TPU), size)
    _sparse_parts_equal(dev, cpu)
    assert not dev.is_coalesced()
    _sparse_parts_equal(dev.coalesce(), cpu.coalesce())
    assert torch.equal(dev.to_dense().cpu(), cpu.to_dense())  # duplicates add up
    # no size: inferred from the indices, as on CPU
    assert torch.sparse_coo_tensor(i.to(TPU), v.to(TPU)).shape == torch.sparse_coo_tensor(i, v).shape
    fallbacks.assert_none()


def test_bool_values_coalesce_like_cpu(fallbacks):
    i = torch.tensor([[0, 0, 1, 2, 2]])
    v = torch.tensor([True, True, False, False, True])
    cpu = torch.sparse_coo_tensor(i, v, (4,))
    dev = torch.sparse_coo_tensor(i.to(TPU), v.to(TPU), (4,))
    _sparse_parts_equal(dev.coalesce(), cpu.coalesce())
    assert torch.equal(dev.to_dense().cpu(), cpu.to_dense())
    fallbacks.assert_none()


def test_accessors_and_errors_match_cpu(fallbacks):
    i, v, size = _uncoalesced()
    cpu = torch.sparse_coo_tensor(i, v, size)
    dev = torch.sparse_coo_tensor(i.to(TPU), v.to(TPU), size)
    assert (dev._dimI(), dev._dimV()) == (cpu._dimI(), cpu._dimV())
    # indices()/values() need a coalesced tensor on both
    for fn in (lambda s: s.indices(), lambda s: s.values()):
        with pytest.raises(RuntimeError):
            fn(cpu)
        with pytest.raises(RuntimeError):
            fn(dev)
    c = dev.coalesce()
    assert torch.equal(c.indices().cpu(), cpu.coalesce().indices())
    assert torch.equal(c.values().cpu(), cpu.coalesce().values())
    with pytest.raises(RuntimeError, match="dtype argument is not supported"):
        dev.to_dense(dtype=torch.float64)
    with pytest.raises(RuntimeError, match="incompatible sizes"):
        torch.ones(2, 2, device=TPU).sparse_mask(dev)
    with pytest.raises(RuntimeError, match="must match backend"):
        torch.sparse_coo_tensor(i, v.to(TPU), size)
    fallbacks.assert_none()


def test_values_alias_and_clone_is_independent(fallbacks):
    x = _dense_sample((3, 4), torch.float32, seed=2)
    cpu, dev = x.to_sparse(), x.to(TPU).to_sparse()
    for s in (cpu, dev):
        s._values().mul_(2)  # _values() aliases the sparse tensor's values on both
    assert torch.equal(dev.to_dense().cpu(), cpu.to_dense())
    clone = dev.clone()
    _sparse_parts_equal(clone, cpu)
    clone._values().zero_()
    assert torch.equal(dev.to_dense().cpu(), cpu.to_dense())
    fallbacks.assert_none()


def test_empty_like_sparse(fallbacks):
    dev = torch.randn(4, 3, 8, 8, device=TPU).to_sparse()
    with pytest.raises(RuntimeError, match="memory format option is only supported by strided"):
        torch.empty_like(dev, memory_format=torch.preserve_format)
    like = torch.empty_like(dev)
    assert like.layout == torch.sparse_coo and like.device.type == "tpu"
    assert like.shape == dev.shape and like._nnz() == 0
    z = dev.clone().zero_()
    assert z._nnz() == 0 and z.shape == dev.shape
    fallbacks.assert_none()


def test_sparse_moves_between_devices(fallbacks):
    x = _dense_sample((5, 6), torch.float32, seed=3)
    cpu = x.to_sparse()
    _sparse_parts_equal(cpu.to(TPU), cpu)
    back = x.to(TPU).to_sparse().cpu()
    assert back.device.type == "cpu"
    assert torch.equal(back._indices(), cpu._indices()) and torch.equal(back._values(), cpu._values())
    assert x.to(TPU).to_sparse().double().dtype == torch.float64
    d = copy.deepcopy(x.to(TPU).to_sparse())
    _sparse_parts_equal(d, cpu)
    dst = torch.sparse_coo_tensor(size=(5, 6), device=TPU).copy_(x.to(TPU).to_sparse())
    _sparse_parts_equal(dst, cpu)
    fallbacks.assert_none()


def test_to_sparse_to_dense_backward_matches_cpu(fallbacks):
    x = _dense_sample((3, 4), torch.float32, seed=4)
    grads = []
    for dev in ("cpu", TPU):
        a = x.to(dev).detach().requires_grad_()
        (a.to_sparse().to_dense() * torch.arange(12.0).reshape(3, 4).to(dev)).sum().backward()
        grads.append(a.grad.cpu())
    assert torch.equal(grads[0], grads[1])
    fallbacks.assert_none()


def test_sparse_csr_is_refused_not_crashed():
    with pytest.raises(NotImplementedError):
        torch.randn(3, 3, device=TPU).to_sparse(layout=torch.sparse_csr)


# ------------------------------------------------------------------------------------ quantized


def _float_sample(shape, seed=0):
    g = _gen(seed)
    x = torch.randn(shape, generator=g) * 3
    flat = x.view(-1)
    if flat.numel() >= 8:
        # ties (round half to even), exact grid points, and values beyond every range
        flat[:8] = torch.tensor([0.25, 0.75, -0.25, 1.25, 0.0, 1e6, -1e6, 2.5])
    return x


@pytest.mark.parametrize("dtype", QDTYPES, ids=str)
def test_empty_affine_quantized_metadata(dtype, fallbacks):
    for shape in ([5, 5, 5, 5], [0, 2, 3], [3, 0, 2], []):
        cpu = torch._empty_affine_quantized(shape, scale=2, zero_point=3, dtype=dtype)
        dev = torch._empty_affine_quantized(shape, scale=2, zero_point=3, dtype=dtype, device=TPU)
        assert dev.device.type == "tpu" and dev.is_quantized
        assert (dev.dtype, dev.shape, dev.stride()) == (cpu.dtype, cpu.shape, cpu.stride())
        assert (dev.q_scale(), dev.q_zero_point(), dev.qscheme()) == (2.0, 3, torch.per_tensor_affine)
        assert dev.is_contiguous()
        like = torch.empty_like(dev)
        assert (like.dtype, like.q_scale(), like.q_zero_point()) == (dtype, 2.0, 3)
    fallbacks.assert_none()


@pytest.mark.parametrize("dtype", QDTYPES, ids=str)
@pytest.mark.parametrize("scale,zero_point", [(0.1, 10), (0.5, 0), (0.5, 3), (2.0, -3)])
def test_quantize_dequantize_match_cpu(dtype, scale, zero_point, fallbacks):
    if dtype == torch.quint8 and zero_point < 0:
        zero_point = 3
    x = _float_sample((6, 7))
    cpu = torch.quantize_per_tensor(x, scale, zero_point, dtype)
    dev = torch.quantize_per_tensor(x.to(TPU), scale, zero_point, dtype)
    assert (dev.dtype, dev.shape, dev.q_scale(), dev.q_zero_point()) == (
        cpu.dtype, cpu.shape, cpu.q_scale(), cpu.q_zero_point())
    ir = dev.int_repr()
    assert ir.device.type == "tpu" and ir.dtype == cpu.int_repr().dtype
    assert torch.equal(ir.cpu(), cpu.int_repr())
    deq = dev.dequantize()
    assert deq.dtype == torch.float32 and deq.device.type == "tpu"
    torch.testing.assert_close(deq.cpu(), cpu.dequantize(), rtol=1e-6, atol=0)
    # the tensor-qparams overload
    dev2 = torch.quantize_per_tensor(x.to(TPU), torch.tensor(scale, device=TPU),
                                     torch.tensor(zero_point, device=TPU), dtype)
    assert torch.equal(dev2.int_repr().cpu(), cpu.int_repr())
    fallbacks.assert_none()


def _check_view(dev_view, cpu_view, dev_base):
    assert dev_view.is_quantized and dev_view.device.type == "tpu"
    assert (dev_view.shape, dev_view.stride(), dev_view.storage_offset()) == (
        cpu_view.shape, cpu_view.stride(), cpu_view.storage_offset())
    assert dev_view.untyped_storage().data_ptr() == dev_base.untyped_storage().data_ptr()
    assert dev_view.qscheme() == cpu_view.qscheme()
    if cpu_view.qscheme() == torch.per_tensor_affine:
        assert (dev_view.q_scale(), dev_view.q_zero_point()) == (
            cpu_view.q_scale(), cpu_view.q_zero_point())
    else:
        assert dev_view.q_per_channel_axis() == cpu_view.q_per_channel_axis()
        assert torch.equal(dev_view.q_per_channel_scales().cpu(), cpu_view.q_per_channel_scales())
    assert torch.equal(dev_view.int_repr().cpu(), cpu_view.int_repr())


VIEWS = {
    "view": lambda t: t.view(-1),
    "view_2d": lambda t: t.view(6, 10),
    "reshape": lambda t: t.reshape(3, 20),
    "flatten": lambda t: t.flatten(1, 2),
    "ravel": lambda t: t.ravel(),
    "transpose": lambda t: t.transpose(0, 2),
    "permute": lambda t: t.permute(2, 0, 1),
    "select": lambda t: t[1],
    "slice": lambda t: t[:, 1:3],
    "unsqueeze": lambda t: t.unsqueeze(1),
    "as_strided": lambda t: t.as_strided((2, 5), (7, 2), 3),
    "unfold": lambda t: t.unfold(2, 2, 1),
    "detach": lambda t: t.detach(),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_quantized_views_match_cpu(name, fallbacks):
    x = _float_sample((3, 4, 5), seed=5)
    cpu = torch.quantize_per_tensor(x, 0.1, 10, torch.quint8)
    dev = torch.quantize_per_tensor(x.to(TPU), 0.1, 10, torch.quint8)
    dv, cv = VIEWS[name](dev), VIEWS[name](cpu)
    _check_view(dv, cv, dev)
    assert (dv._base is dev) == (cv._base is cpu)
    fallbacks.assert_none()


def test_writes_through_a_quantized_view_reach_the_base(fallbacks):
    x = _float_sample((4, 6), seed=6)
    results = []
    for dev in ("cpu", TPU):
        q = torch.quantize_per_tensor(x.to(dev), 0.25, 4, torch.qint8)
        q[1].fill_(1.0)
        q.t()[2][1:3].copy_(torch.quantize_per_tensor(torch.ones(2).to(dev), 0.25, 4, torch.qint8))
        q[2:].copy_(torch.quantize_per_tensor(torch.ones(2, 6).to(dev), 0.25, 4, torch.qint8))
        results.append(q.int_repr().cpu())
    assert torch.equal(results[0], results[1])
    fallbacks.assert_none()


def test_ravel_and_flatten_of_noncontiguous_copy(fallbacks):
    x = _float_sample((5, 5), seed=7)
    cpu = torch.quantize_per_tensor(x, 2.0, 3, torch.quint8)
    dev = torch.quantize_per_tensor(x.to(TPU), 2.0, 3, torch.quint8)
    for fn in (lambda t: t.t().ravel(), lambda t: t.t().flatten(), lambda t: t.t().contiguous()):
        d, c = fn(dev), fn(cpu)
        assert d._base is not dev and d.is_contiguous()
        assert (d.shape, d.stride()) == (c.shape, c.stride())
        assert torch.equal(d.int_repr().cpu(), c.int_repr())
    with pytest.raises(IndexError, match="Dimension out of range"):
        dev.flatten(5, 10)
    with pytest.raises(RuntimeError, match="start_dim cannot come after end_dim"):
        dev.flatten(1, 0)
    fallbacks.assert_none()


@pytest.mark.parametrize("dtype", QDTYPES, ids=str)
def test_quantized_copies_between_devices(dtype, fallbacks):
    x = _float_sample((4, 5), seed=8)
    cpu = torch.quantize_per_tensor(x, 0.5, 2, dtype)
    up = cpu.to(TPU)
    assert up.device.type == "tpu" and up.dtype == dtype
    assert (up.q_scale(), up.q_zero_point()) == (0.5, 2)
    assert torch.equal(up.int_repr().cpu(), cpu.int_repr())
    down = torch.quantize_per_tensor(x.to(TPU), 0.5, 2, dtype).cpu()
    assert down.device.type == "cpu" and torch.equal(down.int_repr(), cpu.int_repr())
    assert (down.q_scale(), down.q_zero_point()) == (0.5, 2)
    # a quantized destination takes the source's parameters (copy_ on CPU does the same)
    dst = torch._empty_affine_quantized([4, 5], scale=9.0, zero_point=1, dtype=dtype, device=TPU)
    dst.copy_(up)
    assert (dst.q_scale(), dst.q_zero_point()) == (0.5, 2)
    assert torch.equal(dst.int_repr().cpu(), cpu.int_repr())
    # float into quantized: quantized with the destination's parameters
    qd = torch._empty_affine_quantized([4, 5], scale=0.5, zero_point=2, dtype=dtype, device=TPU)
    qd.copy_(x.to(TPU))
    assert torch.equal(qd.int_repr().cpu(), cpu.int_repr())
    fallbacks.assert_none()


def test_quantized_copy_errors_match_cpu():
    x = _float_sample((3, 3), seed=9)
    for dev in ("cpu", TPU):
        q = torch.quantize_per_tensor(x.to(dev), 0.5, 2, torch.quint8)
        with pytest.raises(RuntimeError, match="only works with contiguous"):
            q.t()[1].fill_(1.0)
        with pytest.raises(RuntimeError, match="only works with kFloat"):
            q.copy_(x.double().to(dev))
        with pytest.raises(RuntimeError, match="Copying from quantized Tensor to non-quantized"):
            torch.empty(3, 3, device=dev).copy_(q)
        other = torch._empty_affine_quantized([3, 3], scale=1, zero_point=0, dtype=torch.qint8,
                                              device=dev)
        with pytest.raises(RuntimeError):
            other.copy_(q)


def test_quantized_equal_matches_cpu(fallbacks):
    x = _float_sample((4, 4), seed=10)
    cases = [
        (x, 0.5, 2, x, 0.5, 2),
        (x, 0.5, 2, x, 0.25, 2),
        (x, 0.5, 2, x, 0.5, 3),
        (x, 0.5, 2, x + 1, 0.5, 2),
    ]
    for a, sa, za, b, sb, zb in cases:
        want = torch.equal(torch.quantize_per_tensor(a, sa, za, torch.quint8),
                           torch.quantize_per_tensor(b, sb, zb, torch.quint8))
        got = torch.equal(torch.quantize_per_tensor(a.to(TPU), sa, za, torch.quint8),
                          torch.quantize_per_tensor(b.to(TPU), sb, zb, torch.quint8))
        assert got == want
    fallbacks.assert_none()


@pytest.mark.parametrize("src", [torch.uint8, torch.int8, torch.int32], ids=str)
def test_make_per_tensor_quantized_tensor(src, fallbacks):
    ints = torch.arange(-4, 8).to(src) if src != torch.uint8 else torch.arange(12, dtype=src)
    cpu = torch._make_per_tensor_quantized_tensor(ints, 0.5, 1)
    dev = torch._make_per_tensor_quantized_tensor(ints.to(TPU), 0.5, 1)
    assert (dev.dtype, dev.q_scale(), dev.q_zero_point()) == (cpu.dtype, 0.5, 1)
    assert torch.equal(dev.int_repr().cpu(), cpu.int_repr())
    # int_repr is a copy, not a view of the quantized storage
    ir = dev.int_repr()
    ir.zero_()
    assert torch.equal(dev.int_repr().cpu(), cpu.int_repr())
    fallbacks.assert_none()


def test_unsupported_quantized_forms_raise():
    x = torch.randn(4, 4, device=TPU)
    with pytest.raises(NotImplementedError):
        torch.quantize_per_tensor(x, 0.1, 1, torch.quint4x2)
    with pytest.raises(NotImplementedError):
        torch._empty_affine_quantized([2], scale=1, zero_point=0, dtype=torch.quint2x4, device=TPU)


def test_quantized_repr_and_assert_equal():
    x = _float_sample((2, 3), seed=11)
    dev = torch.quantize_per_tensor(x.to(TPU), 0.1, 10, torch.quint8)
    text = repr(dev)
    assert "quantization_scheme=torch.per_tensor_affine" in text and "tpu" in text
    torch.testing.assert_close(dev, torch.quantize_per_tensor(x, 0.1, 10, torch.quint8).to(TPU))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = copy.deepcopy(dev)
    assert torch.equal(d, dev)


def test_layouts_in_every_eager_mode(mode, fallbacks):
    """The chains above in each eager mode (DeferAndFuse records the dense parts: nonzero,
    unique and the integer views must flush and alias as in Strict)."""
    x = _float_sample((4, 6), seed=12)
    x[x.abs() < 2] = 0
    s_cpu = x.to_sparse()
    s = x.to(TPU).to_sparse()
    _sparse_parts_equal(s, s_cpu)
    dup = torch.sparse_coo_tensor(torch.cat([s._indices(), s._indices()], 1),
                                  torch.cat([s._values(), s._values()]), s.shape)
    assert torch.equal(dup.coalesce().to_dense().cpu(), 2 * x)
    q_cpu = torch.quantize_per_tensor(x, 0.5, 3, torch.qint8)
    q = torch.quantize_per_tensor(x.to(TPU), 0.5, 3, torch.qint8)
    v = q.t()[1:3]
    v.contiguous()  # a copy; v stays a view of q
    q[0].fill_(2.0)
    q_cpu[0].fill_(2.0)
    assert torch.equal(v.int_repr().cpu(), q_cpu.t()[1:3].int_repr())
    assert torch.equal(q.dequantize().cpu(), q_cpu.dequantize())
    fallbacks.assert_none()


# ------------------------------------------------------------------- sparse arithmetic (common)


def _pair(seed, shape=(4, 5), coalesced=True):
    x = _dense_sample(shape, torch.float32, seed=seed)
    cpu = x.to_sparse()
    if not coalesced:
        i, v = cpu._indices(), cpu._values()
        cpu = torch.sparse_coo_tensor(torch.cat([i, i], 1), torch.cat([v, v]), shape)
    dev = torch.sparse_coo_tensor(cpu._indices().to(TPU), cpu._values().to(TPU), shape,
                                  is_coalesced=cpu.is_coalesced())
    return cpu, dev


def _sparse_close(dev: torch.Tensor, cpu: torch.Tensor) -> None:
    """The same entries, and values equal up to the last bits (transcendental functions)."""
    assert dev.device.type == "tpu" and dev.layout == cpu.layout and dev.dtype == cpu.dtype
    assert dev.shape == cpu.shape and dev._nnz() == cpu._nnz()
    assert dev.is_coalesced() == cpu.is_coalesced()
    assert torch.equal(dev._indices().cpu(), cpu._indices())
    torch.testing.assert_close(dev._values().cpu(), cpu._values())


@pytest.mark.parametrize("op", ["abs", "neg", "sin", "sqrt", "tanh", "floor", "sign", "expm1"])
def test_sparse_unary_ops_match_cpu(op, fallbacks):
    cpu, dev = _pair(20, coalesced=False)
    if op == "sqrt":
        cpu, dev = cpu.abs(), dev.abs()
    _sparse_close(getattr(torch, op)(dev), getattr(torch, op)(cpu))
    inplace = dev.coalesce().clone()
    getattr(inplace, op + "_")()
    _sparse_close(inplace, getattr(torch, op)(cpu.coalesce()))
    fallbacks.assert_none()


@pytest.mark.parametrize("coalesced", [True, False])
def test_sparse_add_matches_cpu(coalesced, fallbacks):
    (a_cpu, a), (b_cpu, b) = _pair(21, coalesced=coalesced), _pair(22, coalesced=coalesced)
    got, want = torch.add(a, b, alpha=2), torch.add(a_cpu, b_cpu, alpha=2)
    if coalesced:  # CPU merges two coalesced operands into a coalesced result; so does tpu
        _sparse_parts_equal(got, want)
    else:  # uncoalesced operands: tpu concatenates the entries (as CUDA does), CPU merges some
        assert not got.is_coalesced()
        _sparse_parts_equal(got.coalesce(), want.coalesce())
    dense = _dense_sample((4, 5), torch.float32, seed=23)
    assert torch.equal((dense.to(TPU) + a).cpu(), dense + a_cpu)
    c = a.clone()
    c.add_(b)
    assert torch.equal(c.to_dense().cpu(), (a_cpu + b_cpu).to_dense())
    with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
        a + dense.to(TPU)
    with pytest.raises(RuntimeError):
        a_cpu + dense
    fallbacks.assert_none()


def test_sparse_mul_div_by_scalar_match_cpu(fallbacks):
    cpu, dev = _pair(24, coalesced=False)
    _sparse_parts_equal(dev * 3, cpu * 3)
    _sparse_parts_equal(2.5 * dev, 2.5 * cpu)
    _sparse_parts_equal(dev / 4, cpu / 4)
    _sparse_parts_equal(torch.div(dev, 3, rounding_mode="floor"),
                        torch.div(cpu, 3, rounding_mode="floor"))
    m = dev.clone()
    m.mul_(torch.tensor(2.0, device=TPU))
    _sparse_parts_equal(m, cpu * 2)
    fallbacks.assert_none()


def test_sparse_mm_matches_cpu(fallbacks):
    cpu, dev = _pair(25, shape=(6, 5), coalesced=False)
    d = torch.randn(5, 3, generator=_gen(26))
    bias = torch.randn(6, 3, generator=_gen(27))
    torch.testing.assert_close(torch.mm(dev, d.to(TPU)).cpu(), torch.mm(cpu, d))
    torch.testing.assert_close(torch.sparse.mm(dev, d.to(TPU)).cpu(), torch.sparse.mm(cpu, d))
    torch.testing.assert_close(torch.addmm(bias.to(TPU), dev, d.to(TPU), beta=0.5, alpha=2).cpu(),
                               torch.addmm(bias, cpu, d, beta=0.5, alpha=2))
    torch.testing.assert_close((dev @ d.to(TPU)).cpu(), cpu @ d)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(dev, torch.ones(4, 3, device=TPU))
    fallbacks.assert_none()


# ------------------------------------------------------------------- per-channel quantization


@pytest.mark.parametrize("dtype", QDTYPES, ids=str)
@pytest.mark.parametrize("axis", [0, 1])
def test_quantize_per_channel_matches_cpu(dtype, axis, fallbacks):
    x = _float_sample((4, 6), seed=30)
    n = x.shape[axis]
    scales = torch.tensor([0.1, 0.5, 0.25, 2.0, 0.3, 1.0][:n], dtype=torch.float64)
    zps = torch.tensor([0, 3, 1, 2, 5, 4][:n])
    cpu = torch.quantize_per_channel(x, scales, zps, axis, dtype)
    dev = torch.quantize_per_channel(x.to(TPU), scales.to(TPU), zps.to(TPU), axis, dtype)
    assert dev.qscheme() == torch.per_channel_affine and dev.q_per_channel_axis() == axis
    assert torch.equal(dev.q_per_channel_scales().cpu(), cpu.q_per_channel_scales())
    assert torch.equal(dev.q_per_channel_zero_points().cpu(), cpu.q_per_channel_zero_points())
    assert torch.equal(dev.int_repr().cpu(), cpu.int_repr())
    torch.testing.assert_close(dev.dequantize().cpu(), cpu.dequantize(), rtol=1e-6, atol=0)
    # views, copies and equality keep the per-channel parameters
    _check_view(dev[1:], cpu[1:], dev)
    for q in (cpu, dev):  # as_strided refuses per-channel tensors on CPU; the same on tpu
        with pytest.raises(RuntimeError, match="only on uniformly quantized"):
            q.t()
    down = dev.cpu()
    assert down.qscheme() == torch.per_channel_affine and torch.equal(down.int_repr(), cpu.int_repr())
    assert torch.equal(cpu.to(TPU), dev)
    assert torch.equal(dev.clone().int_repr().cpu(), cpu.clone().int_repr())
    fallbacks.assert_none()
