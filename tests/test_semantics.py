"""Device semantics of the tpu backend compared with PyTorch on CPU: host<->device copies in every
dtype (contiguous and not), dtype conversion on the device, the generated ``.tpu()`` methods,
pinned memory, torch.save/torch.load, printing, Python scalar/list conversion, exception types
for bad input, the ``torch.tpu`` module, and autoload in a fresh interpreter.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings

import pytest
import torch

from torch_pjrt import _plugins

TPU = torch.device("tpu")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]


def sample(dtype: torch.dtype, shape=(3, 4, 5), seed=0) -> torch.Tensor:
    """Deterministic CPU values valid for `dtype` (no NaN; ints within int8 range)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 10).to(dtype)
    low = 0 if dtype == torch.uint8 else -100
    return torch.randint(low, 120, shape, generator=g).to(dtype)


def assert_same(t: torch.Tensor, c: torch.Tensor, strides=True):
    """t (any device) equals CPU tensor c exactly, with the same dtype/shape (and strides)."""
    assert t.dtype == c.dtype and t.shape == c.shape
    if strides:
        assert t.stride() == c.stride(), f"strides {t.stride()} != {c.stride()}"
    torch.testing.assert_close(t.cpu(), c, rtol=0, atol=0)


# --- host <-> device copies --------------------------------------------------------------------

NONCONTIG = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.transpose(0, 2),
    "permuted": lambda x: x.permute(1, 2, 0),
    "sliced": lambda x: x[:, ::2, 1:],
    "expanded": lambda x: x[:, :1].expand(3, 4, 5),
    "0d": lambda x: x[1, 2, 3],
    "empty": lambda x: x[:, :, 5:],
}


@pytest.mark.parametrize("layout", list(NONCONTIG))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_host_device_round_trip(dtype, layout):
    src = NONCONTIG[layout](sample(dtype))
    # CPU -> tpu: .to() keeps dense layouts and makes others contiguous, exactly as .clone() does
    t = src.to(TPU)
    assert t.device.type == "tpu"
    assert_same(t, src.clone())
    # tpu -> CPU from a device tensor with the same layout as src
    dev_view = NONCONTIG[layout](sample(dtype).to(TPU))
    back = dev_view.cpu()
    assert back.device.type == "cpu"
    assert_same(back, src.clone())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_into_noncontiguous_destinations(dtype):
    src = sample(dtype, (5, 4))
    # CPU non-contiguous source into a tpu non-contiguous view
    dst_cpu = torch.zeros(4, 10, dtype=dtype)
    dst_tpu = torch.zeros(4, 10, dtype=dtype, device=TPU)
    dst_cpu.t()[::2].copy_(src)
    dst_tpu.t()[::2].copy_(src)
    assert_same(dst_tpu, dst_cpu)
    # tpu non-contiguous source into a CPU non-contiguous view
    out = torch.zeros(4, 10, dtype=dtype)
    out.t()[1::2].copy_(src.to(TPU))
    expected = torch.zeros(4, 10, dtype=dtype)
    expected.t()[1::2].copy_(src)
    assert_same(out, expected)
    # tpu -> tpu between two strided views
    a = torch.zeros(6, 4, dtype=dtype, device=TPU)
    a[1:].t().copy_(dst_tpu[:, 1:6])
    b = torch.zeros(6, 4, dtype=dtype)
    b[1:].t().copy_(dst_cpu[:, 1:6])
    assert_same(a, b)


def _conversion_source(src: torch.dtype, dst: torch.dtype) -> torch.Tensor:
    """Values whose conversion src -> dst is defined behavior in C (PyTorch's CPU reference):
    no negative floats into unsigned/bool-free integer types, all within int8 range."""
    vals = [0, 1, 2.5, 3.75, 7, 100, 127, 0.5, 64.25]
    neg = [-1, -3.75, -100, -0.5]
    if not (dst == torch.uint8 and (src.is_floating_point or src.is_complex)):
        vals += neg
    if src == torch.bool:
        return torch.tensor([True, False, True, True])
    if src.is_floating_point or src.is_complex:
        x = torch.tensor(vals, dtype=torch.float64)
        if src.is_complex:
            x = torch.complex(x, torch.flip(x, [0]))
        return x.to(src)
    x = torch.tensor([int(v) for v in vals])
    if src == torch.uint8:
        x = x.abs()
    return x.to(src)


@pytest.mark.parametrize("dst", DTYPES, ids=str)
@pytest.mark.parametrize("src", DTYPES, ids=str)
def test_to_dtype_on_device(src, dst, fallbacks):
    x = _conversion_source(src, dst)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex -> real discards the imaginary part
        expected = x.to(dst)
        expected_strided = x[::2].to(dst)
        got = x.to(TPU).to(dst)
        # strided sources for the pairs with float32 only: each pair is a fresh program to
        # compile, and the strided read path does not depend on the pair
        strided = torch.float32 in (src, dst)
        got_strided = x.to(TPU)[::2].to(dst) if strided else None
    assert got.device.type == "tpu"
    assert_same(got, expected)
    if strided:
        assert_same(got_strided, expected_strided)
    fallbacks.assert_none(f"{src} -> {dst}")


# --- generated methods -------------------------------------------------------------------------


def test_generated_tensor_methods():
    x = torch.arange(6.0).view(2, 3)
    t = x.tpu()
    assert t.is_tpu and not x.is_tpu
    assert t.device == torch.device("tpu", 0)
    assert x.tpu(0).device == torch.device("tpu", 0)
    assert_same(t, x)
    assert t.tpu() is t  # already there: no copy


def test_module_tpu():
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    ref = [p.detach().clone() for p in m.state_dict().values()]
    assert m.tpu() is m
    for v, r in zip(m.state_dict().values(), ref):
        assert v.device.type == "tpu"
        assert_same(v, r)


def test_storage_tpu():
    x = torch.arange(10, dtype=torch.int32)
    s = x.untyped_storage()
    st = s.tpu()
    assert isinstance(st, torch.UntypedStorage)
    assert st.device.type == "tpu" and st.nbytes() == s.nbytes()
    assert st.cpu().tolist() == s.tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        typed = x.storage().tpu()
    assert typed.device.type == "tpu" and typed.dtype == torch.int32
    assert typed.cpu().tolist() == list(range(10))


# --- pinned memory ----------------------------------------------------------------------------


def test_pinned_round_trip():
    src = torch.randn(1000).pin_memory()
    assert src.is_pinned()
    t = src.to(TPU, non_blocking=True)
    back = torch.empty(1000, pin_memory=True)
    assert back.is_pinned()
    back.copy_(t * 2, non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(back, src * 2)
    assert not torch.randn(3).is_pinned()


# --- torch.save / torch.load -----------------------------------------------------------------


def _save(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_save_load_keeps_device_and_sharing():
    base = torch.arange(12.0, device=TPU).view(3, 4)
    obj = {"base": base, "row": base[1], "col": base[:, 2], "bf16": base.to(torch.bfloat16),
           "int": torch.arange(5, device=TPU)}
    loaded = torch.load(_save(obj))
    for k, v in obj.items():
        assert loaded[k].device.type == "tpu", k
        torch.testing.assert_close(loaded[k].cpu(), v.cpu(), rtol=0, atol=0)
        assert loaded[k].dtype == v.dtype and loaded[k].stride() == v.stride(), k
        assert loaded[k].storage_offset() == v.storage_offset()
    ptr = loaded["base"].untyped_storage().data_ptr()
    assert loaded["row"].untyped_storage().data_ptr() == ptr
    assert loaded["col"].untyped_storage().data_ptr() == ptr
    loaded["base"].add_(1)  # the loaded views alias the loaded base
    assert loaded["row"].cpu().tolist() == [5.0, 6.0, 7.0, 8.0]


@pytest.mark.parametrize("where", ["cpu", torch.device("cpu"), {"tpu:0": "cpu"}])
def test_load_tpu_to_cpu(where):
    x = torch.randn(4, 3)
    loaded = torch.load(_save({"x": x.to(TPU), "v": x.to(TPU)[1:]}), map_location=where)
    assert loaded["x"].device.type == "cpu"
    assert_same(loaded["x"], x)
    assert_same(loaded["v"], x[1:])


@pytest.mark.parametrize("where", ["tpu", "tpu:0", torch.device("tpu")])
def test_load_cpu_to_tpu(where):
    x = torch.randn(4, 3)
    loaded = torch.load(_save(x), map_location=where)
    assert loaded.device == torch.device("tpu", 0)
    assert_same(loaded, x)


def test_state_dict_round_trip():
    m = torch.nn.Linear(5, 3).tpu()
    sd = torch.load(_save(m.state_dict()), map_location="cpu")
    cpu_model = torch.nn.Linear(5, 3)
    cpu_model.load_state_dict(sd)
    x = torch.randn(2, 5)
    torch.testing.assert_close(m(x.to(TPU)).cpu(), cpu_model(x), rtol=1e-6, atol=1e-6)


# --- printing, item, tolist, numpy ----------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: torch.arange(6.0).view(2, 3) / 3,
    lambda: torch.arange(6, dtype=torch.int32),
    lambda: torch.tensor([True, False]),
    lambda: torch.tensor(2.5, dtype=torch.bfloat16),
    lambda: torch.empty(0, 3),
    lambda: torch.tensor([1e-8, 1e8, float("inf"), float("nan")]),
    lambda: torch.randn(100, 100, generator=torch.Generator().manual_seed(0)),
], ids=["float", "int32", "bool", "bf16_0d", "empty", "scientific", "summarized"])
def test_print(make):
    x = make()
    text = repr(x.to(TPU))
    assert "device='tpu:0'" in text
    norm = lambda s: " ".join(s.split())  # noqa: E731  (line wrapping depends on the suffix)
    assert norm(text).replace("device='tpu:0', ", "").replace(", device='tpu:0'", "") == norm(repr(x))
    assert str(x.to(TPU)) == text


def test_item_tolist_numpy():
    x = torch.tensor([[1.5, -2.0], [3.25, 4.0]])
    t = x.to(TPU)
    assert t[1, 0].item() == 3.25 and isinstance(t[1, 0].item(), float)
    assert t.to(torch.int64)[0, 1].item() == -2
    assert isinstance(t.to(torch.int64)[0, 1].item(), int)
    assert t.gt(0)[0, 0].item() is True
    assert t.sum().item() == 6.75
    assert t.tolist() == x.tolist()
    assert t.t().tolist() == x.t().tolist()
    assert t.to(torch.int32).tolist() == x.to(torch.int32).tolist()
    assert (t.cpu().numpy() == x.numpy()).all()
    assert t.t().cpu().numpy().tolist() == x.t().numpy().tolist()
    with pytest.raises(TypeError, match="numpy"):
        t.numpy()


# --- errors -------------------------------------------------------------------------------


def _fail_cases():
    f = lambda *s: torch.ones(*s)  # noqa: E731
    return {
        "add_shape_mismatch": lambda d: f(2, 3).to(d) + f(4).to(d),
        "matmul_shape_mismatch": lambda d: f(2, 3).to(d) @ f(4, 5).to(d),
        "mm_shape_mismatch": lambda d: torch.mm(f(2, 3).to(d), f(2, 3).to(d)),
        "bmm_batch_mismatch": lambda d: torch.bmm(f(2, 3, 4).to(d), f(3, 4, 5).to(d)),
        "sum_dim_out_of_range": lambda d: f(2, 3).to(d).sum(dim=5),
        "softmax_dim_out_of_range": lambda d: f(2, 3).to(d).softmax(dim=-3),
        "transpose_dim_out_of_range": lambda d: f(2, 3).to(d).transpose(0, 2),
        "index_out_of_range": lambda d: f(2, 3).to(d)[5],
        "inplace_result_type_int_float": lambda d: f(3).long().to(d).add_(f(3).to(d)),
        "inplace_result_type_bool_long": lambda d: f(3).bool().to(d).add_(f(3).long().to(d)),
        "inplace_result_type_float_complex": lambda d: f(3).to(d).mul_(f(3).cfloat().to(d)),
        "out_result_type": lambda d: torch.add(f(3).to(d), f(3).to(d), out=f(3).long().to(d)),
        "view_incompatible_strides": lambda d: f(2, 3).to(d).t().view(6),
        "view_bad_numel": lambda d: f(2, 3).to(d).view(7),
        "cat_size_mismatch": lambda d: torch.cat([f(2, 3).to(d), f(2, 4).to(d)]),
        "expand_bad_size": lambda d: f(2, 3).to(d).expand(3),
        "item_of_many": lambda d: f(2, 3).to(d).item(),
        "tensor_index_out_of_range": lambda d: f(4).to(d)[torch.tensor([1, 10]).to(d)],
        "gather_index_out_of_range": lambda d: f(4).to(d).gather(0, torch.tensor([7]).to(d)),
    }


FAIL_CASES = _fail_cases()


# Known failures, each with its reason (strict: they must keep failing until fixed).
KNOWN_FAILURES: dict[str, str] = {}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_FAILURES[n], strict=True))
    if n in KNOWN_FAILURES else n for n in FAIL_CASES])
def test_bad_input_raises_like_cpu(name):
    fn = FAIL_CASES[name]
    with pytest.raises(Exception) as cpu_err:
        fn(torch.device("cpu"))
    with pytest.raises(Exception) as tpu_err:
        r = fn(TPU)
        torch.tpu.synchronize()  # a device-side check may report at synchronization
        r.cpu()
    assert tpu_err.type is cpu_err.type, (
        f"CPU: {cpu_err.type.__name__}: {cpu_err.value}\ntpu: {tpu_err.type.__name__}: "
        f"{tpu_err.value}")
    if "result type" in str(cpu_err.value):
        assert "result type" in str(tpu_err.value)


def test_mixed_devices_raise():
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device=TPU) + torch.ones(3)
    # a CPU 0-d tensor is a scalar and may mix, as with CUDA
    assert_same(torch.ones(3, device=TPU) + torch.tensor(2.0), torch.full((3,), 3.0))


@pytest.mark.parametrize("op", [torch.mul, torch.add, torch.sub, torch.div, torch.maximum])
@pytest.mark.parametrize("sdtype,xdtype", [(torch.float32, torch.float32),
                                           (torch.float64, torch.float32),
                                           (torch.int64, torch.float32),
                                           (torch.float32, torch.int32),
                                           (torch.int64, torch.int16)])
def test_cpu_0d_tensor_in_either_position(op, sdtype, xdtype):
    # CUDA accepts a CPU 0-d tensor as either operand (schedulers write `alpha_t * sample`);
    # results and dtypes (0-d tensors promote by category only) follow CPU's.
    s = torch.tensor(3, dtype=sdtype)
    x = (torch.arange(1, 7).reshape(2, 3) * 2).to(xdtype)
    for a, b in [(s, x), (x, s)]:
        want = op(a, b)
        got = op(a.to(TPU) if a.dim() else a, b.to(TPU) if b.dim() else b)
        assert got.device.type == "tpu" and got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want)  # division may round in the last bit
    out = torch.empty(0, dtype=want.dtype, device=TPU)
    op(s, x.to(TPU), out=out)
    torch.testing.assert_close(out.cpu(), op(s, x))


# --- torch.tpu -------------------------------------------------------------------------------


def test_torch_tpu_api():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    # the CPU plugin's devices are named "cpu"; others name the hardware ("NVIDIA H200")
    name = "cpu" if _plugins.resolve().name == "cpu" else torch.tpu.get_device_name()
    assert name
    assert torch.tpu.get_device_name() == name
    assert torch.tpu.get_device_name(0) == name
    assert torch.tpu.get_device_properties(0).name == name
    torch.tpu.set_device(0)
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0
    with pytest.raises((IndexError, RuntimeError)):
        torch.tpu.set_device(torch.tpu.device_count())
    x = torch.ones(3, device=TPU)
    assert torch.tpu.synchronize() is None
    before = torch.tpu.memory_allocated()
    y = torch.empty(1 << 16, device=TPU)  # 256 KiB
    assert torch.tpu.memory_allocated() - before == 4 << 16
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del y
    assert torch.tpu.memory_allocated() == before
    m = torch.tpu.metrics()
    for key in ("compiles", "cache_hits", "executions", "cpu_fallbacks"):
        assert isinstance(m[key], int)
    torch.tpu.manual_seed(3)
    a = torch.randn(4, device=TPU)
    torch.tpu.manual_seed(3)
    assert torch.equal(a.cpu(), torch.randn(4, device=TPU).cpu())
    assert x.cpu().tolist() == [1.0, 1.0, 1.0]


def test_autoload_in_fresh_interpreter():
    code = ("import sys, torch; x = torch.randn(4, 4, device='tpu'); "
            "print((x @ x).sum().item(), x.device, torch.tpu.get_device_name(), sep='|'); "
            "print('torch_pjrt' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd="/", env=env)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()[-2:]
    value, device, name = first.split("|")
    float(value)
    # the parent's plugin (TORCH_PJRT_PLUGIN is inherited): "cpu", or e.g. "NVIDIA H200"
    assert (device, name) == ("tpu:0", torch.tpu.get_device_name())
    assert second == "True"  # torch_pjrt was loaded by autoload, not by the command
