"""CPU reference launcher for TorchTitan 0.3.0's trainer (``torchtitan.train``).

Runs torchtitan's own trainer on plain CPU tensors with the Gloo process group, so that a
run of the same config on the ``tpu`` device can be compared with it loss by loss. Only the
reference (this process) is changed; the tpu run is untouched.

Run it BY PATH as torchrun's per-rank script (``-m torch_pjrt.testing.titan_cpu`` does not
work: importing the ``torch_pjrt`` package registers the tpu device, see
torch_pjrt/__init__.py, and torchtitan would then pick ``tpu``)::

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 PYTHONPATH=/tmp/titan-site \\
    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        torch_pjrt/testing/titan_cpu.py --module llama3 --config llama3_debugmodel ...

Everything after the script path is passed to ``torchtitan.train`` unchanged.

Substitutions (each is the least needed to run on CPU, or for 6, to compare; nothing else is
patched):

1. Device choice. ``torchtitan/tools/utils.py`` sets ``device_type, device_module =
   get_device_info()`` at import, with ``torch._utils._get_available_device_type() or
   "cuda"``: on a CPU-only machine that is ``"cuda"``, and ``Trainer.__init__``
   (torchtitan/trainer.py) fails in ``torch.cuda.set_device``. We make that one call answer
   ``"cpu"`` while torchtitan/tools/utils.py is imported (and restore it right after). Then
   ``get_local_device()`` gives ``cpu:0`` (``torch.cpu.device_count()`` is 1) and
   ``init_distributed`` (torchtitan/distributed/utils.py, ``_get_distributed_backend``)
   picks ``Backend.default_device_backend_map["cpu"]`` = ``"gloo"`` by itself.

2. Device module. ``torch.cpu`` lacks the memory API that
   ``torchtitan/components/metrics.py`` ``DeviceMemoryMonitor`` calls
   (``get_device_name``, ``get_device_properties(...).total_memory``, ``memory_stats``,
   ``reset_peak_memory_stats``, ``empty_cache``). ``torchtitan.tools.utils.device_module``
   is replaced, before any other torchtitan module imports it, by a module that forwards
   everything to ``torch.cpu`` and adds those five (memory stats are empty, so the memory
   columns of the log read -1; they are not compared). It also answers ``current_device()``
   with 0 instead of ``"cpu"``: ``set_pg_timeouts`` (torchtitan/distributed/utils.py, run
   after step 1) calls ``barrier(device_ids=[device_module.current_device()])``, and
   ``device_ids`` must be ints.

3. FlexAttention. torchtitan's language models run attention through
   ``FlexAttention._compiled_flex_attn`` (torchtitan/models/common/attention.py), a
   ``torch.compile``d ``flex_attention``. On CPU, flex_attention has no backward: with
   inputs that require grad, eager and ``torch.compile``d calls both raise in
   ``_validate_device`` (torch/nn/attention/flex_attention.py, "FlexAttention does not
   support backward on CPU"; Inductor's CPU flex template is forward-only).
   ``_compiled_flex_attn`` is replaced by ``_dense_flex_attention`` below: the dense
   formulation of ``math_attention`` in torch/_higher_order_ops/flex_attention.py (scores
   in fp32, score_mod and the BlockMask's mask_mod over full index grids, softmax, @ v,
   GQA by repeat_interleave) written with ordinary differentiable ops, so autograd gives
   the backward. Same semantics as flex_attention: scale defaults to 1/sqrt(E), fully
   masked query rows give output 0 (and lse -inf), lse is returned in natural log when
   ``return_aux.lse`` is asked for. ``set_determinism`` (torchtitan/distributed/utils.py)
   re-assigns ``_compiled_flex_attn`` under ``--debug.deterministic``; it is wrapped to put
   the dense version back.

4. FSDP2 reduce op. Gloo has no ``ReduceOp.PREMUL_SUM`` ("Cannot use ReduceOp.PREMUL_SUM
   with Gloo"). torchtitan's ``apply_fsdp`` calls ``disable_fsdp_gradient_division``
   (torchtitan/distributed/fsdp.py), i.e. ``set_gradient_divide_factor(1.0)``, and for a
   factor other than the group size FSDP2's ``_get_gradient_divide_factors``
   (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) picks
   ``ReduceOp.PREMUL_SUM(1 / factor)`` for the reduce-scatter. That function is wrapped to
   pass ``force_sum_reduction_for_comms=True``: FSDP2's own SUM-only path (the one it always
   takes on MTIA) -- a plain ``ReduceOp.SUM`` and a division by the factor afterwards,
   skipped when the factor is 1. With factor 1.0 the result is the same sum.

5. Uneven all-to-all. Expert parallelism's token exchange goes through spmd_types'
   ``all_to_all`` (spmd_types/_collectives.py), which calls ``torch.distributed.all_to_all``
   with per-rank tensors of different lengths; Gloo's list all-to-all requires equal sizes
   ("ProcessGroupGloo::alltoall: invalid tensor size"). ``all_to_all`` is wrapped so that
   uneven lists over any group go through ``all_to_all_single`` with split sizes, which Gloo
   supports; equal sizes and async calls keep the original.

6. FLUX's device-side random draws (``--module flux`` only). FLUX training draws on the
   training device's generator: the autoencoder's weights, when ``--encoder.random-init`` builds
   it (``load_ae``, torchtitan/models/flux/model/autoencoder.py, under
   ``torch.device(device)``; loading ``ae.safetensors`` instead fails on any device string with
   an index, ``cpu:0`` and ``tpu:0`` alike: safetensors 0.8.0 "device cpu:0 is invalid"), and
   in every step the latent sample (``DiagonalGaussian``'s ``torch.randn_like``), the noise
   (``torch.randn_like``) and the timesteps (``torch.rand``) of
   ``FluxTrainer.forward_backward_step`` (torchtitan/models/flux/trainer.py). Those are inputs,
   not the computation under test, and the CPU's mt19937 gives other numbers than torch_pjrt's
   Philox, so the losses would differ from the first step. The reference takes them from
   torch_pjrt's generator instead: torch_pjrt is imported (after substitution 1 fixed the
   device type at "cpu"), ``torch.manual_seed`` in ``set_determinism`` then seeds it as it seeds
   the tpu run's, the autoencoder is built on ``tpu`` and moved to the CPU, and during
   ``forward_backward_step`` (only: the dataloader's prompt dropout and crops stay on the CPU's
   generator, as on tpu) ``torch.randn_like`` and ``torch.rand`` draw on ``tpu`` and copy the
   result to the CPU. The same seeds and the same draws in the same order give the same bits
   (a Philox counter stream). Everything computed from them is the CPU's. With torch_pjrt
   loaded, the accelerator PyTorch detects is tpu, and ``barrier(device_ids=[i])``
   (``set_pg_timeouts``) would ask the Gloo group for a tpu backend: ``torch.distributed.barrier``
   drops ``device_ids``, so the barrier runs on the CPU, as without torch_pjrt.

Not substituted:

* ``--compile.enable`` is left as given: without it the reference runs eager; with it
  Inductor compiles the model on CPU (the dense attention above is traced into it). Both
  work; eager and compiled references agree to ~1e-5 relative.

Parity needs the same initial weights. torchtitan initializes parameters on the training
device (``Trainer.__init__``: ``to_empty(device=init_device)`` then ``init_weights``), so the
bits come from the device's generator: CPU's mt19937 here, torch_pjrt's Philox-4x32-10
(csrc/ops/random.c) on tpu. On a CPU mesh DTensor's RNG tracker is also off
(``is_rng_supported_mesh`` in torch/distributed/tensor/_random.py wants
``torch.cpu.set_rng_state``, which does not exist), so each rank draws its own shard from
the same seeded stream. Step-1 losses therefore differ by ~1e-2 relative between devices from
``--debug.seed`` alone. Compare from one seed checkpoint instead, made once on CPU with one
process, and loaded by both runs::

    <torchrun --nproc_per_node 1> titan_cpu.py <model args> --checkpoint.enable \\
        --checkpoint.create-seed-checkpoint --dump-folder /tmp/seed
    <both runs> ... --checkpoint.enable --checkpoint.load-only \\
        --checkpoint.initial-load-path /tmp/seed/checkpoint/step-0
"""

from __future__ import annotations

import os
import sys

# torch_pjrt is a torch backend entry point: with autoload on, `import torch` registers the
# tpu device and torchtitan would pick it. Must be set before torch is imported.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

# Run by path, sys.path[0] is torch_pjrt/testing/; drop it so its modules shadow nothing.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import math  # noqa: E402
import runpy  # noqa: E402
import types  # noqa: E402

import torch  # noqa: E402
import torch._utils  # noqa: E402

if "torch_pjrt" in sys.modules:  # pragma: no cover - a setup error, not a test result
    raise RuntimeError(
        "titan_cpu: torch_pjrt is loaded, so torchtitan would pick the tpu device. Run this "
        "file by path (not with -m torch_pjrt.testing.titan_cpu, which imports the "
        "torch_pjrt package) and do not import torch before it"
    )


# --- substitution 1 and 2: device type "cpu" and a CPU device module ------------------------


def _cpu_device_module() -> types.ModuleType:
    mod = types.ModuleType("titan_cpu_device_module")
    mod.__getattr__ = lambda name: getattr(torch.cpu, name)  # type: ignore[attr-defined]

    def get_device_properties(device=None):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            total = 1
        return types.SimpleNamespace(name="cpu", total_memory=total)

    # torch.cpu.current_device() is the string "cpu"; torchtitan's set_pg_timeouts passes
    # it to barrier(device_ids=[...]), which takes ints. The CPU's index is 0.
    mod.current_device = lambda: 0
    mod.get_device_name = lambda device=None: "cpu"
    mod.get_device_properties = get_device_properties
    mod.memory_stats = lambda device=None: {}
    mod.reset_peak_memory_stats = lambda device=None: None
    mod.empty_cache = lambda: None
    return mod


def _select_cpu_device() -> None:
    if "torchtitan.tools.utils" in sys.modules:
        raise RuntimeError("titan_cpu: torchtitan.tools.utils was imported before the patch")
    original = torch._utils._get_available_device_type
    torch._utils._get_available_device_type = lambda: "cpu"
    try:
        import torchtitan.tools.utils as tt_utils
    finally:
        torch._utils._get_available_device_type = original
    assert tt_utils.device_type == "cpu", tt_utils.device_type
    tt_utils.device_module = _cpu_device_module()


# --- substitution 3: differentiable dense flex attention ------------------------------------


def _dense_flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    score_mod=None,
    block_mask=None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    kernel_options=None,
    *,
    return_aux=None,
):
    """flex_attention(q, k, v, ...) on (B, H, L, E) tensors, as plain autograd-able ops."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch.nn.attention.flex_attention import AuxOutput, _vmap_for_bhqkv

    del kernel_options  # tuning knobs of the fused kernel; meaningless here
    B, Hq, L, E = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    if Hq != Hkv:
        if not enable_gqa or Hq % Hkv != 0:
            raise ValueError(f"query heads {Hq} vs key/value heads {Hkv} (enable_gqa={enable_gqa})")
        key = key.repeat_interleave(Hq // Hkv, dim=1)
        value = value.repeat_interleave(Hq // Hkv, dim=1)
    key = key.expand(B, *key.shape[1:])
    value = value.expand(B, *value.shape[1:])
    if scale is None:
        scale = 1.0 / math.sqrt(E)

    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    scores = (query.to(work) @ key.to(work).transpose(-2, -1)) * scale  # (B, H, L, S)

    b = torch.arange(B, device=query.device)
    h = torch.arange(Hq, device=query.device)
    m = torch.arange(L, device=query.device)
    n = torch.arange(S, device=query.device)
    with TransformGetItemToIndex():
        if score_mod is not None:
            scores = _vmap_for_bhqkv(score_mod, prefix=(0,))(scores, b, h, m, n)
        if block_mask is not None:
            keep = _vmap_for_bhqkv(block_mask.mask_mod, prefix=())(b, h, m, n)
            keep = keep.expand(scores.shape)
        else:
            keep = torch.ones_like(scores, dtype=torch.bool)

    # A fully masked row must give output 0 (flex semantics) without NaN in the backward:
    # give it finite scores for the softmax and zero its probabilities afterwards.
    row_empty = ~keep.any(dim=-1, keepdim=True)
    masked = scores.masked_fill(~keep, float("-inf")).masked_fill(row_empty, 0.0)
    probs = torch.softmax(masked, dim=-1).masked_fill(row_empty, 0.0)
    out = probs.to(query.dtype) @ value.to(query.dtype)

    want_lse = return_lse or (return_aux is not None and return_aux.lse)
    lse = None
    if want_lse:
        lse = torch.logsumexp(masked, dim=-1).masked_fill(row_empty.squeeze(-1), float("-inf"))
    if return_aux is not None:
        if getattr(return_aux, "max_scores", False):
            raise NotImplementedError("titan_cpu: max_scores is not provided by the dense path")
        return out, AuxOutput(lse=lse, max_scores=None)
    if return_lse:
        return out, lse
    return out


def _install_dense_flex_attention() -> None:
    import torchtitan.distributed.utils as dist_utils
    from torchtitan.models.common.attention import FlexAttention

    FlexAttention._compiled_flex_attn = staticmethod(_dense_flex_attention)

    original_set_determinism = dist_utils.set_determinism

    def set_determinism(*args, **kwargs):
        result = original_set_determinism(*args, **kwargs)
        FlexAttention._compiled_flex_attn = staticmethod(_dense_flex_attention)
        return result

    set_determinism.__wrapped__ = original_set_determinism  # type: ignore[attr-defined]
    dist_utils.set_determinism = set_determinism


# --- substitution 4: FSDP2 reduce-scatter with ReduceOp.SUM only ---------------------------


def _force_sum_reduction() -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    original = _fsdp_collectives._get_gradient_divide_factors

    def _get_gradient_divide_factors(*args, **kwargs):
        # Positional order in torch 2.14: (reduce_scatter_group, all_reduce_group,
        # reduce_dtype, device_type, factor, force_sum_reduction_for_comms).
        if len(args) >= 6:
            args = (*args[:5], True, *args[6:])
        else:
            kwargs["force_sum_reduction_for_comms"] = True
        return original(*args, **kwargs)

    _get_gradient_divide_factors.__wrapped__ = original  # type: ignore[attr-defined]
    _fsdp_collectives._get_gradient_divide_factors = _get_gradient_divide_factors


# --- substitution 5: list all_to_all with uneven sizes over Gloo ---------------------------


def _uneven_all_to_all_on_gloo() -> None:
    import torch.distributed as dist

    original = dist.all_to_all

    def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
        sizes = {tuple(t.shape) for t in [*output_tensor_list, *input_tensor_list]}
        if async_op or len(sizes) <= 1 or any(t.dim() == 0 for t in input_tensor_list):
            return original(output_tensor_list, input_tensor_list, group=group,
                            async_op=async_op)
        # Gloo's list all_to_all wants equal sizes; its all_to_all_single takes splits
        inp = torch.cat([t.reshape(t.shape[0], -1) for t in input_tensor_list])
        out = inp.new_empty((sum(t.shape[0] for t in output_tensor_list), inp.shape[1]))
        dist.all_to_all_single(out, inp, [t.shape[0] for t in output_tensor_list],
                               [t.shape[0] for t in input_tensor_list], group=group)
        for dst, src in zip(output_tensor_list, out.split([t.shape[0] for t in output_tensor_list])):
            dst.copy_(src.view(dst.shape))
        return None

    all_to_all.__wrapped__ = original  # type: ignore[attr-defined]
    dist.all_to_all = all_to_all


# --- substitution 6: FLUX's device-side random draws from torch_pjrt's generator -----------


def _flux_draws_from_tpu() -> None:
    import threading

    import torch_pjrt  # noqa: F401  (registers tpu; torchtitan's device type is fixed already)
    import torchtitan.models.flux.trainer as flux_trainer

    tpu = torch.device("tpu", 0)
    original_load_ae = flux_trainer.load_ae

    def load_ae(ckpt_path, autoencoder_config, device="cuda", dtype=torch.bfloat16,
                random_init=False):
        if not random_init:
            return original_load_ae(ckpt_path, autoencoder_config, device=device, dtype=dtype)
        ae = original_load_ae(ckpt_path, autoencoder_config, device=tpu, dtype=dtype,
                              random_init=True)
        return ae.to(device)

    in_step = threading.local()
    original_step = flux_trainer.FluxTrainer.forward_backward_step

    def forward_backward_step(self, **kwargs):
        in_step.on = True
        try:
            return original_step(self, **kwargs)
        finally:
            in_step.on = False

    randn_like, rand = torch.randn_like, torch.rand

    def randn_like_from_tpu(x, *args, **kwargs):
        if not getattr(in_step, "on", False) or kwargs.get("device") is not None:
            return randn_like(x, *args, **kwargs)
        return randn_like(x, *args, device=tpu, **kwargs).to(x.device)

    def rand_from_tpu(*args, **kwargs):
        if not getattr(in_step, "on", False) or kwargs.get("device") is not None:
            return rand(*args, **kwargs)
        return rand(*args, device=tpu, **kwargs).to(torch.get_default_device())

    # With torch_pjrt loaded the accelerator is tpu, and barrier(device_ids=[i]) (torchtitan's
    # set_pg_timeouts) asks the Gloo group for a "tpu" backend; without device_ids it takes
    # the CPU, this run's device.
    barrier = torch.distributed.barrier

    def cpu_barrier(group=None, async_op=False, device_ids=None, **kwargs):
        return barrier(group=group, async_op=async_op, **kwargs)

    for f, o in ((load_ae, original_load_ae), (forward_backward_step, original_step),
                 (randn_like_from_tpu, randn_like), (rand_from_tpu, rand),
                 (cpu_barrier, barrier)):
        f.__wrapped__ = o  # type: ignore[attr-defined]
    flux_trainer.load_ae = load_ae
    flux_trainer.FluxTrainer.forward_backward_step = forward_backward_step
    torch.randn_like, torch.rand = randn_like_from_tpu, rand_from_tpu
    torch.distributed.barrier = cpu_barrier


def main() -> None:
    _select_cpu_device()
    _install_dense_flex_attention()
    _force_sum_reduction()
    _uneven_all_to_all_on_gloo()
    args = sys.argv[1:]
    if "flux" in [v for k, v in zip(args, args[1:]) if k == "--module"]:
        _flux_draws_from_tpu()
    sys.argv = ["torchtitan.train", *sys.argv[1:]]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
