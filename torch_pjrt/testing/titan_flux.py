"""Local stand-ins for the assets of TorchTitan 0.3.0's FLUX debug recipe (issue 37).

``flux_debugmodel`` (torchtitan/models/flux/config_registry.py) reads, besides its own code:

* the T5 and CLIP tokenizers ``google/t5-v1_1-xxl`` and ``openai/clip-vit-large-patch14``
  (``FluxTokenizer``, torchtitan/models/flux/tokenizer.py: ``T5Tokenizer.from_pretrained``,
  ``CLIPTokenizer.from_pretrained``; options ``--tokenizer.t5-tokenizer-path``,
  ``--tokenizer.clip-tokenizer-path``);
* the T5 encoder and CLIP text model of the same names (``FluxEmbedder``,
  model/hf_embedder.py: ``T5EncoderModel`` / ``CLIPTextModel.from_pretrained``, or with
  ``--encoder.random-init`` only their ``config.json``; options ``--encoder.t5-encoder``,
  ``--encoder.clip-encoder``). Which class a path gets is decided by whether "clip" is in it;
* the FLUX.1 autoencoder ``assets/hf/FLUX.1-dev/ae.safetensors`` (``load_ae``,
  model/autoencoder.py; ``--encoder.autoencoder-path``);
* the ``cc12m-test`` images, ``tests/assets/cc12m_test/*.tar`` in torchtitan's source tree
  (flux_datasets.py: ``load_dataset(path, data_files={"train": "*.tar"}, streaming=True)``, a
  WebDataset of ``.jpg`` + ``.txt`` pairs; ``--dataloader.dataset-path``).

None of them is in torchtitan's wheel, and the hub is not reachable here. ``make_flux_assets``
writes stand-ins made here, with no download, from fixed seeds:

* a small T5 tokenizer (a Unigram vocabulary of the words and characters of 512 captions of
  the same kind, in ``T5Tokenizer``'s layout: pad 0, eos 1, unk 2) and a CLIP tokenizer (a
  byte-level BPE with CLIP's ``</w>`` word ends, trained on them with the ``tokenizers``
  library), saved with ``save_pretrained``;
* a T5 encoder (gated-GELU, T5 v1.1's kind) and a CLIP text model with the widths the
  ``flux-debug`` model expects (``context_in_dim`` 4096 = T5's ``d_model``, ``vec_in_dim`` 768 =
  CLIP's pooled width) but 2 layers each and small feed-forwards, randomly initialized at
  seed 0, saved with ``save_pretrained`` next to their tokenizers;
* the autoencoder: torchtitan's own ``AutoEncoder`` with ``flux-debug``'s config, built at
  seed 0 on the CPU, saved with ``safetensors``;
* 32 procedurally drawn 256 x 256 images (shapes on a plain background) with captions that
  describe them, as one WebDataset tar in the ``cc12m-test`` layout.
"""
from __future__ import annotations

import io
import json
import os
import random
import tarfile

# flux-debug's model (torchtitan/models/flux/__init__.py, _flux_debug): txt_in takes T5's
# d_model, vector_in takes CLIP's pooled output
T5_D_MODEL = 4096
CLIP_WIDTH = 768
CLIP_MAX_TOKENS = 77  # FluxTokenizerContainer gives CLIP max_length 77
IMAGES = 32
IMAGE_SIDE = 256

_COLORS = {
    "red": (200, 40, 40), "green": (40, 160, 60), "blue": (40, 70, 200), "yellow": (230, 210, 40),
    "orange": (240, 140, 30), "purple": (130, 50, 160), "black": (20, 20, 20),
    "white": (240, 240, 240), "gray": (128, 128, 128), "pink": (240, 150, 190),
}
_SHAPES = ("circle", "square", "triangle", "bar")
_SIZES = {"small": 0.18, "large": 0.38}


def _draw(rng: random.Random):
    """One image and its caption: a background colour and 1-3 shapes, each with a colour, a
    size and a place, all named in the caption."""
    from PIL import Image, ImageDraw

    names = list(_COLORS)
    bg = rng.choice(names)
    img = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), _COLORS[bg])
    d = ImageDraw.Draw(img)
    parts = []
    for _ in range(rng.randint(1, 3)):
        color = rng.choice([n for n in names if n != bg])
        shape, size = rng.choice(_SHAPES), rng.choice(list(_SIZES))
        half = int(_SIZES[size] * IMAGE_SIDE / 2)
        cx = rng.randint(half, IMAGE_SIDE - half)
        cy = rng.randint(half, IMAGE_SIDE - half)
        box = (cx - half, cy - half, cx + half, cy + half)
        if shape == "circle":
            d.ellipse(box, fill=_COLORS[color])
        elif shape == "square":
            d.rectangle(box, fill=_COLORS[color])
        elif shape == "triangle":
            d.polygon([(cx, cy - half), (cx - half, cy + half), (cx + half, cy + half)],
                      fill=_COLORS[color])
        else:
            d.rectangle((cx - half, cy - half // 4, cx + half, cy + half // 4), fill=_COLORS[color])
        where = ("top" if cy < IMAGE_SIDE / 3 else "bottom" if cy > 2 * IMAGE_SIDE / 3
                 else "middle")
        side = ("left" if cx < IMAGE_SIDE / 3 else "right" if cx > 2 * IMAGE_SIDE / 3
                else "center")
        parts.append(f"a {size} {color} {shape} at the {where} {side}")
    caption = " and ".join(parts) + f", on a {bg} background."
    return img, caption[0].upper() + caption[1:]


def _captions_and_tar(folder: str, count: int = IMAGES, seed: int = 0) -> list[str]:
    """Writes ``folder/shard-000000.tar`` (``NNNNNN.jpg`` + ``NNNNNN.txt`` members, WebDataset's
    layout); returns the captions."""
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    captions = []
    with tarfile.open(os.path.join(folder, "shard-000000.tar"), "w") as tar:
        for i in range(count):
            img, caption = _draw(rng)
            captions.append(caption)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=92)
            for ext, payload in (("jpg", buf.getvalue()), ("txt", caption.encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size, info.mtime = len(payload), 0
                tar.addfile(info, io.BytesIO(payload))
    return captions


def _t5_tokenizer(texts: list[str], folder: str):
    """T5's tokenizer class over a Unigram vocabulary from ``texts``: every word (with
    SentencePiece's word-start mark) scored by its log frequency, and every character, scored
    lower, so that any text of those characters splits."""
    import collections
    import math

    from transformers import T5Tokenizer

    words = collections.Counter(w for t in texts for w in t.split())
    chars = collections.Counter(c for t in texts for c in t if not c.isspace())
    total = sum(words.values()) + sum(chars.values())
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]  # pad 0, eos 1, unk 2
    vocab += [("\u2581" + w, math.log(n / total)) for w, n in sorted(words.items())]
    vocab += [(c, math.log(n / total) - 10.0) for c, n in sorted(chars.items())]
    t5 = T5Tokenizer(vocab=vocab, extra_ids=0)
    t5.save_pretrained(folder)
    return t5


def _clip_tokenizer(texts: list[str], folder: str):
    """CLIP's tokenizer class over a byte-level BPE (``</w>`` word ends, lower case) trained on
    ``texts``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    specials = ["<|startoftext|>", "<|endoftext|>"]
    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=700, special_tokens=specials, end_of_word_suffix="</w>",
        initial_alphabet=alphabet, show_progress=False))
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    for ch in sorted(alphabet):  # every byte also as a whole word's end: no unknown words
        vocab.setdefault(ch + "</w>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    clip = CLIPTokenizer(vocab=vocab, merges=merges)
    clip.save_pretrained(folder)
    return clip


def _t5_encoder(vocab: int, folder: str, seed: int) -> None:
    import torch
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=vocab, d_model=T5_D_MODEL, d_kv=32, d_ff=256, num_layers=2,
                   num_heads=4, feed_forward_proj="gated-gelu", dropout_rate=0.0,
                   tie_word_embeddings=False, pad_token_id=0, eos_token_id=1,
                   decoder_start_token_id=0)
    torch.manual_seed(seed)
    T5EncoderModel(cfg).save_pretrained(folder)


def _clip_encoder(vocab: int, eos: int, pad: int, bos: int, folder: str, seed: int) -> None:
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(vocab_size=vocab, hidden_size=CLIP_WIDTH, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=CLIP_MAX_TOKENS, projection_dim=CLIP_WIDTH,
                         eos_token_id=eos, pad_token_id=pad, bos_token_id=bos)
    torch.manual_seed(seed)
    CLIPTextModel(cfg).save_pretrained(folder)


def _autoencoder(path: str, seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from torchtitan.models.flux.config_registry import flux_debugmodel

    cfg = flux_debugmodel().model_spec.model.autoencoder
    torch.manual_seed(seed)
    with torch.device("cpu"):
        ae = cfg.build()
    save_file({k: v.contiguous() for k, v in ae.state_dict().items()}, path)


def make_flux_assets(folder: str, seed: int = 0, autoencoder: bool = True) -> dict[str, str]:
    """Writes the stand-ins under ``folder`` (kept when already there: a ``done`` marker) and
    returns their paths: ``t5`` and ``clip`` (tokenizer and encoder each), ``autoencoder``
    (a .safetensors file) and ``data`` (the cc12m-test folder). Needs transformers, tokenizers,
    PIL, safetensors, and torchtitan for the autoencoder."""
    paths = {"t5": os.path.join(folder, "t5-encoder"),
             "clip": os.path.join(folder, "clip-text"),
             "autoencoder": os.path.join(folder, "autoencoder", "ae.safetensors"),
             "data": os.path.join(folder, "cc12m_test")}
    # FluxTokenizer and FluxEmbedder take a path for CLIP's when "clip" is in it
    assert "clip" not in paths["t5"].lower(), paths["t5"]
    done = os.path.join(folder, "done")
    if os.path.exists(done) and (not autoencoder or os.path.exists(paths["autoencoder"])):
        return paths
    _captions_and_tar(paths["data"], seed=seed)
    rng = random.Random(seed + 1)  # the tokenizers' training text: more captions of the kind
    corpus = [_draw(rng)[1] for _ in range(512)]
    t5 = _t5_tokenizer(corpus, paths["t5"])
    clip = _clip_tokenizer(corpus, paths["clip"])
    _t5_encoder(len(t5), paths["t5"], seed)
    _clip_encoder(len(clip), clip.eos_token_id, clip.pad_token_id, clip.bos_token_id,
                  paths["clip"], seed)
    if autoencoder:
        os.makedirs(os.path.dirname(paths["autoencoder"]), exist_ok=True)
        _autoencoder(paths["autoencoder"], seed)
    with open(done, "w") as f:
        f.write("ok\n")
    return paths


# The matrix's size for flux-debug: 64 x 64 images (an 8 x 8 latent, 16 image tokens after
# 2 x 2 packing) and 32 T5 tokens, a 48-token sequence (the recipe: 256 x 256 and 256 tokens,
# 512), so that 20 steps on 2 ranks fit this machine's 2 cores.
MATRIX_SIZE = ("--dataloader.img-size", "64", "--tokenizer.max-t5-encoding-len", "32")


def flux_args(paths: dict[str, str], random_init: bool = True) -> list[str]:
    """The options that point flux_debugmodel at the stand-ins. ``random_init``: the
    autoencoder, T5 and CLIP weights are initialized by torchtitan (``--encoder.random-init``,
    one switch for all three; T5 and CLIP from the saved ``config.json``) instead of loaded:
    ``load_ae`` reads ae.safetensors with ``safetensors.torch.load_file(path,
    device=str(device))``, and safetensors 0.8.0 refuses every device string with an index
    ("device cpu:0 is invalid", "device tpu:0 is invalid"), the CPU's included."""
    args = ["--tokenizer.t5-tokenizer-path", paths["t5"],
            "--tokenizer.clip-tokenizer-path", paths["clip"],
            "--encoder.t5-encoder", paths["t5"], "--encoder.clip-encoder", paths["clip"],
            "--dataloader.dataset", "cc12m-test", "--dataloader.dataset-path", paths["data"]]
    if random_init:
        return args + ["--encoder.random-init"]
    return args + ["--encoder.autoencoder-path", paths["autoencoder"]]
