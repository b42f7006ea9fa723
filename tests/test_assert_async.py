"""torch._assert_async on tpu (torch.compile emits it for torch._check-style tensor assertions;
Hugging Face's dbrx and gemma4 vision models hit it compiled): CPU's outcome and message for
every case, no CPU fallback, eagerly and inside a compiled function."""
import pytest
import torch

import torch_pjrt  # noqa: F401

CASES = [(torch.tensor(True), "boom"), (torch.tensor(3), "boom"), (torch.tensor(0), "boom"),
         (torch.tensor(0.0), None), (torch.tensor(2.5), None), (torch.tensor([1, 1]), "x"),
         (torch.tensor([]), "x"), (torch.tensor(False), "")]


def _outcome(t, msg):
    try:
        torch._assert_async(t) if msg is None else torch._assert_async(t, msg)
        return None
    except Exception as e:  # noqa: BLE001 - the outcome is compared, whatever it is
        return type(e), str(e).splitlines()[0]


@pytest.mark.parametrize("t,msg", CASES)
def test_assert_async_as_cpu(t, msg):
    before = dict(torch.tpu.fallback_ops())
    assert _outcome(t.to("tpu"), msg) == _outcome(t, msg)
    assert dict(torch.tpu.fallback_ops()) == before


def test_assert_async_in_a_compiled_function():
    def f(x):
        torch._assert_async((x > 0).all(), "x must be positive")
        return x * 2

    cf = torch.compile(f, backend="tpu")
    before = dict(torch.tpu.fallback_ops())
    x = torch.arange(1.0, 5.0)
    assert torch.equal(cf(x.to("tpu")).cpu(), f(x))
    with pytest.raises(RuntimeError, match="x must be positive"):
        cf(-x.to("tpu"))
    assert dict(torch.tpu.fallback_ops()) == before
