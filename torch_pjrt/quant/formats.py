"""Weight formats of quantized checkpoints, in plain torch: quantizers (offline, on any device)
and dequantizers (the reference formulas; the same code runs on `tpu` and on CPU).

Three formats, each a set of tensors that replace a Linear's `weight` [N, K] in a checkpoint:

``fp8_block`` (the layout of FP8-released LLMs)
    ``weight`` float8_e4m3fn [N, K]; ``weight_scale_inv`` float32 [ceil(N/128), ceil(K/128)].
    W[n, k] = float(weight[n, k]) * weight_scale_inv[n // 128, k // 128]. (Despite its name the
    scale multiplies: it is the inverse of the quantizing scale.)

``mxfp4`` (OCP Microscaling, FP4 elements)
    ``weight`` float4_e2m1fn_x2 [N, K/2] (element 2j in the low nibble of byte j, 2j+1 in the
    high nibble); ``weight_scale`` float8_e8m0fnu [N, K/32]. W = fp4 * 2**(e - 127) per block of
    32 along K.

``nvfp4`` (NVIDIA's FP4 with FP8 block scales and a tensor scale)
    ``weight`` float4_e2m1fn_x2 [N, K/2] (as above); ``weight_scale`` float8_e4m3fn [N, K/16];
    ``weight_scale_2`` float32 [] . W = fp4 * float(weight_scale) * weight_scale_2 per block of
    16 along K.

FP4 E2M1 codes: bit 3 is the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa; the
magnitudes of codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6. Dequantizing decodes them with
arithmetic (no table lookup), so on `tpu` the decode fuses with what follows it.
"""
from __future__ import annotations

import math

import torch

FP8_BLOCK = 128
MX_BLOCK = 32
NV_BLOCK = 16
FP4_MAX = 6.0
E4M3_MAX = 448.0
FORMATS = ("fp8_block", "mxfp4", "nvfp4")

# Magnitudes of the E2M1 codes 0..7, and the ties of round-to-nearest-even between neighbours:
# a tie goes to the code with an even mantissa bit (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, ...).
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _pack_fp4_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] (values 0..15) -> float4_e2m1fn_x2 [..., K/2], low nibble first."""
    if codes.shape[-1] % 2:
        raise ValueError("an FP4 row needs an even number of elements, got %d" % codes.shape[-1])
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).view(torch.float4_e2m1fn_x2)


def fp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """float4_e2m1fn_x2 (or uint8) [..., K/2] -> uint8 codes [..., K]."""
    b = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    lo, hi = b & 0x0F, b >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


def fp4_decode(codes: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """E2M1 codes (uint8 0..15) -> values: exponent field e and mantissa bit m give
    m * 0.5 when e == 0 (subnormal), else 2**(e - 1) * (1 + m / 2)."""
    c = codes.to(torch.int32)
    e = (c >> 1) & 3
    m = (c & 1).to(dtype)
    normal = torch.pow(2.0, (e - 1).to(dtype)) * (1.0 + 0.5 * m)
    mag = torch.where(e == 0, 0.5 * m, normal)
    return torch.where((c & 8) != 0, -mag, mag)


def fp4_encode(x: torch.Tensor) -> torch.Tensor:
    """float -> E2M1 codes, round to nearest even, saturating at +-6 (NaN is not representable:
    it must not reach here)."""
    a = x.abs().float()
    # code k for |x| in [mid(k-1, k), mid(k, k+1)), ties to the even-mantissa neighbour
    mids = torch.tensor([(_FP4_VALUES[i] + _FP4_VALUES[i + 1]) / 2 for i in range(7)],
                        device=a.device)
    down = torch.bucketize(a, mids, right=False)   # a tie counts as below: rounds down
    up = torch.bucketize(a, mids, right=True)      # a tie counts as above: rounds up
    code = torch.where((up != down) & (up % 2 == 0), up, down)  # ties: even code wins
    code = code.clamp(max=7).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def _blocks(w: torch.Tensor, block: int) -> torch.Tensor:
    n, k = w.shape
    if k % block:
        raise ValueError("K = %d is not a multiple of the block size %d" % (k, block))
    return w.reshape(n, k // block, block)


# ---- fp8_block ----

def quantize_fp8_block(w: torch.Tensor, block: int = FP8_BLOCK) -> dict:
    n, k = w.shape
    nb, kb = math.ceil(n / block), math.ceil(k / block)
    padded = torch.zeros(nb * block, kb * block, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    tiles = padded.reshape(nb, block, kb, block)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = (amax / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    q = (tiles / scale[:, None, :, None]).reshape(nb * block, kb * block)[:n, :k]
    return {"weight": q.to(torch.float8_e4m3fn), "weight_scale_inv": scale}


def dequantize_fp8_block(weight, weight_scale_inv, dtype=torch.float32, block: int = FP8_BLOCK):
    n, k = weight.shape
    s = weight_scale_inv.to(dtype)
    s = s.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return weight.to(dtype) * s


# ---- mxfp4 ----

def quantize_mxfp4(w: torch.Tensor, block: int = MX_BLOCK) -> dict:
    b = _blocks(w.float(), block)
    amax = b.abs().amax(dim=-1)
    # shared exponent: floor(log2(amax)) minus E2M1's largest exponent (2), as the OCP MX spec
    # sets it; an all-zero block takes the smallest scale.
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=1e-38))) - 2,
                      torch.full_like(amax, -127.0)).clamp(-127, 127)
    codes = fp4_encode(b / torch.pow(2.0, exp)[..., None])
    return {"weight": _pack_fp4_codes(codes.reshape(w.shape)),
            "weight_scale": (exp + 127).to(torch.uint8).view(torch.float8_e8m0fnu)}


def dequantize_mxfp4(weight, weight_scale, dtype=torch.float32, block: int = MX_BLOCK):
    vals = fp4_decode(fp4_codes(weight), dtype)
    n, k = vals.shape
    e = weight_scale.view(torch.uint8).to(torch.int32) - 127
    scale = torch.pow(2.0, e.to(dtype))
    return (vals.reshape(n, k // block, block) * scale[..., None]).reshape(n, k)


# ---- nvfp4 ----

def quantize_nvfp4(w: torch.Tensor, block: int = NV_BLOCK) -> dict:
    b = _blocks(w.float(), block)
    gscale = (w.float().abs().amax() / (FP4_MAX * E4M3_MAX)).clamp(min=torch.finfo(torch.float32).tiny)
    bscale = (b.abs().amax(dim=-1) / FP4_MAX / gscale).to(torch.float8_e4m3fn)
    eff = bscale.float() * gscale
    codes = fp4_encode(torch.where(eff[..., None] > 0, b / eff[..., None], torch.zeros_like(b)))
    return {"weight": _pack_fp4_codes(codes.reshape(w.shape)), "weight_scale": bscale,
            "weight_scale_2": gscale.reshape(())}


def dequantize_nvfp4(weight, weight_scale, weight_scale_2, dtype=torch.float32,
                     block: int = NV_BLOCK):
    vals = fp4_decode(fp4_codes(weight), dtype)
    n, k = vals.shape
    scale = weight_scale.to(dtype) * weight_scale_2.to(dtype)
    return (vals.reshape(n, k // block, block) * scale[..., None]).reshape(n, k)


QUANTIZE = {"fp8_block": quantize_fp8_block, "mxfp4": quantize_mxfp4, "nvfp4": quantize_nvfp4}
DEQUANTIZE = {"fp8_block": dequantize_fp8_block, "mxfp4": dequantize_mxfp4,
              "nvfp4": dequantize_nvfp4}
# The tensors each format stores per Linear, in the order its dequantizer takes them.
TENSORS = {"fp8_block": ("weight", "weight_scale_inv"), "mxfp4": ("weight", "weight_scale"),
           "nvfp4": ("weight", "weight_scale", "weight_scale_2")}


def dequantize(fmt: str, tensors: dict, dtype=torch.float32) -> torch.Tensor:
    if fmt not in DEQUANTIZE:
        raise ValueError("unknown weight format %r; known: %s" % (fmt, ", ".join(FORMATS)))
    return DEQUANTIZE[fmt](*(tensors[n] for n in TENSORS[fmt]), dtype=dtype)
