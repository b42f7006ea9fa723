"""Hugging Face Transformers models on tpu against CPU: tiny GPT-2, BERT, T5, BART and Gemma (all
with weights tied between the input embedding and the output head, or across encoder and
decoder) train 3 AdamW steps; every parameter's gradient is compared with CPU's at every step
(rtol 1e-4, atol 1e-5), none may be missing, and the ties must survive the move. Also the
library paths that rely on parameter identity: `tie_weights()`, `from_pretrained(...,
device_map="tpu")` and Accelerate's `prepare`.

Models are built from configs (nothing is downloaded); dropout is set to zero so both devices
compute the same function.
"""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import grad_mismatches, run_python, tie_groups

transformers = pytest.importorskip("transformers")

TPU = torch.device("tpu")
VOCAB = 96


def _no_dropout(cfg):
    for k, v in list(vars(cfg).items()):
        if isinstance(v, float) and ("dropout" in k or "pdrop" in k):
            setattr(cfg, k, 0.0)
    return cfg


def _gpt2():
    return transformers.GPT2LMHeadModel(_no_dropout(transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=64)))


def _bert():
    return transformers.BertForMaskedLM(_no_dropout(transformers.BertConfig(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=64)))


def _t5():
    return transformers.T5ForConditionalGeneration(_no_dropout(transformers.T5Config(
        num_layers=2, num_decoder_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64,
        vocab_size=VOCAB, decoder_start_token_id=0, tie_word_embeddings=True)))


def _bart():
    return transformers.BartForConditionalGeneration(_no_dropout(transformers.BartConfig(
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB,
        max_position_embeddings=64)))


def _gemma():
    return transformers.GemmaForCausalLM(_no_dropout(transformers.GemmaConfig(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=32,
        intermediate_size=64, head_dim=16, vocab_size=VOCAB, max_position_embeddings=64)))


MODELS = {"gpt2": _gpt2, "bert": _bert, "t5": _t5, "bart": _bart, "gemma": _gemma}


@pytest.mark.parametrize("name", list(MODELS))
def test_train_three_steps_every_gradient(name, mode, fallbacks):
    torch.manual_seed(0)
    cpu = MODELS[name]()
    ties = tie_groups(cpu)
    assert ties, f"{name}: the test needs a model with tied weights"
    tpu = copy.deepcopy(cpu).to(TPU)
    assert tie_groups(tpu) == ties
    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, tpu)}
    g = torch.Generator().manual_seed(1)
    problems = []
    for step in range(3):
        ids = torch.randint(1, VOCAB, (2, 12), generator=g)
        losses = {}
        for m, dev in ((cpu, "cpu"), (tpu, TPU)):
            opts[m].zero_grad()
            out = m(input_ids=ids.to(dev), labels=ids.to(dev))
            out.loss.backward()
            losses[dev] = out.loss.item()
        bad = grad_mismatches(cpu, tpu, rtol=1e-4, atol=1e-5)
        problems += [f"step {step}: {b}" for b in bad]
        if not abs(losses[TPU] - losses["cpu"]) <= 1e-4 * abs(losses["cpu"]) + 1e-5:
            problems.append(f"step {step}: loss cpu {losses['cpu']} tpu {losses[TPU]}")
        missing = [n for n, p in tpu.named_parameters() if p.requires_grad and p.grad is None]
        problems += [f"step {step}: {n} got no gradient" for n in missing]
        for m in (cpu, tpu):
            opts[m].step()
    assert not problems, f"{name} ({mode}):\n" + "\n".join(problems[:20])
    fallbacks.assert_none(f"{name} training")
    # The updated weights: AdamW turns rounding noise in gradients that are zero in exact
    # arithmetic (the attention key bias: softmax ignores it) into steps of a fraction of lr, so
    # weights are compared to a tenth of one step (lr 1e-2), not to the gradients' tolerance.
    for (n, c), (_, t) in zip(cpu.named_parameters(), tpu.named_parameters()):
        torch.testing.assert_close(t.detach().cpu(), c.detach(), rtol=1e-4, atol=1e-3,
                                   msg=lambda m, n=n: f"{n}: {m}")


def test_tie_weights_and_from_pretrained_device_map(tmp_path):
    torch.manual_seed(0)
    src = _gpt2()
    src.save_pretrained(tmp_path)
    m = _gpt2().to(TPU)
    m.tie_weights()
    assert m.lm_head.weight is m.transformer.wte.weight
    for device_map in ("tpu", {"": "tpu"}, {"": 0}):
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map)
        assert loaded.lm_head.weight is loaded.transformer.wte.weight, device_map
        assert {p.device for p in loaded.parameters()} == {torch.device("tpu", 0)}, device_map
        for (n, a), (_, b) in zip(src.named_parameters(), loaded.named_parameters()):
            torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=0, atol=0, msg=n)


def test_accelerate_prepare_keeps_ties_and_optimizer():
    pytest.importorskip("accelerate")
    # Accelerate picks devices from its own list; ACCELERATE_TORCH_DEVICE names ours. Its state
    # is a process-wide singleton, hence a fresh interpreter.
    r = run_python("""
        import torch, transformers
        from accelerate import Accelerator
        cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)
        m = transformers.GPT2LMHeadModel(cfg)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1)
        acc = Accelerator()
        assert acc.device == torch.device("tpu"), acc.device
        pm, popt, psched = acc.prepare(m, opt, sched)
        assert pm.lm_head.weight is pm.transformer.wte.weight
        params = [p for g in popt.param_groups for p in g["params"]]
        assert all(p is q for p, q in zip(params, pm.parameters())) and len(params) == len(list(pm.parameters()))
        assert {p.device.type for p in params} == {"tpu"}
        x = torch.randint(0, 64, (2, 8), device=acc.device)
        before = pm.transformer.wte.weight.detach().cpu()
        out = pm(x, labels=x); acc.backward(out.loss); popt.step(); psched.step()
        assert pm.transformer.wte.weight.grad.device.type == "tpu"
        assert not torch.equal(before, pm.transformer.wte.weight.detach().cpu())
        print("ok")
    """, ACCELERATE_TORCH_DEVICE="tpu")
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr[-3000:]


_TRAINER_RUN = """
    import json, sys, torch, transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)

    class Data(torch.utils.data.Dataset):
        def __init__(self):
            self.x = torch.randint(0, 64, (12, 12), generator=torch.Generator().manual_seed(1))
        def __len__(self):
            return len(self.x)
        def __getitem__(self, i):
            return {"input_ids": self.x[i], "labels": self.x[i]}

    use_cpu = sys.argv[1] == "cpu"
    args = transformers.TrainingArguments(
        output_dir=sys.argv[2], per_device_train_batch_size=4, num_train_epochs=1,
        learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no", seed=0,
        use_cpu=use_cpu, dataloader_num_workers=0, disable_tqdm=True,
        torch_compile=len(sys.argv) > 3 and sys.argv[3] == "compile")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Data())
    trainer.train()
    devices = {p.device.type for p in trainer.model.parameters()}
    metrics = torch.tpu.metrics() if not use_cpu else {}
    torch.save({"devices": sorted(devices), "graph_runs": metrics.get("graph_runs", 0),
                "logs": [h for h in trainer.state.log_history if "loss" in h],
                "params": {n: p.detach().cpu() for n, p in trainer.model.named_parameters()}},
               sys.argv[2] + "/result.pt")
"""


def _trainer_cpu_vs_tpu(tmp_path, tpu_compiled: bool):
    # transformers' Trainer puts the model on tpu by itself; Accelerate (which moves the batches)
    # knows no tpu device and is told by ACCELERATE_TORCH_DEVICE. Two fresh interpreters: both
    # libraries keep process-wide device state. The CPU run is eager, the reference.
    out = {}
    for dev, env in (("cpu", {}), ("tpu", {"ACCELERATE_TORCH_DEVICE": "tpu"})):
        d = tmp_path / dev
        d.mkdir()
        argv = [dev, str(d)] + (["compile"] if dev == "tpu" and tpu_compiled else [])
        code = "import sys; sys.argv[1:] = " + repr(argv) + "\n" + \
            __import__("textwrap").dedent(_TRAINER_RUN)
        r = run_python(code, **env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        out[dev] = torch.load(d / "result.pt")
    cpu, tpu = out["cpu"], out["tpu"]
    assert cpu["devices"] == ["cpu"] and tpu["devices"] == ["tpu"]
    assert (tpu["graph_runs"] > 0) == tpu_compiled
    assert len(tpu["logs"]) == len(cpu["logs"]) == 3  # 12 samples, batches of 4
    for c, t in zip(cpu["logs"], tpu["logs"]):
        assert t["loss"] == pytest.approx(c["loss"], rel=1e-4, abs=1e-5), (c, t)
        assert t["grad_norm"] == pytest.approx(c["grad_norm"], rel=1e-3), (c, t)
    assert cpu["params"].keys() == tpu["params"].keys()
    for n, c in cpu["params"].items():
        # atol 3e-5: CPU's own fp32 kernels differ by host (on an AVX-512/AMX Xeon one
            # bias near zero came out 1.07e-5 from tpu's after 3 AdamW steps)
            torch.testing.assert_close(tpu["params"][n], c, rtol=1e-4, atol=3e-5,
                                       msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.long  # 29 s; HF training parity stays in CI (test_train_three_steps_every_gradient)
def test_trainer_trains_on_tpu_like_cpu(tmp_path):
    _trainer_cpu_vs_tpu(tmp_path, tpu_compiled=False)


def test_trainer_torch_compile_trains_on_tpu_like_cpu(tmp_path):
    # TrainingArguments(torch_compile=True) calls torch.compile(model) with Inductor, the
    # default backend: the tpu graphs must run as this project's programs (graph_runs > 0)
    _trainer_cpu_vs_tpu(tmp_path, tpu_compiled=True)
