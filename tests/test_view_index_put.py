"""Indexed writes into views (index_put_ / x[idx] = v on a slice, chunk, transpose, strided or
as_strided view) write the base storage at composed indices (view_index_put.cpp): CPU's values
in the view, in the base and in every other alias, for every index layout."""
import pytest
import torch

from conftest import TPU, delta, metrics

L = torch.tensor


def _views():
    # name -> (base shape, view function)
    return {
        "chunk_last": ((4, 3, 5, 8), lambda b: b.chunk(2, dim=3)[0]),   # KV-cache-like
        "chunk_second": ((4, 3, 5, 8), lambda b: b.chunk(2, dim=3)[1]),
        "row_slice": ((6, 7), lambda b: b[2:5]),
        "strided": ((6, 8), lambda b: b[::2, 1::3]),
        "transposed": ((5, 6), lambda b: b.t()),
        "select": ((3, 4, 5), lambda b: b[1]),
        "as_strided": ((40,), lambda b: b.as_strided((3, 4), (9, 2), 3)),
        "narrow_3d": ((4, 6, 5), lambda b: b.narrow(1, 1, 4).permute(2, 0, 1)),
    }


def _index_cases(shape):
    n0 = shape[0]
    cases = {
        "first_dim": (L([0, n0 - 1]),),
        "negative": (L([-1, 0]),),
        "int32": (L([1, 0], dtype=torch.int32),),
        "2d_index": (L([[0, 1], [n0 - 1, 0]]),),
    }
    if len(shape) >= 2:
        n1 = shape[1]
        cases["two_adjacent"] = (L([0, n0 - 1]), L([n1 - 1, 0]))
        cases["broadcast_pair"] = (L([[0], [n0 - 1]]), L([0, n1 - 1]))
        cases["slice_then_index"] = (slice(None), L([n1 - 1, 0, 1 % n1]))
    if len(shape) >= 3:
        n2 = shape[2]
        cases["apart"] = (L([0, n0 - 1]), slice(None), L([n2 - 1, 1 % n2]))  # kc[blk, :, off]
        cases["ellipsis_last"] = (Ellipsis, L([shape[-1] - 1, 0]))
    return cases


def _all_cases():
    for vname, (shape, make) in _views().items():
        view_shape = make(torch.zeros(shape)).shape
        for iname, idx in _index_cases(view_shape).items():
            yield pytest.param(vname, iname, False, id=f"{vname}-{iname}-set")
            # index_put_ with accumulate takes tensor indices only (no slices / Ellipsis)
            if all(isinstance(i, torch.Tensor) for i in idx):
                yield pytest.param(vname, iname, True, id=f"{vname}-{iname}-acc")


@pytest.mark.parametrize("vname,iname,accumulate", list(_all_cases()))
def test_indexed_write_into_view_matches_cpu(vname, iname, accumulate, fallbacks):
    shape, make = _views()[vname]
    base = torch.randn(shape)
    dev = base.to(TPU)
    vc, vd = make(base), make(dev)
    idx = _index_cases(vc.shape)[iname]
    target_shape = vc[idx].shape
    val = torch.randn(target_shape)
    if accumulate:
        vc.index_put_(idx, val, accumulate=True)
        vd.index_put_(tuple(i.to(TPU) for i in idx), val.to(TPU), accumulate=True)
    else:
        vc[idx] = val
        vd[tuple(i.to(TPU) if isinstance(i, torch.Tensor) else i for i in idx)] = val.to(TPU)
    assert torch.equal(dev.cpu(), base)
    assert torch.equal(vd.cpu(), vc)
    fallbacks.assert_none()


def test_kv_cache_block_write_touches_only_the_written_rows(fallbacks):
    kv_c = torch.randn(8, 2, 16, 2 * 4)
    kv_d = kv_c.to(TPU)
    other_alias = kv_d.view(-1)
    blk, off = L([3, 5]), L([7, 2])
    val = torch.randn(2, 2, 4)
    for kv, b, o, v in ((kv_c, blk, off, val), (kv_d, blk.to(TPU), off.to(TPU), val.to(TPU))):
        kc = kv.chunk(2, dim=3)[0]
        kc[b, :, o] = v
    assert torch.equal(kv_d.cpu(), kv_c)
    assert torch.equal(other_alias.cpu(), kv_c.view(-1))
    # Strict mode: the index arithmetic and the scatter into the storage are one program
    kc = kv_d.chunk(2, dim=3)[0]
    b, o, v = blk.to(TPU), off.to(TPU), val.to(TPU)
    kc[b, :, o] = v
    torch.tpu.synchronize()
    before = metrics()
    kc[b, :, o] = v
    torch.tpu.synchronize()
    assert delta(before, metrics()).get("executions") == 1
    fallbacks.assert_none()


def test_duplicate_indices_accumulate_like_cpu(fallbacks):
    base = torch.zeros(5, 6)
    dev = base.to(TPU)
    idx = L([1, 1, 3, 1])
    val = torch.arange(4.0).unsqueeze(1).expand(4, 3)
    base[:, ::2].index_put_((idx,), val, accumulate=True)
    dev[:, ::2].index_put_((idx.to(TPU),), val.to(TPU), accumulate=True)
    assert torch.equal(dev.cpu(), base)
    fallbacks.assert_none()


def test_writes_into_views_in_eager_modes_and_autograd(fallbacks):
    for mode in ("strict", "defer_and_fuse", "debug"):
        base = torch.randn(4, 6)
        dev = base.to(TPU)
        with torch.tpu.eager_mode(mode):
            dev[:, 1:5][L([2, 0]).to(TPU)] = torch.ones(2, 4, device=TPU) * 3
            s = dev.sum()
        base[:, 1:5][L([2, 0])] = 3.0
        assert torch.equal(dev.cpu(), base), mode
        assert s.item() == pytest.approx(base.sum().item(), rel=1e-6)
    # autograd through an indexed write into a view of a non-leaf
    w_c = torch.randn(4, 6, requires_grad=True)
    w_d = w_c.detach().to(TPU).requires_grad_()
    for w, dv in ((w_c, "cpu"), (w_d, TPU)):
        y = w * 2
        y[:, ::2][L([1, 3]).to(dv)] = torch.ones(2, 3, device=dv) * w[0, :3]
        (y ** 2).sum().backward()
    assert torch.allclose(w_d.grad.cpu(), w_c.grad, rtol=1e-6, atol=1e-6)
    fallbacks.assert_none()


@pytest.mark.parametrize("case", ["shape_mismatch", "dtype_mismatch", "too_many_indices"])
def test_bad_writes_into_views_raise_like_cpu(case):
    base = torch.zeros(4, 6)
    dev = base.to(TPU)
    for t, dv in ((base, "cpu"), (dev, TPU)):
        v = t[:, ::2]
        with pytest.raises((RuntimeError, IndexError)) as e:
            if case == "shape_mismatch":
                v[L([0, 1]).to(dv)] = torch.ones(3, 2, device=dv)
            elif case == "dtype_mismatch":
                v.index_put_((L([0, 1]).to(dv),), torch.ones(2, 3, dtype=torch.float64, device=dv))
            else:
                v[L([0]).to(dv), L([0]).to(dv), L([0]).to(dv)] = 1.0
        if dv == "cpu":
            cpu_type = type(e.value)
        else:
            assert type(e.value) is cpu_type
    assert torch.equal(dev.cpu(), base)


def test_out_of_range_index_never_lands_elsewhere_in_the_storage():
    """An index past the view's dimension must not write another element of the base."""
    dev = torch.zeros(6, 4, device=TPU)
    v = dev[1:3]  # rows 1 and 2
    try:
        v[L([5]).to(TPU)] = torch.ones(4, device=TPU)  # would be row 6 of a 1-D composition
        torch.tpu.synchronize()
    except (IndexError, RuntimeError):
        pass  # raising (as CPU) is right too
    got = dev.cpu()
    assert torch.equal(got[0], torch.zeros(4)) and torch.equal(got[3:], torch.zeros(3, 4))
