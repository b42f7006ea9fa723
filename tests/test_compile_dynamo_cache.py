"""PyTorch's Dynamo cache (TORCH_CACHING_PRECOMPILE=1) with the tpu backend
(torch_pjrt/compile/precompile.py): a training step compiled whole, AdamW included, compiles
(torch 2.13 failed the optimizer's frame with "check_fn.guards_state must not be None"), the
cache is saved at exit without a call, and a second process loads the model's frames: Dynamo
traces only the frame PyTorch leaves out of its cache (the optimizer's), nothing is compiled by
XLA, and the losses are the first process's.

A Hugging Face Llama's forward graph holds tensor constants (``get_attr``: the empty key and
value tensors of its KV cache, which it concatenates the new ones to). The Dynamo cache saves a
copy of the AOTAutograd entry that PyTorch makes with the compile's FakeTensorMode still on the
mode stack, which turned those constants into meta tensors in the saved GraphRunner: the second
process failed ("Tensor on device tpu:0 is not on the expected device meta!"; fixed in
graph_runner.GraphRunner.__getstate__/__setstate__)."""
from __future__ import annotations

import pytest
import torch

from _compile_step_script import run_step

DYNAMO_CACHE = {"TORCH_CACHING_PRECOMPILE": "1"}


def test_second_process_loads_the_model_frames_from_the_dynamo_cache(tmp_path):
    first, losses1, _ = run_step(tmp_path, **DYNAMO_CACHE)
    # the model's forward+backward graph and the optimizer's graph
    assert first["traced_graphs"] == 2 and first["compiles"] > 0, first
    assert first["dynamo_cache_hits"] == 0, first
    assert (tmp_path / "inductor" / "dynamo").is_dir()  # saved at exit
    second, losses2, _ = run_step(tmp_path, **DYNAMO_CACHE)
    assert second["dynamo_cache_hits"] > 0, second
    assert second["traced_graphs"] == 1, second  # the optimizer's frame only
    assert second["compiles"] == 0, second
    assert second["graph_runs"] == first["graph_runs"] > 0, (first, second)
    assert losses2 == losses1


def test_hf_llama_second_process_trains_like_the_first_and_like_cpu(tmp_path):
    """The HF Llama step (2 AdamW steps), cold then warm under the Dynamo cache: the warm
    process loads the model's frames (its forward graph holds tensor constants) and its losses
    and every parameter afterwards are the cold process's exactly, and CPU's (eager, the same
    steps) within float tolerance."""
    pytest.importorskip("transformers")
    env = dict(DYNAMO_CACHE, STEP_MODEL="llama", STEP_STEPS="2")
    first, _, cold = run_step(tmp_path, STEP_OUT=str(tmp_path / "cold.pt"),
                              STEP_CPU_REFERENCE="1", **env)
    assert first["traced_graphs"] == 2 and first["dynamo_cache_hits"] == 0, first
    second, _, warm = run_step(tmp_path, STEP_OUT=str(tmp_path / "warm.pt"), **env)
    assert second["dynamo_cache_hits"] > 0, second
    assert second["traced_graphs"] == 1, second  # the optimizer's frame only
    assert second["compiles"] == 0, second
    assert warm["losses"] == cold["losses"], (warm["losses"], cold["losses"])
    torch.testing.assert_close(torch.tensor(warm["losses"]), torch.tensor(cold["cpu_losses"]),
                               rtol=1e-5, atol=1e-5)
    assert warm["params"].keys() == cold["params"].keys() == cold["cpu_params"].keys()
    for name, p in warm["params"].items():
        assert torch.equal(p, cold["params"][name]), f"{name}: warm != cold"
        # AdamW moves an element by up to lr (3e-3) a step, whatever its gradient's size: an
        # element whose gradient is near rounding level moves by a different amount on CPU (a
        # few of the ~100k, up to 1.6e-5 measured); a wrong graph would be off by O(lr)
        torch.testing.assert_close(p, cold["cpu_params"][name], rtol=1e-4, atol=2e-4,
                                   msg=lambda m: f"{name} vs CPU: {m}")


def test_graph_runner_copied_under_a_fake_mode_keeps_its_constants():
    """What PrecompileContext.record_artifact does to an AOTAutograd entry (a deep copy under
    no_dispatch() with the compile's FakeTensorMode still entered): the copied GraphRunner's
    tensor constants stay real tpu tensors with their values, and the copy runs."""
    import copy

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._mode_utils import no_dispatch

    from torch_pjrt.compile.backend import _options
    from torch_pjrt.compile.graph_runner import GraphRunner

    class WithConstant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.tensor([1.5, -2.0, 4.0], device="tpu")  # a plain attribute

        def forward(self, x):
            return (x * self.c,)

    gm = torch.fx.symbolic_trace(WithConstant())
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    runner = GraphRunner(gm, "with_constant", _options(None))
    with FakeTensorMode(), no_dispatch():
        copied = copy.deepcopy(runner)
    assert copied.gm.c.device.type == "tpu", copied.gm.c.device
    x = torch.tensor([2.0, 3.0, -1.0])
    (got,) = copied([x.to("tpu")])
    assert torch.equal(got.cpu(), x * torch.tensor([1.5, -2.0, 4.0]))
