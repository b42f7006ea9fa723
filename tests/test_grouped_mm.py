"""torch._grouped_mm on tpu (torch_pjrt/grouped_mm.py): values and gradients against CPU's
kernel, every offsets case (2-D x 3-D, 3-D x 2-D, 2-D x 2-D), empty groups, rows past the last
offset, no new programs when only the offsets change, and under torch.compile."""
import pytest
import torch

CASES = [  # (a shape, b shape, offsets)
    ((64, 16), (4, 16, 8), [10, 20, 40, 64]),
    ((64, 16), (4, 16, 8), [0, 0, 40, 60]),  # empty groups; rows 60.. belong to none
    ((100, 32), (8, 32, 24), [3, 3, 30, 31, 60, 77, 90, 100]),
    ((600, 16), (3, 16, 8), [1, 2, 600]),  # one long group over many tiles
]


def _rel(x, y):
    return ((x.float() - y.float()).abs().max() / y.float().abs().max().clamp(min=1e-6)).item()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_rows_grouped_forward_backward(case, dtype, tol):
    sa, sb, offsets = case
    torch.manual_seed(0)
    a = torch.randn(sa, dtype=dtype, requires_grad=True)
    b = torch.randn(sb, dtype=dtype, requires_grad=True)
    offs = torch.tensor(offsets, dtype=torch.int32)
    ref = torch._grouped_mm(a, b, offs=offs)
    at = a.detach().tpu().requires_grad_()
    bt = b.detach().tpu().requires_grad_()
    out = torch._grouped_mm(at, bt, offs=offs.tpu())
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    end = offsets[-1]
    assert _rel(out.detach().cpu()[:end], ref.detach()[:end]) < tol
    # rows past the last offset: zeros here (CPU's kernel leaves them unspecified)
    assert torch.all(out.detach().cpu()[end:] == 0)
    grad = torch.randn(ref.shape, dtype=dtype)
    grad[end:] = 0  # CPU's gradients for those rows are not defined either
    ref.backward(grad)
    out.backward(grad.tpu())
    assert _rel(at.grad.cpu()[:end], a.grad[:end]) < tol
    assert _rel(bt.grad.cpu(), b.grad) < tol


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_contraction_and_column_grouped(dtype, tol):
    torch.manual_seed(1)
    offs = torch.tensor([10, 10, 40, 64], dtype=torch.int32)
    a, b = torch.randn(16, 64, dtype=dtype), torch.randn(64, 8, dtype=dtype)  # 2-D x 2-D
    ref = torch._grouped_mm(a, b, offs=offs)
    out = torch._grouped_mm(a.tpu(), b.tpu(), offs=offs.tpu()).cpu()
    assert out.shape == ref.shape == (4, 16, 8) and _rel(out, ref) < tol
    assert torch.all(out[1] == 0)  # the empty group
    a3, b2 = torch.randn(4, 16, 8, dtype=dtype), torch.randn(8, 48, dtype=dtype)  # 3-D x 2-D
    offs = torch.tensor([10, 20, 40, 48], dtype=torch.int32)
    ref = torch._grouped_mm(a3, b2, offs=offs)
    out = torch._grouped_mm(a3.tpu(), b2.tpu(), offs=offs.tpu()).cpu()
    assert out.shape == ref.shape and _rel(out, ref) < tol


def test_new_offsets_compile_nothing():
    """The reason for the kernel: a new distribution of rows over groups is the same programs."""
    torch.manual_seed(2)
    a, b = torch.randn(256, 32).tpu(), torch.randn(8, 32, 16).tpu()
    gen = torch.Generator().manual_seed(3)

    def offsets():
        o = torch.sort(torch.randint(0, 257, (8,), generator=gen))[0].to(torch.int32)
        o[-1] = 256
        return o

    torch._grouped_mm(a, b, offs=offsets().tpu()).sum().item()
    for _ in range(3):
        o = offsets()
        torch.tpu.reset_metrics()
        out = torch._grouped_mm(a, b, offs=o.tpu())
        m = torch.tpu.metrics()
        assert m["compiles"] == 0
        # in Strict mode the kernel's small ops run as one program (one fused run)
        assert m["executions"] == 1 and m["defer_flushes"] == 1, m
        ref = torch._grouped_mm(a.cpu(), b.cpu(), offs=o)
        assert _rel(out.cpu(), ref) < 1e-5


def test_callers_mode_is_kept():
    """Under defer_and_fuse the kernel's ops join the caller's pending graph (no flush of their
    own); Debug runs them one by one, checked."""
    a, b = torch.randn(64, 16), torch.randn(4, 16, 8)
    offs = torch.tensor([10, 20, 40, 64], dtype=torch.int32)
    ref = torch._grouped_mm(a, b, offs=offs)
    for mode in ("defer_and_fuse", "debug"):
        with torch.tpu.eager_mode(mode):
            torch.tpu.reset_metrics()
            out = torch._grouped_mm(a.tpu(), b.tpu(), offs=offs.tpu()) * 2
            flushes = torch.tpu.metrics()["defer_flushes"]
            got = out.cpu()
        assert flushes == 0, mode
        assert _rel(got, ref * 2) < 1e-5


def test_errors_match_cpu():
    for offs, cpu_msg in ((torch.tensor([10, 64]), "int32"),
                          (torch.tensor([1, 2, 3], dtype=torch.int32), "batch sizes")):
        for dev in ("cpu", "tpu"):
            with pytest.raises(RuntimeError, match=cpu_msg):
                torch._grouped_mm(torch.randn(64, 16, device=dev),
                                  torch.randn(2, 16, 8, device=dev), offs=offs.to(dev))


class _Experts(torch.nn.Module):
    def __init__(self, e=4, d=16, f=24):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(e, d, f) / d ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(e, f, d) / f ** 0.5)

    def forward(self, x, counts):
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        h = torch.nn.functional.silu(torch._grouped_mm(x, self.w1, offs=offs))
        return torch._grouped_mm(h, self.w2, offs=offs)


def test_compiled_experts_match_cpu():
    torch.manual_seed(4)
    cpu = _Experts()
    dev = _Experts().tpu()
    dev.load_state_dict(cpu.state_dict())
    step = torch.compile(dev, backend="tpu")
    for counts in ([10, 20, 2, 32], [0, 30, 30, 4]):
        x = torch.randn(64, 16)
        c = torch.tensor(counts)
        cpu.zero_grad()
        dev.zero_grad()
        ref = cpu(x, c)
        out = step(x.tpu(), c.tpu())
        assert _rel(out.detach().cpu(), ref.detach()) < 1e-5
        g = torch.randn_like(ref)
        ref.backward(g)
        out.backward(g.tpu())
        for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
            assert _rel(q.grad.cpu(), p.grad) < 1e-5, name


def test_row_counts_of_one_bucket_share_the_fused_program():
    """Expert parallelism receives a different number of rows every step: counts that round up
    to the same bucket reuse the kernel's program; only the pad and the slice around it are
    new (small programs)."""
    torch.manual_seed(4)
    b = torch.randn(4, 16, 8)
    for m in (193, 200, 207):  # one bucket: 208
        a = torch.randn(m, 16)
        offs = torch.tensor([m // 4, m // 2, m // 2, m], dtype=torch.int32)
        torch.tpu.reset_metrics()
        out = torch._grouped_mm(a.tpu(), b.tpu(), offs=offs.tpu())
        got = out.cpu()
        compiles = torch.tpu.metrics()["compiles"]
        assert got.shape == (m, 8)
        assert _rel(got, torch._grouped_mm(a, b, offs=offs)) < 1e-5
        if m != 193:
            assert compiles <= 3, compiles  # the pad, the slice (and the upload of a)
