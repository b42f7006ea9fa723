"""Quantized checkpoints (issue 13 item 4): FP8 with 128x128 block scales, MXFP4 and NVFP4
weights in safetensors files, loaded into `tpu` models and compared with the same quantized
model computed on CPU by the plain-torch reference (torch_pjrt/quant/formats.py), plus the FP8
KV cache of Hugging Face's generate loop.

The FP4 decoding is checked against ml_dtypes (an independent implementation of E2M1, installed
with jax); the E8M0 scale decoding against CPU's float8_e8m0fnu cast."""
from __future__ import annotations

import pytest
import torch

from torch_pjrt import quant
from torch_pjrt.quant import formats

TPU = torch.device("tpu")


def test_fp4_codes_decode_like_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy as np
    codes = np.arange(16, dtype=np.uint8)
    want = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    got = formats.fp4_decode(torch.from_numpy(codes)).numpy()
    assert np.array_equal(np.signbit(got), np.signbit(want)) and np.array_equal(got, want)


def test_fp4_encode_rounds_like_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy as np
    # every multiple of 1/8 in [-6.5, 6.5] (all ties of E2M1 are among them) and random values
    x = np.concatenate([np.arange(-52, 53, dtype=np.float32) / 8,
                        np.random.default_rng(0).uniform(-6, 6, 4000).astype(np.float32)])
    want = np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    got = formats.fp4_decode(formats.fp4_encode(torch.from_numpy(x))).numpy()
    assert np.array_equal(got, want), x[got != want][:8]


def test_e8m0_scale_decodes_like_cpu_cast():
    e = torch.arange(0, 255, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    ones = torch.full((255, 32), 1.0).view(255, 32)
    packed = formats._pack_fp4_codes(formats.fp4_encode(ones))
    got = formats.dequantize_mxfp4(packed, e.reshape(255, 1))
    assert torch.equal(got[:, 0], e.float())


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_quantize_error_is_small(fmt):
    torch.manual_seed(0)
    w = torch.randn(160, 96)
    d = formats.dequantize(fmt, formats.QUANTIZE[fmt](w))
    rel = ((d - w).norm() / w.norm()).item()
    assert rel < (0.04 if fmt == "fp8_block" else 0.15), rel


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_dequantize_on_tpu_is_exact(fmt):
    torch.manual_seed(1)
    t = formats.QUANTIZE[fmt](torch.randn(136, 64) * 3)
    want = formats.dequantize(fmt, t)
    got = formats.dequantize(fmt, {k: v.to(TPU) for k, v in t.items()})
    assert got.device.type == "tpu" and got.dtype == torch.float32
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_quant_linear_matches_cpu(fmt, mode):
    torch.manual_seed(2)
    lin = torch.nn.Linear(64, 48)
    q = quant.QuantLinear.from_linear(lin, fmt)
    x = torch.randn(5, 64)
    want = q(x)
    qt = quant.QuantLinear.from_linear(lin, fmt).to(TPU)
    torch.tpu.synchronize()
    torch.tpu.reset_metrics()
    got = qt(x.to(TPU))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    if mode == "defer_and_fuse":
        # the dequantization and the matmul ran as one program
        assert torch.tpu.metrics()["executions"] == 1
    dense = qt.to_dense()
    assert type(dense) is torch.nn.Linear and dense.weight.device.type == "tpu"
    torch.testing.assert_close(dense(x.to(TPU)).cpu(), want, rtol=1e-5, atol=1e-5)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False, initializer_range=0.25)
    torch.manual_seed(3)
    return transformers.LlamaForCausalLM(cfg).eval(), transformers.LlamaForCausalLM


def _greedy(model, prompt, device, n=10, **kw):
    ids = torch.tensor([prompt], device=device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False, pad_token_id=0, **kw)
    return out[0, len(prompt):].cpu().tolist()


PROMPTS = ([5, 17, 99, 3], [44, 2, 8, 120, 61, 7, 33, 90, 12])


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_quantized_checkpoint_generates_reference_tokens(fmt, tmp_path):
    model, cls = _tiny_llama()
    path = str(tmp_path / ("llama-%s.safetensors" % fmt))
    quant.save_quantized(model, path, fmt)
    ref = quant.load_quantized(cls(model.config).eval(), path, device="cpu")
    dev = quant.load_quantized(cls(model.config).eval(), path, device=TPU)
    names = quant.quantizable(model, fmt)
    assert len(names) == 14  # q, k, v, o, gate, up, down per layer; lm_head kept
    for n in names:
        m = dev.get_submodule(n)
        assert isinstance(m, quant.QuantLinear) and m.weight.device.type == "tpu"
    for prompt in PROMPTS:
        want = _greedy(ref, prompt, "cpu")
        assert _greedy(dev, prompt, TPU) == want
    dense = quant.load_quantized(cls(model.config).eval(), path, device=TPU, dense=True)
    assert _greedy(dense, PROMPTS[1], TPU) == _greedy(ref, PROMPTS[1], "cpu")


def test_checkpoint_errors(tmp_path):
    from safetensors.torch import save_file
    model, cls = _tiny_llama()
    path = str(tmp_path / "plain.safetensors")
    save_file({"x": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match="not a quantized checkpoint"):
        quant.load_quantized(cls(model.config), path, device="cpu")
    with pytest.raises(ValueError, match="unknown weight format"):
        quant.quantize_state_dict(model, "int3")
    with pytest.raises(ValueError, match="multiple of the block size"):
        formats.quantize_mxfp4(torch.randn(4, 40))


def test_fp8_kv_cache_generates_like_cpu():
    model, _ = _tiny_llama()
    kw = dict(cache_implementation="quantized", cache_config={"backend": "fp8"})
    want = [_greedy(model, p, "cpu", **kw) for p in PROMPTS]
    model.to(TPU)
    assert [_greedy(model, p, TPU, **kw) for p in PROMPTS] == want


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_module_dtype_casts_keep_the_quantized_tensors(fmt):
    """model.to(torch.bfloat16) (and .half(), .to(device)) converts the bias as nn.Linear's,
    never the quantized tensors: their dtypes and bytes stay, on CPU and on tpu."""
    torch.manual_seed(5)
    q = quant.QuantLinear.from_linear(torch.nn.Linear(64, 32), fmt)
    before = {n: t.clone() for n, t in q.quantized_tensors().items()}
    x = torch.randn(3, 64)
    want = q(x.bfloat16())
    q.to(TPU).to(torch.bfloat16)
    assert q.bias.dtype == torch.bfloat16 and q.bias.device.type == "tpu"
    for n, t in q.quantized_tensors().items():
        assert t.device.type == "tpu" and t.dtype == before[n].dtype, n
        assert torch.equal(t.cpu().reshape(-1).view(torch.uint8),
                           before[n].reshape(-1).view(torch.uint8)), n
    got = q(x.bfloat16().to(TPU))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), want, rtol=1.6e-2, atol=1e-3)
    q.half().cpu()
    assert all(t.dtype == before[n].dtype for n, t in q.quantized_tensors().items())


def test_linears_with_bias_and_other_modules(tmp_path):
    """A model that is not a transformer: biased Linears (one too narrow for the FP4 blocks,
    kept dense), a LayerNorm; the loaded model computes CPU's reference."""
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.LayerNorm(96), torch.nn.GELU(),
                                torch.nn.Linear(96, 48), torch.nn.Linear(48, 24))
    path = str(tmp_path / "mlp.safetensors")
    quant.save_quantized(model, path, "mxfp4")
    assert quant.quantizable(model, "mxfp4") == ["0", "3"]  # 48 is not a multiple of 32

    def fresh():
        return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.LayerNorm(96),
                                   torch.nn.GELU(), torch.nn.Linear(96, 48),
                                   torch.nn.Linear(48, 24))
    ref = quant.load_quantized(fresh(), path, device="cpu")
    dev = quant.load_quantized(fresh(), path, device=TPU)
    assert isinstance(dev[0], quant.QuantLinear) and dev[0].bias.device.type == "tpu"
    assert type(dev[4]) is torch.nn.Linear and torch.equal(dev[4].weight.cpu(), model[4].weight)
    x = torch.randn(7, 64)
    torch.testing.assert_close(dev(x.to(TPU)).cpu(), ref(x), rtol=1e-5, atol=1e-5)
    nobias = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.LayerNorm(96),
                                 torch.nn.GELU(), torch.nn.Linear(96, 48), torch.nn.Linear(48, 24))
    with pytest.raises(ValueError, match="the checkpoint has a bias"):
        quant.load_quantized(nobias, path, device="cpu")
