"""Quantized checkpoints in safetensors files: writing one from a model (offline quantization),
and loading one into a model on any device, with each quantized Linear replaced by a QuantLinear
(or, dense=True, by an nn.Linear holding the dequantized weight).

A checkpoint holds, for every quantized Linear at `path`, the format's tensors under
`path.<name>` (formats.TENSORS) and its bias under `path.bias`; every other tensor of the model's
state dict is stored as it is. The format is recorded in the file's metadata ("quant_format")."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from . import formats
from .linear import QuantLinear

_BLOCK_OF = {"fp8_block": 1, "mxfp4": formats.MX_BLOCK, "nvfp4": formats.NV_BLOCK}


def quantizable(model: nn.Module, fmt: str, skip: Iterable[str] = ("lm_head",)) -> list[str]:
    """Names of the Linears a checkpoint of `fmt` quantizes: every nn.Linear whose in_features
    fits the format's block, except the names in `skip` (the output head, by default: it is often
    tied to the input embedding)."""
    skip = set(skip)
    return [n for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and n not in skip and n.split(".")[-1] not in skip
            and m.in_features % _BLOCK_OF[fmt] == 0]


def quantize_state_dict(model: nn.Module, fmt: str, skip: Iterable[str] = ("lm_head",)) -> dict:
    if fmt not in formats.FORMATS:
        raise ValueError("unknown weight format %r; known: %s" % (fmt, ", ".join(formats.FORMATS)))
    names = set(quantizable(model, fmt, skip))
    sd = {}
    for key, t in model.state_dict(keep_vars=False).items():
        owner, _, leaf = key.rpartition(".")
        if owner in names and leaf == "weight":
            for n, q in formats.QUANTIZE[fmt](t.detach().cpu()).items():
                sd["%s.%s" % (owner, n)] = q.contiguous()
        else:
            sd[key] = t.detach().cpu().contiguous()
    return sd


def save_quantized(model: nn.Module, path: str, fmt: str, skip: Iterable[str] = ("lm_head",)):
    from safetensors.torch import save_file
    sd = quantize_state_dict(model, fmt, skip)
    # safetensors refuses tensors that share memory (tied weights): store each once per name
    seen = {}
    for k, t in list(sd.items()):
        ptr = (t.data_ptr(), t.dtype, tuple(t.shape))
        if ptr in seen:
            sd[k] = t.clone()
        seen[ptr] = k
    save_file(sd, path, metadata={"quant_format": fmt})


def _set_module(model: nn.Module, name: str, module: nn.Module):
    owner, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, leaf, module)


def load_quantized(model: nn.Module, path: str, device="tpu", dense: bool = False,
                   dtype=torch.float32) -> nn.Module:
    """Loads the checkpoint at `path` into `model` (built from its config, any device) and moves
    it to `device`. Tied parameters stay tied (the model's own tie_weights() runs if it has one)."""
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        fmt = (f.metadata() or {}).get("quant_format")
        if fmt not in formats.FORMATS:
            raise ValueError("%s is not a quantized checkpoint of a known format (metadata "
                             "quant_format=%r)" % (path, fmt))
        sd = {k: f.get_tensor(k) for k in f.keys()}
    first = formats.TENSORS[fmt][1]
    qnames = sorted(k[: -len(first) - 1] for k in sd if k.endswith("." + first))
    # the Linears are replaced before the model moves, so their dense weights never reach the
    # device
    for name in qnames:
        lin = model.get_submodule(name)
        if not isinstance(lin, nn.Linear):
            raise ValueError("checkpoint quantizes %s, which is a %s, not a Linear"
                             % (name, type(lin).__name__))
        tensors = {n: sd.pop("%s.%s" % (name, n)) for n in formats.TENSORS[fmt]}
        bias = sd.pop(name + ".bias", None)
        if (bias is None) != (lin.bias is None):
            raise ValueError("%s: the checkpoint %s a bias, the model's Linear %s" % (
                name, "has" if bias is not None else "lacks",
                "does not" if lin.bias is None else "has one"))
        q = QuantLinear(lin.in_features, lin.out_features, fmt, tensors,
                        None if bias is None else bias.to(dtype))
        _set_module(model, name, q.to(device).to_dense(dtype) if dense else q)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    quant_keys = {"%s.%s" % (n, t) for n in qnames for t in formats.TENSORS[fmt] + ("bias",)}
    missing = [k for k in missing if k not in quant_keys and not k.endswith("rotary_emb.inv_freq")]
    if unexpected:
        raise ValueError("checkpoint has tensors the model does not: %s" % ", ".join(unexpected[:5]))
    if missing:
        raise ValueError("checkpoint lacks tensors of the model: %s" % ", ".join(missing[:5]))
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.to(device)
