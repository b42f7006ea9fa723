"""Grouped and depthwise convolutions (csrc/ops/conv.c) against PyTorch on the CPU: outputs and
the input, weight and bias gradients, for conv1d/2d/3d and transposed convolutions, with groups
equal to the channels (depthwise), between 1 and the channels, channel multipliers above 1,
strides, dilations and paddings; and one depthwise convolution as wide as the short
convolutions of Mamba / linear-attention layers, whose weight gradient once grew with the
channel count squared."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

TPU = torch.device("tpu")


def rnd(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check_conv(fn, x, w, b, atol=1e-4, rtol=1e-4, dtype=torch.float32):
    """fn(x, w, b) on CPU and on tpu: output, then x/w/b gradients for one random upstream
    gradient (w and b may be None)."""
    args = [x, w, b]
    cpu = [a.clone().requires_grad_() if a is not None else None for a in args]
    dev = [a.to(TPU).requires_grad_() if a is not None else None for a in args]
    ref, out = fn(*cpu), fn(*dev)
    assert out.device.type == "tpu" and out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.cpu(), ref, atol=atol, rtol=rtol)
    up = rnd(*ref.shape, seed=7, dtype=ref.dtype)
    ref.backward(up)
    out.backward(up.to(TPU))
    for name, c, d in zip(("input", "weight", "bias"), cpu, dev):
        if c is None:
            continue
        assert d.grad is not None and d.grad.device.type == "tpu", name
        assert d.grad.dtype == c.grad.dtype and d.grad.shape == c.grad.shape, name
        torch.testing.assert_close(d.grad.cpu(), c.grad, atol=atol, rtol=rtol, msg=name)


# (label, fn(x, w, b), x shape, w shape, with bias)
CASES = [
    # depthwise: groups == channels
    ("1d_depthwise_causal", lambda x, w, b: F.conv1d(x, w, b, padding=3, groups=6),
     (2, 6, 9), (6, 1, 4), True),
    ("1d_depthwise_stride_dil", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2,
                                                         dilation=2, groups=5),
     (3, 5, 13), (5, 1, 3), True),
    ("2d_depthwise", lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=4),
     (2, 4, 7, 6), (4, 1, 3, 3), True),
    ("2d_depthwise_stride_dil_pad", lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1),
                                                             padding=(2, 0), dilation=(1, 2),
                                                             groups=3),
     (2, 3, 9, 10), (3, 1, 3, 2), False),
    ("3d_depthwise", lambda x, w, b: F.conv3d(x, w, b, padding=1, groups=3),
     (1, 3, 5, 4, 6), (3, 1, 3, 3, 3), True),
    # channel multiplier > 1 (groups == in channels, out = k * in)
    ("1d_multiplier3", lambda x, w, b: F.conv1d(x, w, b, padding=1, groups=4),
     (2, 4, 8), (12, 1, 3), True),
    ("2d_multiplier2_stride", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=3),
     (2, 3, 8, 7), (6, 1, 3, 3), True),
    ("3d_multiplier2_dil", lambda x, w, b: F.conv3d(x, w, b, dilation=(1, 2, 1), groups=2),
     (2, 2, 4, 6, 4), (4, 1, 2, 2, 2), False),
    # groups strictly between 1 and the channels, several channels per group
    ("1d_groups2", lambda x, w, b: F.conv1d(x, w, b, padding=2, groups=2),
     (2, 6, 10), (4, 3, 5), True),
    ("1d_groups3_stride_dil", lambda x, w, b: F.conv1d(x, w, b, stride=3, padding=1,
                                                       dilation=2, groups=3),
     (2, 9, 17), (6, 3, 3), True),
    ("2d_groups2_mult", lambda x, w, b: F.conv2d(x, w, b, padding=(1, 2), groups=2),
     (2, 4, 6, 7), (6, 2, 3, 3), True),
    ("2d_groups4_stride", lambda x, w, b: F.conv2d(x, w, b, stride=(1, 2), groups=4),
     (1, 8, 5, 9), (8, 2, 2, 3), False),
    ("3d_groups2", lambda x, w, b: F.conv3d(x, w, b, stride=(2, 1, 1), padding=1, groups=2),
     (1, 4, 5, 4, 4), (6, 2, 3, 2, 3), True),
    ("2d_groups_same", lambda x, w, b: F.conv2d(x, w, b, padding="same", dilation=2, groups=3),
     (2, 6, 7, 7), (3, 2, 3, 3), True),
    # transposed convolutions with groups (their weight gradient swaps the operands' roles)
    ("tr1d_depthwise", lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1,
                                                          groups=4),
     (2, 4, 7), (4, 1, 3), True),
    ("tr2d_groups2_mult", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1,
                                                             output_padding=1, groups=2),
     (2, 4, 5, 4), (4, 3, 3, 3), True),
    ("tr3d_depthwise_dil", lambda x, w, b: F.conv_transpose3d(x, w, b, dilation=2, groups=2),
     (1, 2, 3, 4, 3), (2, 2, 2, 2, 2), False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_grouped_conv_forward_backward(case, fallbacks):
    _, fn, xs, ws, with_bias = case
    x, w = rnd(*xs), rnd(*ws, seed=1)
    # the bias has the output's channel count (a CPU forward without bias tells it)
    b = rnd(fn(x, w, None).shape[1], seed=2) if with_bias else None
    check_conv(fn, x, w, b)
    fallbacks.assert_none()


@pytest.mark.parametrize("mask", [(False, True, False), (True, False, False),
                                  (False, False, True), (True, True, True)])
def test_depthwise_convolution_backward_output_mask(mask, fallbacks):
    # convolution_backward asked for a subset of gradients (the weight alone is what a frozen
    # input asks for)
    x, w, go = rnd(2, 8, 11), rnd(8, 1, 4, seed=1), rnd(2, 8, 14, seed=2)
    args = ([8], [1], [3], [1], False, [0], 8, list(mask))
    ref = torch.ops.aten.convolution_backward(go, x, w, *args)
    out = torch.ops.aten.convolution_backward(go.to(TPU), x.to(TPU), w.to(TPU), *args)
    for r, o, wanted in zip(ref, out, mask):
        # (CPU's depthwise kernel may return gradients it was not asked for; tpu returns
        # exactly the requested ones, as the schema's output_mask says)
        assert (o is None) == (not wanted)
        if wanted:
            assert o.device.type == "tpu" and o.shape == r.shape
            torch.testing.assert_close(o.cpu(), r, atol=1e-4, rtol=1e-4)
    fallbacks.assert_none()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_depthwise_conv_dtypes(dtype, fallbacks):
    atol = {torch.bfloat16: 5e-2, torch.float16: 5e-3, torch.float64: 1e-10}[dtype]
    check_conv(lambda x, w, b: F.conv1d(x, w, b, padding=2, groups=6),
               rnd(2, 6, 9, dtype=dtype), rnd(6, 1, 3, seed=1, dtype=dtype),
               rnd(6, seed=2, dtype=dtype), atol=atol, rtol=atol)
    fallbacks.assert_none()


def test_depthwise_conv_frozen_weight_and_input(fallbacks):
    # weight gradient only (the input is data), then input gradient only (frozen filter)
    x, w = rnd(3, 10, 12), rnd(10, 1, 4, seed=1)
    for x_grad in (False, True):
        xc, wc = x.clone().requires_grad_(x_grad), w.clone().requires_grad_(not x_grad)
        xd, wd = x.to(TPU).requires_grad_(x_grad), w.to(TPU).requires_grad_(not x_grad)
        F.conv1d(xc, wc, padding=3, groups=10).square().sum().backward()
        F.conv1d(xd, wd, padding=3, groups=10).square().sum().backward()
        (c, d) = (xc, xd) if x_grad else (wc, wd)
        torch.testing.assert_close(d.grad.cpu(), c.grad, atol=1e-4, rtol=1e-4)
        assert (xd.grad is None) != x_grad and (wd.grad is None) == x_grad
    fallbacks.assert_none()


def test_wide_depthwise_conv1d(fallbacks):
    # the short causal convolution of a Mamba-style block at 8192 channels; this once took
    # seconds and gigabytes (the weight gradient was a dense C x C convolution)
    C = 8192
    check_conv(lambda x, w, b: F.conv1d(x, w, b, padding=3, groups=C),
               rnd(2, C, 8), rnd(C, 1, 4, seed=1), rnd(C, seed=2))
    fallbacks.assert_none()
