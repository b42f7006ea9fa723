"""A Pallas matmul kernel as a PyTorch op, trained through on the tpu device.

    python examples/pallas_kernel.py [--steps 30] [--mode strict|defer_and_fuse|compile]

The kernel is written in Pallas (blocks of the output computed from row and column panels of
the inputs). torch_pjrt.kernels.jax_op exports it with jax.export for the plugin's platform
(on the CPU plugin Pallas runs in interpret mode, which lowers to plain StableHLO; on a TPU it
is a Mosaic kernel) and inlines it into the programs that call it. pallas_call has no
automatic derivative, so the op gets a backward written with the same kernel
(dX = dY W^T, dW = X^T dY). The first step's loss and every parameter's gradient are checked
against the same model built from plain torch ops on CPU; then a small regression trains.
Needs JAX: pip install jax==0.10.2 jaxlib==0.10.2.
"""
import argparse

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

import torch_pjrt  # noqa: F401  (registers the tpu device)
from torch_pjrt import kernels

BLOCK = 16


def _matmul_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def pallas_matmul(x, w):
    m, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        _matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // BLOCK, n // BLOCK),
        in_specs=[pl.BlockSpec((BLOCK, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, BLOCK), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j: (i, j)),
        interpret=kernels.platform() == "cpu",
    )(x, w)


def pallas_matmul_backward(x, w, g):
    return pallas_matmul(g, w.T), pallas_matmul(x.T, g)


matmul = kernels.jax_op("example::pallas_matmul", pallas_matmul, backward=pallas_matmul_backward)


class Net(torch.nn.Module):
    """x -> tanh(x W1 + b1) W2: both products through the Pallas kernel (or plain torch)."""

    def __init__(self, d_in=32, d_hidden=64, d_out=16, pallas=True):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(d_in, d_hidden, generator=g) / d_in ** 0.5)
        self.b1 = torch.nn.Parameter(torch.zeros(d_hidden))
        self.w2 = torch.nn.Parameter(torch.randn(d_hidden, d_out, generator=g) / d_hidden ** 0.5)
        self.pallas = pallas

    def forward(self, x):
        mm = matmul if self.pallas else torch.matmul
        return mm(torch.tanh(mm(x, self.w1) + self.b1), self.w2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--mode", default="strict", choices=["strict", "defer_and_fuse", "compile"])
    args = p.parse_args()
    if args.mode != "compile":
        torch.tpu.set_eager_mode(args.mode)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, generator=g)
    target = torch.sin(x @ torch.randn(32, 16, generator=g))

    ref = Net(pallas=False)
    net = Net().to("tpu")
    step_fn = net if args.mode != "compile" else torch.compile(net, backend="tpu")

    # first step against plain torch on CPU: loss and every parameter's gradient
    loss_ref = torch.nn.functional.mse_loss(ref(x), target)
    loss_ref.backward()
    loss = torch.nn.functional.mse_loss(step_fn(x.to("tpu")), target.to("tpu"))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), loss_ref.detach(), rtol=1e-5, atol=1e-6)
    for (name, pt), (_, pc) in zip(net.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(pt.grad.cpu(), pc.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"gradient of {name}: {m}")
    print(f"step 0: loss {loss.item():.5f} (CPU reference {loss_ref.item():.5f}); "
          "gradients match")

    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    xt, tt = x.to("tpu"), target.to("tpu")
    first = None
    for step in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(step_fn(xt), tt)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            value = loss.item()
            first = value if first is None else first
            print(f"step {step}: loss {value:.5f}")
    assert value < first, "the loss did not decrease"
    print("metrics:", {k: v for k, v in torch.tpu.metrics().items()
                       if k in ("executions", "compiles", "cpu_fallbacks")})


if __name__ == "__main__":
    main()
