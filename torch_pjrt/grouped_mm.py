"""aten::_grouped_mm for tpu tensors with static shapes (MoE experts).

PyTorch's composite kernel (CompositeExplicitAutograd, what a new device gets) reads the
offsets to the host and runs one ``mm`` per group on a slice whose length is that group's
size, so every new distribution of tokens over experts is a set of new programs: torchtitan's
qwen3 MoE debug model (64 experts) compiled about 1,400 programs per training step and spent
over a minute per step compiling. The kernel registered here never leaves the device and
keeps every shape a function of the inputs' shapes only:

- the grouped dimension (``m``: rows of ``mat_a`` for 2-D x 3-D, columns of ``mat_b`` for
  3-D x 2-D, the contraction for 2-D x 2-D) is cut into tiles of ``t`` positions; since the
  groups are consecutive ranges, tile ``i`` meets the groups ``first[i] .. last[i]``, and all
  tiles together meet at most ``tiles + groups - 1`` (tile, group) pairs;
- each pair is one matrix product of a tile against its group's operand, batched over a
  static number of pairs (``tiles + groups - 1``; pairs past the real count are masked out);
- a position's result is taken from the pair of its own group only (a mask, so values from
  other groups, infinities included, never mix in) and summed back per tile (2-D x 3-D) or
  per group (2-D x 2-D) with ``index_add``.

The work is ``(m + (groups - 1) * t) / m`` times the exact grouped product; ``t`` is chosen
near ``m / groups`` (a power of two, 16..256), so about twice it at worst. Positions past the
last offset get zeros (PyTorch's kernels leave them unspecified). Autograd is PyTorch's: the
derivative of ``_grouped_mm`` is made of ``_grouped_mm`` calls (2-D x 3-D for the input's
gradient, 2-D x 2-D for the weights'), which land here again.
"""
from __future__ import annotations

import torch

from .fake_rules import grouped_mm_checked_size

_LIB = None


def _tile_size(m: int, groups: int) -> int:
    t = 16
    while t < 256 and t * groups < m:
        t *= 2
    return t


def _pairs(offs: torch.Tensor, m: int, t: int):
    """The (tile, group) pairs of a grouped dimension of length ``m`` cut into tiles of ``t``.
    Returns (tile [P], group [P], mask [P, t]: position j of the pair's tile belongs to the
    pair's group, tiles, padded length); P = tiles + groups - 1, static."""
    groups = offs.numel()
    tiles = max(1, -(-m // t))
    padded = tiles * t
    dev = offs.device
    pos = torch.arange(padded, device=dev)
    # group of each position: how many group ends lie at or before it (groups = past the end)
    group_of = (pos[:, None] >= offs.to(torch.int64)[None, :]).sum(1).view(tiles, t)
    first = group_of[:, 0]
    last = group_of[:, -1].clamp(max=groups - 1)
    count = torch.where(first < groups, last - first + 1, torch.zeros_like(first))
    ends = torch.cumsum(count, 0)
    starts = ends - count
    n_pairs = tiles + groups - 1
    p = torch.arange(n_pairs, device=dev)
    tile = (ends[None, :] <= p[:, None]).sum(1).clamp(max=tiles - 1)
    valid = p < ends[-1]
    group = (first[tile] + p - starts[tile]).clamp(0, groups - 1)
    mask = (group_of[tile] == group[:, None]) & valid[:, None]
    return tile, group, mask, tiles, padded


def _rows_grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, dtype) -> torch.Tensor:
    """out[r] = a[r] @ b[group(r)]: a [m, k] with rows grouped by offs, b [groups, k, n]."""
    m, k = a.shape
    n = b.shape[-1]
    t = _tile_size(m, offs.numel())
    tile, group, mask, tiles, padded = _pairs(offs, m, t)
    a_tiles = torch.nn.functional.pad(a, (0, 0, 0, padded - m)).view(tiles, t, k)
    part = torch.bmm(a_tiles[tile], b[group])  # [P, t, n]
    part = torch.where(mask[:, :, None], part, torch.zeros((), dtype=part.dtype, device=a.device))
    out = torch.zeros(tiles, t, n, dtype=part.dtype, device=a.device).index_add_(0, tile, part)
    return out.view(padded, n)[:m].to(dtype)


def _contraction_grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                         dtype) -> torch.Tensor:
    """out[g] = a[:, K_g] @ b[K_g, :]: a [m, K], b [K, n], the contraction grouped by offs."""
    m, kk = a.shape
    n = b.shape[1]
    groups = offs.numel()
    t = _tile_size(kk, groups)
    tile, group, mask, tiles, padded = _pairs(offs, kk, t)
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    a_tiles = torch.nn.functional.pad(a.t(), (0, 0, 0, padded - kk)).view(tiles, t, m)
    b_tiles = torch.nn.functional.pad(b, (0, 0, 0, padded - kk)).view(tiles, t, n)
    keep = mask[:, :, None]
    part = torch.bmm(torch.where(keep, a_tiles[tile], zero).transpose(1, 2),
                     torch.where(keep, b_tiles[tile], zero))  # [P, m, n]
    # several tiles add into one group: sum in float32 at least, round once
    acc = torch.promote_types(part.dtype, torch.float32)
    out = torch.zeros(groups, m, n, dtype=acc, device=a.device)
    return out.index_add_(0, group, part.to(acc)).to(dtype)


def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    size = grouped_mm_checked_size(mat_a, mat_b, offs, bias)
    torch._check(mat_a.dtype == mat_b.dtype,
                 lambda: f"Expected mat_a and mat_b to have the same dtype, but got "
                         f"{mat_a.dtype} and {mat_b.dtype}")
    dtype = out_dtype or mat_a.dtype
    # products in the result's dtype when it is wider (bfloat16 inputs, float32 out_dtype)
    work = torch.promote_types(mat_a.dtype, dtype)
    a, b = mat_a.to(work), mat_b.to(work)
    if a.dim() == 3 and b.dim() == 3:
        out = torch.bmm(a, b).to(dtype)
    elif a.dim() == 2 and b.dim() == 3:
        out = _rows_grouped(a, b, offs, dtype)
    elif a.dim() == 3 and b.dim() == 2:  # columns of b grouped: the transposed 2-D x 3-D case
        out = _rows_grouped(b.t(), a.transpose(1, 2), offs, dtype).t()
    else:
        out = _contraction_grouped(a, b, offs, dtype)
    assert list(out.shape) == list(size), (out.shape, size)
    return out.contiguous()


def _bucket(m: int) -> int:
    """m rounded up to one of 8 sizes per power of two (at most 1/8 padding), at least 64."""
    if m <= 64:
        return 64
    step = 1 << max(0, m.bit_length() - 4)
    return -(-m // step) * step


def _padded_call(mat_a, mat_b, run):
    """run() on inputs whose grouped dimension is padded to _bucket(m) positions: positions past
    the last offset belong to no group (zeros in, zeros out), so the fused program is the same
    for every m of a bucket. Expert parallelism receives a different number of rows every
    step; without buckets each step compiled new programs. The pads and the slice are small
    programs of their own."""
    pad = torch.nn.functional.pad
    if mat_a.dim() == 2 and mat_b.dim() == 3:  # rows of mat_a grouped
        m = mat_a.shape[0]
        mb = _bucket(m)
        if mb == m:
            return run(mat_a, mat_b)
        return run(pad(mat_a, (0, 0, 0, mb - m)), mat_b)[:m]
    if mat_a.dim() == 3 and mat_b.dim() == 2:  # columns of mat_b grouped
        m = mat_b.shape[1]
        mb = _bucket(m)
        if mb == m:
            return run(mat_a, mat_b)
        return run(mat_a, pad(mat_b, (0, mb - m)))[:, :m]
    if mat_a.dim() == 2 and mat_b.dim() == 2:  # the contraction grouped
        k = mat_a.shape[1]
        kb = _bucket(k)
        if kb == k:
            return run(mat_a, mat_b)
        return run(pad(mat_a, (0, kb - k)), pad(mat_b, (0, 0, 0, kb - k)))
    return run(mat_a, mat_b)


def _grouped_mm_fused(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The kernel as one program per call: in Strict mode its ~25 small ops (pairs, gathers,
    bmm, masks, index_add) would each be a program of their own, a launch and a device round
    trip apiece (torchtitan's MoE layers call it 12 times per layer and step), so the body is
    recorded in defer_and_fuse on this thread and run at once. Other modes (defer_and_fuse
    already, Debug's op-by-op checks) and graph capture keep the caller's mode."""
    from . import _C
    from .modes import eager_mode, flush, get_eager_mode

    if get_eager_mode() != "strict" or _C._capture_active():
        return _grouped_mm(mat_a, mat_b, offs, bias, out_dtype)
    grouped_mm_checked_size(mat_a, mat_b, offs, bias)  # errors name the caller's shapes

    def run(a, b):
        with eager_mode("defer_and_fuse"):
            out = _grouped_mm(a, b, offs, bias, out_dtype)
        _C._exec_profile_label("eager:_grouped_mm")  # its program's name in step profiles
        try:
            flush()
        finally:
            _C._exec_profile_label("")
        return out

    if offs is None:
        return run(mat_a, mat_b)
    return _padded_call(mat_a, mat_b, run).contiguous()


def register() -> None:
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("aten", "IMPL")
        _LIB.impl("_grouped_mm", _grouped_mm_fused, "PrivateUse1")
