"""Hugging Face ``model.generate`` on tpu with a static KV cache and a compiled forward, against
CPU eager: greedy tokens identical, every step's logits close, Dynamo compiles bounded (one graph
for all decode steps), every decode step one run of a captured graph, no CPU fallback.

Three ways of compiling the forward:

- ``compile_config``: ``generate(..., cache_implementation="static",
  compile_config=CompileConfig(backend=...))``. transformers compiles ``model.__call__`` itself
  (``get_compiled_call``) and uses it for the decode steps only; the prefill runs eagerly.
- ``default``: no compile config at all. transformers (5.x) auto-compiles the decode steps when
  the model is on a device of type "tpu" and the cache is compileable, and its default
  ``CompileConfig`` for that device type is ``backend="tpu", dynamic=False``
  (``PreTrainedModel._default_compile_config``), i.e. this project's backend.
- ``explicit``: ``model.forward = torch.compile(model.forward, backend="tpu")`` with
  ``disable_compile=True``. Prefill and decode both go through Dynamo (two graphs). The prefill
  graph lazily allocates the static cache and reads the cache layers' CPU scalar
  ``cumulative_length``, so it has CPU tensor inputs and runs uncaptured (through the
  defer_and_fuse recorder) by design; the decode graph is captured.

Models are built from tiny configs (no downloads).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

transformers = pytest.importorskip("transformers")
from transformers import CompileConfig, LogitsProcessor, LogitsProcessorList  # noqa: E402

from torch_pjrt.compile.backend import tpu_backend  # noqa: E402

TPU = torch.device("tpu")
MAX_NEW_TOKENS = 12
PROMPT_LEN = 8
RTOL, ATOL = 1e-4, 1e-5
PAD = 0


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def make_model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "llama":
        cfg = transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=128,
            pad_token_id=PAD, bos_token_id=1, eos_token_id=None)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=128,
            pad_token_id=PAD, bos_token_id=1, eos_token_id=None)
        model = transformers.GPT2LMHeadModel(cfg)
    return model.eval()


def make_prompts(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of PROMPT_LEN tokens; the second left-padded by 3 (so the mask matters)."""
    ids = torch.randint(3, 128, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    ids[1, :3] = PAD
    mask[1, :3] = 0
    return ids, mask


def unique_graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


class StepRecorder(LogitsProcessor):
    """Called once per generation step, after that step's forward: snapshots the runtime metrics
    and Dynamo's graph count (returns the scores unchanged)."""

    def __init__(self) -> None:
        self.steps: list[dict] = []

    def __call__(self, input_ids, scores):
        m = dict(torch.tpu.metrics())
        m["unique_graphs"] = unique_graphs()
        self.steps.append(m)
        return scores


GEN_KW = dict(do_sample=False, max_new_tokens=MAX_NEW_TOKENS, return_dict_in_generate=True,
              output_logits=True, pad_token_id=PAD)


def generate_cpu(model, ids, mask):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, **GEN_KW)


def generate_tpu(model, ids, mask, extra):
    rec = StepRecorder()
    before = dict(torch.tpu.metrics())
    before["unique_graphs"] = unique_graphs()
    with torch.no_grad():
        out = model.generate(ids.to(TPU), attention_mask=mask.to(TPU),
                             cache_implementation="static",
                             logits_processor=LogitsProcessorList([rec]), **extra, **GEN_KW)
    steps = [{k: s[k] - before[k] for k in ("graph_captures", "graph_captures_broken",
                                            "graph_runs", "unique_graphs")} for s in rec.steps]
    return out, steps


def compare(cpu_out, tpu_out, what: str) -> None:
    assert tpu_out.sequences.device.type == "tpu"
    got = tpu_out.sequences.cpu()
    assert torch.equal(got, cpu_out.sequences), (
        f"{what}: tokens differ\ncpu {cpu_out.sequences.tolist()}\ntpu {got.tolist()}")
    assert len(tpu_out.logits) == len(cpu_out.logits) == MAX_NEW_TOKENS
    for step, (c, t) in enumerate(zip(cpu_out.logits, tpu_out.logits)):
        # step 0 is the prefill, steps 1.. are the compiled decode steps
        torch.testing.assert_close(t.cpu(), c, rtol=RTOL, atol=ATOL,
                                   msg=lambda m: f"{what}: logits of step {step}: {m}")


@pytest.mark.parametrize("how", ["compile_config", "default", "explicit"])
@pytest.mark.parametrize("name", [pytest.param("llama", marks=pytest.mark.long), "gpt2"])
def test_generate_static_cache_compiled(name, how, fallbacks):
    cpu = make_model(name)
    tpu = copy.deepcopy(cpu).to(TPU)
    backend_calls = []

    def counting_backend(gm, example_inputs, **kw):
        backend_calls.append(len(gm.graph.nodes))
        return tpu_backend(gm, example_inputs, **kw)

    if how == "compile_config":
        extra = dict(compile_config=CompileConfig(backend=counting_backend))
    elif how == "default":
        extra = {}
    else:
        tpu.forward = torch.compile(tpu.forward, backend=counting_backend)
        extra = dict(disable_compile=True)
    # Dynamo graphs: one for all decode steps, plus the prefill's when it is compiled too
    graphs = 2 if how == "explicit" else 1
    decode_steps = MAX_NEW_TOKENS - 1

    for call, seed in enumerate((1, 2)):  # a second call: new prompt values, same shapes
        ids, mask = make_prompts(seed)
        want = generate_cpu(cpu, ids, mask)
        fallbacks.reset()
        got, steps = generate_tpu(tpu, ids, mask, extra)
        fallbacks.assert_none(f"{name} generate ({how}), call {call}")
        compare(want, got, f"{name} ({how}), call {call}")

        assert len(steps) == MAX_NEW_TOKENS, steps
        # every decode step is exactly one run of a captured graph
        assert [s["graph_runs"] for s in steps] == list(range(MAX_NEW_TOKENS)), steps
        assert all(s["graph_captures_broken"] == 0 for s in steps), steps
        if call == 0:
            # the prefill (step 0) captures nothing; the first decode step captures the decode
            # graph once and later steps reuse it; Dynamo compiled once per distinct graph
            # and nothing more as decoding proceeds
            assert steps[0]["graph_captures"] == 0, steps
            assert all(s["graph_captures"] == 1 for s in steps[1:]), steps
            assert steps[0]["unique_graphs"] == graphs - 1, steps
            assert all(s["unique_graphs"] == graphs for s in steps[1:]), steps
        else:
            # same shapes: no new Dynamo graph, no new capture
            assert all(s["graph_captures"] == 0 and s["unique_graphs"] == 0 for s in steps), steps
    assert unique_graphs() == graphs
    if how != "default":
        assert len(backend_calls) == graphs, backend_calls
    assert steps[-1]["graph_runs"] == decode_steps
