"""Custom kernels as PyTorch ops (docs/kernels.md).

- ``jax_op("ns::name", fn)``: a JAX function (jax.numpy, lax, Pallas) as an op, exported with
  ``jax.export`` per input signature, with its ``jax.vjp`` as the backward. Needs JAX.
- ``stablehlo_op("ns::name", module_text, out_shapes_fn)``: a hand-written or generated
  StableHLO module as an op. Works without JAX.

On the tpu device either kind is one ``tpu::kernel_call``, whose lowering inlines the kernel's
functions into the calling program: one program with its neighbours in defer_and_fuse and
torch.compile, cached in memory and on disk under keys that include the kernel's fingerprint.
"""
from .jax_op import jax_op, platform
from .stablehlo import stablehlo_op

__all__ = ["jax_op", "stablehlo_op", "platform"]
