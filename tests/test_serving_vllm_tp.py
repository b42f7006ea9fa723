"""Tensor-parallel vLLM serving on `tpu` (tensor_parallel_size=2) against Hugging Face on CPU.

Two worker processes (vLLM's multiprocess executor, spawned), each on its own `tpu` device
(`tpu:0` of its own PJRT client with the CPU plugin's one device), collectives on tpu tensors
over torch_pjrt's `tpu_dist` backend (docs/serving-tp.md). A tiny random Llama whose head
counts divide by 2 (4 query heads, 2 KV heads: one KV head per rank) is written to tmp_path with
a locally built tokenizer (nothing is downloaded); greedy generation of a batch of prompts must
equal Hugging Face's greedy `generate` on CPU token for token. The workers are then asked
what they hold and did: half of each sharded weight, collectives through tpu_dist, no CPU
fallback. Needs vLLM (`bash scripts/setup.sh --serving`); skipped without it."""

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --serving)")
transformers = pytest.importorskip("transformers")

import test_serving_vllm as serving_test  # noqa: E402  (its tiny Llama and HF greedy helper)

NEW_TOKENS = 6
PROMPTS = [  # token ids; 1 is BOS
    [1, 5, 9, 33, 7],
    [1] + list(range(40, 61)),  # 21 tokens: prefilled in two chunks (step budget 16)
    [1, 44],
]


def _tiny_llama(path):
    # seed 8: no near-tie greedy choices, so the TP sum order cannot flip one (checked below)
    return serving_test._tiny_llama(path, seed=8, vocab=96, intermediate=96, max_positions=128)


def _hf_greedy(model, prompt):
    return serving_test._hf_greedy(model, prompt, NEW_TOKENS)


@pytest.mark.long  # outside CI's time budget: bash scripts/test.sh --serving runs it
def test_llm_generate_tp2_greedy_matches_hf(tmp_path, monkeypatch):
    assert torch.tpu.is_available(), torch.tpu.diagnostics()
    hf_model = _tiny_llama(tmp_path)
    expected = []
    for p in PROMPTS:
        tokens, margin = _hf_greedy(hf_model, p)
        assert margin > 1e-2, f"the test model's greedy choice is a near-tie ({margin})"
        expected.append(tokens)

    # The engine core in this process (the executor then starts the two workers from here).
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    llm = LLM(model=str(tmp_path), dtype="float32", max_model_len=64, block_size=16,
              kv_cache_memory_bytes=4 << 20, max_num_seqs=4, max_num_batched_tokens=16,
              enable_prefix_caching=False, seed=0, tensor_parallel_size=2)
    try:
        _check(llm, expected)
    finally:  # stops the workers now, not in an atexit hook after pytest closed its streams
        llm.llm_engine.engine_core.shutdown()


def _check(llm, expected):
    from vllm import SamplingParams

    cfg = llm.llm_engine.vllm_config
    assert cfg.device_config.device.type == "tpu"
    assert cfg.parallel_config.distributed_executor_backend == "mp"
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    got = [list(o.outputs[0].token_ids) for o in outs]
    assert got == expected

    def probe(worker):  # runs in each worker process (pickled by value)
        import torch
        import torch.distributed as dist
        from vllm.distributed import get_tp_group

        from torch_pjrt.distributed import stats

        model = worker.model_runner.model
        tp = get_tp_group()
        return dict(
            rank=dist.get_rank(), device=str(worker.device), pid=__import__("os").getpid(),
            device_count=torch.tpu.device_count(),
            tp_backend=dist.get_backend(tp.device_group),
            communicator=type(tp.device_communicator).__name__,
            comm_device=str(tp.device_communicator.device),
            qkv=tuple(model.model.layers[0].self_attn.qkv_proj.weight.shape),
            down=tuple(model.model.layers[0].mlp.down_proj.weight.shape),
            embed=tuple(model.model.embed_tokens.weight.shape),
            collectives=stats()["calls"], fallbacks=torch.tpu.fallback_ops())

    ranks = sorted(llm.collective_rpc(probe), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["pid"] != ranks[1]["pid"]
    head_dim = 64 // 4
    for r in ranks:
        # Each rank's process has its own PJRT client: tpu:<rank> when the plugin has several
        # devices (TORCH_PJRT_CPU_DEVICE_COUNT=2), else its own tpu:0.
        assert r["device"] == f"tpu:{r['rank'] if r['device_count'] > 1 else 0}", r
        assert r["comm_device"] == r["device"], r
        assert r["tp_backend"] == "tpu_dist", r
        assert r["communicator"] == "TpuCommunicator", r
        # Column-parallel QKV: 2 of 4 query heads and 1 of 2 KV heads per rank; row-parallel
        # down projection: half of the intermediate columns; vocab-parallel embedding: half
        # of the rows (vLLM pads the vocabulary to a multiple of 64 first: 96 -> 128).
        assert r["qkv"] == ((2 + 1 + 1) * head_dim, 64), r
        assert r["down"] == (64, 96 // 2), r
        assert r["embed"] == (128 // 2, 64), r
        assert r["collectives"] > 0, r  # all-reduces and logits all-gathers went over tpu_dist
        assert r["fallbacks"] == {}, r


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.long  # a second engine start (API server, engine core, two workers): 45-95 s here
def test_vllm_serve_tp2_completions_match_hf(tmp_path):
    """`vllm serve --tensor-parallel-size 2` (API-server, engine-core and two worker processes)
    on tpu: greedy completions of the OpenAI-compatible endpoint, sent concurrently, equal
    Hugging Face's on CPU."""
    import json
    import os
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
    log_path = tmp_path / "serve.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [vllm_cli, "serve", str(tmp_path), "--port", str(port), "--dtype", "float32",
         "--max-model-len", "64", "--kv-cache-memory-bytes", str(4 << 20),
         "--max-num-batched-tokens", "16", "--no-enable-prefix-caching",
         "--tensor-parallel-size", "2"],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "vllm serve did not come up in 240 s"
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
        assert "backend=tpu_dist" in log_path.read_text()  # the workers' device groups
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
