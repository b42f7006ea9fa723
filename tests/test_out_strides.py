"""A resized out= tensor of an elementwise op takes the layout CPU's TensorIterator gives it:
the inputs' memory order (permuted, dense), not a plain contiguous resize. Strides, shapes,
dtypes and values are compared with CPU."""
from itertools import permutations

import pytest
import torch

DEV = "tpu"


CASES = [
    ("add", lambda a, b, **kw: torch.add(a, b, **kw), False),
    ("eq", lambda a, b, **kw: torch.eq(a, b, **kw), False),
    ("mul", lambda a, b, **kw: torch.mul(a, b, **kw), False),
    ("exp", lambda a, **kw: torch.exp(a, **kw), True),
    ("neg", lambda a, **kw: torch.neg(a, **kw), True),
]


def _pairs():
    torch.manual_seed(0)
    base = torch.randn(2, 3, 8)
    on_dev = base.to(DEV)
    yield "dense", base[:, :, :4].contiguous(), on_dev[:, :, :4].contiguous()
    yield "sliced", base[:, :, ::2], on_dev[:, :, ::2]


@pytest.mark.parametrize("name,op,unary", CASES, ids=[c[0] for c in CASES])
def test_resized_out_takes_the_inputs_layout(name, op, unary):
    for kind, xc, xt in _pairs():
        for p in permutations(range(3)):
            pc, pt = xc.permute(p), xt.permute(p)
            yc = torch.randn(pc.size(-1))
            yt = yc.to(DEV)
            combos = [((pc,), (pt,))] if unary else [((pc, pc), (pt, pt)), ((pc, yc), (pt, yt)),
                                                      ((yc, pc), (yt, pt))]
            for ci, ti in combos:
                expect = op(*ci, out=torch.empty(0, dtype=op(*ci).dtype))
                got = op(*ti, out=torch.empty(0, dtype=expect.dtype, device=DEV))
                where = f"{name} {kind} perm={p}"
                assert got.shape == expect.shape and got.dtype == expect.dtype, where
                assert got.stride() == expect.stride(), where
                torch.testing.assert_close(got.cpu(), expect, msg=where)


def test_out_of_the_right_shape_keeps_its_strides():
    """CPU restrides only an out= it resizes; one of the right shape keeps its own layout."""
    x = torch.randn(3, 4)
    out_c = torch.empty(4, 3).t()
    out_t = torch.empty(4, 3, device=DEV).t()
    torch.add(x, 1, out=out_c)
    torch.add(x.to(DEV), 1, out=out_t)
    assert out_t.stride() == out_c.stride() == (1, 3)
    torch.testing.assert_close(out_t.cpu(), out_c)


def test_resized_out_of_a_non_elementwise_op_is_contiguous_as_on_cpu():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    out_c = torch.empty(0)
    out_t = torch.empty(0, device=DEV)
    torch.mm(a.t().contiguous().t(), b, out=out_c)
    torch.mm(a.to(DEV).t().contiguous().t(), b.to(DEV), out=out_t)
    assert out_t.stride() == out_c.stride()
    torch.testing.assert_close(out_t.cpu(), out_c)
