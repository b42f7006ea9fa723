"""Training parity: the reference models trained on tpu and on CPU from the same initial weights
on the same batches give the same loss and every parameter the same gradient at every step
(float32: losses rtol 1e-5 and gradients rtol 1e-4 / atol 1e-5 at step 0, where both start from
the same weights; losses rtol 1e-3 and gradients rtol 1e-3 / atol 1e-4 afterwards, where the
optimizer has accumulated rounding differences), with no CPU fallback anywhere in the tpu run.
A loss alone is not enough: tied weights that came apart gave the right losses and wrong
gradients. The GPT ties its output head to its token embedding, as GPT-2 does, and the tpu
copy is made as users make it (deepcopy, then `.to("tpu")`). Each model trains in the three
eager modes (strict, debug, defer_and_fuse), selected as the process default so that the
autograd engine's worker thread runs the backward pass in the same mode.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from conftest import grad_mismatches
from torch_pjrt import _models

TPU = torch.device("tpu")
def _compare_losses(cpu, tpu):
    bad = []
    for i, (c, t) in enumerate(zip(cpu, tpu)):
        rtol = 1e-5 if i == 0 else 1e-3
        if not abs(t - c) <= rtol * abs(c):
            bad.append(f"step {i}: cpu {c:.7g} tpu {t:.7g} (rel {abs(t - c) / abs(c):.2e} > {rtol})")
    return bad


def _parity(make_model, make_opt, batches, loss_fn, fallbacks, extra_check=None):
    """Trains both copies in lockstep (each on its own weights): step i's gradients are compared
    right after both backward passes."""
    cpu_model = make_model()
    tpu_model = copy.deepcopy(cpu_model).to(TPU)
    cpu_opt, tpu_opt = make_opt(cpu_model), make_opt(tpu_model)
    fallbacks.reset()  # counts tpu ops only: the CPU run cannot add to it
    cpu_losses, tpu_losses, grad_problems = [], [], []
    for i, (x, y) in enumerate(batches):
        for model, opt, dev, losses in ((cpu_model, cpu_opt, "cpu", cpu_losses),
                                        (tpu_model, tpu_opt, TPU, tpu_losses)):
            opt.zero_grad()
            loss = loss_fn(model, x.to(dev), y.to(dev))
            loss.backward()
            losses.append(loss.item())
        rtol, atol = (1e-4, 1e-5) if i == 0 else (1e-3, 1e-4)
        grad_problems += [f"step {i}: {p}"
                          for p in grad_mismatches(cpu_model, tpu_model, rtol=rtol, atol=atol)]
        cpu_opt.step()
        tpu_opt.step()
    n_fallbacks, fallback_ops = fallbacks.delta, fallbacks.new_ops()
    print(f"losses cpu {cpu_losses[0]:.5f} -> {cpu_losses[-1]:.5f}, "
          f"tpu {tpu_losses[0]:.5f} -> {tpu_losses[-1]:.5f}; fallbacks {n_fallbacks}")
    problems = []
    bad = _compare_losses(cpu_losses, tpu_losses)
    if bad:
        problems.append(f"{len(bad)} of {len(batches)} steps differ; first: " + "; ".join(bad[:5]))
    if grad_problems:
        problems.append(f"{len(grad_problems)} gradient mismatches; first: "
                        + "; ".join(grad_problems[:5]))
    if n_fallbacks:
        problems.append(f"{n_fallbacks} CPU fallbacks during tpu training: "
                        f"{fallback_ops or '(per-op counts unavailable)'}")
    if extra_check is not None and not problems:
        problems += extra_check(cpu_model, tpu_model)
    assert cpu_losses[-1] < cpu_losses[0], "the CPU run did not learn: the test setup is wrong"
    assert not problems, "\n".join(problems)


def _ce(model, x, y):
    return F.cross_entropy(model(x), y)


def test_mlp_sgd_momentum(fallbacks, mode):
    g = torch.Generator().manual_seed(10)
    w_true = torch.randn(32, 10, generator=g)
    batches = []
    for _ in range(60):
        x = torch.randn(16, 32, generator=g)
        batches.append((x, (x @ w_true).argmax(1)))
    _parity(lambda: _models.init_weights(_models.MLP(), seed=1),
            lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
            batches, _ce, fallbacks)


def _bn_stats_match(cpu_model, tpu_model):
    problems = []
    for (name, c), (_, t) in zip(cpu_model.named_buffers(), tpu_model.named_buffers()):
        try:
            torch.testing.assert_close(t.cpu(), c, rtol=1e-3, atol=1e-4)
        except AssertionError as e:
            problems.append(f"buffer {name}: {e}")
    return problems


def test_small_cnn_sgd_momentum(fallbacks, mode):
    g = torch.Generator().manual_seed(20)
    batches = []
    for _ in range(50):
        x = torch.randn(8, 3, 16, 16, generator=g)
        y = (x[:, 0, :8].mean((1, 2)) > x[:, 1, 8:].mean((1, 2))).long() + 2 * (x[:, 2].mean((1, 2)) > 0).long()
        batches.append((x, y))
    _parity(lambda: _models.init_weights(_models.SmallCNN(), seed=2),
            lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
            batches, _ce, fallbacks, extra_check=_bn_stats_match)


def test_tiny_gpt_adamw(fallbacks, mode):
    data = _models.CharDataset(_models.zen_corpus(), block=32)
    g = torch.Generator().manual_seed(30)
    batches = [data.batch(8, g) for _ in range(50)]
    _parity(lambda: _models.init_weights(_models.TinyGPT(data.vocab, tie_head=True), seed=3),
            lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1),
            batches, lambda m, x, y: m(x, y), fallbacks)
