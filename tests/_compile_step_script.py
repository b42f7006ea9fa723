"""The training step that the cross-process compile-cache tests (test_compile_aot_cache.py,
test_compile_dynamo_cache.py) run in fresh processes sharing caches, and the helper that runs
it and reads its results.

The step: AdamW (capturable) on a model, ``opt.zero_grad(); loss = loss_of(model, x, y);
loss.backward(); opt.step()`` compiled whole by ``torch.compile(step, **STEP_COMPILE)``. The
model (``STEP_MODEL``): ``gpt``, the 2-layer tiny GPT of torch_pjrt._models on 3 batches of 8 x
32 characters, or ``llama``, a Hugging Face LlamaForCausalLM from a LlamaConfig (vocab 128,
hidden 64, 2 layers, 4 heads / 2 KV heads) on batches of 4 x 32 tokens, loss from ``labels``
(``STEP_STEPS`` batches, default 3). With ``STEP_OUT`` the losses and every parameter after the
steps are saved there (torch.save, on CPU); with ``STEP_CPU_REFERENCE=1`` too the same steps run
eagerly on CPU afterwards, in the same process, and are saved beside them (``cpu_losses``,
``cpu_params``).

The step is defined at module level, as user code is (its frame's globals are what Dynamo
guards on, and what PyTorch's Dynamo cache must serialize).
"""
from __future__ import annotations

import torch

from conftest import run_python

SCRIPT = """
import os
import torch
from torch._dynamo.utils import counters
from torch_pjrt import _models

kind = os.environ.get("STEP_MODEL", "gpt")
steps = int(os.environ.get("STEP_STEPS", "3"))
g = torch.Generator().manual_seed(0)
if kind == "llama":
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    batches = [(x, x) for x in (torch.randint(0, 128, (4, 32), generator=g)
                                for _ in range(steps))]
else:
    data = _models.CharDataset(_models.zen_corpus(), block=32)
    batches = [data.batch(8, g) for _ in range(steps)]


def build(device):
    if kind == "llama":
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(cfg).to(device)
    return _models.init_weights(_models.TinyGPT(data.vocab, layers=2), seed=0).to(device)


def loss_of(m, x, y):
    return m(input_ids=x, labels=y).loss if kind == "llama" else m(x, y)


model = build("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=True)


def step(x, y):
    opt.zero_grad()
    loss = loss_of(model, x, y)
    loss.backward()
    opt.step()
    return loss


step = torch.compile(step, **eval(os.environ.get("STEP_COMPILE", "{}")))
losses = [step(x.to("tpu"), y.to("tpu")).item() for x, y in batches]
m = torch.tpu.metrics()
c = counters["aot_autograd"]
print("RESULT", "traced_graphs", counters["stats"]["unique_graphs"],
      "dynamo_cache_hits", counters["dynamo_cache"]["dynamo_cache_hit"],
      "hits", c["autograd_cache_hit"], "misses", c["autograd_cache_miss"],
      "saved", c["autograd_cache_saved"], "compiles", m["compiles"],
      "graph_runs", m["graph_runs"], "captures", m["graph_captures"],
      "broken", m["graph_captures_broken"])
print("LOSSES", repr(losses))
if os.environ.get("STEP_OUT"):
    out = {"losses": losses,
           "params": {n: p.detach().cpu() for n, p in model.named_parameters()}}
    if os.environ.get("STEP_CPU_REFERENCE") == "1":
        cpu_model = build("cpu")
        cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=3e-3)
        cpu_losses = []
        for x, y in batches:
            cpu_opt.zero_grad()
            loss = loss_of(cpu_model, x, y)
            loss.backward()
            cpu_opt.step()
            cpu_losses.append(loss.item())
        out["cpu_losses"] = cpu_losses
        out["cpu_params"] = {n: p.detach().clone() for n, p in cpu_model.named_parameters()}
    torch.save(out, os.environ["STEP_OUT"])
"""


def run_step(tmp_path, compile_kwargs: str = "{}", **env: str):
    """Runs SCRIPT in a fresh process whose persistent program cache and PyTorch compile
    caches (AOTAutograd's, Dynamo's) live under `tmp_path`, with `compile_kwargs` (Python
    source of a dict) as torch.compile's keyword arguments and `env` added. Returns its
    counters (dict of ints: traced_graphs, dynamo_cache_hits, hits, misses, saved, compiles,
    graph_runs, captures, broken), its losses and, when env has STEP_OUT, what it saved."""
    r = run_python(SCRIPT, STEP_COMPILE=compile_kwargs,
                   TORCH_PJRT_CACHE_DIR=str(tmp_path / "pjrt"),
                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), **env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    res = [ln for ln in lines if ln.startswith("RESULT")][-1].split()[1:]
    losses = eval([ln for ln in lines if ln.startswith("LOSSES")][-1].split(" ", 1)[1])
    saved = torch.load(env["STEP_OUT"]) if "STEP_OUT" in env else None
    return dict(zip(res[::2], map(int, res[1::2]))), losses, saved
