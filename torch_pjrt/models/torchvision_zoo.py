"""torchvision: every classification, segmentation, video and detection model of
`torchvision.models.list_models()`, built with `weights=None` at a small input size, and the
RAFT optical-flow models on image pairs (quantized models are not run). Detection
models (Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS, SSD) take a list of two images of different
sizes (resized by the model's transform to DET_SIZE where it has one); their eval outputs (boxes,
scores, labels, masks, keypoints per image) are compared, and the training step's loss is the sum
of the model's loss dict, on synthesized targets (two boxes per image), with the R-CNN samplers'
random picks made the same on both devices (_FixedSampler). When
torchvision does not import beside the installed torch (PyPI's wheel is built for another torch),
the zoo is one skipped record carrying that reason: its model list cannot be read then."""
from __future__ import annotations

from typing import List, Tuple

import torch

from .compare import Case, Skip

ZOO = "torchvision"
MAX_PARAMS = 160_000_000
DET_SIZE = 128
BATCH = 2
NUM_CLASSES = 10
# smallest input each family accepts (the rest take 64x64); (C, [T,] H, W)
INPUT = {
    "inception_v3": (3, 75, 75),
    "googlenet": (3, 64, 64),
    # video models whose pooling or position tables fix 16 frames of 224x224
    "s3d": (3, 16, 224, 224),
    "mvit_v1_b": (3, 16, 224, 224),
    "mvit_v2_s": (3, 16, 224, 224),
}
FLOW_SIZE = (3, 128, 128)  # RAFT's correlation pyramid needs feature maps of 16 (1/8 scale)
FLOW_UPDATES = 3
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


def _check_size(tvm, name: str, kw: dict) -> torch.nn.Module:
    """Raises Skip for a model over MAX_PARAMS, counted without allocating where possible;
    returns the model built for counting (on meta where it could be)."""
    try:
        with torch.device("meta"):
            m = tvm.get_model(name, **kw)
    except Exception:  # constructors that compute sizes with tensors (RegNet): count on CPU
        m = tvm.get_model(name, **kw)
    n = sum(p.numel() for p in m.parameters())
    if n > MAX_PARAMS:
        raise Skip(f"too large: {n / 1e6:.1f}M parameters (limit {MAX_PARAMS / 1e6:.0f}M)")
    return m


def _input_name(model: torch.nn.Module) -> str:
    """The name of forward's first parameter (`x` for most, `input` for LRASPP)."""
    import inspect
    return next(iter(inspect.signature(model.forward).parameters))


def _unit_scale(model: torch.nn.Module, images) -> torch.nn.Module:
    """Rescales every convolution and linear layer of a randomly initialized detector so that
    its output has unit standard deviation on `images` (one eval pass; a layer used several
    times, like a head shared by the pyramid levels, is scaled at its first use). At the
    library's initialization the backbone's activations fade to ~1e-8 and the heads' (std 0.01,
    zero bias) give every anchor and class nearly the same score, so which boxes survive top-k
    and NMS would be decided by rounding: the comparison would test ties, not the model. Called
    on the CPU model, which both devices then start from."""
    done = set()

    def hook(m, inputs, out):
        if id(m) in done or not isinstance(out, torch.Tensor) or out.numel() < 2:
            return None
        done.add(id(m))
        s = float(out.std())
        if not (s > 0 and s == s and s != float("inf")):
            return None
        m.weight.mul_(1 / s)
        if m.bias is not None:
            m.bias.mul_(1 / s)
        return out / s

    hooks = [m.register_forward_hook(hook) for m in model.modules()
             if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    model.eval()
    try:
        with torch.no_grad():
            model(images)
    finally:
        for h in hooks:
            h.remove()
    return model


def _canonical_detections(out):
    """Each image's detections ordered by label, then box corners, then score. Models order them
    by score alone; scores tie exactly (boxes whose pooled features are equal, as in an image's
    padding), where unstable top-k and sorting steps may break ties either way on any device,
    and neighbouring scores of hundreds of detections can lie closer than float32 rounding
    moves them. Box corners of one class lie pixels apart, so their order is robust."""
    res = []
    for d in out:
        order = torch.arange(d["scores"].shape[0])
        b = d["boxes"]
        for key in (-d["scores"], b[:, 3], b[:, 2], b[:, 1], b[:, 0], d["labels"].double()):
            order = order[key[order].sort(stable=True).indices]  # least significant key first
        res.append({k: v[order] for k, v in d.items()})
    return res


class _FixedSampler:
    """Stands in for an R-CNN's BalancedPositiveNegativeSampler (RPN and box head), which picks
    its training anchors and proposals with torch.randperm on the tensors' device: the CPU and
    tpu runs would train on different samples (the harness then skips the training step). This
    one runs the library's sampler on CPU copies under a private, fixed CPU generator state, so
    both devices train on the same samples whatever the global seed; the masks go back to the
    tensors' device. The sampling (small index tensors) is then CPU work in both runs."""

    SEED = 4321

    def __init__(self, sampler):
        self.sampler = sampler

    def __call__(self, matched_idxs):
        dev = matched_idxs[0].device if matched_idxs else torch.device("cpu")
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(self.SEED)
            pos, neg = self.sampler([m.cpu() for m in matched_idxs])
        return [p.to(dev) for p in pos], [n.to(dev) for n in neg]


def _fix_samplers(model: torch.nn.Module) -> torch.nn.Module:
    for head in (getattr(model, "rpn", None), getattr(model, "roi_heads", None)):
        if head is not None and hasattr(head, "fg_bg_sampler"):
            head.fg_bg_sampler = _FixedSampler(head.fg_bg_sampler)
    return model


def _detection_case(name: str, kw: dict) -> Case:
    import torchvision.models as tvm
    kw = dict(kw, weights_backbone=None)
    if not name.startswith("ssd"):  # the R-CNN / RetinaNet / FCOS transform resizes to these
        kw.update(min_size=DET_SIZE, max_size=DET_SIZE)
    _check_size(tvm, name, kw)
    sizes = ((3, 96, 128), (3, 120, 100))

    def build():
        return _fix_samplers(_unit_scale(
            tvm.get_model(name, **kw),
            [torch.rand(*s, generator=torch.Generator().manual_seed(1)) for s in sizes]))

    def inputs(gen: torch.Generator):
        return {"images": [torch.rand(*s, generator=gen) for s in sizes]}

    def targets(gen: torch.Generator):
        out = []
        for _, h, w in sizes:
            xy = torch.rand(2, 2, generator=gen) * torch.tensor([w / 2, h / 2])
            wh = 8 + torch.rand(2, 2, generator=gen) * torch.tensor([w / 3, h / 3])
            t = {"boxes": torch.cat([xy, xy + wh], 1),
                 "labels": torch.randint(1, NUM_CLASSES, (2,), generator=gen)}
            if name.startswith("maskrcnn"):
                t["masks"] = (torch.rand(2, h, w, generator=gen) > 0.5).to(torch.uint8)
            if name.startswith("keypointrcnn"):
                kp = t["boxes"][:, None, :2] + torch.rand(2, 17, 2, generator=gen) * wh[:, None]
                t["keypoints"] = torch.cat([kp, torch.ones(2, 17, 1)], 2)
            out.append(t)
        return out

    def train_inputs(gen: torch.Generator):
        return {**inputs(gen), "targets": targets(gen)}

    def loss(out):
        return sum(v for v in out.values())

    info = {"kind": "detection", "input": [list(s) for s in sizes],
            "resize": None if name.startswith("ssd") else DET_SIZE}
    return Case(zoo=ZOO, name=name, build=build, inputs=inputs, train_inputs=train_inputs,
                loss=loss, canonical=_canonical_detections, info=info)


def _flow_case(name: str) -> Case:
    """RAFT: a pair of images in, FLOW_UPDATES refined flow fields out (all compared); the
    training loss is the mean L1 norm of every prediction (a zero-flow target)."""
    import torchvision.models as tvm
    kw = {"weights": None}
    _check_size(tvm, name, kw)

    def build():
        return tvm.get_model(name, **kw)

    def inputs(gen: torch.Generator):
        return {"image1": torch.rand(BATCH, *FLOW_SIZE, generator=gen) * 2 - 1,
                "image2": torch.rand(BATCH, *FLOW_SIZE, generator=gen) * 2 - 1,
                "num_flow_updates": FLOW_UPDATES}

    def loss(out):
        return sum(f.abs().mean() for f in out)

    return Case(zoo=ZOO, name=name, build=build, inputs=inputs, loss=loss,
                info={"kind": "optical_flow", "input": [list(FLOW_SIZE)] * 2,
                      "num_flow_updates": FLOW_UPDATES})


def make_case(name: str) -> Case:
    import torchvision.models as tvm
    kind = _module_of(name)
    if kind == "quantization":
        raise Skip("not run: quantized models (their quantized kernels exist for the CPU only)")
    if kind == "optical_flow":
        return _flow_case(name)
    kw = {"weights": None, "num_classes": NUM_CLASSES}
    if kind == "detection":
        return _detection_case(name, kw)
    if kind == "segmentation":
        kw["weights_backbone"] = None
        kw["aux_loss"] = False
    if name in ("inception_v3", "googlenet"):
        kw["aux_logits"] = False
        kw["init_weights"] = True
    arg = _input_name(_check_size(tvm, name, kw))
    if name in INPUT:
        size = INPUT[name]
    elif kind == "video":
        size = (3, 4, 64, 64)
    elif name.startswith(VIT_224):
        size = (3, 224, 224)
    else:
        size = (3, 64, 64)

    def build():
        return tvm.get_model(name, **kw)

    def inputs(gen: torch.Generator):
        return {arg: torch.randn(BATCH, *size, generator=gen)}

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
