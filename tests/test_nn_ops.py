"""NN and shape ops checked against CPU: values, dtypes and shapes of every output, and the
gradients of ops whose backward has its own lowering. Each case also asserts that nothing fell
back to the CPU."""
import pytest
import torch

import torch_pjrt

TPU = torch.device("tpu")
BF = torch.bfloat16


def fallbacks():
    return dict(torch_pjrt._C.fallback_ops())


def to_tpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(TPU).requires_grad_(obj.requires_grad)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_tpu(o) for o in obj)
    return obj


def check(fn, *args, grad=False, atol=None, rtol=None, **kwargs):
    """fn(*args) on tpu vs CPU (every tensor output; gradients of sum(outputs) if grad)."""
    before = fallbacks()
    targs = to_tpu(args)
    exp, got = fn(*args, **kwargs), fn(*targs, **kwargs)
    exp_l = list(exp) if isinstance(exp, (tuple, list)) else [exp]
    got_l = list(got) if isinstance(got, (tuple, list)) else [got]
    assert len(exp_l) == len(got_l)
    for e, g in zip(exp_l, got_l):
        if isinstance(e, torch.Tensor):
            assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
            torch.testing.assert_close(g.cpu(), e, atol=atol, rtol=rtol, equal_nan=True)
    if grad:
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        tleaves = [a for a in targs if isinstance(a, torch.Tensor) and a.requires_grad]
        le = sum(e.float().sum() for e in exp_l if isinstance(e, torch.Tensor) and e.requires_grad)
        lg = sum(g.float().sum() for g in got_l if isinstance(g, torch.Tensor) and g.requires_grad)
        ge = torch.autograd.grad(le, leaves)
        gg = torch.autograd.grad(lg, tleaves)
        for e, g in zip(ge, gg):
            torch.testing.assert_close(g.cpu(), e, atol=atol, rtol=rtol)
    assert fallbacks() == before, "an op fell back to the CPU"
    return got


# ---- cat ----

@pytest.mark.parametrize("shapes", [[(0, 3), (0, 3)], [(0,), (0,)], [(4, 0, 2), (4, 0, 2)]])
def test_cat_of_only_empty_tensors(shapes):
    check(lambda *ts: torch.cat(ts, dim=-1), *[torch.randn(s) for s in shapes])


def test_combinations_and_glu_backward():
    check(torch.combinations, torch.arange(3.0))
    check(torch.nn.functional.glu, torch.randn(4, 6, requires_grad=True), grad=True)


# ---- normalization statistics (dtype and shape conventions of CPU) ----

@pytest.mark.parametrize("xd,pd", [(torch.float32, torch.float32), (BF, BF), (BF, torch.float32)])
@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_saved_stats(xd, pd, training):
    x = torch.randn(3, 4, 5, dtype=xd)
    w, b = torch.randn(4, dtype=pd), torch.randn(4, dtype=pd)
    rm, rv = torch.randn(4, dtype=pd), torch.rand(4, dtype=pd) + 0.5
    trm, trv = rm.to(TPU), rv.to(TPU)
    got = torch.native_batch_norm(x.to(TPU), w.to(TPU), b.to(TPU), trm, trv, training, 0.1, 1e-5)
    exp = torch.native_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
    tol = dict(atol=2e-2, rtol=2e-2) if xd == BF else {}
    for g, e in zip(got, exp):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, **tol)
    torch.testing.assert_close(trm.cpu(), rm, **tol)
    torch.testing.assert_close(trv.cpu(), rv, **tol)


@pytest.mark.parametrize("op", ["_batch_norm_with_update", "_native_batch_norm_legit_no_training"])
@pytest.mark.parametrize("dt", [torch.float32, BF])
def test_batch_norm_variants(op, dt):
    f = getattr(torch.ops.aten, op)
    x, w, b = torch.randn(2, 3, 4, dtype=dt), torch.randn(3, dtype=dt), torch.randn(3, dtype=dt)
    rm, rv = torch.randn(3, dtype=dt), torch.rand(3, dtype=dt) + 0.5
    tol = dict(atol=2e-2, rtol=2e-2) if dt == BF else {}
    check(lambda *a: f(*a, 0.1, 1e-5), x, w, b, rm, rv, **tol)


@pytest.mark.parametrize("wd", [None, BF, torch.float32])
def test_native_layer_norm_stats_dtype(wd):
    x = torch.randn(2, 3, 8, dtype=BF)
    w = None if wd is None else torch.randn(8, dtype=wd)
    check(lambda x, w: torch.native_layer_norm(x, [8], w, w, 1e-5), x, w, atol=2e-2, rtol=2e-2)


# ---- backwards of activations and losses ----

@pytest.mark.parametrize("fn", [torch.nn.functional.softshrink, torch.nn.functional.hardshrink])
@pytest.mark.parametrize("lambd", [0.5, 0.25])
def test_shrink_backward(fn, lambd):
    x = torch.tensor([-2.0, -0.5, -0.3, -0.25, 0.0, 0.4, 0.5, 0.7, 3.0], requires_grad=True)
    check(lambda x: fn(x, lambd), x, grad=True)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p,weighted", [(1, False), (2, True)])
def test_multi_margin_loss_backward(reduction, p, weighted):
    torch.manual_seed(0)
    x = torch.randn(5, 4, requires_grad=True)
    t = torch.tensor([0, 3, 1, 1, 2])
    w = torch.rand(4) if weighted else None
    check(lambda x, t, w: torch.nn.functional.multi_margin_loss(
        x, t, p=p, margin=0.7, weight=w, reduction=reduction), x, t, w, grad=True)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_backward(reduction):
    torch.manual_seed(0)
    x = torch.randn(3, 5, requires_grad=True)
    t = torch.tensor([[3, 0, -1, 1, 2], [1, 1, 4, 2, 0], [-1, 2, 3, 0, 0]])
    check(lambda x, t: torch.nn.functional.multilabel_margin_loss(x, t, reduction=reduction),
          x, t, grad=True)


# ---- pairwise distances ----

@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_cdist(p):
    torch.manual_seed(0)
    x1 = torch.randn(2, 5, 3, requires_grad=True)
    x2 = torch.randn(1, 4, 3, requires_grad=True)
    check(lambda a, b: torch.cdist(a, b, p=p, compute_mode="donot_use_mm_for_euclid_dist"),
          x1, x2, grad=p != 0.0, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, float("inf")])
def test_pdist(p):
    torch.manual_seed(0)
    x = torch.randn(5, 3, requires_grad=True)
    check(lambda a: torch.nn.functional.pdist(a, p=p), x, grad=p != 0.0, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_margin_losses_of_one_sample(reduction):
    # (reduction="none" of a 1-D input is left out: PyTorch's Meta kernels and decompositions
    # give shape [1] where CPU returns a 0-d loss, a known difference)
    x = torch.randn(5, requires_grad=True)
    check(lambda x, t: torch.nn.functional.multilabel_margin_loss(x, t, reduction=reduction),
          x, torch.tensor([2, 0, -1, 3, 3]), grad=True)
    check(lambda x, t: torch.nn.functional.multi_margin_loss(x, t, reduction=reduction),
          x, torch.tensor(1), grad=True)


# ---- adaptive and fractional max pooling (values, indices, gradients) ----

@pytest.mark.parametrize("shape,out", [((2, 3, 9), 4), ((3, 7), 7), ((2, 3, 9, 10), (4, 3)),
                                       ((3, 5, 7), (2, 7)), ((1, 2, 5, 6, 7), (2, 4, 3))])
def test_adaptive_max_pool(shape, out):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    x.view(-1)[3] = float("nan")
    f = {1: torch.nn.functional.adaptive_max_pool1d, 2: torch.nn.functional.adaptive_max_pool2d,
         3: torch.nn.functional.adaptive_max_pool3d}[1 if isinstance(out, int) else len(out)]
    check(lambda x: f(x, out, return_indices=True), x)
    check(lambda x: f(x, out), torch.randn(*shape, requires_grad=True), grad=True)


@pytest.mark.parametrize("nsp,shape,k,out", [(2, (2, 3, 9, 11), (2, 3), (5, 4)),
                                             (2, (3, 9, 11), (2, 2), (4, 6)),
                                             (3, (2, 2, 7, 8, 9), (2, 2, 3), (3, 4, 5))])
def test_fractional_max_pool(nsp, shape, k, out):
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    n, c = (shape[0], shape[1]) if len(shape) == nsp + 2 else (1, shape[0])
    s = torch.rand(n, c, nsp)
    f = torch.ops.aten.fractional_max_pool2d if nsp == 2 else torch.ops.aten.fractional_max_pool3d
    check(lambda x, s: f(x, list(k), list(out), s), x, s, grad=True)


# random_samples may have more rows than the input has batches (an unbatched input takes one):
# only the first ones are read, as on CPU. Through the modules, as nn.FractionalMaxPool*d are
# built with _random_samples, in float32 and float64, with indices and the input's gradient.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nsp,shape,rows,kw", [
    (3, (4, 5, 5, 5), 2, dict(kernel_size=2, output_ratio=0.5)),
    (3, (3, 6, 7, 8), 3, dict(kernel_size=(2, 3, 2), output_size=(4, 3, 5))),
    (3, (2, 4, 16, 7, 5), 3, dict(kernel_size=(4, 2, 3), output_size=(10, 3, 2))),
    (2, (3, 5, 7), 2, dict(kernel_size=2, output_ratio=0.5)),
    (2, (2, 3, 7, 6), 4, dict(kernel_size=(2, 3), output_size=(4, 3)))])
def test_fractional_max_pool_module_extra_sample_rows(dtype, nsp, shape, rows, kw):
    torch.manual_seed(0)
    c = shape[-nsp - 1]
    s = torch.rand(rows, c, nsp, dtype=dtype)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    cls = torch.nn.FractionalMaxPool2d if nsp == 2 else torch.nn.FractionalMaxPool3d

    def f(x, s):
        return cls(**kw, return_indices=True, _random_samples=s)(x)
    check(f, x, s, grad=True)


@pytest.mark.parametrize("rs_shape,dtype,msg", [
    ((1, 4, 3), torch.float32, "no less then input batch size"),
    ((2, 5, 3), torch.float32, "equals to input channel size"),
    ((2, 4, 2), torch.float32, "size\\(2\\) equals to 3; got 2"),
    ((24,), torch.float32, "to have 3 dimensions, got 1"),
    ((2, 4, 3), torch.float64, "to have the same dtype as input")])
def test_fractional_max_pool_sample_checks(rs_shape, dtype, msg):
    # CPU's kernel (not its Meta kernel) checks random_samples against the input
    x, s = torch.randn(2, 4, 5, 5, 5), torch.rand(*rs_shape, dtype=dtype)
    for d in ("cpu", TPU):
        with pytest.raises(RuntimeError, match=msg):
            torch.ops.aten.fractional_max_pool3d(x.to(d), [2, 2, 2], [2, 2, 2], s.to(d))


# ---- bicubic and antialiased interpolation (forward and backward) ----

@pytest.mark.parametrize("mode,aa", [("bicubic", False), ("bicubic", True), ("bilinear", True)])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("shape,size,sf", [((2, 3, 8, 9), (5, 13), None),
                                           ((1, 1, 6, 6), None, (1.7, 0.6)),
                                           ((1, 1, 16, 12), (3, 5), None)])
def test_interpolate_matrix_modes(mode, aa, align, shape, size, sf):
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    check(lambda x: torch.nn.functional.interpolate(
        x, size=size, scale_factor=sf, mode=mode, align_corners=align, antialias=aa),
        x, grad=True, atol=1e-5, rtol=1e-5)


# ---- grid sampling (forward, input and grid gradients) ----

@pytest.mark.parametrize("nsp,mode,padding,align", [
    (2, 0, 0, False), (2, 0, 1, True), (2, 0, 2, False), (2, 0, 2, True), (2, 1, 2, False),
    (2, 2, 0, True), (2, 2, 2, False), (3, 0, 0, True), (3, 0, 2, False), (3, 1, 1, False)])
def test_grid_sampler(nsp, mode, padding, align):
    torch.manual_seed(0)
    shape = (2, 3, 5, 7) if nsp == 2 else (2, 2, 4, 5, 6)
    gshape = (2, 4, 6, 2) if nsp == 2 else (2, 3, 4, 2, 3)
    x = torch.randn(*shape, requires_grad=True)
    g = (torch.rand(*gshape) * 2.6 - 1.3).requires_grad_()
    f = torch.grid_sampler_2d if nsp == 2 else torch.grid_sampler_3d
    check(lambda x, g: f(x, g, mode, padding, align), x, g, grad=True, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("nsp", [2, 3])
def test_grid_sampler_input_grad_only(nsp):
    # output_mask (True, False): the backward still returns grad_grid (its Meta kernel does)
    torch.manual_seed(0)
    x = torch.randn(*((1, 3, 5, 6) if nsp == 2 else (1, 2, 3, 4, 5)), requires_grad=True)
    g = torch.rand(*((1, 4, 4, 2) if nsp == 2 else (1, 2, 3, 2, 3))) * 2 - 1
    f = torch.grid_sampler_2d if nsp == 2 else torch.grid_sampler_3d
    check(lambda x: f(x, g.to(x.device), 0, 0, False), x, grad=True, atol=1e-5, rtol=1e-5)


# ---- embedding_bag (output, weight and per-sample-weight gradients) ----

@pytest.mark.parametrize("mode,psw", [("sum", False), ("sum", True), ("mean", False),
                                      ("max", False)])
@pytest.mark.parametrize("last,pad", [(False, None), (True, 4), (False, 4)])
def test_embedding_bag(mode, psw, last, pad):
    torch.manual_seed(0)
    w = torch.randn(10, 3, requires_grad=True)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    off = torch.tensor([0, 4, 4, 6] + ([8] if last else []))
    pw = torch.rand(8, requires_grad=True) if psw else None
    check(lambda w, pw: torch.nn.functional.embedding_bag(
        idx.to(w.device), w, off.to(w.device), mode=mode, include_last_offset=last,
        padding_idx=pad, per_sample_weights=pw), w, pw, grad=True)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_2d_indices(mode):
    w = torch.randn(10, 3, requires_grad=True)
    idx = torch.tensor([[1, 2, 3], [4, 5, 9]])
    check(lambda w: torch.nn.functional.embedding_bag(idx.to(w.device), w, mode=mode), w,
          grad=True)


# ---- CTC loss (int list or tensor lengths, padded or concatenated targets) ----

@pytest.mark.parametrize("T,N,C,S,tensor_len,flat,zero_inf,red", [
    (6, 2, 4, 3, False, False, False, "none"), (20, 4, 6, 8, True, False, False, "mean"),
    (12, 3, 5, 4, True, True, False, "sum"), (5, 2, 4, 4, False, False, True, "none")])
def test_ctc_loss(T, N, C, S, tensor_len, flat, zero_inf, red):
    torch.manual_seed(0)
    lp = torch.randn(T, N, C).log_softmax(2).detach().requires_grad_()
    il = torch.randint(max(1, T // 2), T + 1, (N,))
    tl = torch.randint(0, S + 1, (N,))
    tg = torch.randint(1, C, (N, S))
    if flat:
        tg = torch.cat([tg[i, :tl[i]] for i in range(N)])
    lens = (il, tl) if tensor_len else (il.tolist(), tl.tolist())

    def f(lp, tg, *lens):
        lens = [x.to(lp.device) if isinstance(x, torch.Tensor) else x for x in lens]
        return torch.nn.functional.ctc_loss(lp, tg.to(lp.device), *lens, reduction=red,
                                            zero_infinity=zero_inf)
    check(f, lp, tg, *lens, grad=True, atol=1e-5, rtol=1e-5)


# ---- weight norm (the fused interface; wav2vec2-style positional convolutions use it) ----

@pytest.mark.parametrize("shape,dim", [((4, 3, 5), 0), ((4, 3, 5), 2), ((6, 7), 0), ((6, 7), 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, BF])
def test_weight_norm_interface_and_backward(shape, dim, dtype):
    torch.manual_seed(0)
    gshape = [1] * len(shape)
    gshape[dim] = shape[dim]
    v = torch.randn(shape, dtype=dtype, requires_grad=True)
    g = (torch.rand(gshape, dtype=dtype) + 0.5).requires_grad_()
    check(lambda v, g: torch._weight_norm_interface(v, g, dim), v, g)
    # the backward op itself, and through autograd (torch._weight_norm on a 2+-d weight)
    w, n = torch._weight_norm_interface(v.detach(), g.detach(), dim)
    gw = torch.randn(shape, dtype=dtype)
    check(lambda gw, v, g, n: torch.ops.aten._weight_norm_interface_backward(gw, v, g, n, dim),
          gw, v.detach(), g.detach(), n)
    check(lambda v, g: torch._weight_norm(v, g, dim), v, g, grad=True)


def test_weight_norm_parametrized_conv_trains_like_cpu():
    from conftest import grad_mismatches
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(
        torch.nn.Conv1d(6, 6, 5, padding=2, groups=2), name="weight", dim=2)
    tconv = torch.nn.utils.parametrizations.weight_norm(
        torch.nn.Conv1d(6, 6, 5, padding=2, groups=2), name="weight", dim=2).to(TPU)
    tconv.load_state_dict(conv.state_dict())
    x = torch.randn(2, 6, 16)
    before = fallbacks()
    conv(x).square().mean().backward()
    tconv(x.to(TPU)).square().mean().backward()
    assert fallbacks() == before, "an op fell back to the CPU"
    assert grad_mismatches(conv, tconv, rtol=1e-4, atol=1e-5) == []
