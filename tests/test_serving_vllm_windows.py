"""Sliding-window attention and logit soft-capping served by vLLM on `tpu`, against Hugging Face
on CPU: a tiny random Mistral (every layer windowed) and a tiny random Gemma 2 (windowed and
global layers alternating, tanh soft cap on the attention scores and on the final logits).

Prompts are longer than the window and than a step's token budget, so prefill chunks and
decodes both read a context the window cuts. Greedy tokens must equal HF's, whose choices are
checked to be far from ties; each model is also checked to depend on the feature (HF's tokens
change when the window or the cap is removed), so a backend that ignored it would fail.
Needs vLLM (`bash scripts/setup.sh --serving`); skipped without it."""

import numpy as np
import pytest
import torch

from torch_pjrt._models import save_word_tokenizer

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --serving)")
transformers = pytest.importorskip("transformers")

from test_serving_vllm import _hf_greedy  # noqa: E402

VOCAB = 128
NEW = 8
WINDOW = 8
_rng = np.random.default_rng(5)
PROMPTS = [[1] + [int(x) for x in _rng.integers(4, VOCAB, n - 1)] for n in (40, 23, 12, 3)]


def _config(kind, **overrides):
    from transformers import Gemma2Config, MistralConfig

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=256, initializer_range=0.2, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0, sliding_window=WINDOW)
    if kind == "mistral":
        return MistralConfig(**{**common, **overrides})
    # Gemma 2: layer 0 windowed, layer 1 global; caps small enough to change the scores
    return Gemma2Config(**{**common, "query_pre_attn_scalar": 16, "attn_logit_softcapping": 2.0,
                           "final_logit_softcapping": 10.0, **overrides},
                        attn_implementation="eager")


def _model(kind, cfg):
    from transformers import Gemma2ForCausalLM, MistralForCausalLM

    # seeds picked so that the greedy tokens are not one token repeated and their choices are
    # not near-ties
    if kind == "mistral":
        torch.manual_seed(0)
        return MistralForCausalLM(cfg).eval()
    torch.manual_seed(10)
    model = Gemma2ForCausalLM(cfg).eval()
    with torch.no_grad():
        # Gemma scales its (tied) embeddings by sqrt(hidden), so a random model repeats its
        # last input token; smaller embeddings and a large final norm (norms scale by 1 + w)
        # let the layers decide. Random norm weights make a misplaced norm visible.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)
        model.model.embed_tokens.weight.mul_(0.1)
        model.model.norm.weight.fill_(20.0)
    return model


def _greedy_all(model):
    out = [_hf_greedy(model, p, NEW) for p in PROMPTS]
    return [t for t, _ in out], min(m for _, m in out)


# what each model's feature check removes: the window (both), the caps (Gemma 2)
WITHOUT = {"mistral": [dict(sliding_window=None)],
           "gemma2": [dict(sliding_window=4096),
                      dict(attn_logit_softcapping=None, final_logit_softcapping=None)]}


@pytest.mark.long  # outside CI's time budget: bash scripts/test.sh --serving runs it
@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_windowed_and_capped_greedy_matches_hf(kind, tmp_path, monkeypatch):
    assert torch.tpu.is_available(), torch.tpu.diagnostics()
    model = _model(kind, _config(kind))
    expected, margin = _greedy_all(model)
    assert margin > 1e-2, f"the test model's greedy choice is a near-tie ({margin})"
    for change in WITHOUT[kind]:  # the feature matters for these prompts
        other = _model(kind, _config(kind, **change))
        other.load_state_dict(model.state_dict())
        assert _greedy_all(other)[0] != expected, f"{kind}: {change} changes no token"
    model.save_pretrained(tmp_path, safe_serialization=True)
    save_word_tokenizer(tmp_path, VOCAB)

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(tmp_path), dtype="float32", max_model_len=128, block_size=16,
              kv_cache_memory_bytes=8 << 20, max_num_seqs=8, max_num_batched_tokens=16,
              enable_prefix_caching=False, seed=0, enforce_eager=True)
    params = SamplingParams(temperature=0.0, max_tokens=NEW, min_tokens=NEW)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
