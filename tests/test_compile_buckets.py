"""torch.compile(backend="tpu", options={"buckets": ...}) against PyTorch on CPU: padded calls
give the unpadded values, shapes, strides and dtypes (inference and every parameter's gradient
in training), the number of captured programs is the number of buckets hit (so the padded
program really ran), Dynamo traces one graph, graphs that cannot be cut back exactly are
refused with ValueError, and the option is validated."""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from conftest import grad_mismatches
from torch_pjrt import _models

TPU = torch.device("tpu")
VOCAB = 20


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def captures() -> int:
    return int(torch.tpu.metrics()["graph_captures"])


def dynamo_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def buckets(sizes, dims, **kw):
    return {"buckets": {"sizes": sizes, "dims": dims, **kw}}


def assert_same(got: torch.Tensor, want: torch.Tensor, rtol=1e-5, atol=1e-6):
    assert got.device.type == "tpu"
    assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype), (
        got.shape, got.stride(), got.dtype, want.shape, want.stride(), want.dtype)
    torch.testing.assert_close(got.cpu(), want, rtol=rtol, atol=atol)


def bucket_of(n, sizes):
    return next((b for b in sizes if b >= n), n)  # above the largest bucket: n itself


def tiny_gpt(seed):
    # block 64 >= every length and bucket used below (positions index an embedding of 64)
    return _models.init_weights(_models.TinyGPT(VOCAB, block=64, tie_head=True), seed=seed)


# ---- inference ----


@pytest.mark.long
def test_causal_lm_sequence_buckets_inference(fallbacks):
    cpu = tiny_gpt(1).eval()
    sizes = [8, 16, 32]
    cm = torch.compile(copy.deepcopy(cpu).to(TPU), backend="tpu", dynamic=True,
                       options=buckets(sizes, {"idx": 1}))
    lengths = list(range(3, 41))  # 33..40 are above the largest bucket: unpadded
    g = torch.Generator().manual_seed(1)
    before = captures()
    with torch.no_grad():
        for n in lengths:
            idx = torch.randint(0, VOCAB, (2, n), generator=g)
            assert_same(cm(idx.to(TPU)), cpu(idx))
    programs = {bucket_of(n, sizes) for n in lengths}
    assert programs == {8, 16, 32, *range(33, 41)}
    assert captures() - before == len(programs) < len(lengths)
    assert dynamo_graphs() == 1
    fallbacks.assert_none("bucketed inference")


def test_batch_and_sequence_buckets_of_one_argument():
    cpu = tiny_gpt(2).eval()
    sizes = [4, 8]
    cm = torch.compile(copy.deepcopy(cpu).to(TPU), backend="tpu", dynamic=True,
                       options=buckets(sizes, {"idx": [0, -1]}, value=3))
    shapes = [(2, 3), (3, 5), (4, 7), (2, 8), (5, 6), (3, 10)]
    g = torch.Generator().manual_seed(2)
    before = captures()
    with torch.no_grad():
        for b, n in shapes:
            idx = torch.randint(0, VOCAB, (b, n), generator=g)
            assert_same(cm(idx.to(TPU)), cpu(idx))
    programs = {(bucket_of(b, sizes), bucket_of(n, sizes)) for b, n in shapes}
    assert programs == {(4, 4), (4, 8), (8, 8), (4, 10)}
    assert captures() - before == len(programs)
    assert dynamo_graphs() == 1


def test_mark_dynamic_batch_buckets_float_input_several_outputs():
    cpu = _models.init_weights(_models.MLP(), seed=3).eval()
    tpu = copy.deepcopy(cpu).to(TPU)

    def f(x, scale):
        h = tpu.net[0](x)
        # several outputs: a transposed one (cut along its last dim, a view with the unpadded
        # strides), the batch size as an int, a value not depending on the batch
        return tpu(x) * scale, h.t(), x.shape[0], scale * 2

    def ref(x, scale):
        return cpu(x) * scale, cpu.net[0](x).t(), x.shape[0], scale * 2

    cf = torch.compile(f, backend="tpu", options=buckets([4, 8], {"x": 0}))
    scale = torch.randn(10)
    g = torch.Generator().manual_seed(3)
    before = captures()
    with torch.no_grad():
        for b in (3, 2, 4, 6, 5, 7):
            x = torch.randn(b, 32, generator=g)
            xt = x.to(TPU)
            torch._dynamo.mark_dynamic(xt, 0)
            got, want = cf(xt, scale.to(TPU)), ref(x, scale)
            for k in (0, 1, 3):
                assert_same(got[k], want[k])
            assert got[2] == b and type(got[2]) is int
    assert captures() - before == 2 and dynamo_graphs() == 1


# ---- training ----


@pytest.mark.long
def test_causal_lm_sequence_buckets_training_gradients(fallbacks):
    cpu = tiny_gpt(4)
    tpu = copy.deepcopy(cpu).to(TPU)
    sizes = [8, 16]
    cm = torch.compile(tpu, backend="tpu", dynamic=True, options=buckets(sizes, {"idx": 1}))
    lengths = (3, 5, 8, 11, 16, 7, 13, 20)
    g = torch.Generator().manual_seed(4)
    before = captures()
    problems = []
    for n in lengths:
        idx = torch.randint(0, VOCAB, (2, n), generator=g)
        tgt = torch.randint(0, VOCAB, (2, n), generator=g)
        cpu.zero_grad()
        tpu.zero_grad()
        # the loss is outside the compiled model: its view() needs the cut-back logits to have
        # the unpadded strides
        want = F.cross_entropy(cpu(idx).view(-1, VOCAB), tgt.view(-1))
        want.backward()
        got = F.cross_entropy(cm(idx.to(TPU)).view(-1, VOCAB), tgt.to(TPU).view(-1))
        got.backward()
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6)
        # the tolerance of the other training tests (tests/test_compile.py)
        problems += [f"length {n}: {p}" for p in grad_mismatches(cpu, tpu, rtol=1e-4, atol=1e-5)]
    assert not problems, "\n".join(problems[:10])
    programs = {bucket_of(n, sizes) for n in lengths}  # {8, 16, 20}
    # one forward and one backward program per bucket
    assert captures() - before == 2 * len(programs) and len(programs) < len(lengths)
    assert dynamo_graphs() == 1
    fallbacks.assert_none("bucketed training")


def test_gradient_of_a_padded_float_input():
    w = torch.randn(6, 4)

    def f(x, w):
        return (x @ w).cumsum(0).tanh()  # cumsum along the padded dim: causal

    cf = torch.compile(f, backend="tpu", dynamic=True, options=buckets([8], {"x": 0}, value=-1.0))
    g = torch.Generator().manual_seed(5)
    for n in (3, 5):
        x = torch.randn(n, 6, generator=g, requires_grad=True)
        xt = x.detach().to(TPU).requires_grad_()
        wt = w.to(TPU).requires_grad_()
        wc = w.clone().requires_grad_()
        f(x, wc).square().sum().backward()
        cf(xt, wt).square().sum().backward()
        assert_same(xt.grad, x.grad, rtol=1e-5, atol=1e-5)
        assert_same(wt.grad, wc.grad, rtol=1e-5, atol=1e-5)


# ---- where padding does not apply ----


def test_guards_invalid_at_the_bucket_size_run_unpadded():
    def f(x):  # traced for n <= 10: the graph's guards exclude the bucket size 16
        return x * 2 if x.shape[1] <= 10 else x * 3

    cf = torch.compile(f, backend="tpu", dynamic=True, options=buckets([16], {"x": 1}))
    before = captures()
    for n in (3, 4, 5, 6):
        x = torch.randn(2, n)
        assert_same(cf(x.to(TPU)), f(x))
    assert captures() - before == 4


def test_static_dim_is_not_padded():
    cf = torch.compile(lambda x: x.cumsum(1), backend="tpu", dynamic=False,
                       options=buckets([16], {"x": 1}))
    for n in (3, 5):
        x = torch.randn(2, n)
        assert_same(cf(x.to(TPU)), x.cumsum(1))


def test_name_that_is_not_an_argument_warns_and_pads_nothing():
    cf = torch.compile(lambda x: x.cumsum(1), backend="tpu", dynamic=True,
                       options=buckets([16], {"y": 1}))
    before = captures()
    with pytest.warns(UserWarning, match=r"<lambda>\(x\) .* has no argument 'y'"):
        for n in (3, 4):
            x = torch.randn(2, n)
            assert_same(cf(x.to(TPU)), x.cumsum(1))
    assert captures() - before == 2


def test_graph_after_a_graph_break_is_not_padded():
    def f(x):
        y = x.cumsum(1)
        torch._dynamo.graph_break()
        return y * 2 + x  # the resumed frame gets y and x as locals

    cf = torch.compile(f, backend="tpu", dynamic=True, options=buckets([16], {"x": 1}))
    before = captures()
    for n in (3, 4, 5):
        x = torch.randn(2, n)
        assert_same(cf(x.to(TPU)), f(x))
    # the first graph: one padded program; the resumed one: a program per length
    assert captures() - before == 1 + 3
    assert dynamo_graphs() == 2


# ---- graphs that cannot be cut back exactly: refused ----


def value_error(call) -> ValueError:
    """The ValueError `call()` raises in the backend (Dynamo wraps backend errors)."""
    with pytest.raises(Exception) as info:
        call()
    e = info.value
    while e is not None and not isinstance(e, ValueError):
        e = getattr(e, "inner_exception", None) or e.__cause__
    assert e is not None, f"no ValueError in {info.value!r}"
    return e


def compile_error(fn, *args, dims) -> ValueError:
    cf = torch.compile(fn, backend="tpu", dynamic=True, options=buckets([16], dims))
    return value_error(lambda: cf(*args))


def x25():
    return torch.randn(2, 5, device=TPU)


@pytest.mark.parametrize("fn, match", [
    (lambda x: x.sum(1), "output 0 .* has no dim of that size"),
    (lambda x: F.cross_entropy(x, torch.zeros(2, dtype=torch.long, device=x.device)),
     "output 0 .* has no dim of that size"),
    (lambda x: x[:, -1] * 1, "output 0 .* has no dim of that size"),
    (lambda x: torch.cat([x, x], 1) * 1, r"output 0 .* has size 2\*s"),
    (lambda x: (x * 2, x.shape[1] * 2), r"output 1 .* involves a padded size"),
    (lambda x: x.add_(1) * 2, "mutates input"),
    (lambda x: x[:, 1:], "view of padded argument"),
])
def test_outputs_that_cannot_be_cut_back_are_refused(fn, match):
    with pytest.raises(ValueError, match=match):
        raise compile_error(fn, x25(), dims={"x": 1})


def test_undeclared_inputs_sharing_the_padded_size_are_refused():
    def f(x, mask):
        return x * mask

    mask = torch.ones(2, 5, device=TPU)
    with pytest.raises(ValueError, match="mask.* dim 1 .* declare that dim"):
        raise compile_error(f, x25(), mask, dims={"x": 1})
    # declared: padded together, and exact
    cf = torch.compile(f, backend="tpu", dynamic=True, options=buckets([16], {"x": 1, "mask": 1}))
    x, m = torch.randn(2, 7), torch.rand(2, 7)
    assert_same(cf(x.to(TPU), m.to(TPU)), x * m)


def test_int_argument_equal_to_the_padded_size_is_refused():
    # x[:, :n] with n == x.shape[1] makes Dynamo's shape environment replace n's symbol by
    # x's size: the bucket size cannot replace the caller's n
    with pytest.raises(ValueError, match="int input .*n.* involves a padded size"):
        raise compile_error(lambda x, n: x[:, :n] * n, x25(), 5, dims={"x": 1})
    # an int of its own symbol keeps its value, and the graph is padded
    cf = torch.compile(lambda x, n: x.cumsum(1) * n, backend="tpu", dynamic=True,
                       options=buckets([16], {"x": 1}))
    before = captures()
    for length in (5, 6, 7):
        x = torch.randn(2, length)
        assert_same(cf(x.to(TPU), 3), x.cumsum(1) * 3)
    assert captures() - before == 1


def test_non_contiguous_padded_argument_is_refused():
    with pytest.raises(ValueError, match="not contiguous"):
        raise compile_error(lambda x: x * 2, torch.randn(5, 2, device=TPU).t(), dims={"x": 1})


@pytest.mark.parametrize("dims, match", [
    ({"x": 2}, "dim 2 of argument 'x' is out of range"),
    ({"x": [1, -1]}, "lists dim 1 twice"),
])
def test_dims_checked_against_the_graph(dims, match):
    with pytest.raises(ValueError, match=match):
        raise compile_error(lambda x: x * 2, x25(), dims=dims)


# ---- option validation ----


@pytest.mark.parametrize("spec, match", [
    ([8, 16], "must be a dict"),
    ({"sizes": [8], "dims": {"x": 0}, "pad": 0}, "unknown key.*'pad'"),
    ({"dims": {"x": 0}}, "'sizes' is required"),
    ({"sizes": [8]}, "'dims' is required"),
    ({"sizes": [], "dims": {"x": 0}}, "non-empty list of positive ints"),
    ({"sizes": [8, 0], "dims": {"x": 0}}, "non-empty list of positive ints"),
    ({"sizes": [8, 8.5], "dims": {"x": 0}}, "non-empty list of positive ints"),
    ({"sizes": [16, 8], "dims": {"x": 0}}, "strictly increasing"),
    ({"sizes": [8, 8], "dims": {"x": 0}}, "strictly increasing"),
    ({"sizes": [8], "dims": {}}, "non-empty dict"),
    ({"sizes": [8], "dims": {0: 1}}, "keys are argument names"),
    ({"sizes": [8], "dims": {"x": "1"}}, "an int or a non-empty list of ints"),
    ({"sizes": [8], "dims": {"x": []}}, "an int or a non-empty list of ints"),
    ({"sizes": [8], "dims": {"x": 0}, "value": "0"}, "'value'.* must be a number"),
])
def test_option_validation(spec, match):
    cf = torch.compile(lambda x: x + 1, backend="tpu", options={"buckets": spec})
    with pytest.raises(ValueError, match=match):
        raise value_error(lambda: cf(torch.ones(2, device=TPU)))
