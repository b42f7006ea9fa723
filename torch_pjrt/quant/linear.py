"""Linear layers over quantized weights (formats.py): the weight stays in its checkpoint format
on the device and is dequantized inside every forward, so in defer_and_fuse mode and under
torch.compile the dequantization and the matmul run as one program; `to_dense()` gives a plain
nn.Linear with the weight dequantized once, for when memory is plentiful and speed matters."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from . import formats

_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class QuantLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, fmt: str, tensors: dict,
                 bias: torch.Tensor | None = None):
        super().__init__()
        if fmt not in formats.FORMATS:
            raise ValueError("unknown weight format %r; known: %s" % (fmt, ", ".join(formats.FORMATS)))
        missing = [n for n in formats.TENSORS[fmt] if n not in tensors]
        if missing:
            raise ValueError("format %s needs tensors %s; missing %s"
                             % (fmt, ", ".join(formats.TENSORS[fmt]), ", ".join(missing)))
        self.in_features, self.out_features, self.fmt = in_features, out_features, fmt
        for name in formats.TENSORS[fmt]:
            self.register_buffer(name, tensors[name])
        if bias is None:
            self.bias = None
        else:
            self.bias = nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str) -> "QuantLinear":
        t = formats.QUANTIZE[fmt](linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(linear.in_features, linear.out_features, fmt, t, bias)

    def _apply(self, fn, recurse=True):
        # Module.to(dtype), .half() and .bfloat16() convert every floating-point buffer; the
        # quantized tensors must keep their format (and float4 has no conversion at all), so
        # fn sees them as the raw bytes of an integer dtype of the same width, which it moves
        # between devices but never converts.
        kept = {}
        for n in formats.TENSORS[self.fmt]:
            t = self._buffers[n]
            kept[n] = t.dtype
            self._buffers[n] = t.view(_RAW[t.element_size()])
        try:
            return super()._apply(fn, recurse)
        finally:
            for n, dt in kept.items():
                self._buffers[n] = self._buffers[n].view(dt)

    def quantized_tensors(self) -> dict:
        return {n: getattr(self, n) for n in formats.TENSORS[self.fmt]}

    def dequantized_weight(self, dtype=torch.float32) -> torch.Tensor:
        return formats.dequantize(self.fmt, self.quantized_tensors(), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.dequantized_weight(torch.float32).to(x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def to_dense(self, dtype=torch.float32) -> nn.Linear:
        dev = getattr(self, formats.TENSORS[self.fmt][0]).device
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device=dev, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(self.dequantized_weight(dtype))
            if self.bias is not None:
                lin.bias.copy_(self.bias)
        return lin

    def extra_repr(self) -> str:
        return "in_features=%d, out_features=%d, format=%s, bias=%s" % (
            self.in_features, self.out_features, self.fmt, self.bias is not None)
