"""Tensor.view(dtype) across element sizes on tpu: CPU's shape rules and errors, the same bytes,
and writes through the view landing in the base (serving engines allocate one int8 buffer and
view it per layer as bf16 / fp32)."""
import pytest
import torch

from conftest import TPU

DTYPES = [torch.int8, torch.uint8, torch.bool, torch.int16, torch.float16, torch.bfloat16,
          torch.int32, torch.float32, torch.int64, torch.float64, torch.complex64]


def _bytes_of(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    # bytes that are valid values of every dtype above (bool: 0/1; no NaN payload surprises):
    # low bits only, so floats stay ordinary numbers and bools 0 or 1.
    return (torch.randint(0, 2, (n,), generator=g, dtype=torch.uint8))


def _check_same(cpu: torch.Tensor, dev: torch.Tensor) -> None:
    assert dev.device.type == "tpu"
    assert dev.dtype == cpu.dtype and dev.shape == cpu.shape
    assert dev.stride() == cpu.stride() and dev.storage_offset() == cpu.storage_offset()
    assert torch.equal(dev.cpu().view(torch.uint8) if dev.dtype != torch.bool else dev.cpu(),
                       cpu.view(torch.uint8) if cpu.dtype != torch.bool else cpu)


@pytest.mark.parametrize("src", DTYPES, ids=str)
@pytest.mark.parametrize("dst", DTYPES, ids=str)
def test_view_dtype_matches_cpu(src, dst, fallbacks):
    base = _bytes_of(96).view(src).reshape(2, -1)  # 96 bytes: divisible by every size above
    dev = base.to(TPU)
    assert dev.untyped_storage().nbytes() == 96
    _check_same(base.view(dst), dev.view(dst))
    fallbacks.assert_none()


@pytest.mark.parametrize("case", ["slice_rows", "offset", "transposed", "last_dim_odd", "scalar"])
def test_view_dtype_errors_match_cpu(case):
    x = torch.zeros(4, 6, dtype=torch.int8)
    make = {
        "slice_rows": lambda t: t[1:],            # offset 6: not a multiple of 4
        "offset": lambda t: t[:, 2:],             # stride(-1) 1, offset 2
        "transposed": lambda t: t.t(),            # stride(-1) != 1
        "last_dim_odd": lambda t: t[:, :3],       # size(-1) 3 not divisible by 4
        "scalar": lambda t: t[0, 0],              # 0-d
    }[case]
    with pytest.raises(RuntimeError) as cpu_err:
        make(x).view(torch.float32)
    with pytest.raises(RuntimeError) as dev_err:
        make(x.to(TPU)).view(torch.float32)
    assert str(dev_err.value).split("\n")[0] == str(cpu_err.value).split("\n")[0]


def test_views_of_one_int8_buffer_per_layer_write_into_it(fallbacks):
    """One int8 arena, bf16 and fp32 per-layer views at offsets, written in place."""
    arena_c = torch.zeros(256, dtype=torch.int8)
    arena_d = arena_c.to(TPU)
    vals = torch.randn(16, 4)
    for arena in (arena_c, arena_d):
        bf = arena[:128].view(torch.bfloat16).view(16, 4)          # bytes 0..127
        f32 = arena[128:].view(torch.float32).view(8, 4)          # bytes 128..255
        bf.copy_(vals.to(arena.device, torch.bfloat16))
        f32.mul_(0).add_(vals[:8].to(arena.device))
        f32[2:4] += 1.0
        bf[::2] *= 2
    assert torch.equal(arena_d.cpu(), arena_c)
    f = arena_d[128:].view(torch.float32)
    assert torch.equal(f.cpu(), arena_c[128:].view(torch.float32))
    fallbacks.assert_none()


def test_downsized_view_of_a_row_slice_and_back(fallbacks):
    x = torch.randn(5, 8)
    d = x.to(TPU)
    for t in (x, d):
        v = t[1:4].view(torch.int16)  # shape [3, 16], offset 16
        v[:, ::2] = 0                 # zero the low half of every float32
        t[4].view(torch.uint8)[3] = 0x40
    assert torch.equal(d.cpu().view(torch.int32), x.view(torch.int32))
    w = d.view(torch.uint8).view(torch.float64)
    assert torch.equal(w.cpu(), x.view(torch.uint8).view(torch.float64))
    fallbacks.assert_none()


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_view_dtype_in_eager_modes(mode, fallbacks):
    x = torch.arange(32, dtype=torch.int8)
    d = x.to(TPU)
    with torch.tpu.eager_mode(mode):
        v = d.view(torch.int32)
        v += 1
        s = d.view(torch.int16).sum()
    x.view(torch.int32).add_(1)
    assert torch.equal(d.cpu(), x)
    assert s.item() == x.view(torch.int16).sum().item()
    fallbacks.assert_none()


def test_view_dtype_under_torch_compile(fresh_dynamo, fallbacks):
    def step(a):
        v = a.view(torch.float32)
        v.mul_(2)  # a write through the fp32 view of a uint8 input: mutates the input
        return a.view(torch.int16).float().sum(), v + 1

    x = torch.randn(4, 8).view(torch.uint8)
    d = x.to(TPU)
    want = step(x)
    got = torch.compile(step, backend="tpu")(d)
    assert torch.equal(d.cpu(), x)
    assert torch.equal(got[1].cpu(), want[1])
    assert got[0].item() == want[0].item()
    fallbacks.assert_none()


def test_in_place_write_through_a_dtype_view_of_an_empty_tensor(mode):
    # fuzz F28 (seed 2000008963): a fused run reading an empty float32 storage as int32 raised
    # NotImplementedError; an empty storage reads as empty in any dtype
    def run(dev):
        other = torch.arange(3.0).to(dev)
        x = torch.randn(0, 4).to(dev)
        v = x.view(torch.int32)
        y = x * 2
        v.add_(1, alpha=2)
        return other + 1, v, y
    for got, want in zip(run(TPU), run("cpu")):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.cpu(), want)
