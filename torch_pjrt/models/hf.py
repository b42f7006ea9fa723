"""Hugging Face Transformers: every model type of the installed library, built from its default
config shrunk to a tiny size, through the first auto class (in the order of TASKS) that builds on
CPU and takes inputs we can synthesize.

Shrinking is generic, by config attribute name (SHRINK_INT and the list rules in `_shrink_one`),
recursing into sub-configs (text/vision/audio/encoder/decoder); OVERRIDES holds the few
per-architecture corrections. Parameters are counted on the meta device before anything is
allocated, so a config the rules failed to shrink is skipped as too large instead of filling
memory. Nothing downloads: configs come from the library's defaults and HF_HUB_OFFLINE=1 is set.
"""
from __future__ import annotations

import copy
import inspect
import os
import re
from typing import Any, Dict, List, Optional, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from .compare import Case, Skip  # noqa: E402

ZOO = "hf"
MAX_PARAMS = 50_000_000
BATCH, SEQ, DEC_SEQ = 2, 12, 6
HIDDEN, INTER, LAYERS, HEADS, HEAD_DIM = 32, 64, 2, 2, 16
VOCAB, POSITIONS, IMAGE = 256, 128, 64
MAX_IMAGE_TOKENS = POSITIONS - SEQ  # image placeholder tokens a row may take (within positions)

# (auto mapping in transformers.models.auto.modeling_auto, task); the first that works is used
TASKS = [
    ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "causal_lm"),
    ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "seq2seq"),
    ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked_lm"),
    ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "speech_seq2seq"),
    ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "image_cls"),
    ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "seq_cls"),
    ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "audio_cls"),
    ("MODEL_FOR_CTC_MAPPING_NAMES", "ctc"),
    ("MODEL_MAPPING_NAMES", "base"),
]

# integer config attributes set to a small value (only ever made smaller)
SHRINK_INT: Dict[str, int] = {}
_GROUP_OF: Dict[str, str] = {}  # attribute -> the first name of its group below
for _names, _value in (
    (("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "d_embed", "embedding_size",
      "projection_dim", "hidden_dim", "word_embed_proj_dim", "model_dim", "n_embed",
      "encoder_hidden_size", "decoder_hidden_size", "d_inner_hid", "text_embed_dim",
      "vision_embed_dim", "proj_dim", "output_hidden_size", "classifier_proj_size",
      "hidden_size_per_layer_input", "conv_dim_out", "out_hidden_size",
      "cross_attention_hidden_size", "projector_hidden_size", "merged_hidden_size", "d_latents",
      "audio_hidden_size"),
     HIDDEN),
    (("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
      "ffn_hidden_size", "mlp_dim", "moe_intermediate_size", "shared_expert_intermediate_size",
      "decoder_intermediate_size", "d_inner", "inner_hidden_size", "expert_intermediate_size",
      "encoder_intermediate_size", "mlp_hidden_size", "dense_intermediate_size",
      "expert_ffn_hidden_size"), INTER),
    (("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers",
      "decoder_layers", "num_decoder_layers", "num_encoder_layers", "decoder_num_layers",
      "encoder_num_layers", "num_text_layers", "num_vision_layers", "num_blocks",
      "num_hidden_groups_layers", "depth", "num_local_layers"), LAYERS),
    (("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
      "decoder_attention_heads", "decoder_num_attention_heads", "encoder_num_attention_heads",
      "num_attention_heads_per_layer", "index_n_heads"), HEADS),
    (("head_dim", "attention_head_dim", "kv_channels", "d_kv", "v_head_dim", "index_head_dim"),
     HEAD_DIM),
    (("qk_rope_head_dim", "qk_nope_head_dim", "rotary_dim"), HEAD_DIM // 2),
    (("kv_lora_rank", "q_lora_rank"), HIDDEN // 2),
    (("vocab_size", "n_vocab", "text_vocab_size", "entity_vocab_size",
      "encoder_hash_byte_group_vocab"), VOCAB),
    (("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "n_ctx",
      "max_target_positions", "max_text_positions", "seq_length"), POSITIONS),
    (("image_size", "img_size"), IMAGE),
    (("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts",
      "zero_expert_num"), 4),
    (("num_self_attends_per_block",), LAYERS),
    (("num_latents",), 16),
    (("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k",
      "num_experts_per_token"), 2),
    (("index_topk",), 4),
    (("num_queries",), 8),
    (("num_mel_bins",), 16),
    (("mamba_n_heads",), 4),
    (("mamba_d_head", "mamba_d_state", "ssm_state_size", "state_size"), 16),
    (("emb_dim", "n_embd_per_head"), HIDDEN),
    (("max_source_positions",), 32),
    (("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num",
      "num_key_value_groups"), 1),
):
    for _n in _names:
        SHRINK_INT[_n] = _value
        _GROUP_OF[_n] = _names[0]

# list-valued sizes: (attribute, function of the list's length giving the new list)
SHRINK_LIST = {
    "hidden_sizes": lambda n: [16 * 2 ** i for i in range(n)],
    "embed_dims": lambda n: [16 * 2 ** i for i in range(n)],
    "embed_dim_list": lambda n: [16 * 2 ** i for i in range(n)],
    "neck_hidden_sizes": lambda n: [16 * 2 ** i for i in range(n)],
    "depths": lambda n: [1] * n,
    "num_layers_list": lambda n: [1] * n,
    "encoder_layers_list": lambda n: [1] * n,
    "num_heads": lambda n: [2 ** i for i in range(n)],
    "num_attention_heads": lambda n: [2 ** i for i in range(n)],
    "conv_dim": lambda n: [32] * n,
    "mlp_ratios": lambda n: [2] * n,
}

# per-architecture corrections applied after the generic rules: model_type -> {attr: value};
# a dotted attribute names one in a sub-config ("text_config.head_dim")
def _in_text_config(attrs: dict) -> dict:
    """The same overrides, applied to a multimodal model's text sub-config."""
    return {f"text_config.{k}": v for k, v in attrs.items()}


_COMPASS_ROPE = {"rope_parameters": {"full_attention": {
    "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 2, 3]}}}
_HUNYUAN_ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                     "mrope_section": [2, 2, 2, 2]}}
_GLM4V_MOE_ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                       "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 2]}}
_QWEN4_EXP_INDEXER = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM,
                      "indexer_budget": 4, "indexer_compress_ratio": 2}
# SAM3's ViT backbone: the FPN as wide as the shrunk detector and mask decoder, its feature maps
# those of a 64-pixel image (4 patches of 14, scaled by 4, 2, 1) and a global-attention layer
# among the two left
_SAM3_VISION = {"vision_config.fpn_hidden_size": HIDDEN,
                "vision_config.backbone_feature_sizes": [[16, 16], [8, 8], [4, 4]],
                "vision_config.backbone_config.global_attn_indexes": [1]}
OVERRIDES: Dict[str, Dict[str, Any]] = {
    "reformer": {"axial_pos_shape": [8, 16], "axial_pos_embds_dim": [16, 16],
                 "attn_layers": ["local", "lsh"], "max_position_embeddings": 128,
                 "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4},
    "funnel": {"block_sizes": [1, 1], "block_repeats": [1, 1]},
    "longformer": {"attention_window": [4, 4]},
    "led": {"attention_window": [4, 4]},
    "big_bird": {"attention_type": "original_full"},
    "bigbird_pegasus": {"attention_type": "original_full"},
    "transfo-xl": {"cutoffs": [64, 128], "div_val": 1, "d_embed": 32},
    "xlnet": {"d_head": 16},
    "fsmt": {"src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB},
    "prophetnet": {"ngram": 2, "num_buckets": 8},
    "diffllama": {"num_key_value_heads": 2},
    "mamba2": {"num_heads": 4, "head_dim": 16, "n_groups": 1},
    "xlm-prophetnet": {"ngram": 2, "num_buckets": 8},
    # read there, but the default config sets no rotary base and no clipping bound
    "dbrx": {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
    "t5gemma2_encoder": {"text_config.dropout_rate": 0.0},  # read by the encoder, not defined
    "moonshine_streaming": {"num_key_value_heads": HEADS},  # read by the decoder, not defined
    # the image placeholder the language model's inputs mark (None by default), and fewer
    # query tokens (each a placeholder per image)
    "blip-2": {"image_token_index": VOCAB - 1, "num_query_tokens": 8},
    "instructblip": {"image_token_index": VOCAB - 1, "num_query_tokens": 8},
    "instructblipvideo": {"video_token_index": VOCAB - 1, "num_query_tokens": 8},
    "seggpt": {"image_size": [64, 32]},  # an image over its prompt: twice as high as wide
    # EfficientNet's top convolution is round_filters(1280) wide at the shrunk width (640);
    # its batch norm is sized by hidden_dim
    "efficientnet": {"hidden_dim": 640},
    # ALIGN compares unprojected image features (the last block's 160 channels at the shrunk
    # width) with projected text features
    "align": {"projection_dim": 160},
    "idefics": {"vision_config.image_size": IMAGE},
    # unset by default: its experts, and which vision layers feed which (two) text layers
    "diffusion_gemma": {"text_config.num_experts": 4, "text_config.top_k_experts": 2,
                        "text_config.moe_intermediate_size": INTER},
    "granite4_vision": {"deepstack_layer_map": [(-1, 0)], "spatial_target_layers": [0, 1, 0, 1],
                        "downsample_rate": "1/2"},
    "kosmos-2": {"latent_query_num": 4},  # image tokens per text (64 by default)
    "xlstm": {"embedding_dim": HIDDEN},  # the hidden size under another name
    # widths derived from the default hidden size at construction: attention on the
    # concatenated [hidden, embeddings] (twice the hidden size) and the mamba head size
    "zamba2": {"attention_hidden_size": 2 * HIDDEN, "attention_head_dim": 2 * HIDDEN // HEADS,
               "mamba_headdim": 2 * HIDDEN // 8, "num_key_value_heads": HEADS,
               "kv_channels": HIDDEN // HEADS, "num_query_groups": HEADS,
               "hybrid_layer_ids": [1]},  # the layer of kind "hybrid" left
    "esm": {"vocab_size": VOCAB, "pad_token_id": 1, "mask_token_id": 2},  # unset by default
    "xmod": {"default_language": "en_XX"},  # the adapter its inputs go through
    "deepseek_v2": {"num_experts_per_tok": 2},  # unset by default
    "dots1": {"n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},  # unset by default
    "deepseek_ocr2": {"text_config.mlp_layer_types": ["dense", "sparse"]},
    # rotary parameters keyed by layer type (empty by default), multimodal sections summing to
    # half the head
    "cohere_compass_text": _COMPASS_ROPE,
    "cohere_compass": _in_text_config(_COMPASS_ROPE),
    # half the head rotates: the multimodal sections split a quarter of it
    "glm4v_moe_text": _GLM4V_MOE_ROPE,
    "glm4v_moe": _in_text_config(_GLM4V_MOE_ROPE),
    # multimodal rotary with the (sequence, width, height, image) axes it requires (unset)
    "hunyuan_vl_text": _HUNYUAN_ROPE,
    "hunyuan_vl": _in_text_config(_HUNYUAN_ROPE),
    # the defaults name indexed-attention layers but leave their token indexer unset
    "qwen4_exp_text": _QWEN4_EXP_INDEXER,
    "qwen4_exp": _in_text_config(_QWEN4_EXP_INDEXER),
    # the query/key head is qk_head_dim (nope + rope) wide, a partial_rotary_factor of it rotating
    "mistral4": {"head_dim": HEAD_DIM},
    # the decoder's cross-attention over the encoder's states (unshrunk names)
    "dia": {"decoder_config.cross_hidden_size": HIDDEN,
            "decoder_config.cross_num_attention_heads": HEADS,
            "decoder_config.cross_head_dim": HEAD_DIM,
            "decoder_config.cross_num_key_value_heads": HEADS},
    # its codebook entries are the acoustic and semantic widths side by side (derived only when
    # unset)
    "xcodec": {"codebook_dim": 2 * HIDDEN},
    # its subsampling projection takes subsampling_conv_channels[0] // 4 * [1] features: the
    # 16 mel bins of the synthesized input, after two stride-2 convolutions
    "gemma4_audio": {"subsampling_conv_channels": [16, 8]},
    # the VQ image tokenizer's widths are base_channels times its multipliers (up to 4): a
    # multiple of the 32 groups of its group norms
    "janus": {"vq_config.base_channels": 32},
    # VibeVoice's tokenizers double num_filters at each of their six downsampling stages
    "vibevoice_acoustic_tokenizer": {"num_filters": 2},
    "vibevoice_acoustic_tokenizer_encoder": {"num_filters": 2},
    "vibevoice_acoustic_tokenizer_decoder": {"num_filters": 2},
    "vibevoice": {"audio_config.num_filters": 2, "semantic_model_config.num_filters": 2},
    "vibevoice_asr": {"acoustic_tokenizer_encoder_config.num_filters": 2,
                      "semantic_tokenizer_encoder_config.num_filters": 2},
    # the thinker's rotary index reads a vision-start token its config class does not define
    # (the default id, moved into the shrunk vocabulary)
    "qwen2_5_omni_thinker": {"vision_start_token_id": 151652 % VOCAB},
    "qwen3_omni_moe_thinker": {"vision_start_token_id": 151652 % VOCAB},
    # SAM2's Hiera backbone: narrower stages (the FPN's inputs, widest first), fewer blocks, the
    # feature maps of a 64-pixel image (strides 4, 8, 16) and an FPN as wide as the prompt encoder
    # and mask decoder
    "sam2": {"vision_config.backbone_config.embed_dim_per_stage": [32, 64, 128, 256],
             "vision_config.backbone_config.blocks_per_stage": [1, 1, 2, 1],
             "vision_config.backbone_config.global_attention_blocks": [3],
             "vision_config.backbone_channel_list": [256, 128, 64, 32],
             "vision_config.backbone_feature_sizes": [[16, 16], [8, 8], [4, 4]],
             "vision_config.fpn_hidden_size": HIDDEN},
    # its hybrid layers share one transformer, tied from the first into the others: two of them
    # left; attention over [hidden, embeddings] (twice the hidden size) and a mamba time-step
    # rank of hidden / 16, both derived from the default width
    "zamba": {"num_hidden_layers": 3,
              "layers_block_type": ["linear_attention", "hybrid", "hybrid"],
              "attention_hidden_size": 2 * HIDDEN, "attention_head_dim": 2 * HIDDEN // HEADS,
              "num_key_value_heads": HEADS, "mamba_dt_rank": 2},
    # the global transformer takes cross_attn_k (2) encoder states per patch: twice the
    # encoder's width, its heads split by its hidden size, not head_dim
    "blt": {"global_config.hidden_size": 2 * HIDDEN, "global_config.head_dim": HIDDEN,
            "encoder_config.hidden_size_global": 2 * HIDDEN,
            "decoder_config.hidden_size_global": 2 * HIDDEN},
    # its layers are the stages of hidden_sizes (the last one's width is what its output
    # projection takes): all four kept
    "muse_spark_audio": {"num_hidden_layers": 4},
    # the matcher attends over the keypoint detector's descriptors: as wide as its hidden size
    "lightglue": {"descriptor_dim": HIDDEN, "keypoint_detector_config.descriptor_decoder_dim": HIDDEN},
    # its position table is sized for spectrograms of max_length frames: a short one
    "audio-spectrogram-transformer": {"max_length": 64},
    "sam3": _SAM3_VISION,
    # Gemma3's image pooling averages the patch grid (image_size // patch_size a side) down to
    # sqrt(mm_tokens_per_image) a side: 4 tokens for the 4 x 4 patches of a 64-pixel image
    "shieldgemma2": {"mm_tokens_per_image": 4, "yes_token_index": 10784 % VOCAB,
                     "no_token_index": 3771 % VOCAB},
    "sam3_lite_text": _SAM3_VISION,
    # its vision blocks take hidden_size // 64 heads: at least one
    "bridgetower": {"hidden_size": 64, "text_config.hidden_size": 64,
                    "vision_config.hidden_size": 64},
}

# per-architecture inputs the generic synthesis cannot infer: model_type -> the first variant
# tried (see make_inputs and _next_variant)
INPUT_VARIANTS: Dict[str, dict] = {
    "inkling2_vision": {"patches": "tokens"},  # one merged square of patches per image token
    "instructblipvideo": {"frames": 2},  # [B, frames, C, H, W]; the config names no count
    "idefics": {"frames": 1},  # images per text: [B, images, C, H, W]
    "seggpt": {"image_hw": (32, 32)},  # its image and prompt, stacked to the config's 64 x 32
    "musicgen": {"codebooks": True},  # the decoder's input_ids: [batch * codebooks, T]
    "musicgen_melody": {"codebooks": True},
    # frames stacked four at a time before the encoder's input projection: [B, T, 4 * mel]
    "granite_speech5_ctc": {"features": 4 * 16},
    "granite_speech5_encoder": {"features": 4 * 16},
    # its default 100-frame chunks (2 n_window; the position table holds the 13 tokens its
    # convolutions make of one): [B, mel, 100] and a frame mask
    "qwen3_asr_encoder": {"channels_first": True, "feature_frames": 100},
    "lightglue": {"frames": 2},  # a keypoint matcher: a pair of images, [B, 2, C, H, W]
    "muse_spark_audio": {"samples": 2 * 1920},  # whole frames of its feature extractor
    # its DAC encoder downsamples 1920 times: [B, 1, samples]
    "pe_audio_encoder": {"samples": 2 * 1920, "audio_channels": True},
    "dia": {"decoder_codebooks": 9},  # decoder_config.num_channels
    # audio added to the text embeddings step by step: 8 frames per text token
    "voxtral_realtime": {"audio_frames": 8 * SEQ},
    # Perceiver's masked-LM decoder queries every position: text of max_position_embeddings
    "perceiver": {"seq_len": POSITIONS},
    # Kyutai STT's tokens: each step a text token and num_codebooks (32) audio tokens
    "kyutai_speech_to_text": {"id_books": 33},
    # a spectrogram of max_length frames of num_mel_bins: [B, frames, mel]
    "audio-spectrogram-transformer": {"main_shape": (64, 16)},
    # VibeVoice's audio tokenizer downsamples 3200 times: [B, 1, samples]; its encoder takes the
    # same audio, its decoder latents [B, hidden, frames]
    "vibevoice_acoustic_tokenizer": {"samples": 6400, "audio_channels": True},
    "vibevoice_acoustic_tokenizer_encoder": {"main_shape": (1, 6400)},
    "vibevoice_acoustic_tokenizer_decoder": {"main_shape": (HIDDEN, 4)},
}

# configs whose attention has no key/value grouping although the config has a kv-heads count:
# the shrink keeps their kv heads equal to the heads, at whatever depth the config sits
# (a sub-config of a composite included)
NO_KV_GROUPING = {
    "esmc",  # its key norm spans every head
    # block attention that reshapes keys and values with the query heads' count
    "granite_speech5_encoder",
    # values projected to the query heads' count (keys to the kv heads'): eager ran with a
    # grouped config (no mask: SDPA's enable_gqa), compiled the materialized mask repeats the
    # values to twice the query heads ("Attempting to broadcast a dimension of length 4")
    "nemotron3_diarization_audio", "nemotron3_5_transcribe_asr_audio",
    "nemotron3_5_transcribe_word_timestamp",
}
# float multipliers of the architecture (EfficientNet's compound scaling): set, not shrunk
SCALE_FLOAT = {"width_coefficient": 0.5, "depth_coefficient": 0.5}

DROPOUT_WORDS = ("dropout", "drop_prob", "pdrop", "layerdrop", "drop_path", "drop_rate",
                 "mask_time_prob", "mask_feature_prob")


def available() -> Tuple[bool, str]:
    try:
        import transformers  # noqa: F401
    except Exception as e:  # pragma: no cover (depends on the environment)
        return False, f"transformers does not import: {type(e).__name__}: {e}"
    return True, ""


def names() -> List[str]:
    """Every model type of CONFIG_MAPPING that has a class in one of the TASKS auto mappings
    (sub-configs such as `clip_text_model` have none: they are parts of another model type)."""
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    with_class = set()
    for mapping, _ in TASKS:
        with_class |= set(getattr(modeling_auto, mapping, {}))
    return sorted(t for t in CONFIG_MAPPING_NAMES if t in with_class)


def _class_for(model_type: str, mapping: str):
    import transformers
    from transformers.models.auto import modeling_auto
    cls_name = getattr(modeling_auto, mapping, {}).get(model_type)
    if isinstance(cls_name, (list, tuple)):
        cls_name = cls_name[0]
    if not cls_name:
        return None
    return getattr(transformers, cls_name, None)


def _per_layer(values: list, n: int) -> list:
    """A per-layer list (layer_types and the like) cut to n layers, keeping each kind of layer
    it had while there is room: [sliding x5, full] -> [sliding, full]."""
    kinds = list(dict.fromkeys(values))[:n]
    return kinds + [values[-1]] * (n - len(kinds))


# Shrink levels, tried in order until one builds and runs on CPU. "tiny" applies every rule;
# its widths can leave a config inconsistent (a width another attribute must divide, a projection
# sized from a default). "counts" cuts only the counts that change no width (layers, experts,
# vocabulary, positions), so the model keeps its own consistent widths and is larger; "layers"
# also keeps the vocabulary (models whose special-token ids are tied to it). Each stays under
# MAX_PARAMS or is skipped as too large.
LEVELS = ("tiny", "counts", "layers")
_COUNT_GROUPS = ("num_hidden_layers", "num_experts", "num_experts_per_tok", "vocab_size",
                 "max_position_embeddings")


def _allowed(level: str) -> Optional[set]:
    """The SHRINK_INT/SHRINK_LIST names a level may change (None: all of them)."""
    if level == "tiny":
        return None
    groups = {g for g in _COUNT_GROUPS if not (level == "layers" and g == "vocab_size")}
    return {k for k in SHRINK_INT if _GROUP_OF[k] in groups} | {
        "depths", "num_layers_list", "encoder_layers_list"}


_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers")  # what per-layer lists follow
# lists of a backbone's stage names: they follow its stages (depths), not a layer count (Swin's
# num_layers is its number of stages, and out_features must stay as long as out_indices)
_STAGE_LISTS = ("out_features", "_out_features", "stage_names")


def _shrink_one(cfg, allowed: Optional[set] = None) -> None:
    # Heterogeneous configs (per-layer overrides, transformers' `per_layer_config`) refuse reads
    # of their per-layer attributes: the rules run on the homogeneous config, then the overrides
    # of the layers that remain are shrunk by the same rules and put back.
    spec = vars(cfg).get("_heterogeneity_spec")
    if spec is not None:
        overrides = copy.deepcopy(dict(spec.per_layer_overrides))
        cfg.per_layer_config = None
        _shrink_homogeneous(cfg, allowed)
        n = next((v for k, v in vars(cfg).items()
                  if k in _LAYER_COUNTS and isinstance(v, int)), 0)
        kept = {}
        for i, o in overrides.items():
            if int(i) < n:
                _shrink_dict(o, allowed)
                kept[int(i)] = o
        if kept:
            cfg.per_layer_config = kept
        return
    _shrink_homogeneous(cfg, allowed)


def _shrink_homogeneous(cfg, allowed: Optional[set]) -> None:
    from transformers import PretrainedConfig
    layers_before = {k: v for k, v in vars(cfg).items()
                     if k in _LAYER_COUNTS and isinstance(v, int)}
    hidden_before = vars(cfg).get("hidden_size")
    kv_was_heads = (isinstance(vars(cfg).get("num_attention_heads"), int)
                    and vars(cfg).get("num_key_value_heads") == cfg.num_attention_heads)
    for k, v in list(vars(cfg).items()):
        if k.startswith("_"):
            continue
        if isinstance(v, PretrainedConfig):
            _shrink_one(v, allowed)
            # a backbone (HGNetV2) that reports its stages' widths to an RT-DETR style
            # detector from hidden_sizes but builds them from stage_out_channels (left
            # unshrunk): the detector's encoder must see the built widths
            outs = vars(v).get("stage_out_channels")
            if (k == "backbone_config" and "encoder_in_channels" in vars(cfg)
                    and isinstance(outs, (list, tuple))
                    and len(outs) == len(vars(v).get("hidden_sizes") or ())):
                v.hidden_sizes = list(outs)
        elif isinstance(v, dict) and k.endswith("_config") and "model_type" in v:
            _shrink_dict(v, allowed)
        elif isinstance(v, bool):
            continue
        elif isinstance(v, float) and any(w in k for w in DROPOUT_WORDS):
            setattr(cfg, k, 0.0)
        elif allowed is not None and k not in allowed:
            continue
        elif isinstance(v, float) and k in SCALE_FLOAT and v > SCALE_FLOAT[k]:
            setattr(cfg, k, SCALE_FLOAT[k])
        elif isinstance(v, int) and k in SHRINK_INT and v > SHRINK_INT[k]:
            setattr(cfg, k, SHRINK_INT[k])
        elif isinstance(v, (list, tuple)) and v and k in SHRINK_LIST and all(
                isinstance(x, int) and not isinstance(x, bool) for x in v):
            setattr(cfg, k, type(v)(SHRINK_LIST[k](len(v))))
    # per-layer lists of layer kinds must keep the new number of layers
    for lk, before in layers_before.items():
        after = getattr(cfg, lk, before)
        if after >= before:
            continue
        for k, v in list(vars(cfg).items()):
            if (isinstance(v, (list, tuple)) and len(v) == before and v and k not in _STAGE_LISTS
                    and all(isinstance(x, str) for x in v)):
                setattr(cfg, k, type(v)(_per_layer(list(v), after)))
    # depthwise convolutions grouped by the hidden size (Mimi's upsample_groups): the groups
    # follow the new width
    hidden = vars(cfg).get("hidden_size")
    if isinstance(hidden_before, int) and isinstance(hidden, int) and hidden < hidden_before:
        for k, v in list(vars(cfg).items()):
            if k.endswith("_groups") and "key_value" not in k and v == hidden_before:
                setattr(cfg, k, hidden)
    # Falcon-H1's mamba inner width is its heads times their size (both shrunk)
    if all(isinstance(vars(cfg).get(k), int) for k in ("mamba_d_ssm", "mamba_n_heads",
                                                         "mamba_d_head")):
        cfg.mamba_d_ssm = cfg.mamba_n_heads * cfg.mamba_d_head
    # KV-sharing layers (Gemma3n) reuse the cache of an earlier layer of their kind: with the
    # few layers left, every kind must still have a producing layer, or none shares
    shared, n = vars(cfg).get("num_kv_shared_layers"), vars(cfg).get("num_hidden_layers")
    kinds = vars(cfg).get("layer_types")
    if (isinstance(shared, int) and shared > 0 and isinstance(n, int) and isinstance(kinds, list)
            and set(kinds[:max(n - shared, 0)]) != set(kinds)):
        cfg.num_kv_shared_layers = 0
    _remap_token_ids(cfg, getattr(cfg, "vocab_size", None))
    # heads must divide the hidden size; kv heads must divide heads
    heads = getattr(cfg, "num_attention_heads", None)
    if isinstance(heads, int) and isinstance(getattr(cfg, "num_key_value_heads", None), int):
        if heads % cfg.num_key_value_heads:
            cfg.num_key_value_heads = heads
        # multi-head latent attention expands its latent to one key per query head, and
        # Transformers' attention then repeats those keys by heads / kv heads: kv heads that
        # equalled the heads (every MLA config: DeepSeek-V2/V3/V3.2, Kimi, GLM-4-MoE-Lite,
        # LongCat, MiniCPM3, ...) must stay equal to them. Shrunk to 1, eager still ran (no
        # mask: Transformers passes the keys unrepeated with enable_gqa), but compiled, where
        # the mask is materialized, the keys were repeated to twice the query heads and SDPA
        # refused them (the compiled sweep's "Attempting to broadcast" errors).
        if kv_was_heads and "kv_lora_rank" in vars(cfg):
            cfg.num_key_value_heads = heads
        if getattr(cfg, "model_type", None) in NO_KV_GROUPING:
            cfg.num_key_value_heads = heads
    # grouped expert routing (DeepSeek-V3 style): the groups must divide the shrunk experts with
    # at least two experts each (a group scores by its best two), and the groups kept per token
    # cannot outnumber them
    experts = next((getattr(cfg, k) for k in ("n_routed_experts", "num_experts")
                    if isinstance(getattr(cfg, k, None), int)), None)
    # (the groups are n_group, or num_expert_group in Bailing's configs)
    group_key = next((k for k in ("n_group", "num_expert_group")
                      if isinstance(vars(cfg).get(k), int)), None)
    groups = vars(cfg).get(group_key) if group_key else None
    if (isinstance(experts, int) and experts >= 2 and isinstance(groups, int) and groups > 0
            and (experts % groups or experts // groups < 2)):
        groups = max(d for d in range(1, experts + 1)
                     if experts % d == 0 and d <= groups and experts // d >= 2)
        setattr(cfg, group_key, groups)
        if isinstance(vars(cfg).get("topk_group"), int):
            cfg.topk_group = min(cfg.topk_group, groups)
    # seq2seq training shifts labels right from decoder_start_token_id; some defaults leave it unset
    if getattr(cfg, "is_encoder_decoder", False) and getattr(cfg, "decoder_start_token_id", None) is None:
        pad = getattr(cfg, "pad_token_id", None)
        cfg.decoder_start_token_id = pad if isinstance(pad, int) else 0
    # multimodal rotary sections (Qwen-VL style) must add up to half the new head size
    head = getattr(cfg, "head_dim", None)
    if not isinstance(head, int) and isinstance(heads, int) and isinstance(
            getattr(cfg, "hidden_size", None), int) and heads:
        head = cfg.hidden_size // heads
    for k in ("rope_scaling", "rope_parameters"):
        rope = getattr(cfg, k, None)
        if isinstance(head, int) and isinstance(rope, dict):
            sections = rope.get("mrope_section") or _default_mrope(cfg)
            if sections:
                rope["mrope_section"] = _split_like(list(sections), head // 2)
    # multi-head latent attention: the rotary part is what head_dim names there, and the
    # derived query head size follows its two parts
    if isinstance(getattr(cfg, "qk_rope_head_dim", None), int) and "head_dim" in vars(cfg):
        cfg.head_dim = cfg.qk_rope_head_dim
    if "qk_head_dim" in vars(cfg) and isinstance(getattr(cfg, "qk_nope_head_dim", None), int):
        cfg.qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    # time-series transformers: a forecast horizon is required, the context defaults to it
    if "prediction_length" in vars(cfg) and cfg.prediction_length is None:
        cfg.prediction_length = 4
        if "context_length" in vars(cfg) and cfg.context_length is None:
            cfg.context_length = cfg.prediction_length
        if isinstance(vars(cfg).get("label_length"), int):  # Autoformer: a part of the context
            cfg.label_length = min(cfg.label_length, cfg.context_length // 2)
    # kv heads left unset (None: as many as the heads) where the modeling code divides by them
    if "num_key_value_heads" in vars(cfg) and cfg.num_key_value_heads is None and isinstance(
            heads, int):
        cfg.num_key_value_heads = heads
    # a head size left unset where the modeling code reads it: what hidden / heads gives
    if ("head_dim" in vars(cfg) and vars(cfg)["head_dim"] is None and isinstance(heads, int)
            and heads and isinstance(vars(cfg).get("hidden_size"), int)):
        cfg.head_dim = cfg.hidden_size // heads
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    # DETR-style models: the library's own backbone, not timm's, and never pretrained weights
    if getattr(cfg, "use_timm_backbone", False):
        cfg.use_timm_backbone = False
    if getattr(cfg, "use_pretrained_backbone", False):
        cfg.use_pretrained_backbone = False


_TOKEN_ATTRS = ("token_id", "token_index")


def _remap_token_ids(cfg, vocab) -> None:
    """Special-token ids (image placeholders included) moved into a shrunk vocabulary."""
    if not (isinstance(vocab, int) and vocab > 0):
        return
    for k, v in list(vars(cfg).items()):
        if not k.endswith(_TOKEN_ATTRS):
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v >= vocab:
            setattr(cfg, k, v % vocab)
        elif isinstance(v, list):
            setattr(cfg, k, [x % vocab if isinstance(x, int) else x for x in v])


def _special_ids(cfg) -> set:
    ids = set()
    for c in (cfg, _text_cfg(cfg)):
        for k, v in vars(c).items():
            if k.endswith(_TOKEN_ATTRS) and k not in ("pad_token_id", "bos_token_id"):
                if isinstance(v, int) and not isinstance(v, bool):
                    ids.add(v)
                elif isinstance(v, list):
                    ids |= {x for x in v if isinstance(x, int)}
    return ids


def _text_ids(cfg, low: int, vocab: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """Random token ids that are no special token (an image placeholder or an end of text in
    the middle of random text changes what the model computes, or fails its input checks)."""
    ids = torch.randint(low, vocab, (BATCH, seq), generator=gen)
    special = sorted(i for i in _special_ids(cfg) if low <= i < vocab)
    if special:
        ordinary = next((i for i in range(low, vocab) if i not in special), low)
        ids[torch.isin(ids, torch.tensor(special))] = ordinary
    return ids


def _default_mrope(cfg) -> Optional[list]:
    """The rotary sections a model's code assumes when its config names none (Qwen2-VL's
    modeling file defaults to [16, 24, 24]); None for models without multimodal rotary."""
    import importlib
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    mt = getattr(cfg, "model_type", "")
    for name in {mt, mt.rsplit("_text", 1)[0]}:
        try:
            mod = importlib.import_module(f"transformers.models.{model_type_to_module_name(name)}"
                                          f".modeling_{model_type_to_module_name(name)}")
            src = inspect.getsource(mod)
        except Exception:
            continue
        m = re.search(r'get\("mrope_section", (\[[\d, ]+\])\)', src)
        if m:
            return [int(x) for x in m.group(1).strip("[]").split(",")]
    return None


def _split_like(parts: list, total: int) -> list:
    """`parts` rescaled to sum to `total`, each at least 1 where possible, rounding kept exact."""
    s = sum(parts) or 1
    out = [max(1, p * total // s) for p in parts]
    out[-1] += total - sum(out)
    return out


def _shrink_dict(d: dict, allowed: Optional[set] = None) -> None:
    for k, v in list(d.items()):
        if isinstance(v, float) and any(w in k for w in DROPOUT_WORDS):
            d[k] = 0.0
        elif allowed is not None and k not in allowed:
            continue
        elif isinstance(v, int) and not isinstance(v, bool) and k in SHRINK_INT and v > SHRINK_INT[k]:
            d[k] = SHRINK_INT[k]


def small_config(model_type: str, level: str = "tiny"):
    from transformers import AutoConfig
    cfg = AutoConfig.for_model(model_type)
    _shrink_one(cfg, _allowed(level))
    if getattr(cfg, "vocab_size", None) is None:  # a composite: its text part holds the vocabulary
        _remap_token_ids(cfg, getattr(_text_cfg(cfg), "vocab_size", None))
    if level == "tiny":  # the overrides are corrections of the tiny widths
        for k, v in OVERRIDES.get(model_type, {}).items():
            *parents, name = k.split(".")
            target = cfg
            for p in parents:
                target = getattr(target, p)
            setattr(target, name, copy.deepcopy(v))
    if hasattr(cfg, "num_labels"):
        cfg.num_labels = 3
    return cfg


def _param_count_meta(cls, cfg) -> int:
    with torch.device("meta"):
        m = cls(cfg)
    return sum(p.numel() for p in m.parameters())


def _text_cfg(cfg):
    try:
        return cfg.get_text_config(decoder=True)
    except Exception:
        return cfg


def _vision_cfg(cfg):
    return getattr(cfg, "vision_config", None) or cfg


def _image_hw(cfg) -> Tuple[int, int, int]:
    v = _vision_cfg(cfg)
    size = getattr(v, "image_size", None) or getattr(v, "img_size", None) or IMAGE
    if isinstance(size, (list, tuple)):
        h, w = int(size[0]), int(size[-1])
    else:
        h = w = int(size)
    return int(getattr(v, "num_channels", None) or getattr(v, "num_channels_in", None) or 3), h, w


def _signature(model) -> set:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _required(model) -> List[str]:
    """The forward's parameters without a default, in order (self and *args/**kwargs left out)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.name != "self" and p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


# names of a patch grid input of vision encoders fed flattened patches: (t, h, w) per image
_GRID_NAMES = ("grid_thw", "image_grid_thw")
_PATCH_ASIDES = _GRID_NAMES + ("pixel_position_ids", "spatial_shapes", "pixel_attention_mask")


def _fed_patches(model, kind: str = "any") -> bool:
    """Whether the model is a vision encoder that takes its image as patches with their grid
    (kind "grid": a (t, h, w) grid) or positions (kind "any": positions or shapes too)."""
    req = _required(model)
    names = _GRID_NAMES if kind == "grid" else _PATCH_ASIDES
    return bool(req) and req[0] in ("hidden_states", "pixel_values") and any(
        n in req for n in names)


def _merge(v) -> int:
    """The side of the square of patches a vision encoder merges into one token (1: none)."""
    for k in ("spatial_merge_size", "merge_size", "merge_kernel_size", "pooling_kernel_size"):
        m = getattr(v, k, None)
        if isinstance(m, (list, tuple)) and m:
            m = m[0]
        if isinstance(m, int) and not isinstance(m, bool) and m > 0:
            return m
    return 1


def _patch_inputs(model, cfg, req: List[str], gen: torch.Generator,
                  layout: str = "flat") -> Dict[str, Any]:
    """Inputs of a vision encoder that takes its image already cut into patches (what the full
    model's image processor produces): each of BATCH images a g x g grid of patches, g twice the
    merge size. Qwen-VL style encoders take all images' patches in one row with a (t, h, w) grid
    per image: [BATCH * g * g, per_patch] flattened (layout "flat"), or each patch as a small
    image, [BATCH * g * g, C, p, p] ("image"), or one merged square per language-model token,
    [BATCH * (g / m)^2, p * m, p * m, C] with the grid counted in tokens ("tokens"). NaViT style
    ones (siglip2, gemma4) take [BATCH, g * g, per_patch] with the patches' positions or the
    grid's shape, and a mask of the valid patches."""
    v = _vision_cfg(cfg)
    merge = _merge(v)
    g = 2 * merge
    ch = int(getattr(v, "in_channels", None) or getattr(v, "num_channels", None) or 3)
    temporal = int(getattr(v, "temporal_patch_size", None) or getattr(v, "patch_temporal", None) or 1)
    p = int(v.patch_size)
    per_patch = ch * temporal * p ** 2
    first = req[0]
    kw: Dict[str, Any] = {}
    grid = next((n for n in req if n in _GRID_NAMES), None)
    if grid is not None:
        if layout == "tokens":
            kw[first] = torch.randn(BATCH * (g // merge) ** 2, p * merge, p * merge, ch,
                                    generator=gen)
            kw[grid] = torch.tensor([[1, g // merge, g // merge]] * BATCH)
            return kw
        shape = {"flat": (per_patch,), "image": (ch, *((temporal,) if temporal > 1 else ()), p, p)}
        kw[first] = torch.randn(BATCH * g * g, *shape[layout], generator=gen)
        kw[grid] = torch.tensor([[1, g, g]] * BATCH)
        if "merge_sizes" in req:
            kw["merge_sizes"] = torch.tensor([_merge(v)] * BATCH)
        return kw
    kw[first] = torch.randn(BATCH, g * g, per_patch, generator=gen)
    ys, xs = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
    if "pixel_position_ids" in req:  # (x, y) of each patch
        kw["pixel_position_ids"] = torch.stack([xs.flatten(), ys.flatten()], -1).expand(
            BATCH, -1, -1).contiguous()
    if "spatial_shapes" in req:  # (rows, columns) of patches
        kw["spatial_shapes"] = torch.tensor([[g, g]] * BATCH)
    if "pixel_attention_mask" in req:
        kw["pixel_attention_mask"] = torch.ones(BATCH, g * g, dtype=torch.long)
    return kw


def make_inputs(model, cfg, task: str, gen: torch.Generator, with_labels: bool,
                variant: Optional[dict] = None) -> Dict[str, Any]:
    """Keyword inputs from the model's main input name and forward signature. `variant` (see
    VARIANTS) adjusts the multimodal part: image placeholder tokens in the text, or no image."""
    variant = variant or {}
    sig = _signature(model)
    main = getattr(model, "main_input_name", "input_ids")
    if _fed_patches(model):
        return _patch_inputs(model, cfg, _required(model), gen, variant.get("patches", "flat"))
    if isinstance(main, (list, tuple)):  # OneFormer: ["pixel_values", "task_inputs"]
        main = main[0]
    req = _required(model)
    if main not in sig and req:  # a sub-model that keeps its parent's default main input
        main = req[0]
    tcfg = _text_cfg(cfg)
    vocab = int(getattr(tcfg, "vocab_size", None) or VOCAB)
    low = min(3, vocab - 1)
    kw: Dict[str, Any] = {}
    seq = int(variant.get("seq_len", SEQ)) + variant.get("image_tokens", 0)
    if main == "input_ids" and variant.get("codebooks"):  # a row per item and audio codebook
        books = int(tcfg.num_codebooks)
        kw["input_ids"] = torch.randint(low, vocab, (BATCH * books, seq), generator=gen)
        if with_labels and task == "causal_lm":  # [B, T, codebooks]
            kw["labels"] = kw["input_ids"].view(BATCH, books, seq).transpose(1, 2).contiguous()
        return kw
    if variant.get("main_shape"):  # a float main input of a given shape per item
        kw[main] = torch.randn(BATCH, *variant["main_shape"], generator=gen)
    elif main == "input_ids" and variant.get("id_books"):  # a text token and audio codebooks
        kw["input_ids"] = torch.randint(low, vocab, (BATCH, seq, variant["id_books"]),
                                        generator=gen)
        if "attention_mask" in sig:
            kw["attention_mask"] = torch.ones(BATCH, seq, dtype=torch.long)
    elif main == "input_ids":
        kw["input_ids"] = _text_ids(cfg, low, vocab, seq, gen)
        if "attention_mask" in sig:
            kw["attention_mask"] = torch.ones(BATCH, seq, dtype=torch.long)
    elif main in ("pixel_values", "pixel_values_videos"):
        c, h, w = _image_hw(cfg)
        h, w = variant.get("image_hw", (h, w))
        frames = variant.get("frames")  # video: [B, T, C, H, W]
        if main == "pixel_values_videos" and not frames:
            frames = 2
        kw[main] = torch.randn(BATCH, *((frames,) if frames else ()), c, h, w, generator=gen)
    elif main == "input_features":
        if getattr(cfg, "num_mel_bins", None) and getattr(cfg, "max_source_positions", None):
            frames = 2 * int(cfg.max_source_positions)  # whisper-style: conv stride 2 over frames
            kw["input_features"] = torch.randn(BATCH, int(cfg.num_mel_bins), frames, generator=gen)
        else:
            feat = int(getattr(cfg, "input_feat_per_channel", 0) * getattr(cfg, "input_channels", 1)
                       or getattr(cfg, "feature_size", 0) or getattr(cfg, "num_mel_bins", 0) or 16)
            feat *= int(getattr(cfg, "num_stacked_frames", 1))  # low frame rate: frames stacked
            feat = int(getattr(cfg, "feature_projection_input_dim", None) or feat)  # w2v-BERT
            feat = int(variant.get("features", feat))
            frames = int(variant.get("feature_frames", 32))
            kw["input_features"] = torch.randn(BATCH, frames, feat, generator=gen)
            if variant.get("channels_first"):  # [B, features, frames] (convolutional front ends)
                kw["input_features"] = kw["input_features"].transpose(1, 2).contiguous()
        if "attention_mask" in sig and "num_mel_bins" not in vars(cfg):
            kw["attention_mask"] = torch.ones(BATCH, kw["input_features"].shape[1], dtype=torch.long)
    elif main == "audio_mel":  # Gemma3n's audio encoder: [B, frames, mel] and a padding mask
        feat = int(getattr(cfg, "input_feat_size", None) or 16)
        kw["audio_mel"] = torch.randn(BATCH, 32, feat, generator=gen)
        kw["audio_mel_mask"] = torch.zeros(BATCH, 32, dtype=torch.bool)  # True: padding
    elif main == "past_values":
        return _series_inputs(cfg, sig, gen)
    elif main == "inputs" and task in ("masked_lm", "seq_cls"):  # Perceiver's text: token ids
        kw["inputs"] = _text_ids(cfg, low, vocab, seq, gen)
        if "attention_mask" in sig:
            kw["attention_mask"] = torch.ones(BATCH, seq, dtype=torch.long)
    elif main == "states" and isinstance(getattr(cfg, "state_dim", None), int):
        # Decision Transformer: a trajectory of states, actions, rewards, returns to go and steps
        kw["states"] = torch.randn(BATCH, SEQ, cfg.state_dim, generator=gen)
        kw["actions"] = torch.randn(BATCH, SEQ, int(cfg.act_dim), generator=gen)
        kw["rewards"] = torch.randn(BATCH, SEQ, 1, generator=gen)
        kw["returns_to_go"] = torch.randn(BATCH, SEQ, 1, generator=gen)
        kw["timesteps"] = torch.arange(SEQ).expand(BATCH, SEQ).contiguous()
        kw["attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    elif main == "latents" and isinstance(getattr(cfg, "hidden_size", None), int):
        # an audio codec's decoder (Mimi): continuous latents, [B, hidden, frames]
        kw["latents"] = torch.randn(BATCH, int(cfg.hidden_size), 8, generator=gen)
    elif main == "input_values":  # raw audio: [B, T], or [B, channels, T] (codecs)
        ch = int(getattr(cfg, "audio_channels", None) or 1)
        samples = int(variant.get("samples", 1600))
        shape = (BATCH, ch, samples) if variant.get("audio_channels") else (BATCH, samples)
        kw["input_values"] = torch.randn(*shape, generator=gen)
    elif main.endswith("_embeds") and isinstance(getattr(tcfg, "hidden_size", None), int):
        kw[main] = torch.randn(BATCH, SEQ, int(tcfg.hidden_size), generator=gen)  # [B, T, hidden]
    else:
        raise Skip(f"inputs cannot be synthesized: main input {main!r}")
    # multimodal models (text + image): both inputs when the config has a vision part
    if (main == "input_ids" and "pixel_values" in sig and not variant.get("text_only")
            and getattr(cfg, "vision_config", None) is not None):
        if variant.get("grid"):  # Qwen-VL style: flattened patches and their (t, h, w) grid
            v = _vision_cfg(cfg)
            t, g = variant["grid"]
            per_patch = (int(getattr(v, "in_channels", None) or getattr(v, "num_channels", 3))
                         * int(getattr(v, "temporal_patch_size", None) or 1)
                         * int(v.patch_size) ** 2)
            kw["pixel_values"] = torch.randn(BATCH * t * g * g, per_patch, generator=gen)
            kw["image_grid_thw"] = torch.tensor([[t, g, g]] * BATCH)
        else:
            c, h, w = _image_hw(cfg)
            frames = variant.get("frames")  # a video encoder (X-CLIP): [B, T, C, H, W]
            kw["pixel_values"] = torch.randn(BATCH, *((frames,) if frames else ()), c, h, w,
                                             generator=gen)
            if frames and "image_attention_mask" in sig:  # IDEFICS: which images a token sees
                kw["image_attention_mask"] = torch.ones(BATCH, seq, frames, dtype=torch.long)
        n_img = variant.get("image_tokens", 0)
        if n_img:  # each row starts with its image's placeholder tokens
            kw["input_ids"][:, :n_img] = _image_token_id(cfg)
            if "mm_token_type_ids" in sig:  # the processor's marking: 1 for image tokens
                kw["mm_token_type_ids"] = torch.zeros_like(kw["input_ids"])
                kw["mm_token_type_ids"][:, :n_img] = 1
    if main == "pixel_values" and "input_ids" in sig and getattr(cfg, "text_config", None) is not None:
        kw["input_ids"] = _text_ids(cfg, low, vocab, SEQ, gen)
        if "attention_mask" in sig:
            kw["attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    for name in req:  # more inputs the forward requires
        if name in kw:
            continue
        if name.endswith("input_ids"):  # a second text (InstructBLIP's Q-Former prompt)
            kw[name] = _text_ids(cfg, low, vocab, SEQ, gen)
            mask = name[:-len("input_ids")] + "attention_mask"
            if mask in sig:
                kw[mask] = torch.ones(BATCH, SEQ, dtype=torch.long)
        elif name.endswith(("pixel_values", "_masks")) and "pixel_values" in kw:
            kw[name] = torch.randn(*kw["pixel_values"].shape, generator=gen)  # SegGPT's prompt
        elif name == "task_inputs" and isinstance(getattr(cfg, "task_seq_len", None), int):
            kw[name] = _text_ids(cfg, low, vocab, cfg.task_seq_len, gen)  # OneFormer's task
        elif name == "input_values":  # audio beside the text (PE Audio): [B, 1, samples]
            kw[name] = torch.randn(BATCH, 1, 16000, generator=gen)
        elif name == "input_features_mask" and "input_features" in kw:
            kw[name] = _features_mask(cfg, kw["input_features"], variant)
    frames = variant.get("audio_frames")
    if frames and "input_features" in sig and "input_features" not in kw:
        # text-first speech models (Voxtral Realtime): the audio beside the text, [B, mel, T]
        mel = int(getattr(getattr(cfg, "audio_config", None) or cfg, "num_mel_bins", 16))
        kw["input_features"] = torch.randn(BATCH, mel, frames, generator=gen)
    if variant.get("extras"):
        _add_extras(kw, cfg, sig, main, gen)
    is_ed = bool(getattr(cfg, "is_encoder_decoder", False))
    labels_vocab = vocab
    if with_labels:
        if task in ("causal_lm", "masked_lm"):
            kw["labels"] = kw["input_ids" if "input_ids" in kw else main].clone()
        elif task in ("seq2seq", "speech_seq2seq") and not is_ed and main == "input_ids":
            # a decoder-only model under a seq2seq mapping (Voxtral Realtime, VibeVoice): it
            # predicts its own text
            kw["labels"] = kw["input_ids"].clone()
        elif task in ("seq2seq", "speech_seq2seq"):
            kw["labels"] = torch.randint(low, labels_vocab, (BATCH, DEC_SEQ), generator=gen)
        elif task in ("image_cls", "seq_cls", "audio_cls"):
            kw["labels"] = torch.randint(0, int(getattr(cfg, "num_labels", 2)), (BATCH,), generator=gen)
    if is_ed and "labels" not in kw and "decoder_input_ids" in sig:
        kw["decoder_input_ids"] = torch.randint(low, labels_vocab, (BATCH, DEC_SEQ), generator=gen)
    if variant.get("id_books") and "labels" in kw:  # decoder-only: a text label per step
        kw["labels"] = torch.randint(low, labels_vocab, (BATCH, seq), generator=gen)
    books = variant.get("decoder_codebooks")
    if books:  # Dia: the decoder's audio codebooks, [B, T, books]; labels [B * books, T]
        if "labels" in kw:
            kw["labels"] = torch.randint(low, labels_vocab, (BATCH * books, DEC_SEQ), generator=gen)
        kw["decoder_input_ids"] = torch.randint(low, labels_vocab, (BATCH, DEC_SEQ, books),
                                                generator=gen)
    return kw


_EXTRAS = {"bbox", "visual_feats", "pixel_values", "encoder_hidden_states", "spatial_shapes",
           "input_features_mask", "image_embeds_position_mask"}


def _features_mask(cfg, features: torch.Tensor, variant: dict) -> torch.Tensor:
    """All frames valid: [B, frames], the frames last for whisper-style [B, mel, frames] and
    channels-first features."""
    whisper = bool(getattr(cfg, "num_mel_bins", None) and getattr(cfg, "max_source_positions", None))
    last = whisper or variant.get("channels_first")
    return torch.ones(BATCH, features.shape[-1] if last else features.shape[1], dtype=torch.long)  # the inputs _add_extras can synthesize


def _add_extras(kw: Dict[str, Any], cfg, sig: set, main: str, gen: torch.Generator) -> None:
    """The optional inputs a model's forward still needs in practice (it fails without them):
    layout boxes (bros, udop: normalized [x0, y0, x1, y1]), detected-region features and
    positions (lxmert), an image for a text-first model without a vision sub-config (vilt)."""
    seq = kw[main].shape[1] if main in kw and kw[main].dim() > 1 else SEQ
    if "spatial_shapes" in sig:  # NaViT style patches of the vision part (siglip2)
        kw.update(_patch_inputs(None, cfg, ["pixel_values", "pixel_attention_mask",
                                            "spatial_shapes"], gen))
    if "input_features_mask" in sig and "input_features" in kw:
        kw["input_features_mask"] = _features_mask(cfg, kw["input_features"], {})
    n_img = getattr(cfg, "latent_query_num", None)
    if "image_embeds_position_mask" in sig and "input_ids" in kw and isinstance(n_img, int):
        mask = torch.zeros_like(kw["input_ids"])  # Kosmos-2: after the first token, the image
        mask[:, 1:1 + n_img] = 1
        kw["image_embeds_position_mask"] = mask
    if "bbox" in sig and "bbox" not in kw:
        corners = torch.rand(BATCH, seq, 2, 2, generator=gen).sort(dim=2).values  # x0<x1, y0<y1
        kw["bbox"] = corners.transpose(2, 3).reshape(BATCH, seq, 4).contiguous()
    if "visual_feats" in sig and isinstance(getattr(cfg, "visual_feat_dim", None), int):
        regions = 4
        kw["visual_feats"] = torch.randn(BATCH, regions, cfg.visual_feat_dim, generator=gen)
        kw["visual_pos"] = torch.rand(BATCH, regions, int(getattr(cfg, "visual_pos_dim", 4)),
                                      generator=gen)
    if "pixel_values" in sig and "pixel_values" not in kw:
        c, h, w = _image_hw(cfg)
        kw["pixel_values"] = torch.randn(BATCH, c, h, w, generator=gen)
    if "encoder_hidden_states" in sig and isinstance(getattr(cfg, "encoder_hidden_size", None), int):
        kw["encoder_hidden_states"] = torch.randn(BATCH, SEQ, cfg.encoder_hidden_size, generator=gen)


def _series_inputs(cfg, sig: set, gen: torch.Generator) -> Dict[str, Any]:
    """Inputs of a time-series model: a past window of values with its observed mask (all
    observed). The GluonTS-style transformers (time_series_transformer, informer, autoformer)
    take the context plus the lags they look back ([B, context + max lag]) with its time
    features, and the future window the decoder is fed; the patch models (PatchTST, TimesFM)
    take the context, as channels last where the config has input channels."""
    kw: Dict[str, Any] = {}
    ch = getattr(cfg, "num_input_channels", None) or getattr(cfg, "input_size", None) or 1
    tail = (int(ch),) if ch > 1 or "num_input_channels" in vars(cfg) else ()
    if "past_time_features" in sig:
        ctx = int(cfg.context_length)
        past = ctx + max(cfg.lags_sequence)
        pred = int(cfg.prediction_length)
        feats = int(cfg.num_time_features) + int(getattr(cfg, "num_dynamic_real_features", 0))
        kw["past_values"] = torch.randn(BATCH, past, *tail, generator=gen)
        kw["past_time_features"] = torch.randn(BATCH, past, feats, generator=gen)
        kw["past_observed_mask"] = torch.ones_like(kw["past_values"])
        kw["future_values"] = torch.randn(BATCH, pred, *tail, generator=gen)
        kw["future_time_features"] = torch.randn(BATCH, pred, feats, generator=gen)
        return kw
    ctx = int(cfg.context_length)
    if ctx > POSITIONS:  # a maximum, not a required length: a few patches
        ctx = 2 * int(cfg.patch_length)
    kw["past_values"] = torch.randn(BATCH, ctx, *tail, generator=gen)
    if "past_values_padding" in sig:
        kw["past_values_padding"] = torch.zeros(BATCH, ctx, dtype=torch.long)
    if "freq" in sig:
        kw["freq"] = torch.zeros(BATCH, 1, dtype=torch.long)
    return kw


def _image_token_id(cfg) -> int:
    for k in ("image_token_id", "image_token_index", "image_token"):
        for c in (cfg, _text_cfg(cfg)):
            v = getattr(c, k, None)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    raise Skip("inputs cannot be synthesized: no image token id in the config")


_FEATURES = re.compile(r"tokens: (\d+), features:? (\d+)")


def _next_variant(variant: dict, error: Exception, cfg, sig: set,
                  main: str = "input_ids", patches: bool = False) -> Optional[dict]:
    """The inputs to try after a CPU forward failed: for audio, a channel dim or features
    channels-first; for video models, a frame dim; for multimodal text, placeholder tokens for
    as many image features as the model reported, then the text alone (the image inputs a model
    needs beyond pixels, such as grids, cannot be synthesized generically). None: nothing more
    to try."""
    if patches:  # a vision encoder fed a grid of flattened patches: then each as an image
        return None if variant else {"patches": "image"}
    if main == "input_values":
        return None if variant else {"audio_channels": True}
    if main == "input_features":
        if not variant:
            return {"channels_first": True}
        return {"extras": True} if not variant.get("extras") and sig & _EXTRAS else None
    v = _vision_cfg(cfg)
    if main in ("pixel_values", "pixel_values_videos"):
        frames = getattr(v, "num_frames", None) or getattr(cfg, "num_frames", None)
        if not isinstance(frames, int):
            return {"extras": True} if not variant and sig & _EXTRAS - {"pixel_values"} else None
        if not variant:
            return {"frames": min(frames, 8)}
        # then the config's own count (temporal position embeddings sized for it)
        return {"frames": frames} if variant.get("frames", frames) < frames else None
    if not variant and "image_grid_thw" in sig and isinstance(getattr(v, "patch_size", None), int):
        merge = int(getattr(v, "spatial_merge_size", None) or 1)
        g = 2 * merge  # a 1 x g x g patch grid: (g / merge)^2 placeholder tokens per image
        return {"grid": (1, g), "image_tokens": (g // merge) ** 2}
    if not variant and isinstance(getattr(v, "num_frames", None), int) and v is not cfg:
        return {"frames": v.num_frames}  # text + video
    m = _FEATURES.search(str(error))
    if m and not variant and int(m.group(2)) % BATCH == 0:
        per_row = int(m.group(2)) // BATCH
        if 0 < per_row <= MAX_IMAGE_TOKENS:
            return {"image_tokens": per_row}
    if (not variant.get("text_only") and not variant.get("extras")
            and getattr(cfg, "vision_config", None) is not None):
        return {"text_only": True}
    if not variant.get("extras") and sig & _EXTRAS:  # the last try
        return {"extras": True}
    return None


def _try_task(model_type: str, mapping: str, task: str, level: str) -> Optional[Case]:
    """The task's case from the model type's config; where the auto mapping names a class of
    one of its parts (Llama4ForCausalLM under llama4: a text config class) and the whole config
    fails, from that part's config."""
    cls = _class_for(model_type, mapping)
    if cls is None:
        return None
    cfg = small_config(model_type, level)
    want = getattr(cls, "config_class", None)
    part = next((v for k, v in vars(cfg).items() if not k.startswith("_") and want is not None
                 and not isinstance(cfg, want) and isinstance(v, want)), None)
    try:
        return _try_config(model_type, cls, cfg, task, level)
    except Skip:
        raise
    except Exception:
        if part is None:
            raise
    case = _try_config(model_type, cls, part, task, level)
    case.info["config"] = type(part).__name__
    return case


def _try_config(model_type: str, cls, cfg, task: str, level: str) -> Case:
    n = _param_count_meta(cls, cfg)
    if n > MAX_PARAMS:
        raise Skip(f"too large after shrinking: {n / 1e6:.1f}M parameters (limit {MAX_PARAMS / 1e6:.0f}M)")

    def build():
        return cls(cfg)

    probe = build().eval()
    # Inputs must synthesize and the CPU forward must run for the task to be chosen; a failing
    # task falls through to the next one.
    variant: dict = dict(INPUT_VARIANTS.get(model_type, {}))
    while True:
        try:
            with torch.no_grad():
                probe(**make_inputs(probe, cfg, task, torch.Generator().manual_seed(0),
                                    with_labels=False, variant=variant))
            break
        except Skip:
            raise
        except Exception as e:
            variant = _next_variant(variant, e, cfg, _signature(probe),
                                    getattr(probe, "main_input_name", "input_ids"),
                                    _fed_patches(probe, "grid"))
            if variant is None:
                raise
    del probe
    name_cls = cls.__name__
    case = Case(
        zoo=ZOO, name=model_type, build=build,
        inputs=lambda g: make_inputs(build_sig, cfg, task, g, with_labels=False, variant=variant),
        train_inputs=lambda g: make_inputs(build_sig, cfg, task, g, with_labels=True,
                                           variant=variant),
        info={"class": name_cls, "task": task, "shrink": level, **(
            {"inputs": "text only (the image inputs cannot be synthesized)"}
            if variant.get("text_only") else variant)},
    )
    build_sig = _SigHolder(cls)
    if task == "causal_lm":
        tcfg = _text_cfg(cfg)
        pad = getattr(tcfg, "pad_token_id", None)
        eos = getattr(tcfg, "eos_token_id", None)
        if pad is None:
            pad = eos[0] if isinstance(eos, list) and eos else (eos if isinstance(eos, int) else 0)
        case.generate = {"max_new_tokens": 4, "do_sample": False, "num_beams": 1,
                         "pad_token_id": pad, "use_cache": True}
    return case


class _SigHolder:
    """Stands in for the model in make_inputs: what it reads is the class's forward signature and
    main input name, which do not need an instance."""

    def __init__(self, cls):
        self.forward = cls.forward
        self.main_input_name = getattr(cls, "main_input_name", "input_ids")


def make_case(model_type: str) -> Case:
    ok, why = available()
    if not ok:
        return Case(zoo=ZOO, name=model_type, build=_raise(why))
    from .compare import first_line
    failures = []  # of the tiny level: the reason reported when no level builds
    fell = []
    for level in LEVELS:
        for mapping, task in TASKS:
            try:
                case = _try_task(model_type, mapping, task, level)
            except Skip as s:
                (failures if level == "tiny" else fell).append(f"{level} {task}: {s}")
                continue
            except Exception as e:
                (failures if level == "tiny" else fell).append(f"{level} {task}: {first_line(e)}")
                continue
            if case is not None:
                if failures or fell:
                    case.info["fell_through"] = failures + fell
                return case
    failures = [f.split(" ", 1)[1] for f in failures]
    why = "; ".join(failures) if failures else "no auto model class for this model type"
    return Case(zoo=ZOO, name=model_type, build=_raise(f"no task builds on CPU: {why}"[:600]))


def _raise(reason: str):
    def build():
        raise Skip(reason)
    return build
