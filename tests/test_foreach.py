"""_foreach_* ops on tpu: one program per call (csrc/ops/foreach.c), values as on CPU, in-place,
functional and out= variants, Scalar[] values as runtime arguments (no recompilation when they
change, as in every optimizer step)."""
import pytest
import torch

TPU = torch.device("tpu")


def lists():
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (5,), (2, 3, 2), ()]
    return [torch.randn(s, generator=g) for s in shapes], [torch.rand(s, generator=g) + 0.5 for s in shapes]


CASES = {
    "add_list_alpha": lambda f, a, b: f._foreach_add(a, b, alpha=2.5),
    "add_scalar": lambda f, a, b: f._foreach_add(a, 3.0),
    "add_scalarlist": lambda f, a, b: f._foreach_add(a, [1.0, 2.0, 3.0, 4.0]),
    "sub_list": lambda f, a, b: f._foreach_sub(a, b),
    "mul_scalar": lambda f, a, b: f._foreach_mul(a, 0.5),
    "mul_tensor": lambda f, a, b: f._foreach_mul(a, b[3]),
    "div_list": lambda f, a, b: f._foreach_div(a, b),
    "maximum_list": lambda f, a, b: f._foreach_maximum(a, b),
    "clamp_min_scalar": lambda f, a, b: f._foreach_clamp_min(a, 0.1),
    "clamp_max_list": lambda f, a, b: f._foreach_clamp_max(a, b),
    "addcmul_scalar": lambda f, a, b: f._foreach_addcmul(a, b, b, value=0.3),
    "addcdiv_scalarlist": lambda f, a, b: f._foreach_addcdiv(a, a, b, [0.1, 0.2, 0.3, 0.4]),
    "lerp_scalar": lambda f, a, b: f._foreach_lerp(a, b, 0.25),
    "lerp_list": lambda f, a, b: f._foreach_lerp(a, b, b),
    "pow_scalar": lambda f, a, b: f._foreach_pow(b, 2.0),
    "pow_list": lambda f, a, b: f._foreach_pow(b, a),
    "sqrt": lambda f, a, b: f._foreach_sqrt(b),
    "neg": lambda f, a, b: f._foreach_neg(a),
    "exp": lambda f, a, b: f._foreach_exp(a),
    "reciprocal": lambda f, a, b: f._foreach_reciprocal(b),
    "sign": lambda f, a, b: f._foreach_sign(a),
}


class _Inplace:
    """Stands in for `torch` in a case so that `_foreach_x(...)` calls `_foreach_x_(...)`."""

    def __getattr__(self, attr):
        return getattr(torch.ops.aten, attr + "_")


# cases whose in-place variant writes the second list (the first argument there)
_WRITES_SECOND = {"pow_scalar", "sqrt", "reciprocal"}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("variant", ["functional", "inplace"])
def test_foreach_matches_cpu(name, variant):
    a, b = lists()
    ta, tb = [x.to(TPU) for x in a], [x.to(TPU) for x in b]
    fn = CASES[name]
    if variant == "functional":
        want = fn(torch, a, b)
        before = torch.tpu.metrics()["executions"]
        got = fn(torch, ta, tb)
        assert torch.tpu.metrics()["executions"] - before == 1  # the whole list, one program
    else:
        fn(_Inplace(), a, b)
        fn(_Inplace(), ta, tb)
        got, want = (tb, b) if name in _WRITES_SECOND else (ta, a)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device.type == "tpu" and g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w)


def test_foreach_scalarlist_values_do_not_recompile():
    a, b = lists()
    ta, tb = [x.to(TPU) for x in a], [x.to(TPU) for x in b]
    torch._foreach_addcdiv_(ta, ta, tb, [0.1, 0.2, 0.3, 0.4])
    m0 = torch.tpu.metrics()
    torch._foreach_addcdiv_(ta, ta, tb, [-1.0, 2.0, 7.5, 0.001])
    m1 = torch.tpu.metrics()
    assert m1["compiles"] == m0["compiles"]
    ref = [x.clone() for x in a]
    torch._foreach_addcdiv_(ref, ref, b, [0.1, 0.2, 0.3, 0.4])
    torch._foreach_addcdiv_(ref, ref, b, [-1.0, 2.0, 7.5, 0.001])
    for g, w in zip(ta, ref):
        torch.testing.assert_close(g.cpu(), w)


def test_foreach_optimizer_default_path_one_program_per_foreach():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ref.load_state_dict(model.state_dict())
    model.to(TPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=True)
    x = torch.randn(4, 8)
    for _ in range(3):
        for m, o, inp in ((model, opt, x.to(TPU)), (ref, ropt, x)):
            o.zero_grad()
            m(inp).square().sum().backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    assert not any("foreach" in op for op in torch.tpu.fallback_ops())
