"""Aliasing semantics on the tpu device, table-driven against CPU eager.

Each case is a small function applied to fresh base tensor(s). It runs once on CPU and once on
tpu (the bases copied there), and the test compares, exactly:
  - the final value of every base and of every tensor the case returns (aliases and results),
  - dtype, shape, strides, storage offset and storage size of each of them,
  - which pairs of them share storage (``untyped_storage().data_ptr()`` equality, and the
    same StorageImpl), and what each one's ``_base`` is (None, one of the others, or another
    tensor).
When the CPU raises, the tpu must raise the same exception type (e.g. PyTorch's overlap checks).

Base values are small integers stored as floats, so every arithmetic result below is exact and
the comparison can demand bit equality.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch

TPU = torch.device("tpu")
CPU = torch.device("cpu")


def f45(dtype=torch.float32):
    """4x5 base with distinct small integer values (negative ones included where signed)."""
    t = torch.arange(20).reshape(4, 5)
    if dtype.is_floating_point or dtype in (torch.int64, torch.int32, torch.int16, torch.int8):
        t = t - 7
    return (t.to(dtype),)


def sq(n=4, dtype=torch.float32):
    return ((torch.arange(n * n).reshape(n, n) - 5).to(dtype),)


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable  # fn(*bases, dev) -> tuple of tensors (aliases / results)
    make: Callable = f45


def _idx(dev, *v):
    return torch.tensor(v, dtype=torch.long, device=dev)


def _case_copy_dtype(x, dev):
    x[2].copy_(torch.tensor([100, -2, 3, 4, 5], dtype=torch.int64, device=dev))
    return ()


def _case_data_assign(x, dev):
    y = x.view(20)
    x.data = torch.full((2, 2), 3.0, device=dev)
    y.add_(1)
    x.add_(2)
    return (y,)


def _case_resize_grow(x, dev):
    v = x[1]
    x.resize_(30)
    x[20:].fill_(1.5)  # the grown part is uninitialized: define it before comparing
    v.add_(100)
    return (v,)


def _case_resize_shrink(x, dev):
    v = x[3]
    x.resize_(2, 3)
    x.add_(1)
    v.mul_(2)
    return (v,)


def _case_set_tensor(x, dev):
    y = torch.empty(0, device=dev)
    y.set_(x)
    y[0].add_(1)
    return (y,)


def _case_set_storage(x, dev):
    y = torch.empty(0, device=dev)
    y.set_(x.untyped_storage(), 2, (3,), (4,))
    y.mul_(3)
    return (y,)


def _case_set_empty(x, dev):
    v = x[1]
    x.set_()
    v.add_(1)
    return (v,)


def _case_swap_rows(x, dev):
    x[0], x[1] = x[1].clone(), x[0].clone()
    return ()


def _case_view_after_writes(x, dev):
    v = x.t()[1:]
    x.mul_(2)
    w = v[::2]
    x[0].fill_(0)
    return (v, w)


def _case_expand_clone(x, dev):
    e = x[0:1].expand(3, 5)
    c = e.clone()
    c.add_(1)
    x[0, 0] = 42
    return (e, c)


def _case_split(x, dev):
    a, b = x.split(2)
    b.mul_(3)
    a[:, 1:].add_(b[:, :4])
    return (a, b)


def _case_chunk(x, dev):
    parts = x.chunk(3, dim=1)
    parts[1].add_(10)
    return parts


def _case_unbind(x, dev):
    rows = x.unbind(0)
    rows[2].fill_(-5)
    rows[0].add_(rows[3])
    return rows


def _case_0d_base(x, dev):
    v = x.view(1)
    v.mul_(2)
    x.add_(1)
    u = x.unsqueeze(0).expand(3)
    return (v, u)


def _case_masked_fill_view(x, dev):
    v = x[1:]
    v.masked_fill_(v > 5, -1)
    return (v,)


CASES = [
    # --- in-place ops on basic views -------------------------------------------------------
    Case("row_add", lambda x, d: (x[1].add_(1),)),
    Case("column_mul", lambda x, d: (x[:, 2].mul_(3),)),
    Case("strided_rows", lambda x, d: (x[::2].add_(10),)),
    Case("strided_cols_sub", lambda x, d: (x[:, 1::2].sub_(2),)),
    Case("block_fill", lambda x, d: (x[1:3, ::2].fill_(7),)),
    Case("transpose_add", lambda x, d: (x.t().add_(torch.arange(20.0, device=d).view(5, 4)),)),
    Case("transpose_row", lambda x, d: (x.t()[0].add_(1),)),
    Case("diagonal_add", lambda x, d: (x.diagonal().add_(1),)),
    Case("offset_diagonal", lambda x, d: (x.diagonal(1).mul_(-1),)),
    Case("select_zero", lambda x, d: (x.select(1, 3).zero_(),)),
    Case("narrow_add", lambda x, d: (x.narrow(0, 1, 2).add_(5),)),
    Case("unsqueeze_add", lambda x, d: (x.unsqueeze(0)[0, 2].add_(1), x.unsqueeze(2))),
    Case("view_flat_slice", lambda x, d: (x.view(20)[3:7].add_(1),)),
    Case("reshape_is_view", lambda x, d: (x.reshape(2, 10).add_(1),)),
    Case("permute_3d", lambda x, d: (x.permute(2, 0, 1)[1].mul_(2),),
         make=lambda: (torch.arange(24.0).reshape(2, 3, 4),)),
    Case("expand_clone", _case_expand_clone),
    Case("unfold_write", lambda x, d: (x.view(20).unfold(0, 4, 3)[1].add_(100),
                                       x.view(20).unfold(0, 4, 2))),
    Case("unfold_2d_read_after_write", lambda x, d: (x.unfold(1, 2, 1), x.fill_(2))),
    Case("chained_views", lambda x, d: (x[1:].t()[::2].add_(1),)),
    Case("view_then_base_write", lambda x, d: (x[1:3], x.add_(1))),
    Case("view_of_view_after_writes", _case_view_after_writes),
    Case("squeeze_flatten_movedim", lambda x, d: (x.unsqueeze(1).squeeze(1).add_(1),
                                                  x.flatten(), x.movedim(0, 1))),
    Case("view_dtype", lambda x, d: (x.view(torch.int32)[0].add_(1),)),
    # --- out= into views --------------------------------------------------------------------
    Case("out_row", lambda x, d: (torch.add(torch.arange(5.0, device=d),
                                            torch.full((5,), 2.0, device=d), out=x[0]),)),
    Case("out_column", lambda x, d: (torch.mul(torch.arange(4.0, device=d),
                                               torch.full((4,), -3.0, device=d), out=x[:, 1]),)),
    Case("out_self_row", lambda x, d: (torch.add(x[0], x[1], out=x[0]),)),
    Case("out_partial_overlap", lambda x, d: (torch.add(x[0], x[1], out=x.view(20)[2:7]),)),
    # --- copy_ into views ---------------------------------------------------------------------
    Case("copy_from_cpu", lambda x, d: (x[1:3].copy_(torch.arange(10.0).view(2, 5) * 3),)),
    Case("copy_from_tpu_column", lambda x, d: (x[:, 0].copy_(torch.arange(4.0, device=d) - 9),)),
    Case("copy_dtype_conversion", _case_copy_dtype),
    Case("copy_broadcast", lambda x, d: (x[1:3].copy_(torch.arange(5.0, device=d) + 50),)),
    Case("copy_cpu_int_broadcast_transposed",
         lambda x, d: (x.t()[1:3].copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32)),)),
    Case("copy_overlapping_src", lambda x, d: (x.view(20)[1:].copy_(x.view(20)[:-1]),)),
    # --- fill_/zero_/masked_fill_ on views ------------------------------------------------------
    Case("fill_strided", lambda x, d: (x[:, ::2].fill_(3.5),)),
    Case("zero_diagonal", lambda x, d: (x.diagonal().zero_(),)),
    Case("masked_fill_view", _case_masked_fill_view),
    # --- index_put_ / setitem ------------------------------------------------------------------
    Case("setitem_column_int", lambda x, d: (x.__setitem__((slice(None), 1), 5), x[:, 1])[1:]),
    Case("setitem_slices_tensor", lambda x, d: (
        x.__setitem__((slice(1, 3), slice(2, None)), torch.arange(6.0, device=d).view(2, 3)),)[1:]),
    Case("setitem_mask", lambda x, d: (x.__setitem__(x > 8, 0),)[1:]),
    Case("index_put", lambda x, d: (x.index_put_((_idx(d, 0, 2), _idx(d, 1, 3)),
                                                 torch.tensor([9.0, 8.0], device=d)),)),
    Case("index_put_accumulate_on_view", lambda x, d: (x[1:].index_put_(
        (_idx(d, 0, 2, 0),), torch.tensor([1.0, 2, 3, 4, 5], device=d), accumulate=True),)),
    Case("setitem_advanced_iadd", lambda x, d: (
        x.__setitem__((slice(None), [0, 2]), x[:, [0, 2]] + 1),)[1:]),
    Case("iadd_view_from_view", lambda x, d: (x[1].__iadd__(x[2]),)),
    Case("swap_rows", _case_swap_rows),
    # --- .data, detach, set_, resize_, as_strided --------------------------------------------
    Case("data_assignment", _case_data_assign),
    Case("detach_shares", lambda x, d: (x.detach().add_(1),)),
    Case("set_tensor", _case_set_tensor),
    Case("set_storage_offset_stride", _case_set_storage),
    Case("set_empty", _case_set_empty),
    Case("resize_grow", _case_resize_grow),
    Case("resize_shrink", _case_resize_shrink),
    Case("as_strided_add", lambda x, d: (x.as_strided((3, 3), (5, 1), 1).add_(1),)),
    Case("as_strided_overlapping_read", lambda x, d: (x.as_strided((4, 4), (1, 1)), x.add_(1))),
    # (No in-place write through a self-overlapping as_strided view: PyTorch leaves its result
    # undefined and CPU does not detect it, so there is nothing to compare against.)
    # --- split / chunk / unbind ---------------------------------------------------------------
    Case("split_inplace", _case_split),
    Case("chunk_inplace", _case_chunk),
    Case("unbind_inplace", _case_unbind),
    # --- input aliases output ------------------------------------------------------------------
    Case("add_self", lambda x, d: (x.add_(x),)),
    Case("mul_self_transpose", lambda x, d: (x.mul_(x.t()),), make=sq),
    Case("mul_self_transpose_cloned", lambda x, d: (x.mul_(x.t().clone()),), make=sq),
    Case("shifted_self_add", lambda x, d: (x[1:].add_(x[:-1]),)),
    Case("expanded_write", lambda x, d: (x[0].expand(3, 5).add_(1),)),
    Case("addcmul_on_view", lambda x, d: (x[1].addcmul_(x[2], x[3], value=2),)),
    Case("clamp_on_transposed", lambda x, d: (x.t().clamp_(-3, 4),)),
    # --- dtypes ---------------------------------------------------------------------------------
    Case("int64_views", lambda x, d: (x[::2, 1:].mul_(3), x.t()[0].add_(7)),
         make=lambda: f45(torch.int64)),
    Case("int32_diagonal", lambda x, d: (x.diagonal().sub_(4),), make=lambda: f45(torch.int32)),
    Case("int16_column_fill", lambda x, d: (x[:, 3].fill_(-300),), make=lambda: f45(torch.int16)),
    Case("uint8_setitem", lambda x, d: (x.__setitem__((1, slice(None, None, 2)), 200),)[1:],
         make=lambda: f45(torch.uint8)),
    Case("bool_views", lambda x, d: (x[1].logical_not_(), x[:, 0].fill_(True)),
         make=lambda: ((torch.arange(20).reshape(4, 5) % 3 == 0),)),
    Case("bool_int_copy", lambda x, d: (x[2].copy_(torch.tensor([0, 3, 0, -1, 1], device=d)),),
         make=lambda: ((torch.arange(20).reshape(4, 5) % 2 == 0),)),
    # --- 0-d and empty ------------------------------------------------------------------------
    Case("0d_element_view", lambda x, d: (x[1, 2].add_(1), x[3, 4])),
    Case("0d_base", _case_0d_base, make=lambda: (torch.tensor(3.0),)),
    Case("0d_int_fill", lambda x, d: (x.fill_(7), x.view(1, 1)), make=lambda: (torch.tensor(-2),)),
    Case("empty_slice_ops", lambda x, d: (x[2:2].add_(1), x[:, 5:].fill_(1))),
    Case("empty_base", lambda x, d: (x.t().add_(1), x.unsqueeze(0), x.view(5, 0)),
         make=lambda: (torch.empty(0, 5),)),
]


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    same_ptr = sa.data_ptr() == sb.data_ptr() and sa.data_ptr() != 0
    same_impl = sa._cdata == sb._cdata
    assert same_ptr or not sa.nbytes() or not same_impl, "one StorageImpl, two data pointers?"
    return same_ptr or same_impl


def _run(case: Case, dev: torch.device):
    # fresh, non-view bases on both devices (clone: on CPU .to() would return the input)
    bases = tuple(b.clone() if dev == CPU else b.to(dev) for b in case.make())
    try:
        outs = case.fn(*bases, dev)
    except Exception as e:  # noqa: BLE001 - compared against the other device's behavior
        return bases, None, e
    return bases, tuple(outs), None


def _describe(tensors):
    meta = []
    for t in tensors:
        meta.append(dict(dtype=t.dtype, shape=tuple(t.shape), stride=t.stride(),
                         offset=t.storage_offset(), storage_nbytes=t.untyped_storage().nbytes(),
                         is_view=t._is_view()))
    share = {(i, j): _same_storage(tensors[i], tensors[j])
             for i in range(len(tensors)) for j in range(i + 1, len(tensors))}

    def base_of(t):
        if t._base is None:
            return None
        for k, u in enumerate(tensors):
            if t._base is u:
                return k
        return "other"

    return meta, share, [base_of(t) for t in tensors]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_aliasing(case: Case):
    cpu_bases, cpu_outs, cpu_err = _run(case, CPU)
    tpu_bases, tpu_outs, tpu_err = _run(case, TPU)
    if cpu_err is not None:
        assert tpu_err is not None, f"CPU raised {type(cpu_err).__name__}: {cpu_err}; tpu did not"
        assert type(tpu_err) is type(cpu_err), (
            f"CPU raised {type(cpu_err).__name__}: {cpu_err}\n"
            f"tpu raised {type(tpu_err).__name__}: {tpu_err}")
    elif tpu_err is not None:
        raise tpu_err
    cpu_all = list(cpu_bases) + list(cpu_outs or ())
    tpu_all = list(tpu_bases) + list(tpu_outs or ())
    assert len(cpu_all) == len(tpu_all)
    for k, (c, t) in enumerate(zip(cpu_all, tpu_all)):
        assert t.device.type == "tpu", f"tensor {k} is on {t.device}"
    cpu_meta, cpu_share, cpu_base = _describe(cpu_all)
    tpu_meta, tpu_share, tpu_base = _describe(tpu_all)
    for k, (cm, tm) in enumerate(zip(cpu_meta, tpu_meta)):
        assert tm == cm, f"tensor {k}: metadata differs"
    assert tpu_share == cpu_share, "storage sharing differs (pairs of tensor indices)"
    assert tpu_base == cpu_base, "_base differs"
    for k, (c, t) in enumerate(zip(cpu_all, tpu_all)):
        torch.testing.assert_close(t.cpu(), c, rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m, k=k: f"tensor {k}: {m}")


def test_case_count():
    assert len(CASES) >= 40


def test_views_share_storage_on_device(tpu):
    """The storage-sharing comparison above could pass vacuously if both devices said "not
    shared" for everything; check directly that tpu views share their base's storage pointer."""
    x = torch.zeros(4, 5, device=tpu)
    ptr = x.untyped_storage().data_ptr()
    assert ptr != 0
    for v in (x[1], x.t(), x[:, ::2], x.diagonal(), x.view(20), x.unfold(1, 2, 1)):
        assert v.untyped_storage().data_ptr() == ptr
        assert v._base is x
    assert x.clone().untyped_storage().data_ptr() != ptr


@pytest.mark.parametrize("op", [torch.maximum, torch.add, torch.mul])
def test_out_that_is_an_input_and_must_grow_raises_like_cpu(op):
    # CPU refuses to resize an out= tensor that is also an input; on tpu the resize used to free
    # the input's storage under the running call (a segfault, found by the fuzzer)
    def run(dev):
        a = torch.tensor([0.5], dtype=torch.float64, device=dev)
        b = torch.arange(3.0, dtype=torch.float64, device=dev)[::2]
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            op(a, b, out=a)
        return a
    torch.testing.assert_close(run("tpu").cpu(), run("cpu"), rtol=0, atol=0)
    # an out= tensor that is not an input still grows, with CPU's warning
    for dev in ("cpu", "tpu"):
        out = torch.zeros(1, dtype=torch.float64, device=dev)
        with pytest.warns(UserWarning, match="resized"):
            op(torch.ones(1, dtype=torch.float64, device=dev),
               torch.arange(3.0, dtype=torch.float64, device=dev)[::2], out=out)
        assert out.shape == (2,)
