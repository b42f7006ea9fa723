"""torch.set_float32_matmul_precision on the tpu device: float32 products (matmuls and
convolutions) carry the precision as their precision_config, HIGHEST under PyTorch's default
"highest", so that GPU and TPU plugins compute full float32 products as CPU does (XLA's GPU
compiler otherwise runs them in TF32, the TPU one in one bfloat16 pass: seen on an H200, a
float32 mm 1e-4 away from CPU's). The CPU plugin computes float32 either way; what is tested
here is the programs' text and that a change of the setting reaches programs already cached.
"""
import pytest
import torch

from conftest import EAGER_MODES, TPU, delta, metrics
from torch_pjrt.compile.export import export_stablehlo


@pytest.fixture
def restore_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


class LinearAndConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.conv = torch.nn.Conv1d(2, 2, 3)

    def forward(self, x, y):
        return self.lin(x), self.conv(y)


@pytest.mark.parametrize("setting, config", [("highest", "HIGHEST"), ("high", "HIGH"),
                                             ("medium", None)])
def test_float32_products_carry_the_precision(setting, config, restore_precision):
    ep = torch.export.export(LinearAndConv(), (torch.randn(3, 8), torch.randn(1, 2, 5)))
    torch.set_float32_matmul_precision(setting)
    text = export_stablehlo(ep).text
    configs = [line.split("precision_config = ")[1].split("]")[0] for line in text.splitlines()
               if "precision_config" in line]
    if config is None:  # the plugin's default precision
        assert configs == []
    else:  # one dot_general, one convolution, each naming both operands
        assert configs == [f"[#stablehlo<precision {config}>, #stablehlo<precision {config}>"] * 2


def test_other_dtypes_carry_no_precision(restore_precision):
    torch.set_float32_matmul_precision("highest")
    model = LinearAndConv().to(torch.bfloat16)
    ep = torch.export.export(model, (torch.randn(3, 8, dtype=torch.bfloat16),
                                     torch.randn(1, 2, 5, dtype=torch.bfloat16)))
    assert "precision_config" not in export_stablehlo(ep).text


def test_eager_programs_follow_a_change_of_the_setting(mode, restore_precision):
    """A program cached (and memoized) under one setting is not reused under another; going
    back finds the first one again. Values equal CPU's under every setting here (the CPU plugin
    computes float32 products in float32 whatever the config says)."""
    k = 7 + EAGER_MODES.index(mode)  # a shape of its own: no other mode's programs are reused
    a, b = torch.randn(5, k), torch.randn(k, 3)
    expected = a @ b  # on CPU, under the default "highest"
    at, bt = a.to(TPU), b.to(TPU)
    torch.set_float32_matmul_precision("highest")
    torch.mm(at, bt).cpu()  # built (and memoized) under "highest"
    m0 = metrics()
    r_highest = torch.mm(at, bt).cpu()
    assert delta(m0, metrics()).get("cache_misses", 0) == 0
    torch.set_float32_matmul_precision("medium")
    m1 = metrics()
    r_medium = torch.mm(at, bt).cpu()
    assert delta(m1, metrics()).get("cache_misses", 0) >= 1, "the 'highest' program was reused"
    torch.set_float32_matmul_precision("highest")
    m2 = metrics()
    r_again = torch.mm(at, bt).cpu()
    assert delta(m2, metrics()).get("cache_misses", 0) == 0
    for r in (r_highest, r_medium, r_again):
        torch.testing.assert_close(r, expected)


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_graphs_follow_a_change_of_the_setting(restore_precision):
    """Dynamo guards on the setting: a change recompiles, and the new capture's programs carry
    the new precision (a new capture, not the cached one). Going back reuses the first."""
    f = torch.compile(lambda a, b: torch.relu(a @ b), backend="tpu")
    a, b = torch.randn(6, 9), torch.randn(9, 2)
    expected = torch.relu(a @ b)
    at, bt = a.to(TPU), b.to(TPU)
    torch.set_float32_matmul_precision("highest")
    m0 = metrics()
    r1 = f(at, bt).cpu()
    torch.set_float32_matmul_precision("medium")
    r2 = f(at, bt).cpu()
    torch.set_float32_matmul_precision("highest")
    r3 = f(at, bt).cpu()
    d = delta(m0, metrics())
    assert d.get("graph_captures", 0) == 2 and d.get("graph_captures_broken", 0) == 0, d
    for r in (r1, r2, r3):
        torch.testing.assert_close(r, expected)
