"""PyTorch's ahead-of-time compilation with the tpu backend: `torch.compile(fn, fullgraph=True,
backend="tpu").aot_compile(...)`, `save_compiled_function` and, in a fresh process,
`torch.compiler.load_compiled_function`. The loaded function skips Dynamo and AOTAutograd (their
graphs are in the file) and its programs come from the persistent cache, so a restarted process
traces and compiles nothing. Results, gradients included, are compared with CPU."""
from __future__ import annotations

import pytest

from conftest import run_python

SCRIPT = """
import copy, os
import torch
import torch.nn.functional as F
torch.manual_seed(0)
cpu = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                          torch.nn.Linear(32, 4))
model = copy.deepcopy(cpu).to("tpu")
g = torch.Generator().manual_seed(1)
x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)

def loss_fn(m, x, y):
    return F.mse_loss(m(x), y)

path = os.environ["PRECOMPILE_PATH"]
if os.environ["PRECOMPILE_STEP"] == "save":
    fn = torch.compile(loss_fn, fullgraph=True, backend="tpu").aot_compile(
        ((model, x.to("tpu"), y.to("tpu")), {}))
    fn.save_compiled_function(path)
else:
    with open(path, "rb") as f:
        fn = torch.compiler.load_compiled_function(f)
m0 = torch.tpu.metrics()
loss = fn(model, x.to("tpu"), y.to("tpu"))
loss.backward()
want = loss_fn(cpu, x, y)
want.backward()
torch.testing.assert_close(loss.cpu(), want, rtol=1e-5, atol=1e-6)
for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
    assert p.grad is not None and p.grad.device.type == "tpu", name
    torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)
m1 = torch.tpu.metrics()
from torch._dynamo.utils import compilation_time_metrics as ctm
print("RESULT", "compiles", m1["compiles"] - m0["compiles"],
      "captures", m1["graph_captures"] - m0["graph_captures"],
      "dynamo", len(ctm.get("_compile.compile_inner", [])),
      "aot", len(ctm.get("create_aot_dispatcher_function", [])))
"""


def _result(r) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][-1].split()[1:]
    return dict(zip(line[::2], map(int, line[1::2])))


@pytest.mark.long
@pytest.mark.slow
def test_aot_compiled_training_function_saves_and_loads(tmp_path):
    cache = str(tmp_path / "cache")
    path = str(tmp_path / "loss_fn.bin")
    saved = _result(run_python(SCRIPT, PRECOMPILE_PATH=path, PRECOMPILE_STEP="save",
                                    TORCH_PJRT_CACHE_DIR=cache))
    assert saved["captures"] == 2, saved  # forward and backward graph, each one program
    loaded = _result(run_python(SCRIPT, PRECOMPILE_PATH=path, PRECOMPILE_STEP="load",
                                     TORCH_PJRT_CACHE_DIR=cache))
    # the fresh process neither traces (Dynamo, AOTAutograd) nor compiles the graphs' programs
    assert loaded["dynamo"] == 0 and loaded["aot"] == 0, loaded
    assert loaded["captures"] == 2, loaded
    assert loaded["compiles"] == 0, loaded
