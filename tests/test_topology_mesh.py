"""Topology-aware meshes (torch_pjrt/distributed/topology.py, issue 36 item 7): the device order
a mesh takes from the devices' PJRT attributes (``coords``, ``core_on_chip``), checked on
synthetic tori, and ``init_device_mesh("tpu", shape)`` building that mesh in a real 4-rank world
(``run_threads`` in a fresh interpreter, the attributes patched to a torus)."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from torch_pjrt.distributed import topology

HERE = os.path.dirname(os.path.abspath(__file__))


def torus(nx, ny, nz=1, cores=1, seed=0):
    """Attributes of an nx x ny x nz slice with `cores` cores per chip, in a shuffled device
    order (device index != physical order), and each device's (core, x, y, z)."""
    places = [(c, x, y, z) for z in range(nz) for y in range(ny) for x in range(nx)
              for c in range(cores)]
    random.Random(seed).shuffle(places)
    attrs = [{"coords": [x, y, z], "core_on_chip": c, "id": i}
             for i, (c, x, y, z) in enumerate(places)]
    return attrs, places


def hops(a, b, ext):
    """Links between two grid places on a torus of extents ext (core, x, y, z); cores of one
    chip are 0 links apart in x/y/z and 1 in the core axis."""
    return sum(min(abs(p - q), e - abs(p - q)) for p, q, e in zip(a, b, ext))


def grid(order, shape):
    rows = [order[i:i + shape[-1]] for i in range(0, len(order), shape[-1])]
    return rows


def test_2x2_torus_rows_follow_x_and_columns_follow_y():
    attrs, places = torus(2, 2, seed=1)
    order = topology.mesh_order((2, 2), attrs)
    assert order is not None and sorted(order) == list(range(4))
    for row in grid(order, (2, 2)):  # a row: one y, x = 0, 1
        assert [places[d][2] for d in row] == [places[row[0]][2]] * 2
        assert [places[d][1] for d in row] == [0, 1]
    cols = list(zip(*grid(order, (2, 2))))
    for col in cols:
        assert len({places[d][1] for d in col}) == 1


@pytest.mark.parametrize("shape", [(4, 4), (2, 8), (16,), (2, 2, 4), (8, 2)])
def test_4x4_torus_every_mesh_row_is_a_ring_of_neighbours(shape):
    attrs, places = torus(4, 4, seed=2)
    ext = (1, 4, 4, 1)
    order = topology.mesh_order(shape, attrs)
    assert order is not None and sorted(order) == list(range(16))
    for row in grid(order, shape):
        steps = [hops(places[a], places[b], ext) for a, b in zip(row, row[1:] + row[:1])]
        assert steps == [1] * len(row), (shape, row, steps)


def test_4x4_mesh_4x4_is_the_grid():
    attrs, places = torus(4, 4, seed=3)
    order = topology.mesh_order((4, 4), attrs)
    for y, row in enumerate(grid(order, (4, 4))):
        assert [places[d][1:3] for d in row] == [(x, y) for x in range(4)]


def test_cores_of_a_chip_are_the_fastest_dimension():
    attrs, places = torus(2, 2, cores=2, seed=4)
    order = topology.mesh_order((4, 2), attrs)
    for row in grid(order, (4, 2)):
        a, b = (places[d] for d in row)
        assert a[1:] == b[1:] and {a[0], b[0]} == {0, 1}


def test_pytorch_order_stands_without_a_full_grid():
    assert topology.mesh_order((4,), [{"id": i} for i in range(4)]) is None  # no coords (CPU)
    attrs, _ = torus(2, 2)
    assert topology.mesh_order((3,), attrs[:3]) is None  # a grid with a hole
    assert topology.mesh_order((2, 2), attrs[:3] + attrs[:1]) is None  # a repeated place
    assert topology.mesh_order((8,), attrs) is None  # sizes differ
    attrs6, _ = torus(3, 2)
    assert topology.mesh_order((3, 2), attrs6) is None  # 2 does not factor over x=3
    in_order = [{"coords": [x, y, 0]} for y in range(2) for x in range(2)]
    assert topology.mesh_order((2, 2), in_order) is None  # already PyTorch's order


def test_cpu_devices_report_attributes_without_coords():
    import torch

    a = topology.device_attributes(0)
    assert a["id"] == 0 and "coords" not in a
    assert torch.tpu.device_count() >= 1


# --- init_device_mesh in a 4-rank world (child process) -----------------------------------------

def case_init_device_mesh() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torch_pjrt.distributed import run_threads

    # A 2x2 torus whose physical order is not the device order: device i sits at PLACES[i].
    places = [(1, 1), (0, 0), (1, 0), (0, 1)]
    topology.device_attributes = lambda i: {"coords": [*places[i], 0], "id": i}
    expect = topology.mesh_order((2, 2), [{"coords": [*p, 0]} for p in places])
    assert expect == [1, 2, 3, 0], expect

    def rank_fn(rank):
        mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
        assert mesh.mesh.flatten().tolist() == expect, mesh.mesh
        same_name = dist.init_device_mesh("tpu", (2, 2))
        assert same_name.mesh.flatten().tolist() == expect
        tp = mesh.get_group("tp")
        x = torch.full((3,), float(rank + 1), device=f"tpu:{rank}")
        dist.all_reduce(x, group=tp)
        row = next(r for r in mesh.mesh.tolist() if rank in r)
        assert x.cpu().tolist() == [float(sum(r + 1 for r in row))] * 3, (rank, x)
        with pytest.raises(RuntimeError, match="unique"):  # PyTorch's own check and message
            init_device_mesh("tpu", (2, 2), mesh_dim_names=("a", "a"))
        return rank

    assert run_threads(rank_fn, 4) == [0, 1, 2, 3]
    os.environ["TORCH_PJRT_TOPOLOGY_MESH"] = "0"
    assert run_threads(lambda r: init_device_mesh("tpu", (2, 2)).mesh.flatten().tolist(), 4) \
        == [[0, 1, 2, 3]] * 4
    print("case_init_device_mesh OK")


def test_init_device_mesh_orders_ranks_by_topology():
    from torch_pjrt import _plugins

    if _plugins.resolve().name != "cpu":
        pytest.skip("several devices come from the CPU plugin (TORCH_PJRT_CPU_DEVICE_COUNT)")
    env = {**os.environ, "TORCH_PJRT_CPU_DEVICE_COUNT": "4", "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "case_init_device_mesh"],
                       capture_output=True, text=True, env=env, timeout=180, cwd=HERE)
    assert r.returncode == 0 and "case_init_device_mesh OK" in r.stdout, \
        (r.stdout + r.stderr)[-6000:]


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
