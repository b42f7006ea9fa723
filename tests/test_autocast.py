"""torch.autocast("tpu"): CUDA's cast policy on the tpu device (csrc/bridge/autocast.cpp), and
torch.amp.GradScaler("tpu") (its two ops are lowered in csrc/ops/optim.c).

References: an op under tpu autocast must equal the same op run on CPU, without autocast, on the
inputs cast as CUDA's policy casts them (lower precision for matmul-like ops, float32 for the
fp32 list, the widest input dtype for the promote list). Training runs compare against CPU
autocast (whose policy agrees with CUDA's on the ops those models use). Every tpu run checks
that nothing fell back to the CPU.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import grad_mismatches
from torch_pjrt import _models

TPU = torch.device("tpu")
LOW = [torch.bfloat16, torch.float16]
TOL = {torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.float32: dict(rtol=1e-5, atol=1e-5)}


def _rand(shape, seed, lo=-1.0, hi=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * (hi - lo) + lo).to(dtype)


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices
        return fn(*args)


def _tpu(ts):
    return [t.to(TPU) if isinstance(t, torch.Tensor) else t for t in ts]


# ---- lower_precision_fp: name -> (function, input shapes) ------------------------------------

_LOWER = {
    "mm": (torch.mm, [(4, 8), (8, 5)]),
    "matmul": (torch.matmul, [(3, 4, 8), (8, 5)]),
    "bmm": (torch.bmm, [(2, 4, 8), (2, 8, 5)]),
    "addmm": (torch.addmm, [(4, 5), (4, 8), (8, 5)]),
    "baddbmm": (torch.baddbmm, [(2, 4, 5), (2, 4, 8), (2, 8, 5)]),
    "addbmm": (torch.addbmm, [(4, 5), (2, 4, 8), (2, 8, 5)]),
    "addmv": (torch.addmv, [(4,), (4, 8), (8,)]),
    "addr": (torch.addr, [(4, 5), (4,), (5,)]),
    "mv": (torch.mv, [(4, 8), (8,)]),
    "linear": (F.linear, [(6, 8), (5, 8), (5,)]),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), [(4, 8), (8, 5)]),
    "linalg_multi_dot": (lambda a, b, c: torch.linalg.multi_dot([a, b, c]),
                         [(3, 4), (4, 5), (5, 2)]),
    "chain_matmul": (lambda a, b, c: _quiet(torch.chain_matmul, a, b, c), [(3, 4), (4, 5), (5, 2)]),
    "conv3d": (F.conv3d, [(1, 2, 4, 4, 4), (3, 2, 2, 2, 2), (3,)]),
    "conv_transpose1d": (F.conv_transpose1d, [(2, 4, 5), (4, 3, 3), (3,)]),
    "linalg_vecdot": (torch.linalg.vecdot, [(3, 8), (3, 8)]),
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, padding=1), [(2, 3, 10), (4, 3, 3), (4,)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2), [(2, 3, 8, 8), (4, 3, 3, 3), (4,)]),
    "conv_transpose2d": (F.conv_transpose2d, [(2, 4, 5, 5), (4, 3, 3, 3), (3,)]),
    "prelu": (F.prelu, [(2, 3, 4), (3,)]),
    "sdpa": (F.scaled_dot_product_attention, [(2, 2, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8)]),
}


@pytest.mark.parametrize("dt", LOW, ids=str)
@pytest.mark.parametrize("name", list(_LOWER))
def test_lower_precision_ops(name, dt, fallbacks):
    fn, shapes = _LOWER[name]
    xs = [_rand(s, seed=i) for i, s in enumerate(shapes)]
    ref = fn(*[x.to(dt) for x in xs])  # CPU, no autocast, inputs cast as CUDA's policy casts them
    with torch.autocast("tpu", dtype=dt):
        out = fn(*_tpu(xs))
    assert out.dtype == dt == ref.dtype
    torch.testing.assert_close(out.cpu(), ref, **TOL[dt])
    fallbacks.assert_none(name)


def test_default_dtype_is_float16_like_cuda():
    a = _rand((4, 4), 0).to(TPU)
    assert torch.get_autocast_dtype("tpu") == torch.float16
    assert torch.tpu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.tpu.is_bf16_supported() is True
    for ctx in (torch.autocast("tpu"), torch.amp.autocast("tpu"),
                torch.autocast(device_type="tpu")):
        assert not torch.is_autocast_enabled("tpu")
        with ctx:
            assert torch.is_autocast_enabled("tpu")
            assert (a @ a).dtype == torch.float16
        assert (a @ a).dtype == torch.float32


# ---- fp32, fp32_set_opt_dtype, fp32_append_dtype ---------------------------------------------

_POS = dict(lo=0.1, hi=2.0)
_UNIT = dict(lo=-0.9, hi=0.9)
_FP32 = {
    "exp": (torch.exp, [((3, 5), {})]),
    "log": (torch.log, [((3, 5), _POS)]),
    "log2": (torch.log2, [((3, 5), _POS)]),
    "log1p": (torch.log1p, [((3, 5), _POS)]),
    "expm1": (torch.expm1, [((3, 5), {})]),
    "acos": (torch.acos, [((3, 5), _UNIT)]),
    "asin": (torch.asin, [((3, 5), _UNIT)]),
    "cosh": (torch.cosh, [((3, 5), {})]),
    "sinh": (torch.sinh, [((3, 5), {})]),
    "tan": (torch.tan, [((3, 5), {})]),
    "erfinv": (torch.erfinv, [((3, 5), _UNIT)]),
    "rsqrt": (torch.rsqrt, [((3, 5), _POS)]),
    "reciprocal": (torch.reciprocal, [((3, 5), _POS)]),
    "pow_scalar_exp": (lambda x: torch.pow(x, 3), [((3, 5), {})]),
    "pow_tensor": (torch.pow, [((3, 5), _POS), ((3, 5), {})]),
    "pow_scalar_base": (lambda x: torch.pow(2.0, x), [((3, 5), {})]),
    "softplus": (F.softplus, [((3, 5), {})]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (5,), w, b), [((3, 5), {}), ((5,), {}),
                                                               ((5,), {})]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (5,), w), [((3, 5), {}), ((5,), {})]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [((2, 4, 3), {}), ((4,), {}),
                                                             ((4,), {})]),
    "cosine_similarity": (F.cosine_similarity, [((3, 5), {}), ((3, 5), {})]),
    "mse_loss": (F.mse_loss, [((3, 5), {}), ((3, 5), {})]),
    "l1_loss": (F.l1_loss, [((3, 5), {}), ((3, 5), {})]),
    "smooth_l1_loss": (F.smooth_l1_loss, [((3, 5), {}), ((3, 5), {})]),
    "huber_loss": (F.huber_loss, [((3, 5), {}), ((3, 5), {})]),
    "kl_div": (lambda x, y: F.kl_div(x, y, reduction="batchmean"), [((3, 5), {}),
                                                                    ((3, 5), _POS)]),
    "bce_with_logits": (F.binary_cross_entropy_with_logits, [((3, 5), {}), ((3, 5), _POS)]),
    "logsumexp": (lambda x: torch.logsumexp(x, 1), [((3, 5), {})]),
    "cdist": (torch.cdist, [((3, 4), {}), ((5, 4), {})]),
    "dist": (torch.dist, [((3, 4), {}), ((3, 4), {})]),
    "renorm": (lambda x: torch.renorm(x, 2, 0, 1.0), [((3, 5), {})]),
    "upsample_nearest2d": (lambda x: F.interpolate(x, scale_factor=2), [((1, 2, 3, 3), {})]),
    "upsample_bilinear2d": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
                            [((1, 2, 3, 3), {})]),
    # fp32_set_opt_dtype
    "softmax": (lambda x: torch.softmax(x, -1), [((3, 5), {})]),
    "log_softmax": (lambda x: F.log_softmax(x, 1), [((3, 5), {})]),
    "cumsum": (lambda x: torch.cumsum(x, 1), [((3, 5), {})]),
    "cumprod": (lambda x: torch.cumprod(x, 1), [((3, 5), {})]),
    "sum": (torch.sum, [((3, 5), {})]),
    "sum_dim": (lambda x: x.sum(1), [((3, 5), {})]),
    "prod": (torch.prod, [((3, 5), _POS)]),
    "vector_norm": (torch.linalg.vector_norm, [((3, 5), {})]),
    # fp32_append_dtype
    "norm": (torch.norm, [((3, 5), {})]),
    "norm_dim": (lambda x: torch.norm(x, 2, 1), [((3, 5), {})]),
    "nll_loss": (lambda x: F.nll_loss(x, torch.tensor([1, 0, 4], device=x.device)),
                 [((3, 5), {})]),
}


@pytest.mark.parametrize("dt", LOW, ids=str)
@pytest.mark.parametrize("name", list(_FP32))
def test_fp32_ops(name, dt, fallbacks):
    """Lower-precision inputs run in float32: equal to the op on the inputs cast to float."""
    fn, specs = _FP32[name]
    xs = [_rand(s, seed=i, **kw).to(dt) for i, (s, kw) in enumerate(specs)]
    ref = fn(*[x.float() for x in xs])
    with torch.autocast("tpu", dtype=dt):
        out = fn(*_tpu(xs))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-5, atol=2e-5)
    fallbacks.assert_none(name)


def test_explicit_dtype_is_kept(fallbacks):
    """fp32_set_opt_dtype ops keep a dtype the caller passes; unlisted ops keep theirs."""
    x = _rand((3, 5), 0).half()
    xt = x.to(TPU)
    with torch.autocast("tpu", dtype=torch.float16):
        s = torch.sum(xt, dtype=torch.float16)
        sm = torch.softmax(xt, 1, dtype=torch.float64)
        r, a, m = F.relu(xt), xt + xt, xt + xt.float()
    assert (s.dtype, sm.dtype) == (torch.float16, torch.float64)
    assert (r.dtype, a.dtype, m.dtype) == (torch.float16, torch.float16, torch.float32)
    torch.testing.assert_close(s.cpu(), torch.sum(x, dtype=torch.float16))
    torch.testing.assert_close(sm.cpu(), torch.softmax(x, 1, dtype=torch.float64))
    torch.testing.assert_close(r.cpu(), F.relu(x))
    fallbacks.assert_none()


# ---- promote ---------------------------------------------------------------------------------

_PROMOTE = {
    "dot": (torch.dot, [(6,), (6,)]),
    "vdot": (torch.vdot, [(6,), (6,)]),
    "cross": (lambda a, b: torch.linalg.cross(a, b), [(4, 3), (4, 3)]),
    "tensordot": (lambda a, b: torch.tensordot(a, b, dims=1), [(3, 4), (4, 2)]),
    "bilinear": (lambda a, b, w: F.bilinear(a, b, w), [(3, 4), (3, 5), (2, 4, 5)]),
    "index_put": (lambda x, v: torch.index_put(x, (torch.tensor([0, 2], device=x.device),), v),
                  [(4, 3), (2, 3)]),
    "scatter_add": (lambda x, s: x.scatter_add(0, torch.tensor([[0, 1, 0]], device=x.device), s),
                    [(2, 3), (1, 3)]),
    "addcmul": (torch.addcmul, [(3, 4), (3, 4), (3, 4)]),
    "addcdiv": (lambda a, b, c: torch.addcdiv(a, b, c, value=0.5), [(3, 4), (3, 4), (3, 4)]),
    "atan2": (torch.atan2, [(3, 4), (3, 4)]),
}
_PROMOTE_RANGE = {"addcdiv": {2: _POS}}  # input index -> value range (a divisor away from 0)


@pytest.mark.parametrize("name", list(_PROMOTE))
def test_promote_ops(name, fallbacks):
    """Mixed float32/lower-precision inputs run in float32; all-lower-precision inputs stay."""
    fn, shapes = _PROMOTE[name]
    xs = [_rand(s, seed=i, **_PROMOTE_RANGE.get(name, {}).get(i, {})) for i, s in enumerate(shapes)]
    mixed = [x if i == 0 else x.half() for i, x in enumerate(xs)]
    ref = fn(*[x.float() for x in mixed])
    with torch.autocast("tpu", dtype=torch.float16):
        out = fn(*_tpu(mixed))
        low = fn(*_tpu([x.half() for x in xs]))
    assert out.dtype == torch.float32 and low.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(low.cpu(), fn(*[x.half() for x in xs]), rtol=2e-3, atol=2e-3)
    fallbacks.assert_none(name)


@pytest.mark.parametrize("name", ["dot", "vdot", "scatter_add", "tensordot"])
def test_mixed_dtypes_without_autocast_raise_like_cpu(name):
    fn, shapes = _PROMOTE[name]
    mixed = [_rand(s, seed=i) if i == 0 else _rand(s, seed=i).half()
             for i, s in enumerate(shapes)]
    with pytest.raises(RuntimeError) as cpu_err:
        fn(*mixed)
    with pytest.raises(cpu_err.type):
        fn(*_tpu(mixed))
    with torch.autocast("tpu", enabled=False):
        with pytest.raises(cpu_err.type):
            fn(*_tpu(mixed))


# ---- nesting, eligibility, device isolation, refusals ----------------------------------------

def test_nested_autocast(fallbacks):
    a, b = _rand((4, 8), 0), _rand((8, 3), 1)
    at, bt = a.to(TPU), b.to(TPU)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert (at @ bt).dtype == torch.bfloat16
        with torch.autocast("tpu", enabled=False):
            assert not torch.is_autocast_enabled("tpu")
            out = at @ bt
            assert out.dtype == torch.float32
            torch.testing.assert_close(out.cpu(), a @ b, rtol=1e-5, atol=1e-5)
            with pytest.raises(RuntimeError):
                a @ b.bfloat16()  # CPU refuses mixed dtypes outside autocast ...
            with pytest.raises(RuntimeError):
                at @ bt.bfloat16()  # ... and so does tpu
            # an explicit cast inside the disabled region is honored
            assert (at.bfloat16() @ bt.bfloat16()).dtype == torch.bfloat16
        with torch.autocast("tpu", dtype=torch.float16):
            assert (at @ bt).dtype == torch.float16
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16
        out = at @ bt
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.cpu(), a.bfloat16() @ b.bfloat16(), **TOL[torch.bfloat16])
    assert not torch.is_autocast_enabled("tpu")
    assert (at @ bt).dtype == torch.float32
    fallbacks.assert_none()


def test_ineligible_tensors_are_not_cast(fallbacks):
    """float64 inputs are left alone (as CUDA leaves them); so are CPU tensors under tpu
    autocast, and tpu tensors under CPU autocast."""
    a = _rand((4, 4), 0, dtype=torch.float64)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        out = a.to(TPU) @ a.to(TPU)
        cpu_out = a.float() @ a.float()
    assert out.dtype == torch.float64 and cpu_out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), a @ a)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a.float().to(TPU) @ a.float().to(TPU)).dtype == torch.float32
        assert (a.float() @ a.float()).dtype == torch.bfloat16
    fallbacks.assert_none()


def test_binary_cross_entropy_is_refused_like_cuda():
    p, y = _rand((3, 4), 0, lo=0.1, hi=0.9), _rand((3, 4), 1, lo=0, hi=1)
    pt, yt = p.to(TPU), y.to(TPU)
    with torch.autocast("tpu", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(pt, yt)
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.BCELoss()(pt, yt)
    torch.testing.assert_close(F.binary_cross_entropy(pt, yt).cpu(), F.binary_cross_entropy(p, y))


def test_unsupported_dtype_disables_autocast_with_a_warning():
    a = _rand((4, 4), 0).to(TPU)
    with pytest.warns(UserWarning, match="Disabling autocast"):
        ctx = torch.autocast("tpu", dtype=torch.float32)
    with ctx:
        assert not torch.is_autocast_enabled("tpu")
        assert (a @ a).dtype == torch.float32


def test_bad_arguments_raise_like_cpu():
    assert torch.amp.is_autocast_available("tpu")
    for dev in ("cpu", "tpu"):
        with pytest.raises(ValueError, match="device_type"):
            torch.autocast(torch.device(dev))  # a torch.device, not a string
        with pytest.raises(RuntimeError):
            torch.autocast(dev + "x")


def test_cross_entropy_follows_cudas_policy(fallbacks):
    """cross_entropy is not in CUDA's lists: its decomposition calls log_softmax with an
    explicit dtype (the input's, kept), then nll_loss (fp32). So the log-probabilities are
    rounded to the lower precision and the loss is summed in float32, as on CUDA."""
    y = torch.tensor([1, 0, 4])
    for dt in LOW:
        x = _rand((3, 5), 0).to(dt)
        ref = F.nll_loss(F.log_softmax(x, 1).float(), y)
        with torch.autocast("tpu", dtype=dt):
            out = F.cross_entropy(x.to(TPU), y.to(TPU))
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.cpu(), ref, **TOL[dt])
    fallbacks.assert_none()


# ---- training ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", LOW, ids=str)
def test_backward_matches_cpu_autocast(dt, mode, fallbacks):
    """MLP forward under autocast, backward outside it: gradients are float32 like the
    parameters and close to CPU autocast's (both run linear in `dt`, the loss in float32).
    Once per eager mode."""
    m = _models.init_weights(_models.MLP(), seed=5)
    mt = copy.deepcopy(m).to(TPU)
    x = _rand((16, 32), 0)
    y = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(1))
    fallbacks.reset()
    outs = []
    for model, dev in ((m, "cpu"), (mt, "tpu")):
        with torch.autocast(dev, dtype=dt):
            out = model(x.to(dev))
            loss = F.cross_entropy(out, y.to(dev))
        assert out.dtype == dt and loss.dtype == torch.float32
        loss.backward()
        outs.append((out, loss))
    fallbacks.assert_none("autocast forward and backward")
    torch.testing.assert_close(outs[1][0].cpu(), outs[0][0], **TOL[dt])
    torch.testing.assert_close(outs[1][1].cpu(), outs[0][1], rtol=1e-2, atol=1e-3)
    for p in mt.parameters():
        assert p.grad.dtype == p.dtype == torch.float32
    rtol = 3e-2 if dt == torch.bfloat16 else 3e-3
    assert not grad_mismatches(m, mt, rtol=rtol, atol=rtol / 10)


def _scaler_training(model, dev, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(dev, init_scale=2.0**20, growth_interval=2)
    g = torch.Generator().manual_seed(7)
    scales, losses, skipped = [], [], []
    for _ in range(steps):
        x, y = torch.randn(16, 32, generator=g).to(dev), torch.randn(16, 10, generator=g).to(dev)
        opt.zero_grad()
        with torch.autocast(dev, dtype=torch.float16):
            out = model(x)
            loss = F.mse_loss(out, y)
        assert out.dtype == torch.float16 and loss.dtype == torch.float32
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < before)
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    return scales, losses, skipped


def test_grad_scaler_training_matches_cpu(mode, fallbacks):
    """GradScaler("tpu") + float16 autocast against GradScaler("cpu") + CPU float16 autocast:
    the same steps are skipped for inf gradients (the initial scale overflows float16), the
    scale follows the same sequence, and parameters, gradients and losses agree. Once per eager
    mode."""
    m = _models.init_weights(_models.MLP(), seed=9)
    mt = copy.deepcopy(m).to(TPU)
    cpu = _scaler_training(m, "cpu", 8)
    fallbacks.reset()
    tpu = _scaler_training(mt, "tpu", 8)
    fallbacks.assert_none("GradScaler steps")
    assert tpu[0] == cpu[0]  # scales, exactly
    assert tpu[2] == cpu[2] and any(tpu[2]) and not all(tpu[2])  # some steps skipped, not all
    torch.testing.assert_close(tpu[1], cpu[1], rtol=1e-3, atol=1e-4)
    for (name, p), q in zip(m.named_parameters(), mt.parameters()):
        assert q.grad.dtype == q.dtype == torch.float32, name
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-3, atol=1e-4, msg=name)
    assert not grad_mismatches(m, mt, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float32, torch.float64],
                         ids=str)
def test_unscale_op_matches_cpu(dt, fallbacks):
    def run(dev, with_inf):
        grads = [_rand((3, 5), 0, lo=-3e4, hi=3e4).to(dt), _rand((7,), 1).to(dt),
                 torch.empty(0, dtype=dt)]
        if with_inf:
            grads[1][3] = float("nan") if dt == torch.float32 else float("inf")
        grads = [t.to(dev) for t in grads]
        found = torch.full((1,), 0.25).to(dev)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.tensor(1 / 3).to(dev))
        return [t.cpu() for t in grads], found.cpu()

    fallbacks.reset()
    for with_inf in (False, True):
        (gc, fc), (gt, ft) = run("cpu", with_inf), run(TPU, with_inf)
        torch.testing.assert_close(ft, fc, rtol=0, atol=0)
        assert fc.item() == (1.0 if with_inf else 0.25)  # kept when all finite
        for a, b in zip(gt, gc):
            assert a.dtype == b.dtype == dt
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    fallbacks.assert_none()


def test_unscale_of_many_gradients_matches_cpu(fallbacks):
    """More gradients than one lowered call holds (a large model's GradScaler step) run in
    chunks sharing found_inf; an inf in a late chunk is found."""
    res = {}
    fallbacks.reset()
    for dev in ("cpu", TPU):
        grads = [torch.full((2,), float(i)) for i in range(600)]
        grads[555][1] = float("inf")
        grads = [g.to(dev) for g in grads]
        found = torch.zeros(()).to(dev)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.tensor(0.5).to(dev))
        res[str(dev)] = (found.cpu(), torch.stack([g.cpu() for g in grads]))
    fallbacks.assert_none()
    assert res["cpu"][0].item() == 1.0 and res["cpu"][1][599, 0].item() == 299.5
    torch.testing.assert_close(res["tpu"], res["cpu"], rtol=0, atol=0)


def test_update_scale_op_matches_cpu(fallbacks):
    # (found_inf, growth_factor, growth_interval): growth, backoff on inf and NaN, overflow to
    # inf refused, tracker counting up to the interval
    seq = [(0.0, 2.0, 1), (float("nan"), 2.0, 1), (0.0, 2.0, 3), (0.0, 2.0, 3), (0.0, 2.0, 3),
           (1.0, 2.0, 3), (0.0, 1.5, 2), (0.0, 1.5, 2), (0.0, 1.0001, 1)]
    res = {}
    fallbacks.reset()
    for dev in ("cpu", TPU):
        scale = torch.tensor([3.0e38]).to(dev)
        tracker = torch.zeros(1, dtype=torch.int32).to(dev)
        trace = []
        for found, growth, interval in seq:
            r = torch._amp_update_scale_(scale, tracker, torch.tensor([found]).to(dev), growth,
                                         0.25, interval)
            assert r is scale
            trace.append((scale.item(), tracker.item()))
        res[str(dev)] = trace
    fallbacks.assert_none()
    assert res["tpu"] == res["cpu"]


def test_functional_amp_ops_match_cpu(fallbacks):
    """The out-of-place forms (what functionalization produces) leave their inputs alone."""
    res = {}
    fallbacks.reset()
    for dev in ("cpu", TPU):
        g = [torch.tensor([1.0, 2.0, float("inf")]).to(dev), torch.tensor([3.0]).to(dev)]
        outs, found = torch.ops.aten._amp_foreach_non_finite_check_and_unscale(
            g, torch.zeros(1).to(dev), torch.tensor([0.5]).to(dev))
        scale, tracker = torch.ops.aten._amp_update_scale(
            torch.tensor([4.0]).to(dev), torch.tensor([1], dtype=torch.int32).to(dev),
            torch.zeros(1).to(dev), 2.0, 0.5, 2)
        res[str(dev)] = [t.cpu() for t in [*outs, found, *g, scale, tracker]]
    fallbacks.assert_none()
    for t, c in zip(res["tpu"], res["cpu"]):
        assert t.dtype == c.dtype
        torch.testing.assert_close(t, c, rtol=0, atol=0)
    assert res["cpu"][2].item() == 1.0 and res["cpu"][3][2].item() == float("inf")


def test_amp_op_errors_match_cpu():
    f32, i32 = torch.ones(1), torch.zeros(1, dtype=torch.int32)
    cases = [
        lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(2, dtype=torch.long, device=d)], f32.to(d), f32.to(d)),
        lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(2, device=d)], torch.zeros(2, device=d), f32.to(d)),
        lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(2, device=d)], f32.to(d), f32.double().to(d)),
        lambda d: torch._amp_update_scale_(f32.to(d), i32.long().to(d), f32.to(d), 2.0, 0.5, 3),
        lambda d: torch._amp_update_scale_(torch.ones(2, device=d), i32.to(d), f32.to(d), 2.0,
                                           0.5, 3),
        lambda d: torch._amp_update_scale_(f32.to(d), i32.to(d), f32.half().to(d), 2.0, 0.5, 3),
    ]
    for case in cases:
        with pytest.raises(Exception) as cpu_err:
            case("cpu")
        with pytest.raises(cpu_err.type) as tpu_err:
            case(TPU)
        assert type(tpu_err.value) is type(cpu_err.value)


# ---- torch.compile ---------------------------------------------------------------------------

def test_compiled_autocast_matches_eager(fallbacks):
    def f(x, w, b):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            y = F.linear(x, w, b)
            z = torch.softmax(y, -1)
            with torch.autocast("tpu", enabled=False):
                u = y.float() @ w
        return y, z, u, F.gelu(y)

    args = _tpu([_rand((8, 16), 0), _rand((4, 16), 1), _rand((4,), 2)])
    eager = f(*args)
    fallbacks.reset()
    compiled = torch.compile(f, backend="tpu")(*args)
    fallbacks.assert_none("compiled autocast")
    assert [t.dtype for t in eager] == [torch.bfloat16, torch.float32, torch.float32,
                                        torch.bfloat16]
    for c, e in zip(compiled, eager):
        assert c.dtype == e.dtype
        torch.testing.assert_close(c.cpu(), e.cpu(), **TOL[e.dtype])


def test_compiled_training_step_under_autocast(fallbacks):
    """Autocast around a compiled model (Dynamo guards on the autocast state): forward and
    gradients equal eager tpu autocast's, and the same compiled model outside autocast runs
    in float32."""
    m = _models.init_weights(_models.MLP(), seed=11).to(TPU)
    mc = copy.deepcopy(m)
    cm = torch.compile(mc, backend="tpu")
    x = _rand((16, 32), 3).to(TPU)
    y = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(4)).to(TPU)
    fallbacks.reset()
    for model in (m, cm):
        with torch.autocast("tpu", dtype=torch.float16):
            out = model(x)
            F.cross_entropy(out, y).backward()
        assert out.dtype == torch.float16
    fallbacks.assert_none("compiled training step")
    for (name, p), q in zip(m.named_parameters(), mc.parameters()):
        assert q.grad.dtype == torch.float32
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=2e-3, atol=2e-4, msg=name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cm(x).dtype == torch.float32
