"""torchvision's detection ops on the tpu device: `torchvision::nms` and `torchvision::roi_align`
(Faster R-CNN, Mask R-CNN, RetinaNet and SSD call them; without kernels here they would run on
the CPU through the fallback).

- nms: the scores are sorted on the device (stable, descending, as torchvision's CPU kernel),
  `tpu::nms_keep` (csrc/ops/vision.c) runs the greedy suppression as one program, and the kept
  positions (a data-dependent count: one host read, as CPU's result size needs) index the order.
- roi_align: written in torch ops, so it lowers like any eager code and autograd derives its
  backward (registered for AutogradPrivateUse1, which takes precedence over torchvision's own
  Autograd kernel there). Each output bin averages bilinear samples on CPU's sampling grid with
  CPU's sample positions, edge rules and adaptive grid size (sampling_ratio <= 0: ceil of the
  box size over the bin count, per box; the largest grid is read to the host, smaller boxes mask
  their extra samples). Samples gather channels-last rows of the feature map.

The kernels are registered by operator name before torchvision defines the operators (the
dispatcher keeps kernels for names it has not seen a schema for), so importing torchvision
before or after torch_pjrt both work.
"""
from __future__ import annotations

import torch

_LIBS: list = []


def _nms_keep_fake(boxes, iou_threshold):
    return boxes.new_empty((boxes.shape[0],), dtype=torch.bool)


def _nms(dets, scores, iou_threshold):
    torch._check(dets.dim() == 2, lambda: f"boxes should be a 2d tensor, got {dets.dim()}D")
    torch._check(dets.size(1) == 4,
                 lambda: f"boxes should have 4 elements in dimension 1, got {dets.size(1)}")
    torch._check(scores.dim() == 1, lambda: f"scores should be a 1d tensor, got {scores.dim()}D")
    torch._check(dets.size(0) == scores.size(0), lambda: (
        f"boxes and scores should have same number of elements in dimension 0, got "
        f"{dets.size(0)} and {scores.size(0)}"))
    if dets.numel() == 0:
        return torch.empty((0,), dtype=torch.long, device=dets.device)
    order = scores.sort(stable=True, descending=True).indices
    keep = torch.ops.tpu.nms_keep(dets.index_select(0, order), float(iou_threshold))
    return order[keep]


def _axis_samples(start, bin_size, grid, grid_max: int, pooled: int, size: int, dtype):
    """Per box, bin and sample along one axis: (low index, high index, low weight, high weight,
    valid), each [K, pooled, grid_max], with CPU's positions and edge handling."""
    p = torch.arange(pooled, device=start.device, dtype=dtype).view(1, -1, 1)
    i = torch.arange(grid_max, device=start.device, dtype=dtype).view(1, 1, -1)
    g = grid.to(dtype).view(-1, 1, 1)
    b = bin_size.view(-1, 1, 1)
    pos = (start.view(-1, 1, 1) + p * b) + (i + 0.5) * b / g
    valid = (i < g) & (pos >= -1.0) & (pos <= size)
    pos = pos.clamp_min(0)
    low = pos.floor().long()
    edge = low >= size - 1
    low = torch.where(edge, size - 1, low)
    high = torch.where(edge, size - 1, low + 1)
    pos = torch.where(edge, low.to(dtype), pos)
    frac = pos - low.to(dtype)
    return low, high, 1.0 - frac, frac, valid


def _roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    torch._check(input.dtype == rois.dtype, lambda: (
        f"roi_align: input and rois must have the same dtype, got {input.dtype} and {rois.dtype}"))
    torch._check(rois.dim() == 2 and rois.size(1) == 5, lambda: "rois must have shape as Tensor[K, 5]")
    n, c, h, w = input.shape
    ph, pw = int(pooled_height), int(pooled_width)
    k = rois.shape[0]
    if k == 0 or input.numel() == 0:
        return input.new_zeros((k, c, ph, pw))
    dt = input.dtype
    off = 0.5 if aligned else 0.0
    bidx = rois[:, 0].long()
    start_w = rois[:, 1] * spatial_scale - off
    start_h = rois[:, 2] * spatial_scale - off
    rw = (rois[:, 3] * spatial_scale - off) - start_w
    rh = (rois[:, 4] * spatial_scale - off) - start_h
    if not aligned:
        rw, rh = rw.clamp_min(1.0), rh.clamp_min(1.0)
    bin_h, bin_w = rh / ph, rw / pw
    if sampling_ratio > 0:
        gh = gw = torch.full((k,), sampling_ratio, dtype=torch.long, device=input.device)
        gh_max = gw_max = int(sampling_ratio)
    else:
        gh, gw = torch.ceil(rh / ph).long(), torch.ceil(rw / pw).long()
        gh_max, gw_max = (max(int(v), 1) for v in torch.stack([gh.max(), gw.max()]).tolist())
    count = (gh * gw).clamp_min(1).to(dt)
    ylo, yhi, wyl, wyh, vy = _axis_samples(start_h, bin_h, gh, gh_max, ph, h, dt)
    xlo, xhi, wxl, wxh, vx = _axis_samples(start_w, bin_w, gw, gw_max, pw, w, dt)
    # [K, ph, gh, pw, gw] samples; rows of the channels-last map are (image, y, x)
    rows = input.permute(0, 2, 3, 1).reshape(n * h * w, c)
    base = (bidx * (h * w)).view(-1, 1, 1, 1, 1)

    def y_(t):
        return t.view(k, ph, gh_max, 1, 1)

    def x_(t):
        return t.view(k, 1, 1, pw, gw_max)

    mask = (y_(vy) & x_(vx)).to(dt)
    out = None
    for yi, wy in ((ylo, wyl), (yhi, wyh)):
        for xi, wx in ((xlo, wxl), (xhi, wxh)):
            idx = base + y_(yi) * w + x_(xi)
            term = rows.index_select(0, idx.reshape(-1)).view(k, ph, gh_max, pw, gw_max, c)
            term = term * (y_(wy) * x_(wx) * mask).unsqueeze(-1)
            out = term if out is None else out + term
    out = out.sum(dim=(2, 4)) / count.view(-1, 1, 1, 1)
    return out.permute(0, 3, 1, 2).contiguous()


def register() -> None:
    """Registers the kernels once per process (idempotent)."""
    if _LIBS:
        return
    tpu = torch.library.Library("tpu", "FRAGMENT")
    tpu.define("nms_keep(Tensor boxes, float iou_threshold) -> Tensor")
    tpu.impl("nms_keep", _nms_keep_fake, "Meta")
    tv = torch.library.Library("torchvision", "IMPL")
    tv.impl("nms", _nms, "PrivateUse1")
    tv.impl("roi_align", _roi_align, "AutogradPrivateUse1")
    _LIBS.extend([tpu, tv])
