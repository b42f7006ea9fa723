"""Fake-tensor rules for ops whose Meta kernel checks CUDA's limits, narrower than what this
device runs eagerly. Dynamo traces with fake tensors, which take an op's shape and dtype from its
Meta kernel; where that kernel refuses what the eager ``tpu`` kernel accepts, a model that runs
eagerly breaks its graph (or fails) under ``torch.compile``.

- ``torch._grouped_mm`` (MoE experts: Transformers' ``integrations/moe.py`` calls it on a device
  named ``tpu`` for every dtype): the Meta kernel accepts bfloat16 only (CUDA's kernel); on
  ``tpu`` the op runs PyTorch's composite in float32 and float16 too. The rule gives float32 /
  float16 inputs on ``tpu`` the composite's result: a contiguous tensor of the input dtype (or
  ``out_dtype``), shaped as the Meta kernel shapes it. Anything else (bfloat16, other devices)
  goes to the Meta kernel as before.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten
_WIDER_GROUPED_MM = (torch.float32, torch.float16)


def _grouped_mm_size(a, b, offs) -> list[int]:
    """The result's size (the cases of PyTorch's grouped product: 2-D x 3-D, 3-D x 3-D,
    3-D x 2-D, 2-D x 2-D with offsets)."""
    if a.dim() == 2 and b.dim() == 2:
        torch._check(offs is not None, lambda: "2d x 2d grouped_mm needs offsets")
        return [offs.size(0), a.size(0), b.size(1)]
    if a.dim() == 2:
        torch._check(offs is not None and offs.size(0) == b.size(0),
                     lambda: "matrix batch sizes have to match")
        return [a.size(0), b.size(-1)]
    if b.dim() == 2:
        torch._check(offs is not None and offs.size(0) == a.size(0),
                     lambda: "matrix batch sizes have to match")
        return [a.size(1), b.size(1)]
    torch._check(a.size(0) == b.size(0), lambda: "batched dimension has to match")
    return [a.size(0), a.size(1), b.size(-1)]


def grouped_mm_checked_size(mat_a, mat_b, offs, bias) -> list[int]:
    """The tpu kernel's argument checks (shared by this rule and torch_pjrt/grouped_mm.py) and
    the result's size."""
    torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                 lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} "
                         f"and mat_b.dim()={mat_b.dim()}")
    torch._check(offs is None or offs.dtype == torch.int32,
                 lambda: f"Offsets tensor must be integer (int32) tensor, but got {offs.dtype}.")
    torch._check(bias is None, lambda: "Bias not supported yet")
    return _grouped_mm_size(mat_a, mat_b, offs)


def _is_grouped_mm(func) -> bool:
    return func is aten._grouped_mm.default


def _grouped_mm_fake(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if (mat_a.device.type != "tpu" or mat_a.dtype not in _WIDER_GROUPED_MM
            or mat_b.dtype != mat_a.dtype):
        return NotImplemented  # the Meta kernel's rules (and messages)
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    size = grouped_mm_checked_size(mat_a, mat_b, offs, bias)
    with in_kernel_invocation_manager(fake_mode):
        out = torch.empty(size, dtype=out_dtype or mat_a.dtype, device="meta")
    return FakeTensor(fake_mode, out, mat_a.device)


_registered = False


def register() -> None:
    """Adds the rules to PyTorch's fake-tensor implementations (idempotent)."""
    global _registered
    if _registered:
        return
    from torch._subclasses import fake_impls

    fake_impls.register_op_impl(_is_grouped_mm)(_grouped_mm_fake)
    _registered = True
