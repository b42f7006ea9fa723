"""Gamma, Dirichlet and Poisson sampling on tpu (torch_pjrt/distribution_ops.py): no CPU fallback, the
distribution CPU samples (a two-sample Kolmogorov-Smirnov test against CPU's own samples, and
the known mean and variance), CPU's edge values, and reproducibility under a seed."""
import pytest
import torch

TPU = torch.device("tpu")


def _ks(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.sort().values, b.sort().values
    grid = torch.cat([a, b])
    fa = torch.searchsorted(a, grid, right=True) / len(a)
    fb = torch.searchsorted(b, grid, right=True) / len(b)
    return float((fa - fb).abs().max())


@pytest.mark.parametrize("alpha", [0.05, 0.4, 1.0, 2.5, 40.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gamma_samples_have_cpus_distribution(alpha, dtype):
    n = 40000
    before = dict(torch.tpu.fallback_ops())
    torch.manual_seed(0)
    got = torch._standard_gamma(torch.full((n,), alpha, dtype=dtype, device=TPU)).cpu()
    want = torch._standard_gamma(torch.full((n,), alpha, dtype=dtype))
    assert got.dtype == dtype and got.shape == (n,)
    assert torch.tpu.fallback_ops() == before
    # two samples of 40000 from one distribution: KS above 0.015 has probability < 1e-4
    assert _ks(got, want) < 0.015
    assert abs(got.mean().item() - alpha) < 6 * (alpha / n) ** 0.5  # variance alpha
    assert (got > 0).all()


def test_gamma_edge_values_match_cpu():
    a = torch.tensor([0.0, 1e-30, float("nan"), float("inf"), -1.0, -float("inf")])
    for dtype in (torch.float32, torch.float64):
        want = torch._standard_gamma(a.to(dtype))
        got = torch._standard_gamma(a.to(dtype).to(TPU)).cpu()
        assert torch.equal(got, want), (dtype, got, want)


def test_gamma_is_reproducible_under_a_seed_and_takes_a_generator():
    a = torch.rand(3, 7, device=TPU) * 3
    torch.manual_seed(11)
    x = torch._standard_gamma(a).cpu()
    torch.manual_seed(11)
    y = torch._standard_gamma(a).cpu()
    assert torch.equal(x, y) and x.shape == (3, 7)
    g = torch.Generator(device=TPU)
    g.manual_seed(4)
    u = torch._standard_gamma(a, generator=g).cpu()
    g.manual_seed(4)
    assert torch.equal(torch._standard_gamma(a, generator=g).cpu(), u)
    z = torch.distributions.Gamma(a, 2.0).sample()
    assert z.device.type == "tpu" and z.shape == (3, 7)


def test_integer_concentration_raises_like_cpu():
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch._standard_gamma(torch.ones(2, dtype=torch.int64))
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch._standard_gamma(torch.ones(2, dtype=torch.int64, device=TPU))


def test_dirichlet_and_beta_samples_on_tpu():
    before = dict(torch.tpu.fallback_ops())
    conc = torch.tensor([0.5, 1.0, 3.0])
    torch.manual_seed(0)
    got = torch.distributions.Dirichlet(conc.to(TPU)).sample((30000,)).cpu()
    want = torch.distributions.Dirichlet(conc).sample((30000,))
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.sum(-1), torch.ones(30000))
    for k in range(3):
        assert _ks(got[:, k], want[:, k]) < 0.02
    beta = torch.distributions.Beta(torch.tensor([2.0], device=TPU),
                                    torch.tensor([5.0], device=TPU)).sample((20000,)).cpu()
    assert abs(beta.mean().item() - 2 / 7) < 0.005
    assert torch.tpu.fallback_ops() == before
    # CPU's edge rule: zero concentrations split evenly, results at least the smallest normal
    edge = torch.tensor([[0.0, 0.0], [1e-30, 1e-30]])
    assert torch.equal(torch._sample_dirichlet(edge.to(TPU)).cpu(), torch._sample_dirichlet(edge))


@pytest.mark.parametrize("rate", [0.0, 0.3, 4.0, 9.99, 10.0, 60.0, 1e5])
def test_poisson_samples_have_cpus_distribution(rate):
    n = 40000
    before = dict(torch.tpu.fallback_ops())
    torch.manual_seed(0)
    got = torch.poisson(torch.full((n,), rate, device=TPU)).cpu()
    want = torch.poisson(torch.full((n,), rate))
    assert got.dtype == torch.float32 and torch.equal(got, got.round()) and (got >= 0).all()
    assert torch.tpu.fallback_ops() == before
    assert _ks(got, want) < 0.015
    assert abs(got.mean().item() - rate) <= 6 * (rate / n) ** 0.5


def test_poisson_rejects_negative_and_nan_rates_like_cpu():
    for bad in (-1.0, float("nan")):
        for dev in ("cpu", TPU):
            with pytest.raises(RuntimeError, match="expected rate to be non-negative"):
                torch.poisson(torch.tensor([1.0, bad], device=dev))
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.poisson(torch.ones(2, dtype=torch.int64, device=TPU))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_samples_stay_positive(dtype):
    # computed in float32; the floor is the smallest normal number of the result's dtype (a
    # float32 floor would round to zero in float16)
    a = torch.tensor([0.0, 1e-3, 0.5, 3.0], dtype=dtype, device=TPU)
    g = torch._standard_gamma(a).cpu()
    assert g.dtype == dtype and (g >= torch.finfo(dtype).tiny).all()
    d = torch._sample_dirichlet(torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=dtype, device=TPU))
    assert d.dtype == dtype and (d.cpu() > 0).all()
