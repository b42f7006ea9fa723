"""timm: every name in `timm.list_models()`, built without pretrained weights, 10 classes, at a
small input size: 64x64 where the model accepts an `img_size` (and in any case for convolutional
models that take any size), else its default input size. Parameters are counted on the meta device
first; a model over MAX_PARAMS is skipped as too large for this machine (2 cores, 24 GiB, shared
by two workers), with its count."""
from __future__ import annotations

from typing import List, Tuple

import torch

from .compare import Case, Skip

ZOO = "timm"
MAX_PARAMS = 30_000_000
SMALL = 64
BATCH = 2
NUM_CLASSES = 10


def available() -> Tuple[bool, str]:
    try:
        import timm  # noqa: F401
    except Exception as e:
        return False, f"timm does not import: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return True, ""


SIZE_WORDS = ("test", "atto", "femto", "pico", "nano", "micro", "tiny", "xxs", "xs", "mini",
              "small", "s", "lite", "b0", "18", "mobile")


def _size_rank(name: str) -> int:
    parts = name.replace(".", "_").split("_")
    for i, w in enumerate(SIZE_WORDS):
        if w in parts or (len(w) > 2 and w in name):
            return i
    return len(SIZE_WORDS)


def names() -> List[str]:
    """Every model of timm.list_models(), ordered so that a partial sweep (--limit, or one cut
    short) covers the most families: round-robin over timm's model modules (resnet, vit, ...),
    each module's small variants (test_, tiny, small, ...) first."""
    import timm
    all_names = set(timm.list_models())
    per_module = []
    for mod in timm.list_modules():
        ms = sorted((n for n in timm.list_models(module=mod) if n in all_names),
                    key=lambda n: (_size_rank(n), n))
        per_module.append(ms)
    ordered, seen = [], set()
    for i in range(max(map(len, per_module), default=0)):
        for ms in per_module:
            if i < len(ms) and ms[i] not in seen:
                ordered.append(ms[i])
                seen.add(ms[i])
    ordered += sorted(all_names - seen)
    return ordered


def _create(name: str, **kw):
    import timm
    return timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES, **kw)


def _zero_drop() -> dict:
    return {"drop_rate": 0.0, "drop_path_rate": 0.0}


def _cpu_runs(name: str, kw: dict, size) -> bool:
    try:
        m = _create(name, **kw).eval()
        with torch.no_grad():
            m(torch.randn(1, *size))
        return True
    except Exception:
        return False


def _plan(name: str, small: bool = True):
    """(kwargs for create_model, input size (C, H, W), parameter count), chosen on meta. With
    small=False, the model's own input size (for models that reject a small one)."""
    attempts = ([dict(img_size=SMALL, **_zero_drop())] if small else []) + [dict(**_zero_drop()), {}]
    last = None
    for kw in attempts:
        try:
            with torch.device("meta"):
                m = _create(name, **kw)
        except Exception as e:  # the model does not take these kwargs: try fewer
            last = e
            continue
        n = sum(p.numel() for p in m.parameters())
        cfg = getattr(m, "pretrained_cfg", None) or getattr(m, "default_cfg", None) or {}
        c, h, w = tuple(cfg.get("input_size", (3, 224, 224)))
        fixed = bool(cfg.get("fixed_input_size", False))
        if "img_size" in kw:
            h = w = SMALL
        elif small and not fixed:
            h, w = min(h, SMALL), min(w, SMALL)
        return kw, (c, h, w), n
    raise Skip(f"CPU fails (build): {type(last).__name__}: {str(last).splitlines()[0] if str(last) else ''}")


def make_case(name: str) -> Case:
    kw, size, n = _plan(name)
    if n > MAX_PARAMS:
        raise Skip(f"too large: {n / 1e6:.1f}M parameters (limit {MAX_PARAMS / 1e6:.0f}M)")
    if not _cpu_runs(name, kw, size):  # e.g. a patch grid that 64x64 does not divide: full size
        kw, size, n = _plan(name, small=False)
        if n > MAX_PARAMS:
            raise Skip(f"too large: {n / 1e6:.1f}M parameters (limit {MAX_PARAMS / 1e6:.0f}M)")

    def build():
        return _create(name, **kw)

    def inputs(gen: torch.Generator):
        return {"x": torch.randn(BATCH, *size, generator=gen)}

    def train_inputs(gen: torch.Generator):
        return inputs(gen)

    def loss(out):
        logits = out if isinstance(out, torch.Tensor) else out[0]
        target = torch.arange(logits.shape[0]) % logits.shape[-1]
        return torch.nn.functional.cross_entropy(logits.float().reshape(logits.shape[0], -1),
                                                 target.to(logits.device))

    return Case(zoo=ZOO, name=name, build=build, inputs=inputs, train_inputs=train_inputs,
                loss=loss, info={"input": list(size), "kwargs": {k: v for k, v in kw.items()
                                                                 if k == "img_size"}})
