"""Quantized weights and the FP8 KV cache on `tpu` (issue 13): measured, not asserted.

1. Weight memory: a Llama built from a config (random weights, `--hidden` wide, `--layers`
   deep) is written as a checkpoint in each format and loaded onto `tpu`; the bytes each load
   adds (`torch.tpu.memory_allocated()`, after the model is on the device) against the same
   model with bf16 weights. The quantized Linears keep their weights quantized (QuantLinear);
   the embedding and the output head stay in the model's dtype in every row.
2. Decode speed: greedy tokens/s of the loaded model (batch 1), median of `--reps` runs, in
   Strict and in defer_and_fuse mode, quantized (dequantized inside each forward) against the
   bf16 model.
3. FP8 KV cache accuracy: the bf16 model generates `--new` tokens for `--prompts` random prompts
   with Hugging Face's bf16 cache and with its FP8 cache (float8_e4m3fn + a per-tensor scale,
   `cache_implementation="quantized", cache_config={"backend": "fp8"}`): the share of generated
   tokens that agree, and the largest difference of the first step's logits after the prompt
   is in the cache (teacher-forced, so both caches see the same tokens).

    .venv/bin/python benchmarks/bench_quant.py [--hidden 512 --layers 4] [--out docs/kernels.md]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from markdown_section import write_section  # noqa: E402

import torch_pjrt  # noqa: E402,F401
from torch_pjrt import quant  # noqa: E402

BEGIN = "<!-- bench_quant: begin -->"
END = "<!-- bench_quant: end -->"
TPU = torch.device("tpu")


def build(args):
    import transformers
    cfg = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 32 * 32,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 256), max_position_embeddings=512,
        tie_word_embeddings=False, initializer_range=0.25)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval(), transformers.LlamaForCausalLM


def allocated():
    torch.tpu.synchronize()
    gc.collect()
    return torch.tpu.memory_allocated()


def tokens_per_s(model, reps, new):
    ids = torch.tensor([[5, 17, 99, 3, 44, 2, 8, 120]], device=TPU)
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, pad_token_id=0)
        out.cpu()
        times.append(time.perf_counter() - t)
    return new / statistics.median(times[1:])  # the first run compiles


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args()
    model, cls = build(args)
    nlin = sum(p.numel() for n, p in model.named_parameters() if n.endswith("proj.weight"))
    lines = ["Llama from a config: hidden %d, %d layers, vocab %d; %.1f M parameters in the "
             "quantized Linears (q/k/v/o/gate/up/down), %.1f M in all. `%s`"
             % (args.hidden, args.layers, args.vocab, nlin / 1e6,
                sum(p.numel() for p in model.parameters()) / 1e6,
                "python benchmarks/bench_quant.py " + " ".join(sys.argv[1:])), "",
             "| weights | bytes on tpu | vs bf16 | Strict tokens/s | defer_and_fuse tokens/s |",
             "|---|---|---|---|---|"]
    tmp = tempfile.mkdtemp()
    rows = []
    for fmt in ("bf16",) + quant.FORMATS:
        base = allocated()
        if fmt == "bf16":
            m = cls(model.config).eval()
            m.load_state_dict(model.state_dict())
            m.to(device=TPU, dtype=torch.bfloat16)
        else:
            path = os.path.join(tmp, fmt + ".safetensors")
            quant.save_quantized(model, path, fmt)
            m = quant.load_quantized(cls(model.config).eval(), path, device=TPU)
            m.to(torch.bfloat16)  # the embedding, norms and head; QuantLinear buffers keep dtypes
        size = allocated() - base
        speeds = []
        for mode in ("strict", "defer_and_fuse"):
            with torch.tpu.eager_mode(mode):
                speeds.append(tokens_per_s(m, args.reps, args.new))
        rows.append((fmt, size, speeds))
        del m
    bf = rows[0][1]
    for fmt, size, sp in rows:
        lines.append("| %s | %d | %.2fx | %.1f | %.1f |" % (fmt, size, size / bf, sp[0], sp[1]))

    # FP8 KV cache against the bf16 cache, bf16 model
    m = cls(model.config).eval()
    m.load_state_dict(model.state_dict())
    m.to(device=TPU, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    agree = total = 0
    worst = 0.0
    for _ in range(args.prompts):
        ids = torch.randint(1, args.vocab, (1, 24), generator=g).to(TPU)
        outs = []
        for kw in ({}, {"cache_implementation": "quantized", "cache_config": {"backend": "fp8"}}):
            with torch.no_grad():
                o = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                               min_new_tokens=args.new, do_sample=False, pad_token_id=0, **kw)
            outs.append(o[0, ids.shape[1]:].cpu())
        agree += int((outs[0] == outs[1]).sum())
        total += args.new
        # teacher-forced: the prompt fills each cache, then the same next token is scored
        logits = []
        for kw in ({}, {"cache_implementation": "quantized", "cache_config": {"backend": "fp8"}}):
            with torch.no_grad():
                o = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                               min_new_tokens=2, do_sample=False, pad_token_id=0,
                               output_scores=True, return_dict_in_generate=True, **kw)
            logits.append(o.scores[1].float().cpu())
        # generate masks tokens it must not emit yet with -inf: finite entries only
        ref, got = logits
        ok = ref.isfinite() & got.isfinite()
        worst = max(worst, float((got[ok] - ref[ok]).abs().max() / ref[ok].abs().max()))
    lines += ["", "FP8 KV cache (float8_e4m3fn, per-tensor scale) against the bf16 cache, bf16 "
              "model, %d prompts of 24 tokens, %d new tokens each: %d of %d generated tokens "
              "agree (%.1f%%); largest difference of the second step's logits, relative to "
              "the largest logit: %.4f." % (args.prompts, args.new, agree, total,
                                           100.0 * agree / total, worst)]
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_section(args.out, BEGIN, END, text)


if __name__ == "__main__":
    main()
