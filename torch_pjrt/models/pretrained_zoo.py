"""Pretrained: real trained weights that a PyPI package ships inside itself (nothing downloaded),
run on CPU and on tpu and compared like every other zoo's model (eval forward, one training
step).

- `resemblyzer_voice_encoder`: Resemblyzer 0.1.4's speaker encoder (a 3-layer LSTM, 40 -> 256,
  and a 256 -> 256 projection; `resemblyzer/pretrained.pt`, 17 MB, in the wheel) embedding a
  batch of 160-frame mel spectrograms of synthesized voiced sounds. Embeddings are L2-normed.

The package's `__init__` imports its audio front end (librosa, webrtcvad, scipy), which the
model itself does not use, so it is installed with `pip install --no-deps resemblyzer==0.1.4`
and, when those do not import, the model's own two modules (`hparams.py`, `voice_encoder.py`)
are loaded from the package directory with an empty `resemblyzer.audio` in their place.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import math
import os
import sys
import types
from typing import Dict, List, Tuple

import torch

from .compare import Case, Skip

ZOO = "pretrained"
BATCH = 3
FRAMES = 160  # resemblyzer's partial utterance: 1.6 s of 10 ms frames
SAMPLE_RATE = 16000
N_FFT, HOP, N_MELS = 400, 160, 40  # 25 ms windows, 10 ms hop, 40 mel channels (its hparams)


def available() -> Tuple[bool, str]:
    if importlib.util.find_spec("resemblyzer") is None:
        return False, ("resemblyzer does not import: not installed "
                       "(pip install --no-deps resemblyzer==0.1.4)")
    return True, ""


def _voice_encoder_class():
    try:
        return importlib.import_module("resemblyzer.voice_encoder").VoiceEncoder
    except ImportError:
        pass  # its audio front end's dependencies are missing: load the model modules alone
    spec = importlib.util.find_spec("resemblyzer")
    pkg_dir = spec.submodule_search_locations[0]
    for name in [n for n in sys.modules if n == "resemblyzer" or n.startswith("resemblyzer.")]:
        del sys.modules[name]  # a half-imported package from the attempt above
    pkg = types.ModuleType("resemblyzer")
    pkg.__spec__ = importlib.machinery.ModuleSpec("resemblyzer", None, is_package=True)
    pkg.__spec__.submodule_search_locations = pkg.__path__ = [pkg_dir]
    sys.modules["resemblyzer"] = pkg
    audio = types.ModuleType("resemblyzer.audio")
    sys.modules["resemblyzer.audio"] = pkg.audio = audio
    for sub in ("hparams", "voice_encoder"):
        s = importlib.util.spec_from_file_location(f"resemblyzer.{sub}", f"{pkg_dir}/{sub}.py")
        mod = importlib.util.module_from_spec(s)
        sys.modules[s.name] = mod
        s.loader.exec_module(mod)
        setattr(pkg, sub, mod)
    return pkg.voice_encoder.VoiceEncoder


def _voice_encoder() -> torch.nn.Module:
    try:
        cls = _voice_encoder_class()
    except Exception as e:
        raise Skip(f"resemblyzer's model does not load: {type(e).__name__}: {e}") from e
    model = cls(device="cpu", verbose=False)
    # it loads with strict=False: make sure every parameter came from the file
    pkg_dir = os.path.dirname(sys.modules[cls.__module__].__file__)
    ckpt = torch.load(os.path.join(pkg_dir, "pretrained.pt"), map_location="cpu")
    state = ckpt["model_state"]
    for name, p in model.state_dict().items():
        if name not in state or not torch.equal(state[name], p):
            raise RuntimeError(f"resemblyzer: parameter {name} was not loaded from pretrained.pt")
    return model


def _mel_filters() -> torch.Tensor:
    """[n_fft // 2 + 1, N_MELS] triangular filters evenly spaced on the mel scale, 0-8 kHz."""
    def mel(f):
        return 2595.0 * math.log10(1.0 + f / 700.0)
    edges_mel = torch.linspace(mel(0.0), mel(SAMPLE_RATE / 2), N_MELS + 2, dtype=torch.float64)
    edges_hz = 700.0 * (10.0 ** (edges_mel / 2595.0) - 1.0)
    freqs = torch.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1, dtype=torch.float64)
    lo, mid, hi = edges_hz[:-2], edges_hz[1:-1], edges_hz[2:]
    up = (freqs[:, None] - lo) / (mid - lo)
    down = (hi - freqs[:, None]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0.0).float()


def _voice_mels(gen: torch.Generator) -> Dict[str, torch.Tensor]:
    """Mel power spectrograms [BATCH, FRAMES, N_MELS] of synthesized vowel-like sounds: a
    harmonic series on a gliding pitch (90-250 Hz) under three formant peaks, plus a little
    noise; each item its own pitch and formants."""
    n = (FRAMES - 1) * HOP
    t = torch.arange(n, dtype=torch.float64) / SAMPLE_RATE
    waves = []
    for _ in range(BATCH):
        f0 = 90.0 + 160.0 * torch.rand((), generator=gen, dtype=torch.float64)
        glide = f0 * (1.0 + 0.2 * torch.sin(2 * math.pi * 0.7 * t))
        phase = 2 * math.pi * torch.cumsum(glide, 0) / SAMPLE_RATE
        formants = 300.0 + 2500.0 * torch.rand(3, generator=gen, dtype=torch.float64)
        w = torch.zeros(n, dtype=torch.float64)
        for k in range(1, 30):
            gain = sum(torch.exp(-((k * f0 - f) / 150.0) ** 2) for f in formants)
            w += gain * torch.sin(k * phase)
        w += 0.01 * torch.randn(n, generator=gen, dtype=torch.float64)
        waves.append(w / w.abs().max())
    spec = torch.stft(torch.stack(waves), N_FFT, HOP, window=torch.hann_window(N_FFT,
                      dtype=torch.float64), return_complex=True).abs() ** 2
    mels = (spec.transpose(1, 2).float() @ _mel_filters())[:, :FRAMES]
    return {"mels": mels.contiguous()}


CASES = {
    "resemblyzer_voice_encoder": lambda: Case(
        zoo=ZOO, name="resemblyzer_voice_encoder", build=_voice_encoder, inputs=_voice_mels,
        info={"class": "resemblyzer.VoiceEncoder", "weights": "resemblyzer/pretrained.pt"}),
}


def names() -> List[str]:
    return list(CASES)


def make_case(name: str) -> Case:
    return CASES[name]()
