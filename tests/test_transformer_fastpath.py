"""nn.MultiheadAttention's and nn.TransformerEncoderLayer's inference fast paths on tpu
(torch_pjrt/transformer_ops.py) against CPU's own fused kernels, with no CPU fallback."""
import pytest
import torch

import torch_pjrt  # noqa: F401

TPU = torch.device("tpu")


def _same(cpu, got, atol=1e-5):
    got = got.cpu()
    assert got.dtype == cpu.dtype and got.shape == cpu.shape
    torch.testing.assert_close(got, cpu, rtol=1e-5, atol=atol)


def _masks(kind, b, t, s):
    g = torch.Generator().manual_seed(1)
    pad = torch.rand(b, s, generator=g) < 0.3
    pad[:, 0] = False
    causal = torch.ones(t, s, dtype=torch.bool).triu(1)
    return {"none": (None, None), "pad": (None, pad), "attn": (causal, None),
            "both": (causal, pad), "float_attn": (torch.zeros(t, s).masked_fill(causal, -1e9), None)}[kind]


@pytest.mark.parametrize("kind", ["none", "pad", "attn", "both", "float_attn"])
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("self_attn", [True, False])
def test_multihead_attention_fast_path_matches_cpu(kind, need_weights, average, self_attn):
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    b, t = 2, 5
    q = torch.randn(b, t, 16)
    kv = q if self_attn else torch.randn(b, t, 16)
    attn_mask, pad = _masks(kind, b, t, t)
    mt = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    mt.load_state_dict(m.state_dict())
    mt = mt.to(TPU)
    qt = q.to(TPU)
    kvt = qt if self_attn else kv.to(TPU)
    kw = dict(need_weights=need_weights, average_attn_weights=average)
    with torch.inference_mode():
        out_c, w_c = m(q, kv, kv, attn_mask=attn_mask, key_padding_mask=pad, **kw)
        before = dict(torch.tpu.fallback_ops())
        out_t, w_t = mt(qt, kvt, kvt, key_padding_mask=None if pad is None else pad.to(TPU),
                        attn_mask=None if attn_mask is None else attn_mask.to(TPU), **kw)
    assert dict(torch.tpu.fallback_ops()) == before, "an op fell back to the CPU"
    _same(out_c, out_t)
    if w_c is None:
        assert w_t is None
    else:
        _same(w_c, w_t)


def test_masked_softmax_matches_cpu_including_fully_masked_rows():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5)
    mask = torch.rand(2, 3, 5, 5) < 0.5
    mask[0, 1, 2] = True  # a row with every position masked: NaN on CPU
    for mask_type, m in ((2, mask), (None, mask), (1, mask[:, 0, 0]), (0, mask[0, 0])):
        ref = torch._masked_softmax(x, m, 3, mask_type)
        got = torch._masked_softmax(x.to(TPU), m.to(TPU), 3, mask_type)
        torch.testing.assert_close(got.cpu(), ref, equal_nan=True)


@pytest.mark.parametrize("x_shape,mask_shape,mask_type,dtype", [
    ((2, 3, 5, 5), (1, 1, 5, 5), None, torch.bool),
    ((2, 3, 5, 5), (5, 5), None, torch.bool),
    ((2, 3, 5, 5), (4, 5), 0, torch.bool),
    ((2, 3, 5, 5), (3, 5), 1, torch.bool),
    ((2, 3, 5, 5), (2, 1, 5, 5), 2, torch.bool),
    ((2, 3, 5, 5), (5, 5), 0, torch.float32),
    ((6, 5, 5), (5, 5), 0, torch.bool),
])
def test_masked_softmax_refuses_what_cpu_refuses(x_shape, mask_shape, mask_type, dtype):
    x, m = torch.randn(x_shape), torch.zeros(mask_shape, dtype=dtype)
    with pytest.raises(RuntimeError) as cpu:
        torch._masked_softmax(x, m, x.dim() - 1, mask_type)
    with pytest.raises(RuntimeError) as tpu:
        torch._masked_softmax(x.to(TPU), m.to(TPU), x.dim() - 1, mask_type)
    assert str(cpu.value).splitlines()[0] in str(tpu.value)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("with_pad", [False, True])
def test_transformer_encoder_layer_fast_path_matches_cpu(norm_first, activation, with_pad):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0,
                                             activation=activation, batch_first=True,
                                             norm_first=norm_first).eval()
    x = torch.randn(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    lt = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0,
                                          activation=activation, batch_first=True,
                                          norm_first=norm_first).eval()
    lt.load_state_dict(layer.state_dict())
    lt = lt.to(TPU)
    with torch.inference_mode():
        ref = layer(x, src_key_padding_mask=pad if with_pad else None)
        got = lt(x.to(TPU), src_key_padding_mask=pad.to(TPU) if with_pad else None)
    _same(ref, got)


def test_fast_path_ops_run_without_the_cpu_fallback():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, 0.0, batch_first=True).eval().to(TPU)
    x = torch.randn(2, 6, 16, device=TPU)
    before = dict(torch.tpu.fallback_ops())
    with torch.inference_mode():
        layer(x).cpu()
    assert dict(torch.tpu.fallback_ops()) == before


def test_nested_tensor_path_of_transformer_encoder_raises_a_clear_error():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, 0.0, batch_first=True)
    x = torch.randn(2, 6, 16, device=TPU)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 3:] = True
    enc = torch.nn.TransformerEncoder(layer, 2).eval().to(TPU)
    with torch.inference_mode(), pytest.raises(NotImplementedError, match="enable_nested_tensor=False"):
        enc(x, src_key_padding_mask=pad.to(TPU))
    # the way around it gives CPU's results at the real tokens
    plain = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    ref = torch.nn.TransformerEncoder(layer, 2).eval()
    with torch.inference_mode():
        got = plain.to(TPU)(x, src_key_padding_mask=pad.to(TPU)).cpu()
        want = ref.cpu()(x.cpu(), src_key_padding_mask=pad)
    keep = ~pad
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)


def _layer_pair(norm_first, dtype):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, 0.0, batch_first=True,
                                             norm_first=norm_first, dtype=dtype).eval()
    lt = torch.nn.TransformerEncoderLayer(16, 4, 32, 0.0, batch_first=True,
                                          norm_first=norm_first, dtype=dtype).eval()
    lt.load_state_dict(layer.state_dict())
    return layer, lt.to(TPU)


# PyTorch's fast-path condition admits privateuse1, so a nested input reaches
# _transformer_encoder_layer_fwd on NestedTensorPrivateUse1: with no elements CPU returns a
# nested tensor of the input's sizes, and so does tpu (on the device, nothing falling back).
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("parts", [1, 3])
def test_encoder_layer_over_an_empty_nested_tensor_matches_cpu(norm_first, dtype, parts):
    layer, lt = _layer_pair(norm_first, dtype)
    comps = [torch.rand(0, 16, dtype=dtype) for _ in range(parts)]
    before = dict(torch.tpu.fallback_ops())
    with torch.no_grad():
        want = layer(torch.nested.nested_tensor(comps))
        got = lt(torch.nested.nested_tensor([c.to(TPU) for c in comps]))
    assert dict(torch.tpu.fallback_ops()) == before, "an op fell back to the CPU"
    assert want.is_nested and got.is_nested and got.device.type == "tpu"
    assert got.dtype == want.dtype and got.dim() == want.dim() and got.numel() == want.numel() == 0
    assert [got.size(i) for i in range(3)] == [want.size(i) for i in range(3)] == [parts, 0, 16]


def test_encoder_layer_over_a_nested_tensor_with_elements_raises_a_clear_error():
    _, lt = _layer_pair(False, torch.float32)
    nt = torch.nested.nested_tensor([torch.rand(2, 16, device=TPU), torch.rand(3, 16, device=TPU)])
    with torch.no_grad(), pytest.raises(NotImplementedError, match="not supported on the tpu"):
        lt(nt)


# An empty dense batch (no sequences, or sequences of length 0) takes the dense fast path.
@pytest.mark.parametrize("shape", [(0, 5, 16), (3, 0, 16)])
def test_encoder_layer_over_an_empty_dense_batch_matches_cpu(shape):
    layer, lt = _layer_pair(False, torch.float64)
    x = torch.rand(*shape, dtype=torch.float64)
    with torch.no_grad():
        want, got = layer(x), lt(x.to(TPU))
    _same(want, got)


@pytest.mark.parametrize("rows", [[[1, 1, 0, 0], [1, 0, 0, 0]], [[1, 0, 1, 0], [1, 0, 0, 0]],
                                  [[0, 0, 0, 0], [1, 1, 1, 1]]])
def test_left_aligned_mask_test_matches_cpu(rows):
    t, m = torch.randn(2, 4, 3), torch.tensor(rows, dtype=torch.bool)
    assert torch._nested_tensor_from_mask_left_aligned(t.to(TPU), m.to(TPU)) == \
        torch._nested_tensor_from_mask_left_aligned(t, m)


@pytest.mark.parametrize("t_shape,mask,dtype", [((2, 4, 3), [[1, 1, 0]] * 2, torch.bool),
                                                ((2, 4, 3), [[1, 1, 0, 0]] * 2, torch.long),
                                                ((4, 3), [[1, 1, 0, 0]] * 2, torch.bool)])
def test_left_aligned_refuses_what_cpu_refuses(t_shape, mask, dtype):
    t, m = torch.randn(t_shape), torch.tensor(mask, dtype=dtype)
    with pytest.raises(RuntimeError) as cpu:
        torch._nested_tensor_from_mask_left_aligned(t, m)
    with pytest.raises(RuntimeError) as tpu:
        torch._nested_tensor_from_mask_left_aligned(t.to(TPU), m.to(TPU))
    assert str(cpu.value).splitlines()[0] in str(tpu.value)
