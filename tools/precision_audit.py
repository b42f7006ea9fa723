"""Per-op precision audit of one model's training step on `tpu` (torch_pjrt/models/precision.py):
which aten op, if any, is less accurate on tpu than CPU's kernel on the same inputs.

    python tools/precision_audit.py torchvision:regnet_x_800mf [--size 64] [--top 15] [--eval]
    python tools/precision_audit.py timm:densenet121

The model is built on CPU under seed 0 (10 classes), deep-copied to tpu and run on a random
batch of 2 images in train mode; its summed logits are backpropagated. The table gives, per op,
the worst call's tpu error and CPU float32 error against CPU float64 on that call's inputs.
"""
import argparse
import copy

import torch

import torch_pjrt  # noqa: F401  (the tpu device)
from torch_pjrt.models.precision import OpAudit


def build(spec: str):
    zoo, name = spec.split(":", 1)
    if zoo == "torchvision":
        import torchvision
        return torchvision.models.get_model(name, num_classes=10)
    if zoo == "timm":
        import timm
        return timm.create_model(name, pretrained=False, num_classes=10)
    raise SystemExit(f"unknown zoo {zoo!r}: use torchvision:NAME or timm:NAME")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="torchvision:NAME or timm:NAME")
    ap.add_argument("--size", type=int, default=64, help="image height and width")
    ap.add_argument("--top", type=int, default=15, help="ops to list")
    ap.add_argument("--eval", action="store_true", help="an eval-mode forward pass only")
    a = ap.parse_args()
    torch.manual_seed(0)
    m = build(a.model)
    m = m.eval() if a.eval else m.train()
    x = torch.randn(2, 3, a.size, a.size)
    mt = copy.deepcopy(m).to("tpu")
    audit = OpAudit()
    with audit, torch.set_grad_enabled(not a.eval):
        out = mt(x.to("tpu"))
        logits = out if isinstance(out, torch.Tensor) else out[0]
        if not a.eval:
            logits.float().sum().backward()
    print(f"{'op':36} {'calls':>6} {'tpu/cpu':>9} {'tpu err':>10} {'cpu err':>10}  inputs (worst call)")
    for w in audit.worst(a.top):
        print(f"{w.op:36} {w.calls:6d} {w.ratio:9.3g} {w.tpu_err:10.3g} {w.cpu_err:10.3g}  {w.inputs}")
    if audit.skipped:
        print("not audited (CPU could not rerun them):", dict(audit.skipped))


if __name__ == "__main__":
    main()
