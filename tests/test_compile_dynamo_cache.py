"""PyTorch's Dynamo cache (TORCH_CACHING_PRECOMPILE=1) with the tpu backend
(torch_pjrt/compile/precompile.py): a training step compiled whole, AdamW included, compiles
(torch 2.13 failed the optimizer's frame with "check_fn.guards_state must not be None"), the
cache is saved at exit without a call, and a second process loads the model's frames: Dynamo
traces only the frame PyTorch leaves out of its cache (the optimizer's), nothing is compiled by
XLA, and the losses are the first process's."""
from __future__ import annotations

from conftest import run_python

STEP = """
import torch
from torch._dynamo.utils import compilation_time_metrics as ctm, counters
from torch_pjrt import _models
data = _models.CharDataset(_models.zen_corpus(), block=32)
g = torch.Generator().manual_seed(0)
batches = [data.batch(8, g) for _ in range(3)]
model = _models.init_weights(_models.TinyGPT(data.vocab, layers=2), seed=0).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=True)
@torch.compile
def step(x, y):
    opt.zero_grad()
    loss = model(x, y)
    loss.backward()
    opt.step()
    return loss
losses = [step(x.to("tpu"), y.to("tpu")).item() for x, y in batches]
m = torch.tpu.metrics()
print("RESULT", "traced_graphs", counters["stats"]["unique_graphs"],
      "compiles", m["compiles"], "graph_runs", m["graph_runs"])
print("LOSSES", repr(losses))
"""


def _run(tmp_path):
    r = run_python(STEP, TORCH_CACHING_PRECOMPILE="1", TORCH_PJRT_CACHE_DIR=str(tmp_path / "pjrt"),
                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    res = [ln for ln in lines if ln.startswith("RESULT")][-1].split()[1:]
    losses = eval([ln for ln in lines if ln.startswith("LOSSES")][-1].split(" ", 1)[1])
    return dict(zip(res[::2], map(int, res[1::2]))), losses


def test_second_process_loads_the_model_frames_from_the_dynamo_cache(tmp_path):
    first, losses1 = _run(tmp_path)
    # the model's forward+backward graph and the optimizer's graph
    assert first["traced_graphs"] == 2 and first["compiles"] > 0, first
    assert (tmp_path / "inductor" / "dynamo").is_dir()  # saved at exit
    second, losses2 = _run(tmp_path)
    assert second["traced_graphs"] == 1, second  # the optimizer's frame only
    assert second["compiles"] == 0, second
    assert second["graph_runs"] == first["graph_runs"] > 0, (first, second)
    assert losses2 == losses1
