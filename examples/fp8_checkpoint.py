"""Quantized checkpoints on the tpu device: a small Llama (built from a config, random weights)
is written as an FP8 checkpoint with 128x128 block scales (or MXFP4 / NVFP4), loaded onto `tpu`
with its Linear weights kept quantized, and made to generate greedily, with Hugging Face's bf16
and FP8 KV caches. The same checkpoint computed on CPU by the plain-torch reference gives the
tokens to compare with.

    python examples/fp8_checkpoint.py [--format fp8_block|mxfp4|nvfp4] [--new 16]
"""
import argparse
import os
import tempfile

import torch
import transformers

from torch_pjrt import quant


def generate(model, ids, new, **kw):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, pad_token_id=0, **kw)
    return out[0, ids.shape[1]:].cpu().tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", default="fp8_block", choices=quant.FORMATS)
    ap.add_argument("--new", type=int, default=16)
    args = ap.parse_args()

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=672,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=False,
                                   initializer_range=0.25)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = os.path.join(tempfile.mkdtemp(), "llama-%s.safetensors" % args.format)
    quant.save_quantized(model, path, args.format)
    print("checkpoint %s: %d bytes (%d quantized Linears)"
          % (path, os.path.getsize(path), len(quant.quantizable(model, args.format))))

    before = torch.tpu.memory_allocated()
    tpu_model = quant.load_quantized(transformers.LlamaForCausalLM(cfg).eval(), path, device="tpu")
    torch.tpu.synchronize()
    print("on tpu: %d bytes" % (torch.tpu.memory_allocated() - before))
    cpu_model = quant.load_quantized(transformers.LlamaForCausalLM(cfg).eval(), path, device="cpu")

    prompt = torch.tensor([[5, 17, 99, 3, 44, 2, 8, 120]])
    want = generate(cpu_model, prompt, args.new)
    got = generate(tpu_model, prompt.to("tpu"), args.new)
    print("cpu reference:", want)
    print("tpu          :", got, "(same)" if got == want else "(DIFFERENT)")
    fp8_kv = dict(cache_implementation="quantized", cache_config={"backend": "fp8"})
    got_kv = generate(tpu_model, prompt.to("tpu"), args.new, **fp8_kv)
    print("tpu, FP8 KV  :", got_kv, "(%d of %d tokens as with the full-precision cache)"
          % (sum(a == b for a, b in zip(got_kv, got)), args.new))


if __name__ == "__main__":
    main()
