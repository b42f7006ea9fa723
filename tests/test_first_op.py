"""The first tpu op of a process does not import torch._dynamo (torch_pjrt/_meta_no_dynamo.py),
and once Dynamo is imported the same Meta kernels behave as PyTorch's wrappers make them."""
import subprocess
import sys

CODE = r"""
import sys, torch, torch_pjrt
x = torch.arange(12.0).reshape(3, 4).to("tpu")
y = (x * 2 + 1).sum(dim=0)
# unary elementwise refs are out_wrapper(type_promotion(_disable_dynamo(ref))): the disable
# layer is reachable only through closure cells, not __wrapped__
z = [f(x) for f in (torch.exp, torch.sin, torch.tanh, torch.sqrt, torch.abs, torch.neg)]
assert "torch._dynamo" not in sys.modules, "the first ops imported torch._dynamo"
torch.testing.assert_close(z[0].cpu(), torch.exp(torch.arange(12.0).reshape(3, 4)))
torch.testing.assert_close(y.cpu(), (torch.arange(12.0).reshape(3, 4) * 2 + 1).sum(dim=0))
import torch._dynamo
f = torch.compile(lambda a, b: torch.relu(a * 3 - b), backend="tpu")
a, b = torch.randn(5, 6), torch.randn(5, 6)
torch.testing.assert_close(f(a.to("tpu"), b.to("tpu")).cpu(), torch.relu(a * 3 - b))
# eager ops after the import still give CPU's results and CPU's errors
torch.testing.assert_close((x - 1).cpu(), torch.arange(12.0).reshape(3, 4) - 1)
try:
    x.add_(torch.ones(3, 4, dtype=torch.complex64, device="tpu"))
except RuntimeError as e:
    assert "can't be cast" in str(e), e
else:
    raise AssertionError("no error")
print("ok")
"""


def test_first_ops_do_not_import_dynamo():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


# Code Dynamo leaves to eager inside a compiled function (here after the graph break at the
# generator) runs under Dynamo's frame hook; its tpu ops call Meta kernels through
# _meta_no_dynamo's _UntilDynamo, whose frames Dynamo must not compile (it did: a graph break
# on the `disable`d function per call, recompiles on each new input rank).
COMPILED = r"""
import copy, torch, torch_pjrt
from torch._dynamo.utils import counters

def loss(outs):  # the model harness's projection loss, as it was
    total = None
    gen = torch.Generator().manual_seed(1234)
    for t in outs:
        w = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.device, t.dtype)
        term = (t * w).sum() / max(1, t.numel())
        total = term if total is None else total + term
    return total

lin = torch.nn.Linear(6, 4)
lin_t = copy.deepcopy(lin).to("tpu")
x = torch.randn(3, 6)
want = loss([torch.tanh(lin(x))])
got = torch.compile(lambda a: loss([torch.tanh(lin_t(a))]))(x.to("tpu"))
assert got.device.type == "tpu" and got.dtype == want.dtype and got.shape == want.shape
torch.testing.assert_close(got.cpu(), want)
bad = [k.splitlines()[0] for k in counters["graph_break"] if "disable" in k or "_meta_no_dynamo" in k]
assert not bad, bad
print("ok")
"""


def test_meta_kernel_wrapper_is_not_compiled_by_dynamo():
    r = subprocess.run([sys.executable, "-c", COMPILED], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr[-3000:]
