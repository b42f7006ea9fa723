"""uint8 bilinear / bicubic upsampling (plain and antialiased) on tpu against CPU.

CPU resamples uint8 images with a fixed-point separable kernel (csrc/ops/conv.c, resample_u8):
int16 weights, int32 sums, round-shift-clamp, width then height through a uint8 intermediate.
tpu reproduces it bit for bit, so values are compared exactly, with dtype, shape and strides
(channels_last in, channels_last out). CPU refuses uint8 for linear 1-d, trilinear and every
backward, and other integer dtypes for all of these modes: tpu raises the same error type.

One case is compared with a reference instead of CPU: an output width of 1. CPU's generic
separable kernel (used for more than 4 channels, or without AVX2) then repeats the first output
row down the height pass, in float and uint8 alike; its vectorized uint8 kernel and tpu compute
the resampling as defined, which the plain-Python reference below restates.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt

TPU = torch.device("tpu")
A = torch.ops.aten
OPS = {
    ("bilinear", False): A.upsample_bilinear2d,
    ("bilinear", True): A._upsample_bilinear2d_aa,
    ("bicubic", False): A.upsample_bicubic2d,
    ("bicubic", True): A._upsample_bicubic2d_aa,
}


def fallbacks():
    return dict(torch_pjrt._C.fallback_ops())


def u8(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)


def same(got, exp):
    assert got.device.type == "tpu"
    assert got.dtype == exp.dtype and got.shape == exp.shape, (got.dtype, got.shape, exp.dtype, exp.shape)
    assert got.stride() == exp.stride(), (got.stride(), exp.stride())
    g = got.cpu()
    diff = (g.int() - exp.int()).abs()
    assert torch.equal(g, exp), f"max diff {diff.max().item()}, {(diff > 0).float().mean().item():.2%} differ"


@pytest.mark.parametrize("mode,aa", list(OPS))
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("shape,size", [
    ((2, 3, 9, 11), (20, 25)),   # up both
    ((1, 5, 30, 27), (7, 4)),    # down both (antialias spans many taps)
    ((2, 5, 12, 12), (5, 31)),   # down one, up the other
    ((1, 3, 10, 13), (10, 6)),   # height unchanged: only the width pass
    ((1, 4, 13, 10), (6, 10)),   # width unchanged: only the height pass
    ((1, 3, 6, 7), (6, 7)),      # same size: a copy
    ((1, 2, 1, 5), (4, 9)),      # a single input row
])
def test_values_match_cpu(mode, aa, align, shape, size):
    x = u8(*shape)
    before = fallbacks()
    op = OPS[(mode, aa)]
    same(op(x.to(TPU), list(size), align), op(x, list(size), align))
    assert fallbacks() == before


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("aa", [False, True])
@pytest.mark.parametrize("sf", [0.37, 1.7, (2.5, 0.6)])
@pytest.mark.parametrize("recompute", [False, True])
def test_scale_factor(mode, aa, sf, recompute):
    # without recompute_scale_factor the given scales (not the size ratio) set the weights
    x = u8(2, 3, 17, 23, seed=1)
    kw = dict(scale_factor=sf, mode=mode, antialias=aa, recompute_scale_factor=recompute)
    same(F.interpolate(x.to(TPU), **kw), F.interpolate(x, **kw))


@pytest.mark.parametrize("mode,aa", list(OPS))
@pytest.mark.parametrize("layout", ["channels_last", "sliced", "restrided", "unsqueezed",
                                    "channels_last_sliced", "channels_last_unsqueezed"])
def test_layouts(mode, aa, layout):
    x = u8(1 if "unsqueezed" in layout else 2, 5 if aa else 3, 24, 24, seed=2)
    if layout.startswith("channels_last"):
        x = x.contiguous(memory_format=torch.channels_last)

    def view(t):
        if layout.endswith("sliced"):
            t = t[:, :, 3:-3, 2:-2]
        elif layout == "restrided":
            t = t[:, :, ::2, ::3]
        elif layout.endswith("unsqueezed"):
            t = t[0][None]
        return t

    xc, xt = view(x), view(x.to(TPU))
    assert xt.stride() == xc.stride()
    for size in [(9, 9), (31, 33)]:
        kw = dict(size=size, mode=mode, antialias=aa)
        exp = F.interpolate(xc, **kw)
        if layout in ("channels_last", "channels_last_sliced"):
            assert exp.is_contiguous(memory_format=torch.channels_last)
        same(F.interpolate(xt, **kw), exp)


def test_float_consistency():
    # what PyTorch's test_upsamplingBiMode2d_consistency checks, on a small image: bilinear
    # uint8 within 1 of float rounded and clamped
    x = u8(2, 3, 40, 40, seed=3)
    for aa in [False, True]:
        for size in [8, 57]:
            kw = dict(size=(size, size), mode="bilinear", antialias=aa)
            ref = F.interpolate(x.float(), **kw).round().clip(0, 255)
            got = F.interpolate(x.to(TPU), **kw).cpu()
            assert (got.float() - ref).abs().max() <= 1


# ---- width 1: a plain-Python statement of the fixed-point algorithm ----

def _filter(x, cubic, a):
    x = abs(x)
    if not cubic:
        return 1.0 - x if x < 1.0 else 0.0
    if x < 1.0:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2.0:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


def _taps(n_in, n_out, cubic, aa):
    """[(first, [int weights])] per output and the precision; no align_corners, no scales."""
    scale = n_in / n_out
    ntap = 4 if cubic else 2
    taps, wmax = [], 0.0
    for o in range(n_out):
        if aa:
            support = ntap * 0.5 * max(scale, 1.0)
            center = scale * (o + 0.5)
            inv = 1.0 / scale if scale >= 1.0 else 1.0
            lo = max(int(center - support + 0.5), 0)
            hi = min(int(center + support + 0.5), n_in)
            w = [_filter((k + lo - center + 0.5) * inv, cubic, -0.5) for k in range(hi - lo)]
            w = [v / sum(w) for v in w]
            wmax = max([wmax] + w)
        else:
            src = scale * (o + 0.5) - 0.5
            if not cubic:
                src = max(src, 0.0)
            i0 = min(math.floor(src), n_in - 1)
            t = min(max(src - i0, 0.0), 1.0)
            first = i0 - ntap // 2 + 1
            lo = max(first, 0)
            w = [0.0] * (min(first + ntap, n_in) - lo)
            for k in range(ntap):  # taps outside the input fold onto the edge
                pos = min(max(first + k, 0), n_in - 1)
                w[pos - lo] += _filter(k + 1 - ntap // 2 - t, cubic, -0.75)
                wmax = max(wmax, w[pos - lo])
        taps.append((lo, w))
    prec = 0
    while prec < 22 and int(0.5 + wmax * 2 ** (prec + 1)) < 2 ** 15:
        prec += 1
    q = [(lo, [int(v * 2 ** prec + (0.5 if v >= 0 else -0.5)) for v in w]) for lo, w in taps]
    return q, prec


def _resample(rows, n_out, cubic, aa):
    """rows: list over the resampled dim of lists of values (the other dims flattened)."""
    q, prec = _taps(len(rows), n_out, cubic, aa)
    out = []
    for lo, w in q:
        col = []
        for j in range(len(rows[0])):
            s = sum(rows[lo + k][j] * wk for k, wk in enumerate(w)) + (1 << (prec - 1))
            col.append(min(max(s >> prec, 0), 255))
        out.append(col)
    return out


@pytest.mark.parametrize("mode,aa", list(OPS))
@pytest.mark.parametrize("channels", [3, 5])
def test_width_one(mode, aa, channels):
    cubic = mode == "bicubic"
    x = u8(1, channels, 7, 10, seed=4)
    got = OPS[(mode, aa)](x.to(TPU), [9, 1], False).cpu()
    # width pass (10 -> 1) on rows of [c, h], then height pass (7 -> 9)
    cols = [[int(v) for v in x[0, :, :, w].flatten()] for w in range(10)]
    mid = _resample(cols, 1, cubic, aa)[0]  # [c * 7]
    rows = [[mid[c * 7 + h] for c in range(channels)] for h in range(7)]
    res = _resample(rows, 9, cubic, aa)  # [9][c]
    exp = torch.tensor(res, dtype=torch.uint8).t().reshape(1, channels, 9, 1)
    assert torch.equal(got, exp)


def test_reference_matches_cpu():
    # the reference agrees with CPU wherever CPU is not affected by the width-1 defect
    x = u8(1, 3, 11, 13, seed=5)
    for (mode, aa), op in OPS.items():
        cubic = mode == "bicubic"
        exp = op(x, [6, 17], False)
        rows = [[int(v) for v in x[0, :, :, w].flatten()] for w in range(13)]
        mid = _resample(rows, 17, cubic, aa)  # [17][c * 11]
        cols = [[mid[w][c * 11 + h] for c in range(3) for w in range(17)] for h in range(11)]
        res = _resample(cols, 6, cubic, aa)  # [6][c * 17]
        got = torch.tensor(res, dtype=torch.uint8).reshape(6, 3, 17).permute(1, 0, 2)[None]
        assert torch.equal(got, exp), (mode, aa)


# ---- what CPU refuses ----

def _error(fn, x):
    try:
        fn(x)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e)
    return None


@pytest.mark.parametrize("mode,shape,dt,aa", [
    ("linear", (1, 3, 8), torch.uint8, False),
    ("trilinear", (1, 3, 4, 4, 4), torch.uint8, False),
    ("bilinear", (1, 3, 8, 8), torch.int8, False),
    ("bilinear", (1, 3, 8, 8), torch.int32, True),
    ("bicubic", (1, 3, 8, 8), torch.int64, False),
    ("bicubic", (1, 3, 8, 8), torch.bool, True),
])
def test_refused_forward(mode, shape, dt, aa):
    x = torch.zeros(shape, dtype=dt)
    fn = lambda t: F.interpolate(t, size=(5,) * (len(shape) - 2), mode=mode, antialias=aa)  # noqa: E731
    err = _error(fn, x)
    assert err is NotImplementedError
    assert _error(fn, x.to(TPU)) is err


@pytest.mark.parametrize("mode,aa", list(OPS))
def test_refused_backward(mode, aa):
    name = {("bilinear", False): "upsample_bilinear2d", ("bilinear", True): "_upsample_bilinear2d_aa",
            ("bicubic", False): "upsample_bicubic2d", ("bicubic", True): "_upsample_bicubic2d_aa"}
    bwd = getattr(A, name[(mode, aa)] + "_backward")
    g = u8(1, 3, 5, 5)
    fn = lambda t: bwd(t, [5, 5], [1, 3, 8, 8], False)  # noqa: E731
    err = _error(fn, g)
    assert err is NotImplementedError
    assert _error(fn, g.to(TPU)) is err
