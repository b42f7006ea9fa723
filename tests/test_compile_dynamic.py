"""Dynamic shapes under torch.compile(backend="tpu") beyond `dynamic=True` (test_compile.py has
that one): `torch._dynamo.mark_dynamic` and PyTorch's automatic dynamic shapes (the default:
the second distinct size of a dimension recompiles the frame once with that dimension symbolic).
In every case Dynamo keeps one symbolic graph per frame and the backend captures one program per
distinct concrete size; results are compared with CPU eager."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

TPU = torch.device("tpu")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def f(x, w):
    return torch.tanh(x @ w).softmax(-1).sum(0) + x.mean()


def _frames() -> int:
    return counters["stats"]["unique_graphs"]


def _run(cf, lengths, w):
    m0 = torch.tpu.metrics()
    for n in lengths:
        x = torch.randn(n, 8, generator=torch.Generator().manual_seed(n))
        got = cf(x.to(TPU), w.to(TPU))
        want = f(x, w)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    m1 = torch.tpu.metrics()
    return {k: m1[k] - m0[k] for k in ("graph_captures", "graph_runs")}


def test_mark_dynamic_one_graph_one_program_per_size():
    w = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    cf = torch.compile(f, backend="tpu")
    lengths = (4, 6, 9, 6, 4, 13)

    def call(x, w_):
        torch._dynamo.mark_dynamic(x, 0)
        return cf(x, w_)

    # mark_dynamic is applied to the tensor Dynamo sees: wrap so every call marks its input
    m = _run(call, lengths, w)
    assert _frames() == 1, f"mark_dynamic recompiled: {_frames()} Dynamo graphs"
    assert m["graph_captures"] == len(set(lengths)), m  # one program per distinct size
    assert m["graph_runs"] == len(lengths), m  # every call ran a captured program


def test_automatic_dynamic_recompiles_once_then_specializes_per_size():
    w = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    cf = torch.compile(f, backend="tpu")  # no dynamic=: PyTorch's automatic dynamic shapes
    lengths = (4, 6, 9, 13, 6, 20)
    m = _run(cf, lengths, w)
    # first size static, second size marks the dimension dynamic (one recompile), then none
    assert _frames() == 2, f"{_frames()} Dynamo graphs for {len(set(lengths))} sizes"
    assert m["graph_captures"] == len(set(lengths)), m
    assert m["graph_runs"] == len(lengths), m


def test_dynamic_false_specializes_every_size():
    w = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    cf = torch.compile(f, backend="tpu", dynamic=False)
    lengths = (4, 6, 9)
    _run(cf, lengths, w)
    assert _frames() == len(lengths)  # dynamic=False: a Dynamo graph per size, as on CUDA
