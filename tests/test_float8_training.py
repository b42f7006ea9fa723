"""float8 training through torchao's Float8Linear (what torchtitan's float8 option applies) on
tpu, against the same on CPU: tensorwise and rowwise scaling, eager and compiled (plain
torch.compile), the output and every parameter's gradient. Its matmuls are torch._scaled_mm."""
import copy

import pytest
import torch

float8 = pytest.importorskip("torchao.float8", reason="torchao is installed by scripts/test.sh "
                             "(requirements-test-nodeps.txt)")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(128, 32, bias=False))


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_linear_forward_and_gradients_match_cpu(recipe, compiled, fallbacks):
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    cpu = float8.convert_to_float8_training(_model(), config=config)
    tpu = float8.convert_to_float8_training(copy.deepcopy(_model()).to("tpu"), config=config)
    assert type(tpu[0]).__name__ == "Float8Linear"
    run = torch.compile(tpu) if compiled else tpu
    torch._dynamo.reset()
    ref = cpu(x)
    ref.pow(2).sum().backward()
    before = torch.tpu.metrics()["graph_runs"]
    for _ in range(2):  # the second step replays what the first captured
        for p in tpu.parameters():
            p.grad = None
        out = run(x.to("tpu"))
        out.pow(2).sum().backward()
    if compiled:
        assert torch.tpu.metrics()["graph_runs"] - before >= 4  # forward and backward, twice
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(tpu.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5, msg=name)
    fallbacks.assert_none("float8 training")
