"""torchvision: every classification, segmentation, video and optical-flow-free model of
`torchvision.models.list_models()`, built with `weights=None` at a small input size. When
torchvision does not import beside the installed torch (PyPI's wheel is built for another torch),
the zoo is one skipped record carrying that reason: its model list cannot be read then."""
from __future__ import annotations

from typing import List, Tuple

import torch

from .compare import Case, Skip

ZOO = "torchvision"
MAX_PARAMS = 30_000_000
BATCH = 2
NUM_CLASSES = 10
# smallest input each family accepts (the rest take 64x64); (C, [T,] H, W)
INPUT = {
    "inception_v3": (3, 75, 75),
    "googlenet": (3, 64, 64),
}
VIT_224 = ("vit_", "swin_", "maxvit_")  # fixed position tables or windows sized for 224


def available() -> Tuple[bool, str]:
    try:
        import torchvision  # noqa: F401
        import torchvision.models  # noqa: F401
    except Exception as e:
        return False, (f"torchvision does not import: {type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''}")
    return True, ""


def _module_of(name: str) -> str:
    import torchvision.models as tvm
    for mod_name in ("segmentation", "video", "detection", "optical_flow", "quantization"):
        mod = getattr(tvm, mod_name, None)
        if mod is not None and name in tvm.list_models(module=mod):
            return mod_name
    return "classification"


def names() -> List[str]:
    import torchvision.models as tvm
    return sorted(tvm.list_models())


def make_case(name: str) -> Case:
    import torchvision.models as tvm
    kind = _module_of(name)
    if kind in ("detection", "optical_flow", "quantization"):
        raise Skip(f"inputs cannot be synthesized: {kind} models take image lists / targets "
                   "(or quantized kernels), not one batch tensor")
    kw = {"weights": None, "num_classes": NUM_CLASSES}
    if kind == "segmentation":
        kw["weights_backbone"] = None
        kw["aux_loss"] = False
    if name in ("inception_v3", "googlenet"):
        kw["aux_logits"] = False
        kw["init_weights"] = True
    try:
        with torch.device("meta"):  # counted without allocating
            m = tvm.get_model(name, **kw)
    except Exception:  # constructors that compute sizes with tensors (RegNet): count on CPU
        m = tvm.get_model(name, **kw)
    n = sum(p.numel() for p in m.parameters())
    del m
    if n > MAX_PARAMS:
        raise Skip(f"too large: {n / 1e6:.1f}M parameters (limit {MAX_PARAMS / 1e6:.0f}M)")
    if kind == "video":
        size = (3, 4, 64, 64)
    elif name.startswith(VIT_224):
        size = (3, 224, 224)
    else:
        size = INPUT.get(name, (3, 64, 64))

    def build():
        return tvm.get_model(name, **kw)

    def inputs(gen: torch.Generator):
        return {"x": torch.randn(BATCH, *size, generator=gen)}

    def loss(out):
        if isinstance(out, dict):  # segmentation: {"out": (N, classes, H, W)}
            logits = out["out"]
            target = torch.zeros(logits.shape[0], *logits.shape[2:], dtype=torch.long)
            target[:, ::2] = 1
            return torch.nn.functional.cross_entropy(logits, target.to(logits.device))
        target = torch.arange(out.shape[0]) % out.shape[-1]
        return torch.nn.functional.cross_entropy(out, target.to(out.device))

    return Case(zoo=ZOO, name=name, build=build, inputs=inputs, loss=loss,
                info={"kind": kind, "input": list(size)})
