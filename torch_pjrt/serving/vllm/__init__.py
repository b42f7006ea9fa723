"""A vLLM platform plugin that serves models on torch_pjrt's `tpu` device.

vLLM finds `register` through the `vllm.platform_plugins` entry point (pyproject.toml). It
returns the platform's class path when a `tpu` device is usable and None otherwise, so an
installation without a device leaves vLLM's own platform detection alone.

Layout: platform.py (the Platform: config, devices, attention backend choice), worker.py
(device init, memory, warm-up), model_runner.py (vLLM's V1 GPUModelRunner on `tpu`, slot
mapping in torch), step_capture.py (a compiled decode step as one captured program),
attention.py (the fused paged-attention ops and their per-step metadata)."""


def register():
    try:
        import torch
        import torch_pjrt  # noqa: F401  (loads the device even with autoload off)

        if not (hasattr(torch, "tpu") and torch.tpu.is_available()):
            return None
    except Exception:  # a broken or absent build: not our platform
        return None
    return "torch_pjrt.serving.vllm.platform.TpuPlatform"
