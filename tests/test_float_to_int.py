"""Floating -> integer conversion gives CPU's values, out-of-range ones included.

CPU converts through a 32-bit integer (64-bit for int64, and for uint8 from float64) where a
value out of that range, an infinity or a NaN gives the smallest integer, and keeps that
integer's low bits; XLA's own convert saturates. PyTorch's test_float_to_int_conversion_finite
compares against NumPy, which behaves as CPU does.
"""
from __future__ import annotations

import pytest
import torch

VALUES = [2.0**31 + 261, -(2.0**31) - 263, 2.0**40 + 3, float("nan"), float("inf"),
          -float("inf"), 300.0, -300.0, 70000.5, -1.5, -0.5, 0.5, 3.99, -2.0,
          torch.finfo(torch.float).max, torch.finfo(torch.float).min]


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
                                 torch.uint16, torch.bool])
def test_float_to_int_like_cpu(src, dst):
    a = torch.tensor(VALUES, dtype=torch.float64).to(src)
    expected = a.to(dst)
    got = a.to("tpu").to(dst).cpu()
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected), (got.tolist(), expected.tolist())


def test_complex_to_int_warns_and_takes_the_real_part_like_cpu():
    a = torch.tensor([3.7 - 2j, -300.5 + 1j, 2.0**33 + 0j], dtype=torch.complex64)
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # CPU warns once per process; here each side warns every time
    try:
        for dst in (torch.int8, torch.float32):
            with pytest.warns(UserWarning, match="discards the imaginary part"):
                expected = a.to(dst)
            with pytest.warns(UserWarning, match="discards the imaginary part"):
                got = a.to("tpu").to(dst).cpu()
            assert torch.equal(got, expected)
            with pytest.warns(UserWarning, match="discards the imaginary part"):
                torch.empty(3, dtype=dst, device="tpu").copy_(a.to("tpu"))
    finally:
        torch.set_warn_always(before)
