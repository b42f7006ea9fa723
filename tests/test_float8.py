"""Low-precision dtypes on tpu (float8 variants, e8m0, packed float4) and torch._scaled_mm,
against PyTorch on CPU: every code of each 8-bit format cast to every dtype, dense sweeps of
float32 / float64 / float16 / bfloat16 / integer values cast into each format (ties,
subnormals, overflow, NaN, infinities, -0), byte movement ops, CPU's refusals, _scaled_mm.
docs/low_precision.md has the table these tests check."""
import math
import warnings

import pytest
import torch

import torch_pjrt  # noqa: F401

TPU = torch.device("tpu")

F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
      torch.float8_e8m0fnu]
F4 = torch.float4_e2m1fn_x2
LOWP = F8 + [F4]
OTHER = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
         torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def codes(dt):
    """Every code of an 8-bit format, as a CPU tensor of that dtype."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt)


def assert_same(got, want):
    """Values, dtype and shape of a tpu result against CPU's: bytes for the low-precision
    formats (NaN's sign included), else values with NaN == NaN and the sign of zeros."""
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype in LOWP:
        g, w = got.view(torch.uint8), want.view(torch.uint8)
        bad = (g != w).nonzero().flatten()[:8]
        assert bad.numel() == 0, f"codes differ at {bad.tolist()}: {g[bad].tolist()} vs {w[bad].tolist()}"
        return
    if want.is_complex():
        assert_same(torch.view_as_real(got), torch.view_as_real(want))
        return
    if want.is_floating_point():
        g, w = got.double(), want.double()
        same = (g == w) | (g.isnan() & w.isnan())
        # zeros' signs; NaN's sign is not compared here (the existing float32 -> bfloat16
        # conversion keeps it where CPU's drops it, independently of these dtypes)
        same &= (torch.signbit(g) == torch.signbit(w)) | w.isnan()
        bad = (~same).nonzero().flatten()[:8]
        assert bad.numel() == 0, f"differ at {bad.tolist()}: {g[bad].tolist()} vs {w[bad].tolist()}"
        return
    assert torch.equal(got, want)


def int_safe(values_f32, dt):
    """Mask of float values whose cast to integer dtype dt is defined in C++ (finite, in
    range). Outside it CPU wraps (through int32/int64) and the existing float-to-integer
    conversion of tpu saturates, for float32 tensors as well: not these dtypes' rule."""
    if dt == torch.bool or dt.is_floating_point or dt.is_complex:
        return torch.ones_like(values_f32, dtype=torch.bool)
    info = torch.iinfo(dt)
    v = values_f32.double()
    return v.isfinite() & (v > float(info.min) - 1) & (v < float(info.max) + 1)


# ---- every code of each format to every dtype ----

@pytest.mark.parametrize("src", F8, ids=str)
def test_every_code_to_every_dtype(src, fallbacks):
    c = codes(src)
    d = c.to(TPU)
    as_f32 = c.float()
    for dt in OTHER + F8:
        if dt == src:
            continue
        keep = int_safe(as_f32, dt)
        assert_same(d[keep.to(TPU)].to(dt), c[keep].to(dt))
    fallbacks.assert_none()


# ---- values of every other dtype into each format ----

def float32_sweep():
    """Every bfloat16 bit pattern as float32 (every tie of the 8-bit formats: their rounding
    bit and everything below it are zero), those patterns one ulp up and down, and a strided
    walk through all 2^32 float32 bit patterns."""
    hi = torch.arange(65536, dtype=torch.int64) << 16
    bits = torch.cat([hi, hi + 1, (hi - 1).clamp_min(0), torch.arange(0, 2**32, 4099)])
    return (bits - (bits >= 2**31).long() * 2**32).to(torch.int32).view(torch.float32)


SPECIAL = [0.0, -0.0, 1.0, -1.0, 500.0, 1e6, -3e5, math.nan, -math.nan, math.inf, -math.inf,
           0.0013, 448.0, 464.0, 464.01, 470.0, 479.99, 480.0, 240.0, 247.9, 248.0, 256.0,
           57344.0, 61439.0, 61440.0, 65535.0, 65536.0, 2.0**-6, 2.0**-7, 2.0**-9, 2.0**-10,
           2.0**-16, 2.0**-17, 1.5 * 2.0**-17, 2.0**-18, 1.5 * 2.0**127, 2.0**127, 3.4e38,
           1e-45, -1e-45, 1.5, 2.5, 3.0 * 2.0**-127, 2.0**-127, 2.0**-126]


@pytest.mark.parametrize("dst", F8, ids=str)
def test_float32_into_format(dst, fallbacks):
    x = torch.cat([float32_sweep(), torch.tensor(SPECIAL, dtype=torch.float32)])
    assert_same(x.to(TPU).to(dst), x.to(dst))
    fallbacks.assert_none()


@pytest.mark.parametrize("dst", F8, ids=str)
def test_other_dtypes_into_format(dst, fallbacks):
    h16 = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    b16 = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    # float64 just off float32 ties: rounding to float32 first decides them, as on CPU
    f32 = float32_sweep()[::7].double()
    f64 = torch.cat([f32, f32 * (1 + 2.0**-30), f32 * (1 - 2.0**-30),
                     torch.tensor(SPECIAL, dtype=torch.float64), torch.tensor([1e300, -1e-300])])
    ints = torch.cat([torch.arange(-70000, 70000, 13), torch.tensor([2**40 + 1, -2**62, 2**63 - 1])])
    cases = [h16, b16, f64, ints, ints.int(), ints.clamp(-32768, 32767).short(),
             torch.arange(-128, 128).to(torch.int8), torch.arange(256).to(torch.uint8),
             torch.tensor([True, False]),
             torch.complex(f64[:5000], f64[5000:10000]).to(torch.complex64)]
    for x in cases:
        assert_same(x.to(TPU).to(dst), x.to(dst))
    fallbacks.assert_none()


def test_brief_examples():
    """CPU's different overflow and NaN rules per format, on the values of the issue."""
    x = torch.tensor([1, 500, 1e6, -3e5, math.nan, 0.0013])
    for dt in F8:
        assert_same(x.to(TPU).to(dt), x.to(dt))
        assert_same(x.to(TPU).to(dt).float(), x.to(dt).float())


# ---- creation, copies, views, byte movement ----

@pytest.mark.parametrize("dt", LOWP, ids=str)
def test_creation_and_copies(dt, fallbacks):
    z = torch.zeros(3, 4, dtype=dt, device=TPU)
    assert z.dtype == dt and z.device.type == "tpu"
    assert_same(z, torch.zeros(3, 4, dtype=dt))
    e = torch.empty(2, 5, dtype=dt, device=TPU)
    assert e.shape == (2, 5) and e.dtype == dt
    c = codes(dt).reshape(16, 16)
    d = c.to(TPU)
    assert_same(d, c)                                   # host -> device -> host, bytes
    assert_same(d.view(torch.uint8), c.view(torch.uint8))
    assert_same(d.view(torch.int8).view(dt), c)
    assert_same(d.clone(), c)
    assert_same(torch.empty_like(d).copy_(d), c)
    assert_same(torch.zeros_like(d), torch.zeros_like(c))
    if dt != F4:  # copies converting into and out of views (float4 converts to nothing)
        x = torch.cat([float32_sweep()[::4099], torch.tensor(SPECIAL)])[:64].reshape(8, 8)
        dd, cc = d.clone(), c.clone()
        dd[2:10, 1::2] = x.to(TPU)
        cc[2:10, 1::2] = x
        assert_same(dd, cc)
        y, yc = torch.zeros(16, 8, device=TPU, dtype=torch.float64), torch.zeros(16, 8, dtype=torch.float64)
        y.copy_(d[:, ::2])
        yc.copy_(c[:, ::2])
        assert_same(y, yc)
        hd = torch.empty(4, 16, dtype=dt, device=TPU)
        hd.copy_(x.reshape(4, 16))  # host float32 into a tpu tensor of the format
        assert_same(hd, x.reshape(4, 16).to(dt))
    fallbacks.assert_none()


@pytest.mark.parametrize("dt", LOWP, ids=str)
def test_byte_movement(dt, fallbacks):
    c = codes(dt).reshape(16, 16)
    d = c.to(TPU)
    assert_same(d[2:9:3, 1::4], c[2:9:3, 1::4])
    assert_same(d[2:9:3, 1::4].contiguous(), c[2:9:3, 1::4].contiguous())
    assert_same(d.t().contiguous(), c.t().contiguous())
    assert_same(torch.cat([d, d[:3]]), torch.cat([c, c[:3]]))
    assert_same(torch.stack([d[0], d[5]]), torch.stack([c[0], c[5]]))
    i = torch.tensor([3, 0, 15, 3])
    assert_same(d.index_select(1, i.to(TPU)), c.index_select(1, i))
    assert_same(d.flip(0), c.flip(0))
    assert_same(d.roll(3, 1), c.roll(3, 1))
    assert_same(d[:2].repeat(2, 3), c[:2].repeat(2, 3))
    m = torch.rand(16, 16, generator=torch.Generator().manual_seed(0)) > 0.5
    assert_same(torch.where(m.to(TPU), d, d.t()), torch.where(m, c, c.t()))
    dd, cc = d.clone(), c.clone()
    dd[3] = d[4]
    cc[3] = c[4]
    assert_same(dd, cc)
    if dt != F4:  # CPU indexes float4 with no advanced-index kernel
        assert_same(d[i.to(TPU)], c[i])
        assert_same(d[m.to(TPU)], c[m])
        assert_same(d.masked_select(m.to(TPU)), c.masked_select(m))
    fallbacks.assert_none()


def like_cpu(f, *args):
    """f on CPU tensors and on their tpu copies: CPU's values, or CPU's exception type."""
    try:
        want = f(*args)
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        with pytest.raises(type(e)):
            f(*[a.to(TPU) if isinstance(a, torch.Tensor) else a for a in args])
            torch.tpu.synchronize()
        return
    assert_same(f(*[a.to(TPU) if isinstance(a, torch.Tensor) else a for a in args]), want)


@pytest.mark.parametrize("dt", F8, ids=str)
def test_fill_and_index_put(dt):
    # values CPU rounds, and values it refuses with its overflow error (beyond the format's
    # range, or below e8m0's smallest value 2^-127: zero and negatives)
    for v in [0.0, 1.0, -2.5, 0.3, 1e-3, 1e9, -1e9, math.inf, math.nan]:
        like_cpu(lambda x: torch.full((5,), v, dtype=dt, device=x.device), torch.empty(0))
        like_cpu(lambda x: x.fill_(v), torch.ones(3, dtype=dt))
        like_cpu(lambda x: x.fill_(v), torch.ones(1, dtype=dt))  # CPU's unchecked fast path
    c, v = codes(dt)[:40].clone(), codes(dt)[100:104]
    i = torch.tensor([1, 7, 39, 20])
    d = c.to(TPU)
    if dt == torch.float8_e8m0fnu:  # CPU's index_put has no e8m0 kernel
        with pytest.raises(NotImplementedError), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d.index_put_((i.to(TPU),), v.to(TPU))
        return
    d.index_put_((i.to(TPU),), v.to(TPU))
    c.index_put_((i,), v)
    assert_same(d, c)


def test_float4_refusals_like_cpu():
    """CPU has no conversion or arithmetic kernels for float4_e2m1fn_x2: the same errors."""
    d = codes(F4).to(TPU)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for f in [lambda x: x.float(), lambda x: x.to(torch.float8_e4m3fn),
                  lambda x: torch.ones(3, device=x.device).to(F4), lambda x: x.fill_(1.0),
                  lambda x: torch.ones(3, dtype=F4, device=x.device),
                  lambda x: x[torch.tensor([0, 1], device=x.device)],
                  lambda x: torch.empty(256, device=x.device).copy_(x)]:
            with pytest.raises(Exception) as cpu_error:
                f(codes(F4))
            with pytest.raises(cpu_error.type):
                f(d)
                torch.tpu.synchronize()


OPS = {
    "add": lambda x: x + x, "mul": lambda x: x * x, "neg": lambda x: -x, "abs": lambda x: x.abs(),
    "sum": lambda x: x.sum(), "amax": lambda x: x.amax(), "lt": lambda x: x < x,
    "eq": lambda x: x == x, "isnan": lambda x: x.isnan(), "isinf": lambda x: x.isinf(),
    "sort": lambda x: x.sort().values, "clamp": lambda x: x.clamp(0, 1),
    "mm": lambda x: x[:4].reshape(2, 2) @ x[:4].reshape(2, 2),
    "masked_fill": lambda x: x.masked_fill(x.view(torch.uint8) > 7, 1.0),
    "gather": lambda x: x.gather(0, torch.tensor([1, 0], device=x.device)),
    "pad": lambda x: torch.nn.functional.pad(x, (1, 1)),
    "cumsum": lambda x: x.cumsum(0),
}


@pytest.mark.parametrize("dt", LOWP, ids=str)
def test_other_ops_like_cpu(dt):
    """Ops CPU refuses for a format raise CPU's exception type on tpu; the ones it computes
    (through CPU's own kernel) give CPU's values."""
    c = codes(dt)[:64:3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for f in OPS.values():
            like_cpu(f, c)


def test_defer_and_fuse_casts():
    x = torch.cat([float32_sweep()[::13], torch.tensor(SPECIAL)])
    with torch.tpu.eager_mode("defer_and_fuse"):
        d = x.to(TPU)
        outs = [d.to(dt) for dt in F8]
        backs = [o.float() for o in outs]
        crossed = outs[0].to(torch.float8_e5m2fnuz)
        got = [o.cpu() for o in outs + backs + [crossed]]
    want = [x.to(dt) for dt in F8]
    want += [w.float() for w in want] + [want[0].to(torch.float8_e5m2fnuz)]
    for g, w in zip(got, want):
        assert_same(g, w)


# ---- torch._scaled_mm ----

def fp8_matrix(m, n, dt, seed, integer=False):
    g = torch.Generator().manual_seed(seed)
    if integer:  # small integers: every product and sum is exact in float32
        return torch.randint(-8, 9, (m, n), generator=g).float().to(dt)
    return (torch.randn(m, n, generator=g) * 4).to(dt)


def scaled_mm_cases():
    a, b = fp8_matrix(16, 32, torch.float8_e4m3fn, 1), fp8_matrix(24, 32, torch.float8_e4m3fn, 2).t()
    ai, bi = fp8_matrix(16, 32, torch.float8_e4m3fn, 3, True), fp8_matrix(32, 24, torch.float8_e5m2, 4, True)
    one, half = torch.tensor(1.0), torch.tensor(0.5)
    rows_a = torch.rand(16, 1, generator=torch.Generator().manual_seed(5)) + 0.5
    rows_b = torch.rand(1, 24, generator=torch.Generator().manual_seed(6)) + 0.5
    bias = torch.randn(24, generator=torch.Generator().manual_seed(7))
    return [
        # (args, kwargs, exact): exact where every sum is exact in float32
        ((ai, bi, one, half), dict(out_dtype=torch.float32), True),
        ((ai, bi, half, torch.tensor([4.0])), dict(out_dtype=torch.bfloat16), True),
        ((ai, bi, one, half), dict(), True),                       # float8 out (self's dtype)
        ((ai, bi, one, one), dict(out_dtype=torch.float8_e4m3fn, scale_result=torch.tensor(4.0)), True),
        ((ai, bi, one, one), dict(out_dtype=torch.float32, scale_result=torch.tensor(4.0)), True),
        ((ai, bi, one, one), dict(out_dtype=torch.int32), True),
        ((ai, bi, one, half), dict(out_dtype=torch.bfloat16, bias=bias.bfloat16()), True),
        ((a, b, torch.tensor(0.37), torch.tensor(1.9)), dict(out_dtype=torch.float32), False),
        ((a, b, torch.tensor(0.37), torch.tensor(1.9)), dict(out_dtype=torch.bfloat16, bias=bias), False),
        ((a, b, rows_a, rows_b), dict(out_dtype=torch.float32), False),
        ((a, b, rows_a, rows_b), dict(out_dtype=torch.float16, use_fast_accum=True), False),
        ((a.to(torch.float8_e4m3fnuz), b.to(torch.float8_e5m2fnuz), one, one),
         dict(out_dtype=torch.float32), False),
    ]


@pytest.mark.parametrize("case", range(12))
def test_scaled_mm(case, fallbacks):
    args, kwargs, exact = scaled_mm_cases()[case]
    want = torch._scaled_mm(*args, **kwargs)
    tpu_kwargs = {k: v.to(TPU) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    got = torch._scaled_mm(*[t.to(TPU) for t in args], **tpu_kwargs)
    if exact:
        assert_same(got, want)
        fallbacks.assert_none()
        return
    # the sum's order differs (XLA's against CPU's): float32 agrees to rounding, a narrower
    # output to one unit in its last place
    assert got.dtype == want.dtype and got.shape == want.shape
    exact_sum = (args[0].double() @ args[1].double()).abs().amax()
    torch.testing.assert_close(got.cpu().double(), want.double(), rtol=2 * torch.finfo(want.dtype).eps,
                               atol=float(exact_sum) * 1e-6)
    fallbacks.assert_none()


def test_scaled_mm_refusals_like_cpu():
    a, b = fp8_matrix(8, 32, torch.float8_e4m3fn, 1), fp8_matrix(16, 32, torch.float8_e4m3fn, 2).t()
    one = torch.tensor(1.0)
    bad = [
        (torch.ones(8), torch.ones(16), {}),                            # neither scaling
        (torch.ones(8, 1), one, {}),
        (one.double(), one.double(), {}),
        (torch.ones(8, 1).bfloat16(), torch.ones(1, 16).bfloat16(), {}),
        (torch.ones(1, 8).t(), torch.ones(1, 16), {}),                  # row scale's stride
        (one, one, dict(bias=torch.ones(8, 16))),
        (one, one, dict(scale_result=one.half())),
    ]
    for sa, sb, kw in bad:
        tkw = {k: v.to(TPU) for k, v in kw.items()}
        if sa.dtype == torch.float64:
            try:
                torch._scaled_mm(a, b, sa, sb, **kw)
            except Exception:  # noqa: BLE001 - CPU's reference path refuses: compare below
                pass
            else:
                # Known difference, host-dependent: on hosts with AMX, CPU's _scaled_mm takes
                # its oneDNN path, which accepts float64 scales that its reference path and
                # CUDA refuse; tpu refuses them as CUDA does.
                with pytest.raises(ValueError, match="scaling"):
                    torch._scaled_mm(a.to(TPU), b.to(TPU), sa.to(TPU), sb.to(TPU))
                continue
        with pytest.raises(Exception) as cpu_error:
            torch._scaled_mm(a, b, sa, sb, **kw)
        with pytest.raises(cpu_error.type):
            torch._scaled_mm(a.to(TPU), b.to(TPU), sa.to(TPU), sb.to(TPU), **tkw)
            torch.tpu.synchronize()


@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_casts_and_scaled_mm():
    def f(x, a, b, s):
        return x.to(torch.float8_e4m3fn).float() * 2, torch._scaled_mm(a, b, s, s, out_dtype=torch.bfloat16)

    x = torch.tensor([1, 500, 1e6, -3e5, math.nan, 0.0013, 470.0, -0.0])
    a = fp8_matrix(16, 32, torch.float8_e4m3fn, 8, True)
    b = fp8_matrix(32, 16, torch.float8_e5m2, 9, True)
    s = torch.tensor(0.5)
    got = torch.compile(f, backend="tpu")(x.to(TPU), a.to(TPU), b.to(TPU), s.to(TPU))
    for g, w in zip(got, f(x, a, b, s)):
        assert_same(g, w)


# ---- block-scaled _scaled_mm (MX, NVFP4): CPU lacks them; the reference is their definition ----

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def unpack_float4(x, dim):
    """float4_e2m1fn_x2 bytes as float32, two values per byte along dim, low nibble first
    (nibble: sign bit, then the magnitude's index in E2M1)."""
    u = x.view(torch.uint8).long()
    table = torch.tensor(E2M1 + [-v for v in E2M1])
    both = torch.stack([table[u & 15], table[u >> 4]], dim=dim + 1)
    shape = list(x.shape)
    shape[dim] *= 2
    return both.reshape(shape)


def blocked_layout(s):
    """A [rows, K blocks] scale matrix in cuBLAS's blocked layout: padded to multiples of
    [128, 4], each 128 x 4 tile stored as [32, 4, 4] holding tile row r at (r % 32, r // 32)."""
    rows, cols = s.shape
    rb, cb = -(-rows // 128), -(-cols // 4)
    p = torch.zeros(rb * 128, cb * 4, dtype=torch.uint8)
    p[:rows, :cols] = s.view(torch.uint8)
    return p.reshape(rb, 4, 32, cb, 4).permute(0, 3, 2, 1, 4).reshape(-1).view(s.dtype)


def block_scaled_reference(a, b, sa, sb, block, out_dtype):
    """The definition: each operand's values times its block's scale, then the product."""
    A = unpack_float4(a, 1) if a.dtype == F4 else a.float()
    B = unpack_float4(b, 0) if b.dtype == F4 else b.float()
    k = A.shape[1]
    SA = sa.float().repeat_interleave(block, 1)[:, :k]
    SB = sb.float().repeat_interleave(block, 1)[:, :k]
    return ((A * SA) @ (B * SB.t())).to(out_dtype)


def random_bytes(shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8).view(dtype)


def powers_of_two(shape, seed, dtype):
    """Scales 2^-2 .. 2^2: every product and sum of the tests is then exact in float32."""
    g = torch.Generator().manual_seed(seed)
    return (2.0 ** torch.randint(-2, 3, shape, generator=g).float()).to(dtype)


@pytest.mark.parametrize("form", ["mxfp8", "mxfp4", "nvfp4"])
def test_scaled_mm_block_scaled(form, fallbacks):
    # m, n, K blocks not multiples of the layout's tile (128 x 4): its padding, several tiles
    m, n = 20, 136
    if form == "mxfp8":
        k, block, sdt = 288, 32, torch.float8_e8m0fnu
        g = torch.Generator().manual_seed(11)
        a = torch.randint(-8, 9, (m, k), generator=g).float().to(torch.float8_e4m3fn)
        b = torch.randint(-8, 9, (k, n), generator=g).float().to(torch.float8_e5m2)
    else:
        k, block, sdt = (288, 32, torch.float8_e8m0fnu) if form == "mxfp4" else (160, 16, torch.float8_e4m3fn)
        a, b = random_bytes((m, k // 2), 12, F4), random_bytes((k // 2, n), 13, F4)
    kb = -(-k // block)
    sa, sb = powers_of_two((m, kb), 14, sdt), powers_of_two((n, kb), 15, sdt)
    for out_dtype in [torch.float32, torch.bfloat16]:
        got = torch._scaled_mm(a.to(TPU), b.to(TPU), blocked_layout(sa).to(TPU),
                               blocked_layout(sb).to(TPU), out_dtype=out_dtype)
        assert_same(got, block_scaled_reference(a, b, sa, sb, block, out_dtype))
    fallbacks.assert_none()


def test_scaled_mm_block_scaled_refusals():
    a, b = random_bytes((8, 32), 1, F4), random_bytes((32, 16), 2, F4)
    e8 = torch.ones(512, dtype=torch.float8_e8m0fnu)
    with pytest.raises(RuntimeError, match="blockwise"):  # the layout's size (PyTorch's words)
        torch._scaled_mm(a.to(TPU), b.to(TPU), e8[:100].to(TPU), e8.to(TPU), out_dtype=torch.float32)
    with pytest.raises(RuntimeError, match="contiguous"):
        torch._scaled_mm(a.to(TPU), b.to(TPU), e8.to(TPU).reshape(128, 4).t(), e8.to(TPU),
                         out_dtype=torch.float32)
    f8 = torch.ones(8, 32, dtype=torch.float8_e4m3fn)
    nv = torch.ones(512, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError):  # NVFP4 scales take float4 operands
        torch._scaled_mm(f8.to(TPU), f8.t().to(TPU), nv.to(TPU), nv.to(TPU), out_dtype=torch.float32)


@pytest.mark.parametrize("form", ["1x128,128x128", "1x128,1x128", "128x128,1x128"])
def test_scaled_mm_blocks_of_128(form, fallbacks):
    """float32 scales per block of 128 (CUDA's forms; CPU lacks them): against the definition,
    each operand's values times its block's scale, then the product (exact: small integers,
    power-of-two scales)."""
    m, k, n = 20, 288, 136  # partial blocks along every dim
    g = torch.Generator().manual_seed(21)
    a = torch.randint(-8, 9, (m, k), generator=g).float().to(torch.float8_e4m3fn)
    b = torch.randint(-8, 9, (k, n), generator=g).float().to(torch.float8_e4m3fn)
    kb = -(-k // 128)
    a_rows = m if form.startswith("1x128") else -(-m // 128)
    b_cols = n if form.endswith(",1x128") else -(-n // 128)
    sa, sb = powers_of_two((a_rows, kb), 22, torch.float32), powers_of_two((kb, b_cols), 23, torch.float32)
    SA = sa.repeat_interleave(1 if a_rows == m else 128, 0).repeat_interleave(128, 1)[:m, :k]
    SB = sb.repeat_interleave(128, 0).repeat_interleave(1 if b_cols == n else 128, 1)[:k, :n]
    for out_dtype in [torch.float32, torch.bfloat16]:
        want = ((a.float() * SA) @ (b.float() * SB)).to(out_dtype)
        got = torch._scaled_mm(a.to(TPU), b.to(TPU), sa.to(TPU), sb.to(TPU), out_dtype=out_dtype)
        assert_same(got, want)
    fallbacks.assert_none()
