"""torch.tpu.peak_flops (torch_pjrt/peak_flops.py): the peak behind the MFU figures."""
import torch

from torch_pjrt import peak_flops as pf


def test_cpu_peak_from_the_host_description():
    info = {"model name": "X", "cpu MHz": "2000.000",
            "flags": "fma avx2 avx512f avx512_bf16 amx_bf16 amx_tile"}
    assert pf.cpu_peak(torch.float32, info, cores=2)[0] == 2 * 64 * 2.0e9
    assert pf.cpu_peak(torch.bfloat16, info, cores=2)[0] == 2 * 1024 * 2.0e9
    no_amx = {**info, "flags": "fma avx2 avx512f avx512_bf16"}
    assert pf.cpu_peak(torch.bfloat16, no_amx, cores=4)[0] == 4 * 128 * 2.0e9
    avx2 = {**info, "flags": "fma avx2"}
    assert pf.cpu_peak(torch.bfloat16, avx2, cores=1)[0] == 32 * 2.0e9
    assert pf.cpu_peak(torch.float32, {"flags": "avx2"}, cores=1)[0] == 0.0  # no clock: no figure


def test_this_device_has_a_stated_peak():
    flops, how = torch.tpu.peak_flops()
    assert flops > 0 and ("GFLOP/s" in how or "published" in how)
    assert torch.tpu.peak_flops(torch.float32)[0] <= flops


def test_published_figures_by_device_kind(monkeypatch):
    monkeypatch.setattr(torch.tpu, "get_device_name", lambda device=None: "TPU v5 lite")
    assert pf.peak_flops(torch.bfloat16)[0] == 197e12
    monkeypatch.setattr(torch.tpu, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert pf.peak_flops(torch.bfloat16)[0] == 989e12
