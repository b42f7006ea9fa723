"""The inference fast paths of `nn.MultiheadAttention` and `nn.TransformerEncoderLayer` on tpu.

In eval mode without autograd those modules call fused aten ops that PyTorch implements for CPU
and CUDA only: `_native_multi_head_attention`, `_transformer_encoder_layer_fwd` (which calls
the former) and `_masked_softmax`. Without kernels here they would run on the CPU through the
fallback (torchvision's ViT does). They are written in torch ops, following CPU's kernels:

- _masked_softmax: a bool `mask`, True meaning "masked out"; for 4-D scores [B, H, L, L],
  mask_type 0 is an [L, L] mask and 1 a [B, L] key-padding mask; otherwise the mask has the
  scores' shape; a row with every position masked is NaN; CPU's shape checks and messages.
- _native_multi_head_attention: batch-first [B, T, D] query and [B, S, D] key and value; one
  packed projection when query, key and value are the same tensor, else three; q is scaled by
  1/sqrt(head dim) before q @ k^T; a float mask counts as True where nonzero; weights are the
  masked softmax, averaged over heads when asked; the second result is undefined (None in
  Python) when weights are not needed.
- _transformer_encoder_layer_fwd: self-attention and a two-layer feed-forward block (ReLU or
  GELU), each with a residual, layer norm before (norm_first) or after each block.

The ops have no autograd formula (PyTorch's fast path runs only without grad). Nested tensors
can be built on tpu (torch.nested.nested_tensor) but PyTorch registers their kernels for
NestedTensorCPU, CUDA and HPU only, so almost no op runs on them: `_nested_tensor_from_mask`
(nn.TransformerEncoder's path for padded batches) raises NotImplementedError naming the way
around it; the left-alignment test it follows runs here. One nested case is served, because
PyTorch's fast-path condition lets privateuse1 nested inputs through: an encoder layer over a
nested tensor with no elements, which CPU's kernel returns as a nested tensor over the same
(empty) buffer without computing anything; any other nested input to the layer raises
NotImplementedError.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_LIBS: list = []


def _masked_softmax(x, mask, dim=None, mask_type=None):
    torch._check(mask.dtype == torch.bool, lambda: "Mask should be a boolean tensor")
    dim = x.dim() - 1 if dim is None else dim
    if mask_type is None:
        torch._check(mask.dim() != 2 or mask.shape == x.shape, lambda: "Mask Type should be defined")
    if x.dim() == 4 and mask_type == 0:  # [L, L] for scores [B, H, L, L]
        torch._check(mask.shape == x.shape[2:], lambda: "For mask_type == 0 mask shape should be (L, L)")
        mask = mask.view(1, 1, *mask.shape)
    elif x.dim() == 4 and mask_type == 1:  # [B, L]: key padding
        torch._check(mask.shape == (x.shape[0], x.shape[3]),
                     lambda: "For mask_type == 1 mask shape should be (B, L)")
        mask = mask.view(mask.shape[0], 1, 1, mask.shape[1])
    else:
        torch._check(mask.shape == x.shape,
                     lambda: "For mask_type == 2 mask shape should match input shape")
    # a row with every position masked is NaN, as on CPU
    return torch.softmax(x.masked_fill(mask.expand_as(x), -math.inf), dim)


def _mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
         mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    torch._check(query.dim() == 3 and key.dim() == 3 and value.dim() == 3,
                 lambda: "expected query, key and value to be 3-D [batch, sequence, embed_dim]")
    torch._check(query.shape[-1] == embed_dim,
                 lambda: f"query's last dim ({query.shape[-1]}) is not embed_dim ({embed_dim})")
    torch._check(embed_dim % num_head == 0,
                 lambda: f"embed_dim ({embed_dim}) is not divisible by num_head ({num_head})")
    b, t, _ = query.shape
    s = key.shape[1]
    dh = embed_dim // num_head
    if query is key and key is value:
        q, k, v = F.linear(query, qkv_weight, qkv_bias).chunk(3, dim=-1)
    else:
        wq, wk, wv = qkv_weight.chunk(3, dim=0)
        bq, bk, bv = qkv_bias.chunk(3, dim=0)
        q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
    q = q.view(b, t, num_head, dh).transpose(1, 2) / math.sqrt(dh)
    k = k.reshape(b, s, num_head, dh).transpose(1, 2)
    v = v.reshape(b, s, num_head, dh).transpose(1, 2)
    scores = q @ k.transpose(-2, -1)  # [B, H, T, S]
    if mask is None:
        attn = torch.softmax(scores, -1)
    else:  # a float mask counts as masked where nonzero, as CPU converts it
        attn = _masked_softmax(scores, mask if mask.dtype == torch.bool else mask != 0, 3, mask_type)
    ctx = (attn @ v).transpose(1, 2).reshape(b, t, embed_dim)
    out = F.linear(ctx, proj_weight, proj_bias)
    if not need_weights:
        return out, None  # an undefined tensor, as CPU returns (None in Python)
    return out, (attn.mean(dim=1) if average_attn_weights else attn)


def _encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                   use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                   norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                   mask_type=None):
    def norm(x, w, bias):
        return F.layer_norm(x, (embed_dim,), w, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
             False, True, mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    res = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    h = F.linear(x, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = F.linear(h, ffn_weight_2, ffn_bias_2) + res
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


def _left_aligned(t, mask):
    """_nested_tensor_from_mask_left_aligned: whether every row of the [N, L] `mask` (True for a
    real token) is a run of True then a run of False; CPU's checks. A bool to the host."""
    torch._check(t.dim() == 3, lambda: "Input should be a 3D tensor, N * L * D")
    torch._check(mask.dtype == torch.bool,
                 lambda: f"Expected mask to be of ScalarType Bool, but got {_dtype_name(mask)} instead.")
    torch._check(mask.dim() == 2 and mask.shape == t.shape[:2], lambda: "Mask size should match input size")
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


# c10's ScalarType names, as CPU's messages spell dtypes
_SCALAR_TYPE_NAMES = {
    torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int",
    torch.int64: "Long", torch.float16: "Half", torch.float32: "Float", torch.float64: "Double",
    torch.bfloat16: "BFloat16", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}


def _dtype_name(x) -> str:
    return _SCALAR_TYPE_NAMES.get(x.dtype, str(x.dtype))


def _nested_from_mask(t, mask, mask_check=True):
    raise NotImplementedError(
        "nested tensors are not supported on the tpu device (torch._nested_tensor_from_mask); "
        "nn.TransformerEncoder takes that path in eval mode with a src_key_padding_mask: "
        "build it with enable_nested_tensor=False")


_NESTED_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.NestedTensorCPU)


def _encoder_layer_nested(src, *args, **kwargs):
    """_transformer_encoder_layer_fwd for NestedTensorPrivateUse1. With no elements, the kernel
    PyTorch registers for NestedTensorCPU (the device-generic one CPU and CUDA also use) returns
    at once, wrapping src's own buffer and sizes in a new nested tensor: no element is read and
    nothing leaves the device, so it is called as it is. With elements, that kernel would go on
    to nested ops that have no tpu kernels; refused here with a message that says so."""
    if src.numel() != 0:
        raise NotImplementedError(
            "nested tensors are not supported on the tpu device: nn.TransformerEncoderLayer's "
            "inference fast path (torch._transformer_encoder_layer_fwd) over a nested tensor "
            "with elements; pass a padded tensor with src_key_padding_mask instead")
    return torch.ops.aten._transformer_encoder_layer_fwd.default.redispatch(
        _NESTED_CPU, src, *args, **kwargs)


def register() -> None:
    """Registers the kernels once per process (idempotent)."""
    if _LIBS:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_masked_softmax", _masked_softmax, "PrivateUse1")
    lib.impl("_native_multi_head_attention", _mha, "PrivateUse1")
    lib.impl("_transformer_encoder_layer_fwd", _encoder_layer, "PrivateUse1")
    lib.impl("_nested_tensor_from_mask_left_aligned", _left_aligned, "PrivateUse1")
    lib.impl("_nested_tensor_from_mask", _nested_from_mask, "PrivateUse1")
    lib.impl("_transformer_encoder_layer_fwd", _encoder_layer_nested, "NestedTensorPrivateUse1")
    _LIBS.append(lib)
