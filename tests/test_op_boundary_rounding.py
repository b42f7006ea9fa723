"""Half-precision results are rounded to their dtype at every op boundary, in fused programs too
(DeferAndFuse, torch.compile), as PyTorch does on CPU: XLA's default of keeping intermediates
unrounded between fused ops (xla_allow_excess_precision) is off in the programs torch_pjrt
compiles, unless the user names that flag in XLA_FLAGS (fuzz finding F27, docs/reliability.md)."""
import pytest
import torch

from conftest import run_python

DTYPES = (torch.bfloat16, torch.float16)


def _values(dtype):
    g = torch.Generator().manual_seed(0)
    # large arguments make sin sensitive to one rounding step of its input
    return (torch.randn(4096, generator=g) * 30).to(dtype), (torch.randn(4096, generator=g) * 7).to(dtype)


def _sin_of_sum(v):
    return torch.sin(torch.add(v, v, alpha=2))


def _trunc_after_add_(v, i):
    v.add_(i)  # stores the rounded sum; trunc must read that, not the unrounded one
    return torch.trunc(v), v


@pytest.mark.parametrize("dtype", DTYPES)
def test_eager_modes_round_between_ops(mode, dtype):
    v, i = _values(dtype)
    got = _sin_of_sum(v.to("tpu")).cpu()
    assert torch.equal(got, _sin_of_sum(v)), (got != _sin_of_sum(v)).sum()
    ref_t, ref_v = _trunc_after_add_(v.clone(), i)
    got_t, got_v = _trunc_after_add_(v.to("tpu"), i.to("tpu"))
    assert torch.equal(got_v.cpu(), ref_v)
    assert torch.equal(got_t.cpu(), ref_t), (got_t.cpu() != ref_t).sum()


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_graphs_round_between_ops(dtype):
    v, i = _values(dtype)
    f = torch.compile(_sin_of_sum, backend="tpu")
    assert torch.equal(f(v.to("tpu")).cpu(), _sin_of_sum(v))
    g = torch.compile(_trunc_after_add_, backend="tpu")
    got_t, got_v = g(v.to("tpu"), i.to("tpu"))
    ref_t, ref_v = _trunc_after_add_(v.clone(), i)
    assert torch.equal(got_v.cpu(), ref_v) and torch.equal(got_t.cpu(), ref_t)


def test_a_user_who_sets_the_flag_keeps_xlas_excess_precision(tmp_path):
    # the user's XLA_FLAGS choice wins; programs compiled under other flags are other cache
    # entries (the flags are part of the cache identity), so the same cache directory serves
    # both processes without handing one the other's programs
    code = """
        import torch, torch_pjrt
        torch.tpu.set_eager_mode("defer_and_fuse")
        g = torch.Generator().manual_seed(0)
        v = (torch.randn(4096, generator=g) * 30).to(torch.bfloat16)
        ref = torch.sin(torch.add(v, v, alpha=2))
        d = v.to("tpu")
        print("MISMATCHES", (torch.sin(torch.add(d, d, alpha=2)).cpu() != ref).sum().item())
    """
    counts = {}
    for flags in ("", "--xla_allow_excess_precision=true", ""):
        r = run_python(code, XLA_FLAGS=flags, TORCH_PJRT_CACHE_DIR=str(tmp_path))
        assert r.returncode == 0, r.stderr[-3000:]
        line = next(l for l in r.stdout.splitlines() if l.startswith("MISMATCHES"))
        counts.setdefault(flags, []).append(int(line.split()[1]))
    assert counts[""] == [0, 0], counts
    assert counts["--xla_allow_excess_precision=true"][0] > 100, counts
