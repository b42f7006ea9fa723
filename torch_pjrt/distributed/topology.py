"""Topology-aware device meshes: ``init_device_mesh("tpu", shape)`` lays the mesh over the
devices so that its fastest (last) dimension follows the interconnect's rings.

A TPU plugin describes each device's place in the slice with PJRT device attributes: ``coords``
(the chip's x, y, z in the torus) and ``core_on_chip``. Ranks in PyTorch's default mesh are in
rank order, and rank order is device-index order, which need not walk the torus along its links.
Here the mesh is built from the physical grid instead:

- the grid's axes, fastest first, are the core on a chip, then x, y and z;
- mesh dimensions, from the last to the first, take grid axes in that order: a mesh dimension
  takes whole axes while its size is a multiple of theirs (a dimension of 8 on a 4 x 4 torus
  takes x and half of y), or the inner part of one axis when it is smaller (a dimension of 2
  over x's 4 takes neighbouring pairs; the next dimension takes the pairs' positions);
- a mesh dimension made of several axes walks them as a snake (boustrophedon: the faster digit
  runs backwards on every other value of the slower ones), so that neighbours in the dimension
  are neighbours on the grid, and a dimension of 2 x-rows closes its ring through the torus.

Devices without coordinates (the CPU and GPU plugins here), a grid with holes, or a mesh whose
sizes do not factor over the grid's axes keep PyTorch's order. Only a mesh of the whole process
set of devices on one host is reordered (ranks = device indices: ``tpu_dist``'s rank r uses
``tpu:r``, ``run_threads``' rank r too)."""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["mesh_order", "device_grid", "device_attributes"]

_AXES = ("core_on_chip", "x", "y", "z")


def device_grid(attributes: Sequence[dict]):
    """Each device's grid position (core, x, y, z, each from 0) and the grid's extents, or
    None when the devices do not describe a full grid (no ``coords``, holes, repeats)."""
    if not attributes or not all(isinstance(a.get("coords"), (list, tuple)) for a in attributes):
        return None
    raw = []
    for a in attributes:
        c = list(a["coords"]) + [0] * (3 - len(a["coords"]))
        raw.append((int(a.get("core_on_chip", 0)), int(c[0]), int(c[1]), int(c[2])))
    values = [sorted({r[k] for r in raw}) for k in range(4)]
    extents = tuple(len(v) for v in values)
    if math.prod(extents) != len(raw):
        return None
    places = [tuple(values[k].index(r[k]) for k in range(4)) for r in raw]
    if len(set(places)) != len(places):
        return None
    return places, extents


def _assign(mesh_shape: Sequence[int], extents: Sequence[int]):
    """For each mesh dimension, its pieces of grid axes, fastest first: (axis, stride, size),
    stride in the axis's own units. None when the sizes do not factor over the axes."""
    axes = [(k, e) for k, e in enumerate(extents) if e > 1]  # fastest first
    pos, used = 0, 1  # the current axis, and how much of it earlier dimensions took
    pieces: list[list[tuple[int, int, int]]] = []
    for m in reversed(list(mesh_shape)):
        dim: list[tuple[int, int, int]] = []
        while m > 1:
            if pos >= len(axes):
                return None
            axis, extent = axes[pos]
            left = extent // used
            if m % left == 0:  # the rest of this axis
                dim.append((axis, used, left))
                m //= left
                pos, used = pos + 1, 1
            elif left % m == 0:  # the inner part of what is left
                dim.append((axis, used, m))
                used *= m
                m = 1
            else:
                return None
        pieces.append(dim)
    if pos < len(axes):
        return None
    return list(reversed(pieces))


def _snake_digits(index: int, sizes: Sequence[int]) -> list[int]:
    """index in the reflected mixed-radix order over digits of `sizes` (fastest first):
    consecutive indices differ by one in exactly one digit."""
    digits = []
    for s in sizes:
        digits.append(index % s)
        index //= s
    for k in range(len(digits) - 2, -1, -1):  # reflect a digit when the slower ones sum odd
        if sum(digits[k + 1:]) % 2:
            digits[k] = sizes[k] - 1 - digits[k]
    return digits


def mesh_order(mesh_shape: Sequence[int], attributes: Sequence[dict]) -> list[int] | None:
    """The device indices of a mesh of `mesh_shape` over devices with these attributes (index
    i = device i), in the mesh's row-major order; None when PyTorch's order stands (no
    coordinates, no full grid, a size that does not factor, or the identity)."""
    n = math.prod(mesh_shape)
    if n != len(attributes):
        return None
    grid = device_grid(attributes)
    if grid is None:
        return None
    places, extents = grid
    pieces = _assign(mesh_shape, extents)
    if pieces is None:
        return None
    where = {p: i for i, p in enumerate(places)}
    order = []
    for flat in range(n):
        idx, rest = [], flat
        for m in reversed(list(mesh_shape)):
            idx.append(rest % m)
            rest //= m
        idx.reverse()
        place = [0, 0, 0, 0]
        for d, dim in enumerate(pieces):
            digits = _snake_digits(idx[d], [size for _, _, size in dim])
            for (axis, stride, _), digit in zip(dim, digits):
                place[axis] += digit * stride
        order.append(where[tuple(place)])
    return None if order == list(range(n)) else order


def device_attributes(index: int) -> dict:
    """The plugin's attributes of ``tpu:index`` (PJRT device attributes, e.g. a TPU's
    ``coords`` and ``core_on_chip``) and its global ``id``."""
    from .. import device

    return dict(device._C.device_attributes(index))


def _rank_order(mesh_shape: Sequence[int]) -> list[int] | None:
    """The ranks of a topology-ordered mesh, when this process's world is one device per rank
    on this host (rank r on tpu:r), else None."""
    import os

    import torch
    import torch.distributed as dist

    if os.environ.get("TORCH_PJRT_TOPOLOGY_MESH", "1") in ("0", "false", "off"):
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    n = math.prod(mesh_shape)
    if n != dist.get_world_size() or n != torch.tpu.device_count():
        return None
    return mesh_order(mesh_shape, [device_attributes(i) for i in range(n)])


def _install() -> None:
    """Makes ``init_device_mesh("tpu", shape)`` (torch.distributed's and
    torch.distributed.device_mesh's) build a topology-ordered mesh where one applies; every
    other call, and any call with ``backend_override`` or invalid names (whose errors are
    PyTorch's own), goes to PyTorch's function unchanged. Idempotent."""
    import functools

    import torch
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh

    original = device_mesh.init_device_mesh
    if getattr(original, "_torch_pjrt_topology", False):
        return

    @functools.wraps(original)
    def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None, backend_override=None):
        order = None
        names_ok = mesh_dim_names is None or (
            len(set(mesh_dim_names)) == len(mesh_dim_names) == len(mesh_shape))
        if device_type == "tpu" and backend_override is None and names_ok:
            order = _rank_order(tuple(mesh_shape))
        if order is None:
            return original(device_type, mesh_shape, mesh_dim_names=mesh_dim_names,
                            backend_override=backend_override)
        mesh = torch.tensor(order, dtype=torch.int).view(tuple(mesh_shape))
        return device_mesh.DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names)

    init_device_mesh._torch_pjrt_topology = True
    device_mesh.init_device_mesh = init_device_mesh
    if getattr(dist, "init_device_mesh", None) is original:
        dist.init_device_mesh = init_device_mesh
