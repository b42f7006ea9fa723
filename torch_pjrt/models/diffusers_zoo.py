"""Diffusers: a tiny UNet2DConditionModel (cross-attention UNet, as in Stable Diffusion) and a
tiny DiTTransformer2DModel (forward + one training step each), and a tiny DDPMPipeline (UNet2D
plus DDPMScheduler) running a few denoising steps that must give CPU's image. Noise comes from a
CPU generator in every case, so both devices denoise the same noise."""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from .compare import SEED, Case

ZOO = "diffusers"
BATCH = 2


def available() -> Tuple[bool, str]:
    try:
        import diffusers  # noqa: F401
    except Exception as e:
        return False, (f"diffusers does not import: {type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''}")
    return True, ""


def _unet_cond():
    from diffusers import UNet2DConditionModel
    return UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32), norm_num_groups=8, cross_attention_dim=16,
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))


def _unet_cond_inputs(gen: torch.Generator) -> Dict[str, torch.Tensor]:
    return {"sample": torch.randn(BATCH, 4, 16, 16, generator=gen),
            "timestep": torch.tensor([10, 500]),
            "encoder_hidden_states": torch.randn(BATCH, 5, 16, generator=gen)}


def _dit():
    from diffusers import DiTTransformer2DModel
    return DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2,
        sample_size=8, patch_size=2, num_embeds_ada_norm=1000, norm_num_groups=8)


def _dit_inputs(gen: torch.Generator) -> Dict[str, torch.Tensor]:
    return {"hidden_states": torch.randn(BATCH, 4, 8, 8, generator=gen),
            "timestep": torch.tensor([3, 700]),
            "class_labels": torch.tensor([1, 7])}


def _ddpm(device: torch.device) -> Dict[str, torch.Tensor]:
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
    torch.manual_seed(SEED)
    unet = UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(16, 32), norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    pipe = DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=1000)).to(device)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        out = pipe(batch_size=1, generator=torch.Generator().manual_seed(1),
                   num_inference_steps=4, output_type="np")
    return {"image": torch.from_numpy(out.images.copy())}


CASES = {
    "unet2d_condition": lambda: Case(zoo=ZOO, name="unet2d_condition", build=_unet_cond,
                                     inputs=_unet_cond_inputs,
                                     info={"class": "UNet2DConditionModel"}),
    "dit_transformer2d": lambda: Case(zoo=ZOO, name="dit_transformer2d", build=_dit,
                                      inputs=_dit_inputs, info={"class": "DiTTransformer2DModel"}),
    "ddpm_pipeline": lambda: Case(zoo=ZOO, name="ddpm_pipeline", pipeline=_ddpm,
                                  info={"class": "DDPMPipeline", "steps": 4}),
}


def names() -> List[str]:
    return list(CASES)


def make_case(name: str) -> Case:
    return CASES[name]()
