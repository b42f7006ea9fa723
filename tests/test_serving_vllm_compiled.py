"""vLLM on `tpu` in both execution modes against Hugging Face on CPU, and what compiled mode
promises: the model's pieces between attention layers run as compiled programs
(torch_pjrt/serving/vllm/compiler.py), every step's token count is padded to a bucket, every
bucket is compiled at engine start, and a restarted engine compiles nothing.

The model, prompts and HF reference are the ones of tests/test_serving_vllm.py (a tiny random
Llama written to tmp_path, 5 prompts of 2 to 40 tokens, a 16-token step budget so that prefills
are chunked and steps mix prefills with decodes). Needs vLLM (`bash scripts/setup.sh
--serving`); skipped without it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --serving)")
pytest.importorskip("transformers")

from test_serving_vllm import NEW_TOKENS, PROMPTS, _hf_greedy, _tiny_llama  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = 16  # max_num_batched_tokens: buckets 1, 2, 4, 8, 16


def _llm(path, enforce_eager):
    from vllm import LLM

    return LLM(model=str(path), dtype="float32", max_model_len=128, block_size=16,
               kv_cache_memory_bytes=8 << 20, max_num_seqs=8, max_num_batched_tokens=BUDGET,
               enable_prefix_caching=False, seed=0, enforce_eager=enforce_eager)


# compiled-widths: decode steps' context widths start at one block (16 slots) instead of
# attention.MIN_DECODE_CONTEXT, so that this model's contexts (3 to 48 positions) span several
# widths (16, 32, 64; 128 is the model's length): one captured step per (tokens, width) pair.
@pytest.mark.parametrize("mode", ["compiled", "compiled-widths", "eager"])
def test_llm_generate_greedy_matches_hf(tmp_path, monkeypatch, request, fallbacks, mode):
    assert torch.tpu.is_available(), torch.tpu.diagnostics()
    hf_model = _tiny_llama(tmp_path / "model")
    expected = []
    for p in PROMPTS:
        tokens, margin = _hf_greedy(hf_model, p)
        assert margin > 1e-2, f"the test model's greedy choice is a near-tie ({margin})"
        expected.append(tokens)

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    from vllm import SamplingParams
    from vllm.config import CompilationMode

    from torch_pjrt.compile.graph_runner import GraphRunner
    from torch_pjrt.serving.vllm import attention, model_runner

    widths = [128]  # the fixed layout's context widths: MIN_DECODE_CONTEXT is past the model's
    if mode == "compiled-widths":
        monkeypatch.setattr(attention, "MIN_DECODE_CONTEXT", 16)
        widths = [16, 32, 64, 128]

    # every token count the model ran with (padded) and the real one of each step
    sizes = []
    run_padding = model_runner.TpuModelRunner._determine_batch_execution_and_padding

    def spy_padding(self, num_tokens, *args, **kwargs):
        out = run_padding(self, num_tokens, *args, **kwargs)
        sizes.append((num_tokens, out[1].num_tokens))
        return out

    monkeypatch.setattr(model_runner.TpuModelRunner, "_determine_batch_execution_and_padding",
                        spy_padding)
    from torch_pjrt.serving.vllm.step_capture import StepRunner

    # pieces (vLLM's compiled graphs) and whole decode steps (step_capture.py), apart
    calls = {"run": 0, "capture": 0}
    step_calls = {"run": 0, "capture": 0}
    run, capture = GraphRunner.__call__, GraphRunner._capture

    def spy_run(self, *args):
        (step_calls if isinstance(self, StepRunner) else calls)["run"] += 1
        return run(self, *args)

    def spy_capture(self, *args):
        (step_calls if isinstance(self, StepRunner) else calls)["capture"] += 1
        return capture(self, *args)

    monkeypatch.setattr(GraphRunner, "__call__", spy_run)
    monkeypatch.setattr(GraphRunner, "_capture", spy_capture)
    steps, fixed_decodes = [], []
    build = attention.TpuPagedAttentionMetadataBuilder.build

    def spy_build(self, common_prefix_len, cm, fast_build=False):
        R = cm.num_reqs
        qsl = cm.query_start_loc_cpu[: R + 1]
        seq_lens = cm.seq_lens[:R].cpu().tolist()
        # the builder reads the host's context lengths: they must be the device's
        assert cm.seq_lens_cpu_upper_bound[:R].tolist() == seq_lens
        steps.append(((qsl[1:] - qsl[:-1]).tolist(), seq_lens))
        md = build(self, common_prefix_len, cm, fast_build)
        if md.fixed:  # a decode step in the layout a captured step reads: (tokens, width)
            assert md.fixed[0] == md.num_actual_tokens and md.fixed[1] >= max(seq_lens)
            fixed_decodes.append(md.fixed)
        return md

    monkeypatch.setattr(attention.TpuPagedAttentionMetadataBuilder, "build", spy_build)

    llm = _llm(tmp_path / "model", enforce_eager=(mode == "eager"))
    request.addfinalizer(llm.llm_engine.engine_core.shutdown)  # even when the test fails
    cfg = llm.llm_engine.vllm_config
    assert cfg.device_config.device.type == "tpu"
    compiled = cfg.compilation_config.mode == CompilationMode.VLLM_COMPILE
    assert compiled == (mode != "eager"), cfg.compilation_config.mode
    warmup_sizes = sorted({padded for _, padded in sizes})
    captured_at_start = calls["capture"]
    steps_captured_at_start = step_calls["capture"]
    sizes.clear()
    steps.clear()
    fixed_decodes.clear()
    calls["run"] = calls["capture"] = step_calls["run"] = step_calls["capture"] = 0

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    got = [list(o.outputs[0].token_ids) for o in outs]
    assert got == expected
    if mode == "compiled-widths":
        # every decode step above holds the 40-token prompt (64 slots); a short prompt alone
        # decodes at 16
        out = llm.generate([{"prompt_token_ids": PROMPTS[2]}], params)
        assert list(out[0].outputs[0].token_ids) == expected[2]

    chunked = any(q > 1 and s - q > 0 for qs, ss in steps for q, s in zip(qs, ss))
    mixed = any(1 in qs and max(qs) > 1 for qs, _ in steps)
    assert chunked and mixed, steps
    fallbacks.assert_none("the engine's start and generation")

    if mode == "eager":
        assert calls["run"] == 0 and captured_at_start == 0  # no compiled graph at all
        assert step_calls["run"] == 0 and not fixed_decodes
        assert all(n == padded for n, padded in sizes), sizes  # no padding
        return
    buckets = [1, 2, 4, 8, 16]
    assert warmup_sizes == buckets  # engine start ran (and captured) every bucket
    assert captured_at_start > 0
    # engine start captured the decode step of every bucket a decode batch (at most 8
    # requests) pads to at every context width; every decode step then ran as one captured
    # program
    assert steps_captured_at_start == len([1, 2, 4, 8]) * len(widths)
    decodes = sum(1 for qs, _ in steps if max(qs) == 1)
    assert len(fixed_decodes) == decodes > 0, (fixed_decodes, steps)
    used = sorted({w for _, w in fixed_decodes})
    assert set(used) <= set(widths) and (len(used) >= 2 or len(widths) == 1), used
    assert step_calls == {"run": decodes, "capture": 0}, step_calls
    # 2 layers: 3 pieces (before, between and after the attention ops) per other step
    assert calls["run"] == 3 * (len(sizes) - decodes), (calls, sizes)
    assert calls["capture"] == 0, "a step compiled a piece that warm-up had not"
    assert all(padded in buckets and padded >= n for n, padded in sizes), sizes
    assert any(padded > n for n, padded in sizes), sizes  # some step really was padded


CHILD = textwrap.dedent("""
    import json, os, sys, time
    t0 = time.perf_counter()
    import torch
    from vllm import LLM, SamplingParams
    sys.path.insert(0, {tests!r})
    from test_serving_vllm import PROMPTS
    t1 = time.perf_counter()
    llm = LLM(model={model!r}, dtype="float32", max_model_len=128, block_size=16,
              kv_cache_memory_bytes=8 << 20, max_num_seqs=8, max_num_batched_tokens=16,
              enable_prefix_caching=False, seed=0)
    t2 = time.perf_counter()
    m = torch.tpu.metrics()
    start = {{"compiles": m["compiles"], "compile_s": m["compile_ns"] / 1e9,
              "engine_start_s": t2 - t1}}
    params = SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8)
    outs = llm.generate([{{"prompt_token_ids": p}} for p in PROMPTS], params)
    m = torch.tpu.metrics()
    print("RESULT " + json.dumps({{"start": start, "compiles": m["compiles"],
                                   "tokens": [list(o.outputs[0].token_ids) for o in outs]}}))
""")


def _start_and_generate(tmp_path, model):
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"),
               TORCH_PJRT_CACHE_DIR=str(tmp_path / "pjrt-cache"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = CHILD.format(tests=os.path.join(ROOT, "tests"), model=str(model))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"child failed ({p.returncode}):\n{p.stderr[-4000:]}")


@pytest.mark.long  # outside CI's time budget: bash scripts/test.sh --serving runs it
def test_restarted_engine_compiles_nothing(tmp_path):
    """Two engine starts on empty caches (vLLM's and torch_pjrt's, in tmp_path): the first
    compiles every bucket's programs at start; the second finds all of them on disk and
    compiles no program, neither at start nor while generating, with the same tokens."""
    hf_model = _tiny_llama(tmp_path / "model")
    expected = [_hf_greedy(hf_model, p)[0] for p in PROMPTS]
    first = _start_and_generate(tmp_path, tmp_path / "model")
    second = _start_and_generate(tmp_path, tmp_path / "model")
    print("first:", first["start"], "second:", second["start"])
    assert first["tokens"] == expected and second["tokens"] == expected
    assert first["start"]["compiles"] > 0
    assert second["start"]["compiles"] == 0, second
    assert second["compiles"] == 0, second
