"""The native few-row matrix product (csrc/runtime/small_gemm.c, called from programs as an XLA
FFI custom call: csrc/runtime/ffi_kernels.c, csrc/ops/linalg.c): float32 mm / addmm / linear
with 1 to 8 rows and a large right-hand matrix, on the CPU plugin (one row of a row-major
matrix is the kernel's matrix-vector form). Results against CPU's, in
eager mode and compiled, and the handler's call count to show which products used it."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt

TPU = torch.device("tpu")
C = torch_pjrt._C

pytestmark = pytest.mark.skipif(
    C.platform_name() != "cpu", reason="the native kernels are registered on the CPU plugin only")


def calls():
    torch.tpu.synchronize()
    return C.native_small_gemm_calls()


def close(got, want, k):
    assert got.dtype == want.dtype and got.shape == want.shape
    # CPU's own fp32 sums differ by host (oneDNN's blocking): 7.4e-5 seen at k=768 on an
    # AVX-512/AMX Xeon, 1.1e-4 allowed there
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=4e-6 * k ** 0.5)


def test_registered_on_the_cpu_plugin():
    assert C.native_kernels_status().startswith("registered"), C.native_kernels_status()


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("k,n", [(768, 2048), (300, 1000), (64, 4099), (2048, 768)])
def test_linear_matches_cpu_and_runs_natively(m, k, n):
    torch.manual_seed(m * 7 + n)
    x, w, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    before = calls()
    close(F.linear(x.to(TPU), w.to(TPU)), F.linear(x, w), k)
    close(F.linear(x.to(TPU), w.to(TPU), bias.to(TPU)), F.linear(x, w, bias), k)
    # a column-major weight (the serving runner stores linear weights that way): same result
    wt = w.t().contiguous().t()
    close(F.linear(x.to(TPU), wt.to(TPU)), F.linear(x, w), k)
    # every row count goes native, one row too (its matrix-vector form for the column-major one)
    assert calls() - before == 3


def test_mm_addmm_and_out_variants():
    torch.manual_seed(0)
    a, b, c = torch.randn(4, 512), torch.randn(512, 700), torch.randn(4, 700)
    before = calls()
    close(torch.mm(a.to(TPU), b.to(TPU)), a @ b, 512)
    close(torch.addmm(c.to(TPU), a.to(TPU), b.to(TPU), beta=0.5, alpha=2.0),
          torch.addmm(c, a, b, beta=0.5, alpha=2.0), 512)
    out = torch.empty(4, 700, device=TPU)
    torch.mm(a.to(TPU), b.to(TPU), out=out)
    close(out, a @ b, 512)
    assert calls() - before == 3


def test_products_left_to_xla():
    """More than 8 rows, small matrices, other dtypes and batched products keep dot_general."""
    torch.manual_seed(1)
    before = calls()
    a, b = torch.randn(9, 512), torch.randn(512, 512)
    close(a.to(TPU) @ b.to(TPU), a @ b, 512)
    s, t = torch.randn(4, 16), torch.randn(16, 16)
    close(s.to(TPU) @ t.to(TPU), s @ t, 16)
    d, e = torch.randn(4, 512, dtype=torch.float64), torch.randn(512, 512, dtype=torch.float64)
    torch.testing.assert_close((d.to(TPU) @ e.to(TPU)).cpu(), d @ e)
    bb, cc = torch.randn(2, 4, 512), torch.randn(2, 512, 512)
    close(torch.bmm(bb.to(TPU), cc.to(TPU)), torch.bmm(bb, cc), 512)
    assert calls() == before


def test_special_values_as_on_cpu():
    """Zero sums are +0, NaN and infinities propagate to the rows and columns they reach."""
    a = torch.zeros(3, 512)
    b = -torch.rand(512, 600)
    got = (a.to(TPU) @ b.to(TPU)).cpu()
    want = a @ b
    assert torch.equal(got, want) and not torch.signbit(got).any()
    a = torch.randn(3, 512)
    a[1, 7] = float("nan")
    a[2, 3] = float("inf")
    b = torch.randn(512, 600)
    got, want = (a.to(TPU) @ b.to(TPU)).cpu(), a @ b
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    fin = want.isfinite()
    torch.testing.assert_close(got[fin], want[fin], rtol=1e-5, atol=1e-4)


def test_compiled_linear_and_gradients():
    torch.manual_seed(2)
    lin = torch.nn.Linear(640, 1200)
    x = torch.randn(6, 640, requires_grad=True)
    dev = torch.nn.Linear(640, 1200).to(TPU)
    dev.load_state_dict(lin.state_dict())
    xd = x.detach().to(TPU).requires_grad_()
    before = calls()
    fn = torch.compile(lambda m, v: m(v).square().sum(), backend="tpu")
    fn(dev, xd).backward()
    lin(x).square().sum().backward()
    assert calls() > before  # the forward product at 6 rows
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dev.weight.grad.cpu(), lin.weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dev.bias.grad.cpu(), lin.bias.grad, rtol=1e-4, atol=1e-4)


def test_off_switch_leaves_every_product_to_xla():
    code = ("import torch, torch_pjrt; C = torch_pjrt._C; "
            "x = torch.randn(4, 768, device='tpu') @ torch.randn(768, 2048, device='tpu'); "
            "torch.tpu.synchronize(); print(C.native_kernels_status(), C.native_small_gemm_calls())")
    env = dict(os.environ, TORCH_PJRT_SMALL_GEMM="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0" and "TORCH_PJRT_SMALL_GEMM=0" in out.stdout


def _attention_inputs(dtype):
    """Two requests (a 3-token prefill at positions 2..4, a decode at position 6) in a cache of
    4 blocks of 4 slots, 4 query heads over 2 kv heads; one padding row."""
    torch.manual_seed(3)
    D = 8
    cache = torch.randn(4, 4, 2, 2 * D).to(dtype)
    query = torch.randn(4, 4, D).to(dtype)
    context_slots = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 11], [0, 1, 2, 3, 12, 13, 14, 15]])
    query_index = torch.tensor([[0, 1, 2], [3, 0, 0]])
    query_pos = torch.tensor([[2, 3, 4], [6, -1, -1]])
    output_index = torch.tensor([0, 1, 2, 3])
    return cache, query, context_slots, query_index, query_pos, output_index


@pytest.mark.parametrize("soft_cap,window", [(0.0, -1), (5.0, 2)])
def test_paged_attention_runs_natively_for_float32(soft_cap, window):
    args = _attention_inputs(torch.float32)
    cache, query, cs, qi, qp, oi = args
    want = torch.ops.tpu.paged_attention(query, cache, cs, qi, qp, oi, 0.35, soft_cap, window)
    before = C.native_attention_calls()
    got = torch.ops.tpu.paged_attention(query.to(TPU), cache.to(TPU), cs.to(TPU), qi.to(TPU),
                                        qp.to(TPU), oi.to(TPU), 0.35, soft_cap, window)
    torch.tpu.synchronize()
    assert C.native_attention_calls() == before + 1
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_paged_attention_over_many_rows_matches_cpu():
    """A grid big enough for the kernel to split its rows across the thread pool
    (attention_kernel.c): 6 requests of 16-token chunks (positions 40..55) in a 64-block cache
    of 8 slots, 8 query heads over 2 kv heads of 64; one request's rows are all padding."""
    torch.manual_seed(5)
    R, Q, S, H, KVH, D, bs = 6, 16, 64, 8, 2, 64, 8
    cache = torch.randn(64, bs, KVH, 2 * D)
    query = torch.randn(R * Q, H, D)
    blocks = torch.randperm(64)[: R * (S // bs)].view(R, S // bs)
    cs = (blocks[:, torch.arange(S) // bs] * bs + torch.arange(S) % bs).contiguous()
    qi = torch.arange(R * Q).view(R, Q)
    qp = (40 + torch.arange(Q)).expand(R, Q).clone()
    qp[3] = -1
    oi = torch.arange(R * Q)
    want = torch.ops.tpu.paged_attention(query, cache, cs, qi, qp, oi, 0.125, 0.0, -1)
    before = C.native_attention_calls()
    got = torch.ops.tpu.paged_attention(query.to(TPU), cache.to(TPU), cs.to(TPU), qi.to(TPU),
                                        qp.to(TPU), oi.to(TPU), 0.125, 0.0, -1)
    torch.tpu.synchronize()
    assert C.native_attention_calls() == before + 1
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert not got[3 * Q:4 * Q].cpu().any()


def test_paged_attention_of_other_dtypes_stays_with_xla():
    cache, query, cs, qi, qp, oi = _attention_inputs(torch.bfloat16)
    before = C.native_attention_calls()
    torch.ops.tpu.paged_attention(query.to(TPU), cache.to(TPU), cs.to(TPU), qi.to(TPU),
                                  qp.to(TPU), oi.to(TPU), 0.35, 0.0, -1)
    torch.tpu.synchronize()
    assert C.native_attention_calls() == before
