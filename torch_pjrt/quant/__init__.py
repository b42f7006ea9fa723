"""Quantized weights on any device: FP8 with block scales, MXFP4 and NVFP4 checkpoints
(formats.py), Linear layers that keep them quantized (linear.py), and safetensors loading
(checkpoint.py). Plain torch throughout: the same code is the CPU reference."""
from .formats import FORMATS, dequantize, fp4_decode, fp4_encode  # noqa: F401
from .linear import QuantLinear  # noqa: F401
from .checkpoint import load_quantized, quantizable, quantize_state_dict, save_quantized  # noqa: F401
