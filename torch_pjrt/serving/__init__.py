"""Serving front ends over the `tpu` device (vLLM: torch_pjrt.serving.vllm)."""
