"""vLLM serving on the `tpu` device (torch_pjrt/serving/vllm/) against Hugging Face on CPU.

A tiny random Llama (grouped-query attention) is written to tmp_path with a locally built
tokenizer (nothing is downloaded) and served with vLLM's `LLM` on tpu: greedy generation of
several prompts of different lengths in one batch must equal Hugging Face's greedy `generate`
on CPU token for token. The engine's token budget per step is small, so the long prompts are
prefilled in chunks and steps mix prefills with decodes; the test checks that both happened.
Needs vLLM (`bash scripts/setup.sh --serving`); skipped without it."""

import os

import numpy as np
import pytest
import torch

from torch_pjrt._models import save_word_tokenizer

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --serving)")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8
PROMPTS = [  # token ids; 1 is BOS
    [1, 5, 9, 33, 7],
    [1] + list(range(40, 62)),  # 22 tokens: longer than a step's token budget
    [1, 44],
    [1, 12, 13, 14, 15, 16, 17, 18, 19],
    [1] + [int(x) for x in np.random.default_rng(3).integers(4, 128, 39)],  # 40 tokens
]


def _tiny_llama(path, seed=0, vocab=128, intermediate=128, max_positions=256):
    """A tiny random Llama and a word-level tokenizer saved to `path` (also the serving TP and
    compiled tests' model, with their own sizes and seed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    # initializer_range 0.2: logits far enough apart that greedy choices are not near-ties
    # (checked below), so CPU and tpu rounding cannot flip a choice.
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=intermediate,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_positions, initializer_range=0.2,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path, safe_serialization=True)
    save_word_tokenizer(path, vocab)
    return model


def _hf_greedy(model, prompt, new_tokens=NEW_TOKENS):
    """HF's greedy tokens for `prompt` and the smallest top-2 logit gap along the way."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, output_scores=True,
                         return_dict_in_generate=True)
    top2 = torch.stack([s[0].topk(2).values for s in out.scores])
    return out.sequences[0, len(prompt):].tolist(), float((top2[:, 0] - top2[:, 1]).min())


@pytest.mark.long  # CI runs its superset, test_serving_vllm_compiled.py's [compiled] case
def test_llm_generate_greedy_matches_hf(tmp_path, monkeypatch, fallbacks):
    assert torch.tpu.is_available(), torch.tpu.diagnostics()
    hf_model = _tiny_llama(tmp_path)
    expected = []
    for p in PROMPTS:
        tokens, margin = _hf_greedy(hf_model, p)
        assert margin > 1e-2, f"the test model's greedy choice is a near-tie ({margin})"
        expected.append(tokens)

    from torch_pjrt.serving.vllm import attention

    steps = []  # (query lengths, context lengths) of every step the engine ran
    build = attention.TpuPagedAttentionMetadataBuilder.build

    def spy(self, common_prefix_len, cm, fast_build=False):
        R = cm.num_reqs
        qsl = cm.query_start_loc_cpu[: R + 1]
        seq_lens = cm.seq_lens[:R].cpu().tolist()
        # the builder reads the host's context lengths: they must be the device's
        assert cm.seq_lens_cpu_upper_bound[:R].tolist() == seq_lens
        steps.append(((qsl[1:] - qsl[:-1]).tolist(), seq_lens))
        return build(self, common_prefix_len, cm, fast_build)

    monkeypatch.setattr(attention.TpuPagedAttentionMetadataBuilder, "build", spy)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(tmp_path), dtype="float32", max_model_len=128, block_size=16,
              kv_cache_memory_bytes=8 << 20, max_num_seqs=8, max_num_batched_tokens=16,
              enable_prefix_caching=False, seed=0)
    try:
        assert llm.llm_engine.vllm_config.device_config.device.type == "tpu"
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    finally:  # a failed test's engine must not outlive it (the next engine's groups are global)
        llm.llm_engine.engine_core.shutdown()
    got = [list(o.outputs[0].token_ids) for o in outs]
    assert got == expected

    # The batch really exercised chunked prefill (a prefill continuing after an earlier chunk)
    # and mixed steps (a decode and a prefill chunk in one step).
    chunked = any(q > 1 and s - q > 0 for qs, ss in steps for q, s in zip(qs, ss))
    mixed = any(1 in qs and max(qs) > 1 for qs, _ in steps)
    assert chunked and mixed, steps
    fallbacks.assert_none("the engine's start and generation")


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.long  # outside CI's time budget: bash scripts/test.sh --serving runs it
def test_vllm_serve_completions_match_hf(tmp_path):
    """`vllm serve` (its own API-server and engine-core processes) on tpu: greedy completions
    of the OpenAI-compatible endpoint, sent concurrently, equal Hugging Face's on CPU."""
    import json
    import shutil
    import subprocess
    import sys
    import time
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    pytest.importorskip("uvicorn", reason="vllm serve's dependencies are not installed "
                        "(bash scripts/setup.sh --serving)")
    hf_model = _tiny_llama(tmp_path)
    expected = [_hf_greedy(hf_model, p)[0] for p in PROMPTS]
    vllm_cli = shutil.which("vllm", path=os.path.dirname(sys.executable))
    assert vllm_cli, "vLLM's `vllm` command is not beside this interpreter"
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [vllm_cli, "serve", str(tmp_path), "--port", str(port), "--dtype", "float32",
         "--max-model-len", "128", "--kv-cache-memory-bytes", str(8 << 20),
         "--max-num-batched-tokens", "16", "--no-enable-prefix-caching"],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "vllm serve did not come up in 180 s"
                time.sleep(1)

        def complete(prompt):
            body = json.dumps({"model": str(tmp_path), "prompt": prompt, "temperature": 0,
                               "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS,
                               "return_token_ids": True}).encode()
            req = urllib.request.Request(base + "/v1/completions", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.load(r)["choices"][0]["token_ids"]

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(complete, PROMPTS))
        assert got == expected
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
