"""torchvision's detection ops on tpu (torch_pjrt/vision_ops.py, csrc/ops/vision.c).

Without torchvision (the torch 2.13.0 environment, where PyPI's torchvision does not import), the
tpu kernels are called directly and compared with plain-Python references written from
torchvision's CPU algorithms; with torchvision, `torchvision.ops` on tpu is compared with its own
CPU kernels, values and gradients.
"""
import math

import pytest
import torch

from torch_pjrt import vision_ops

try:
    import torchvision  # noqa: F401
    from torchvision import ops as tv_ops
except Exception:  # noqa: BLE001 - absent or built for another torch
    tv_ops = None

needs_tv = pytest.mark.skipif(tv_ops is None, reason="torchvision does not import with this torch")


def _boxes(n, seed, ties=True):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 50
    wh = torch.rand(n, 2, generator=g) * 20
    s = torch.rand(n, generator=g)
    if ties:
        s[: n // 3] = 0.5
    return torch.cat([xy, xy + wh], 1), s


def _nms_reference(b, s, thr):
    """torchvision's CPU kernel, loop for loop: stable descending order, then each kept box
    suppresses later boxes with IoU above the threshold (computed in the boxes' dtype)."""
    order = s.sort(stable=True, descending=True).indices.tolist()
    x1, y1, x2, y2 = b.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    sup = [False] * len(order)
    keep = []
    for a, i in enumerate(order):
        if sup[a]:
            continue
        keep.append(i)
        for c in range(a + 1, len(order)):
            j = order[c]
            w = (torch.minimum(x2[i], x2[j]) - torch.maximum(x1[i], x1[j])).clamp_min(0)
            h = (torch.minimum(y2[i], y2[j]) - torch.maximum(y1[i], y1[j])).clamp_min(0)
            inter = w * h
            if float(inter / (area[i] + area[j] - inter)) > thr:
                sup[c] = True
    return torch.tensor(keep, dtype=torch.long)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 60])
@pytest.mark.parametrize("thr", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nms_matches_cpu_algorithm(n, thr, dtype):
    b, s = _boxes(n, seed=n)
    b, s = b.to(dtype), s.to(dtype)
    got = vision_ops._nms(b.to("tpu"), s.to("tpu"), thr)
    assert got.device.type == "tpu" and got.dtype == torch.long
    assert torch.equal(got.cpu(), _nms_reference(b, s, thr))


def test_nms_identical_and_nested_boxes():
    b = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 10], [2, 2, 8, 8], [20, 20, 21, 21.0]])
    s = torch.tensor([0.5, 0.9, 0.8, 0.1])
    for thr in (0.2, 0.36, 0.5):
        assert torch.equal(vision_ops._nms(b.to("tpu"), s.to("tpu"), thr).cpu(),
                           _nms_reference(b, s, thr))


def test_nms_threshold_compared_as_cpu_does():
    # IoU exactly 0.5 in float32 is not above a 0.5 threshold; 0.25 / 0.5 boxes sit on it
    b = torch.tensor([[0, 0, 2, 1], [1, 0, 3, 1.0]])  # inter 1, union 3: IoU 1/3
    s = torch.tensor([1.0, 0.5])
    for thr in (1 / 3, math.nextafter(1 / 3, 0), math.nextafter(1 / 3, 1)):
        assert torch.equal(vision_ops._nms(b.to("tpu"), s.to("tpu"), thr).cpu(),
                           _nms_reference(b, s, thr)), thr


def test_nms_bad_input_raises_like_cpu():
    with pytest.raises(RuntimeError, match="boxes should have 4 elements"):
        vision_ops._nms(torch.zeros(3, 5, device="tpu"), torch.zeros(3, device="tpu"), 0.5)
    with pytest.raises(RuntimeError, match="same number of elements"):
        vision_ops._nms(torch.zeros(3, 4, device="tpu"), torch.zeros(2, device="tpu"), 0.5)


def _roi_align_reference(x, rois, ss, ph, pw, sr, aligned):
    """torchvision's CPU forward written as loops (bilinear with its edge rules, per-bin grid)."""
    n, c, h, w = x.shape
    out = torch.zeros(rois.shape[0], c, ph, pw, dtype=x.dtype)
    off = 0.5 if aligned else 0.0
    for k, r in enumerate(rois.tolist()):
        b = int(r[0])
        sw, sh, ew, eh = (v * ss - off for v in r[1:])
        rw, rh = ew - sw, eh - sh
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        gh = sr if sr > 0 else math.ceil(rh / ph)
        gw = sr if sr > 0 else math.ceil(rw / pw)
        cnt = max(gh * gw, 1)
        for p in range(ph):
            for q in range(pw):
                acc = torch.zeros(c, dtype=torch.float64)
                for iy in range(gh):
                    y = sh + p * bh + (iy + 0.5) * bh / gh
                    for ix in range(gw):
                        xx = sw + q * bw + (ix + 0.5) * bw / gw
                        if y < -1.0 or y > h or xx < -1.0 or xx > w:
                            continue
                        yy, xc = max(y, 0.0), max(xx, 0.0)
                        yl, xl = int(yy), int(xc)
                        if yl >= h - 1:
                            yl = yhh = h - 1
                            yy = float(yl)
                        else:
                            yhh = yl + 1
                        if xl >= w - 1:
                            xl = xh = w - 1
                            xc = float(xl)
                        else:
                            xh = xl + 1
                        ly, lx = yy - yl, xc - xl
                        hy, hx = 1 - ly, 1 - lx
                        v = x[b].double()
                        acc += (hy * hx * v[:, yl, xl] + hy * lx * v[:, yl, xh]
                                + ly * hx * v[:, yhh, xl] + ly * lx * v[:, yhh, xh])
                out[k, :, p, q] = (acc / cnt).to(x.dtype)
    return out


ROIS = torch.tensor([[0, 1.0, 2.0, 10.5, 12.0], [1, -3, -2, 5, 7], [0, 14, 10, 30, 25],
                     [1, 0, 0, 0.5, 0.3], [0, 3.3, 4.4, 19.9, 15.9]])


@pytest.mark.parametrize("sr", [2, 0, 3])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("ss,pooled", [(1.0, (3, 3)), (0.5, (2, 4))])
def test_roi_align_matches_cpu_algorithm(sr, aligned, ss, pooled):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 12, 14, generator=g)
    ref = _roi_align_reference(x, ROIS, ss, *pooled, sr, aligned)
    got = vision_ops._roi_align(x.to("tpu"), ROIS.to("tpu"), ss, *pooled, sr, aligned)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch.testing.assert_close(got.cpu(), ref, atol=1e-5, rtol=1e-5)


def test_roi_align_empty_rois():
    x = torch.randn(1, 2, 5, 5, device="tpu")
    out = vision_ops._roi_align(x, torch.zeros(0, 5, device="tpu"), 1.0, 2, 2, 2, False)
    assert out.shape == (0, 2, 2, 2) and out.device.type == "tpu"


@needs_tv
@pytest.mark.parametrize("n", [0, 5, 300])
def test_torchvision_nms_and_batched_nms(n):
    b, s = _boxes(n, seed=7)
    for thr in (0.3, 0.5):
        assert torch.equal(tv_ops.nms(b.to("tpu"), s.to("tpu"), thr).cpu(), tv_ops.nms(b, s, thr))
    idx = torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(tv_ops.batched_nms(b.to("tpu"), s.to("tpu"), idx.to("tpu"), 0.5).cpu(),
                       tv_ops.batched_nms(b, s, idx, 0.5))


@needs_tv
@pytest.mark.parametrize("sr", [2, -1])
@pytest.mark.parametrize("aligned", [False, True])
def test_torchvision_roi_align_values_and_grads(sr, aligned):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 16, 20, generator=g, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    before = dict(torch.tpu.fallback_ops())  # process-wide counts: earlier tests' stay in them
    ref = tv_ops.roi_align(x, ROIS, (7, 7), 0.5, sr, aligned)
    got = tv_ops.roi_align(xt, ROIS.to("tpu"), (7, 7), 0.5, sr, aligned)
    torch.testing.assert_close(got.cpu(), ref, atol=1e-5, rtol=1e-5)
    go = torch.randn(ref.shape, generator=g)
    (gr,) = torch.autograd.grad(ref, x, go)
    (gt,) = torch.autograd.grad(got, xt, go.to("tpu"))
    torch.testing.assert_close(gt.cpu(), gr, atol=1e-5, rtol=1e-5)
    assert dict(torch.tpu.fallback_ops()) == before
