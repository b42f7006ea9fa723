"""The per-op precision audit the model harness uses to tell amplified float32 rounding from an
op computed less accurately on tpu (torch_pjrt/models/precision.py)."""
import torch

import torch_pjrt  # noqa: F401
from torch_pjrt.models.precision import OpAudit

LIB = torch.library.Library("pjrt_audit_test", "DEF")
LIB.define("sloppy_exp(Tensor x) -> Tensor")
LIB.define("argmax_last(Tensor x) -> Tensor")
# CPU: the real thing. tpu: exp through bfloat16 (an op less accurate than CPU's), and argmax
# with ties broken toward the last index (CPU's rule is the first).
LIB.impl("sloppy_exp", lambda x: torch.exp(x), "CPU")
LIB.impl("sloppy_exp", lambda x: torch.exp(x.to(torch.bfloat16)).to(x.dtype), "PrivateUse1")
LIB.impl("argmax_last", lambda x: torch.argmax(x, dim=-1), "CPU")
LIB.impl("argmax_last", lambda x: x.shape[-1] - 1 - torch.argmax(x.flip(-1), dim=-1),
         "PrivateUse1")


def _audit(fn, *args):
    audit = OpAudit()
    with audit:
        fn(*args)
    return audit


def test_accurate_ops_are_within_a_few_times_cpu():
    x = torch.randn(64, 64).to("tpu")
    a = _audit(lambda x: (x @ x).exp().sum(), x)
    assert {"mm", "exp", "sum"} <= set(a.ops)
    for w in a.ops.values():
        assert w.ratio < 10, w


def test_a_less_accurate_op_is_flagged():
    x = torch.rand(256).to("tpu")
    a = _audit(torch.ops.pjrt_audit_test.sloppy_exp, x)
    w = a.ops["sloppy_exp"]
    assert w.ratio > 100 and w.tpu_err > 1e-4 and w.cpu_err < 1e-6, w


def test_integer_outputs_must_equal_cpus():
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]]).to("tpu")
    a = _audit(torch.ops.pjrt_audit_test.argmax_last, x)
    assert a.ops["argmax_last"].ratio == float("inf")
    b = _audit(lambda x: torch.argmax(x, dim=-1), x)  # the real op breaks ties as CPU does
    assert b.ops["argmax"].ratio == 0.0


def test_backward_ops_and_in_place_ops_are_audited():
    x = torch.randn(4, 8, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()

    def step(xt):
        y = torch.nn.functional.gelu(xt @ xt.t())
        y.add_(1.0).sum().backward()

    a = _audit(step, xt)
    assert {"gelu_backward", "add_"} <= set(a.ops), set(a.ops)
    assert all(w.ratio < 10 for w in a.ops.values()), a.worst()


def test_random_and_uninitialized_ops_are_not_audited():
    x = torch.randn(16).to("tpu")
    a = _audit(lambda x: (torch.empty_like(x), torch.rand_like(x), torch.nn.functional.dropout(x, 0.5)), x)
    assert not ({"empty_like", "rand_like", "native_dropout", "bernoulli_"} & set(a.ops)), set(a.ops)
