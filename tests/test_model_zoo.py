"""The model-coverage harness (torch_pjrt.models) on a representative few models, against CPU:
its statuses must mean what they say (a wrong tpu result is a mismatch, an op without a lowering is
a fallback, a model CPU cannot run is skipped), and the same code the sweeps use passes on small
Hugging Face and Diffusers models. timm and torchvision do not import beside this torch (PyPI's
torchvision is built for another torch, and timm imports torchvision); their cases run when they
do, and otherwise the zoo must say so in one skipped record.

The sweeps themselves (`python -m torch_pjrt.models`) are too long for CI; their results are in
docs/models.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from torch_pjrt.models import compare, runner, zoos
from torch_pjrt.models.compare import Case, Skip, run_case

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _importable(zoo: str) -> bool:
    return zoos.module(zoo).available()[0]


def _assert_pass(rec: dict) -> None:
    assert rec["status"] == "pass", json.dumps(rec, indent=1)[:3000]
    assert rec["compared"] > 0 and not rec["fallback_ops"]


# --- the harness's own statuses --------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self, tpu_offset: float = 0.0):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)
        self.tpu_offset = tpu_offset

    def forward(self, x):
        y = torch.tanh(self.lin(x))
        if x.device.type == "tpu":  # a deliberately wrong device result
            y = y + self.tpu_offset
        return y


def _inputs(gen):
    return {"x": torch.randn(3, 6, generator=gen)}


def test_small_module_passes_and_every_gradient_is_compared():
    rec = run_case(Case(zoo="test", name="net", build=_Net, inputs=_inputs))
    _assert_pass(rec)
    # outputs + loss + (weight, bias) gradients + (weight, bias) after the SGD step
    assert rec["compared"] == 1 + 1 + 2 + 2
    assert rec["phases"] == {"forward": "pass", "train": "pass"}


def test_wrong_tpu_result_is_a_mismatch_naming_the_tensor():
    rec = run_case(Case(zoo="test", name="net", build=lambda: _Net(tpu_offset=1e-2), inputs=_inputs))
    assert rec["status"] == "mismatch", rec
    assert rec["phases"]["forward"] == "mismatch" and "out" in rec["mismatched_tensors"]
    assert rec["worst"]["max_abs_err"] > 1e-3


# An op whose tpu kernel adds `err` in float32 only (a planted float32-only inaccuracy, inside
# an op where the per-op audit can see it; CPU's kernel is exact).
_LIB = torch.library.Library("pjrt_zoo_plant", "DEF")
_LIB.define("plant(Tensor x, float err) -> Tensor")
_LIB.impl("plant", lambda x, err: x.clone(), "CPU")
_LIB.impl("plant", lambda x, err: x + err if x.dtype == torch.float32 else x.clone(), "PrivateUse1")
_LIB.impl("plant", lambda x, err: x.clone(), "Meta")
torch.library.register_autograd("pjrt_zoo_plant::plant", lambda ctx, g: (g, None))


class _Cancel(torch.nn.Module):
    """(x + 1e4) - 1e4: float32 keeps x only to about ulp(1e4) = 1e-3, float64 exactly. On tpu in
    float32 an op adds `f32_error` more (a planted error in float32 only): about CPU's own
    rounding error passes the float64 check, far more does not."""

    def __init__(self, f32_error: float):
        super().__init__()
        self.shift = torch.nn.Parameter(torch.tensor(1e4))
        self.f32_error = f32_error

    def forward(self, x):
        y = (x + self.shift) - self.shift
        return torch.ops.pjrt_zoo_plant.plant(y, self.f32_error) * 10


def test_float32_rounding_passes_by_the_float64_check():
    rec = run_case(Case(zoo="test", name="cancel", build=lambda: _Cancel(torch.finfo().eps * 1e4),
                        inputs=_inputs))
    assert rec["status"] == "pass", rec
    assert rec["rounding"]["mismatched"] >= 1 and rec["float64_check"].startswith("float32 rounding")
    assert rec["phases"]["forward"].startswith("pass: float32 rounding")


def test_float32_only_error_beyond_rounding_is_still_a_mismatch():
    rec = run_case(Case(zoo="test", name="cancel", build=lambda: _Cancel(0.5), inputs=_inputs))
    assert rec["status"] == "mismatch", rec
    # float64 matches, the model-level figures do not, and the per-op audit names the op
    assert rec["float64_check"].startswith("float64 matches, but"), rec["float64_check"]
    assert "worst plant" in rec["float64_check"], rec["float64_check"]


def test_a_loss_computed_in_float32_inside_the_model_keeps_the_check_honest():
    # the loss stays float32 in the float64 run (a .float() in the loss, as timm's): its
    # figures are compared in float64, not written off as incomparable (which passed anything)
    rec = run_case(Case(zoo="test", name="cancel", build=lambda: _Cancel(0.5), inputs=_inputs,
                        loss=lambda out: (out.float() ** 2).mean()))
    assert rec["status"] == "mismatch", rec
    assert "inf" not in rec["float64_check"], rec["float64_check"]


class _Amplify(torch.nn.Module):
    """(x - c) * 1e6 with c equal to the input x: exact in float32 and float64 alike, so CPU's
    plain float32 run has no error at all, while one ulp on x moves the output by up to
    ulp(x) * 1e6. On tpu the input first moves by `tpu_error` (the planted op)."""

    def __init__(self, tpu_error: float):
        super().__init__()
        x = _inputs(torch.Generator().manual_seed(compare.INPUT_SEED))["x"]
        self.c = torch.nn.Parameter(x.clone())
        self.tpu_error = tpu_error

    def forward(self, x):
        return (torch.ops.pjrt_zoo_plant.plant(x, self.tpu_error) - self.c) * 1e6


def test_rounding_amplified_beyond_one_lucky_cpu_run_passes_by_the_jittered_runs():
    # CPU's plain float32 run is exact here, so by it alone tpu's input change of 20 * 2**-24
    # (amplified 1e6x) is too far, and the audit rejects the planted op (CPU's kernel is exact,
    # the tpu one some ulps off); CPU's runs with inputs and parameters moved by one ulp show
    # that the model carries rounding that far
    rec = run_case(Case(zoo="test", name="amplify", build=lambda: _Amplify(20 * 2.0 ** -24),
                        inputs=_inputs))
    assert rec["status"] == "pass", json.dumps(rec, indent=1)
    assert "its plain run and 2 with inputs and parameters moved" in rec["float64_check"], \
        rec["float64_check"]
    rec = run_case(Case(zoo="test", name="amplify", build=lambda: _Amplify(1e-3),
                        inputs=_inputs))
    assert rec["status"] == "mismatch", json.dumps(rec, indent=1)


def test_wrong_result_in_float64_too_is_a_mismatch():
    rec = run_case(Case(zoo="test", name="net", build=lambda: _Net(tpu_offset=1e-2), inputs=_inputs))
    assert rec["status"] == "mismatch" and rec["float64_check"].startswith("float64 differs"), rec


# An op both of whose float32 kernels are off by the same relative 1e-3, in opposite directions
# (CPU's up, tpu's down), and exact in float64: tpu is exactly as accurate as CPU.
_LIB.define("wobble(Tensor x) -> Tensor")
_LIB.impl("wobble", lambda x: x * (1 + 1e-3) if x.dtype == torch.float32 else x.clone(), "CPU")
_LIB.impl("wobble", lambda x: x * (1 - 1e-3) if x.dtype == torch.float32 else x.clone(),
          "PrivateUse1")
_LIB.impl("wobble", lambda x: x.clone(), "Meta")
torch.library.register_autograd("pjrt_zoo_plant::wobble", lambda ctx, g: g)


class _Threshold(torch.nn.Module):
    """A decision at a threshold: which |y| exceed |x|. Float64 says none; a rounding error
    flips it, so the integer output differs between the devices."""

    def __init__(self, wobble: bool):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.wobble = wobble

    def forward(self, x):
        x = self.lin(x)
        y = torch.ops.pjrt_zoo_plant.wobble(x) if self.wobble else \
            torch.ops.pjrt_zoo_plant.plant(x, 0.5)
        return y, (y.abs() > x.abs()).long()


def test_a_threshold_that_rounding_flips_on_cpu_too_passes_by_the_audit():
    # CPU's own float32 flips the decision against float64, float64 matches on both devices,
    # and the audit finds every op as accurate as CPU's: rounding, not a wrong op
    rec = run_case(Case(zoo="test", name="threshold", build=lambda: _Threshold(True),
                        inputs=_inputs))
    assert rec["status"] == "pass", json.dumps(rec, indent=1)
    assert "differ in shape, NaN/inf or integer values, as CPU's own float32" in \
        rec["float64_check"] and "per-op audit" in rec["float64_check"], rec["float64_check"]


def test_a_threshold_flipped_only_on_tpu_is_a_mismatch():
    # CPU's float32 decision equals its float64 one: a flip on tpu is not rounding
    rec = run_case(Case(zoo="test", name="threshold", build=lambda: _Threshold(False),
                        inputs=_inputs))
    assert rec["status"] == "mismatch", json.dumps(rec, indent=1)
    assert rec["float64_check"].startswith("not a rounding difference"), rec["float64_check"]


def test_cpu_failure_is_skipped_not_error():
    def build():
        raise ValueError("this config is invalid")
    rec = run_case(Case(zoo="test", name="bad", build=build, inputs=_inputs))
    assert rec["status"] == "skipped"
    assert rec["reason"] == "CPU fails (build): ValueError: this config is invalid"
    rec = run_case(Case(zoo="test", name="noinputs", build=_Net,
                        inputs=lambda g: (_ for _ in ()).throw(Skip("inputs cannot be synthesized"))))
    assert rec["status"] == "skipped" and rec["reason"] == "inputs cannot be synthesized"


def test_tpu_exception_is_an_error_with_phase():
    class Boom(_Net):
        def forward(self, x):
            if x.device.type == "tpu":
                raise RuntimeError("no lowering for this\nsecond line")
            return super().forward(x)
    rec = run_case(Case(zoo="test", name="boom", build=Boom, inputs=_inputs))
    assert rec["status"] == "error" and rec["phase"] == "forward"
    assert rec["reason"] == "RuntimeError: no lowering for this"


def test_random_training_step_is_not_compared_and_says_why():
    class Noisy(_Net):
        def forward(self, x):
            y = self.lin(x)
            return y + torch.rand_like(y) if self.training else y  # RNG in train mode only
    rec = run_case(Case(zoo="test", name="noisy", build=Noisy, inputs=_inputs))
    assert rec["phases"]["forward"] == "pass"
    assert rec["phases"]["train"].startswith("skipped: the training step uses the random number")
    assert rec["status"] == "pass" and "train skipped" in rec["reason"]


def test_random_eval_forward_is_skipped_with_the_reason():
    class Masked(_Net):
        def forward(self, x):
            return self.lin(x) * (torch.rand(x.shape[0], 1) > 0.5)  # random masking in eval too
    rec = run_case(Case(zoo="test", name="masked", build=Masked, inputs=_inputs))
    assert rec["status"] == "skipped"
    assert rec["reason"].startswith("CPU's eval forward pass uses the random number generator")


_lib = torch.library.Library("pjrt_zoo_test", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CPU")  # CPU kernel only: tpu takes the fallback


def test_cpu_fallback_is_reported_with_the_op_name():
    class WithCustomOp(_Net):
        def forward(self, x):
            return self.lin(torch.ops.pjrt_zoo_test.twice(x))
    rec = run_case(Case(zoo="test", name="fb", build=WithCustomOp, inputs=_inputs))
    assert rec["status"] == "fallback", rec
    assert set(rec["fallback_ops"]) == {"pjrt_zoo_test::twice"}
    assert rec["phases"] == {"forward": "pass", "train": "pass"}


def test_diff_tolerances():
    c = torch.tensor([1.0, 100.0, float("nan"), float("inf")])
    assert compare.diff("t", c, c.clone(), "output").ratio == 0
    d = compare.diff("t", c, torch.tensor([1.0, 100.0 + 2e-2, float("nan"), float("inf")]), "output")
    assert d.ratio == pytest.approx(2e-2 / (1e-4 + 1e-4 * 100.0), rel=1e-3) and d.ratio > 1  # float32 100.02
    assert compare.diff("t", c, torch.tensor([1.0, 100.0, 0.0, float("inf")]), "output").note.startswith("NaN")
    assert compare.diff("t", torch.ones(2), torch.ones(3), "output").note.startswith("shape")
    assert compare.diff("t", torch.tensor([1, 2]), torch.tensor([1, 3]), "output").ratio == float("inf")


# --- the zoos, through the same code the sweeps run --------------------------------------------


HF_FEW = ["gpt2", "bert", "t5"]


@pytest.mark.long
@pytest.mark.skipif(not _importable("hf"), reason="transformers does not import")
@pytest.mark.parametrize("name", HF_FEW)
def test_hf_models(name):
    rec = zoos.run_one("hf", name)
    _assert_pass(rec)
    assert rec["phases"]["train"] == "pass"
    if rec["info"]["task"] == "causal_lm":
        assert rec["phases"]["generate"] == "pass"
        assert all(len(seq) == 12 + 4 for seq in rec["generated"])


@pytest.mark.long
@pytest.mark.skipif(not _importable("diffusers"), reason="diffusers does not import")
@pytest.mark.parametrize("name", ["unet2d_condition", "dit_transformer2d"])
def test_diffusers_models(name):
    _assert_pass(zoos.run_one("diffusers", name))


@pytest.mark.long
@pytest.mark.skipif(not _importable("diffusers"), reason="diffusers does not import")
def test_diffusers_ddpm_pipeline():
    _assert_pass(zoos.run_one("diffusers", "ddpm_pipeline"))


# long (29 s, the slowest of CI's suite; `scripts/test.sh --long` runs it): CI's
# 20-minute budget
@pytest.mark.long
def test_pretrained_voice_encoder_embeddings_equal_cpu():
    # real trained weights shipped inside a PyPI package (scripts/test.sh installs it); the
    # harness's whole case (forward and training step) is the long test below
    from torch_pjrt.models import pretrained_zoo
    ok, why = pretrained_zoo.available()
    assert ok, why
    model = pretrained_zoo._voice_encoder().eval()
    mels = pretrained_zoo._voice_mels(torch.Generator().manual_seed(1))["mels"]
    with torch.no_grad():
        want = model(mels)
        got = model.to("tpu")(mels.to("tpu"))
    assert got.device.type == "tpu" and got.dtype == want.dtype and got.shape == want.shape == (3, 256)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    # distinct inputs give distinct unit embeddings (the weights are real, not a constant map)
    sim = want @ want.T
    assert torch.allclose(sim.diagonal(), torch.ones(3)) and (sim.triu(1)[sim.triu(1) != 0] < 0.99).all()


@pytest.mark.long
def test_pretrained_zoo_case():
    _assert_pass(zoos.run_one("pretrained", "resemblyzer_voice_encoder"))


@pytest.mark.parametrize("zoo,names", [("timm", ["test_resnet.r160_in1k", "test_vit.r160_in1k"]),
                                       ("torchvision", ["resnet18", "mobilenet_v3_small"])])
def test_timm_and_torchvision(zoo, names):
    ok, why = zoos.module(zoo).available()
    if not ok:
        # the zoo's whole sweep is one skipped record carrying the import error
        assert zoos.names(zoo) == [zoos.ALL]
        rec = zoos.run_one(zoo, zoos.ALL)
        assert rec["status"] == "skipped" and rec["reason"] == why and "does not import" in why
        return
    for name in names:
        _assert_pass(zoos.run_one(zoo, name))


# --- the subprocess driver: JSONL, resume, timeout -----------------------------------------------


@pytest.mark.long
def test_runner_writes_resumable_jsonl_and_records_timeouts(tmp_path):
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "torch_pjrt.models", "--zoo", "hf", "-k", "hf/distilbert",
           "-k", "hf/gpt2", "-j", "1", "--out", str(out)]
    assert [n for _, n in zoos.select(["hf"], ["hf/distilbert", "hf/gpt2"])] == ["distilbert", "gpt2"]
    # a timeout far below the model's run time: an error record, no hang
    r = subprocess.run(cmd + ["--timeout", "0.5", "--limit", "1"], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = runner.load_records(str(out))
    assert [x["name"] for x in recs] == ["distilbert"]
    assert recs[0]["status"] == "error" and recs[0]["phase"] == "worker"
    assert recs[0]["reason"].startswith("timeout"), recs[0]
    # resume: the recorded model is not run again; the next one is, and passes
    r = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = runner.load_records(str(out))
    assert [x["name"] for x in recs] == ["distilbert", "gpt2"]
    assert recs[1]["status"] == "pass", recs[1]


def test_report_renders_rates_and_reasons(tmp_path):
    from torch_pjrt.models import report
    path = tmp_path / "results-x.jsonl"
    recs = [
        {"zoo": "hf", "name": "a", "status": "pass"},
        {"zoo": "hf", "name": "b", "status": "error", "phase": "train",
         "reason": "RuntimeError: no lowering for aten::foo", "fallback_ops": {}},
        {"zoo": "hf", "name": "c", "status": "fallback", "reason": "CPU fallback: aten::bar",
         "fallback_ops": {"aten::bar": 3}},
        {"zoo": "timm", "name": zoos.ALL, "status": "skipped", "reason": "timm does not import"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    md = tmp_path / "models.md"
    report.write_report([str(path)], str(md))
    text = md.read_text()
    assert "| hf | 3 | 1 | 1 | 0 | 1 | 0 | 33% | 33% |" in text
    assert "| timm | 1 | 0 | 0 | 0 | 0 | 1 | 0% | - |" in text
    assert "| `aten::bar` | 1 |" in text
    assert "train: RuntimeError: no lowering for aten::foo" in text


def test_rcnn_sampler_picks_the_same_samples_on_both_devices_under_any_seed():
    pytest.importorskip("torchvision")  # imports beside torch 2.14.1 (docs/torch-releases.md)
    from torchvision.models.detection._utils import BalancedPositiveNegativeSampler
    from torch_pjrt.models.torchvision_zoo import _FixedSampler
    matched = [torch.tensor([1, 0, -1, 2, 0, 0, 1, 0, 3, 0]), torch.tensor([0, 0, 1, -2, 0, 4])]
    sampler = _FixedSampler(BalancedPositiveNegativeSampler(4, 0.5))
    runs = []
    for seed, dev in ((0, "cpu"), (1, "cpu"), (0, "tpu")):
        torch.manual_seed(seed)
        pos, neg = sampler([m.to(dev) for m in matched])
        assert all(p.device.type == dev for p in pos + neg)
        runs.append([t.cpu() for t in pos + neg])
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    assert [int(p.sum()) for p in runs[0][:2]] == [2, 2]  # at most half of 4 are positives


class _PlainListNet(torch.nn.Module):
    """Keeps a layer in a plain list (a model bug seen in HF's OneFormer): .to() leaves it on CPU."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 3)
        self.proj = [torch.nn.Linear(3, 3)]
        self.alias = [self.lin]  # a plain list of registered layers is harmless

    def forward(self, x):
        return self.proj[0](self.lin(x))


def test_layers_in_a_plain_list_are_a_cpu_only_model_not_a_tpu_error():
    rec = run_case(Case(zoo="test", name="plain", build=_PlainListNet, inputs=_inputs))
    assert rec["status"] == "skipped" and "proj" in rec["reason"], rec
    net = _PlainListNet()
    del net.proj
    from torch_pjrt.models.compare import _unregistered_modules
    assert _unregistered_modules(net) == ""


# --- compiled mode (`--compile`): torch.compile(model), plain, against CPU eager ----------------


class _Broken(_Net):
    """A graph break in the middle of the forward pass: two Dynamo graphs per compiled call."""

    def forward(self, x):
        y = self.lin(x)
        torch._dynamo.graph_break()
        return torch.tanh(y) * 2


def _assert_compiled(rec: dict) -> dict:
    assert rec["mode"] == "compile", rec
    _assert_pass(rec)
    assert rec["phases"] == {"forward": "pass", "train": "pass"}
    # forward, training forward+loss and SGD step each compiled at least one graph
    assert set(rec["compile_phases"]) == {"forward", "train", "sgd step"}
    assert all(n >= 1 for n in rec["compile_phases"].values()), rec["compile_phases"]
    c = rec["compile"]
    assert c["graphs"] == sum(rec["compile_phases"].values())
    assert c["graph_breaks"] == sum(c["break_reasons"].values())
    # the harness adds no graph break of its own (the compiled loss draws no random numbers),
    # nor does torch_pjrt (the Meta kernels' wrapper is not traced: _meta_no_dynamo.py)
    assert not any("Generator" in k or "opaque object" in k or "disable" in k
                   for k in c["break_reasons"]), c["break_reasons"]
    assert c["recompiles"] == len(c["recompile_reasons"])
    assert c["graph_runs"] >= 0 and "graph_captures" in c
    return c


def test_compiled_mode_small_module_passes_with_every_gradient_compared():
    rec = run_case(Case(zoo="test", name="net", build=_Net, inputs=_inputs), "compile")
    c = _assert_compiled(rec)
    assert rec["compared"] == 1 + 1 + 2 + 2  # output, loss, 2 gradients, 2 updated parameters
    assert rec["compile_phases"]["forward"] == 1 and rec["compile_phases"]["train"] == 1
    assert rec["fallback_ops"] == {}
    assert c["graphs"] >= 3 and c["recompiles"] == 0, c


def test_compiled_mode_records_graph_breaks_with_their_reason():
    rec = run_case(Case(zoo="test", name="broken", build=_Broken, inputs=_inputs), "compile")
    c = _assert_compiled(rec)
    assert rec["compile_phases"]["forward"] == 2 and rec["compile_phases"]["train"] >= 2
    user = [k for k in c["break_reasons"] if "graph_break()" in k]
    assert user and c["break_reasons"][user[0]] >= 2, c["break_reasons"]  # forward and train
    assert "\n" not in user[0] and len(user[0]) <= 300
    # the frames compiled around the break under no_grad (eval) are compiled again for
    # training: recompiles, each with its guard failure
    assert c["recompiles"] >= 1 and all("grad_mode" in r for r in c["recompile_reasons"]), c


def test_compiled_mode_wrong_result_is_a_mismatch():
    rec = run_case(Case(zoo="test", name="net", build=lambda: _Net(tpu_offset=1e-2),
                        inputs=_inputs), "compile")
    assert rec["mode"] == "compile" and rec["status"] == "mismatch", rec
    assert "out" in rec["mismatched_tensors"] and rec["compile"]["graphs"] >= 1
    # the float64 check reruns compiled; no per-op audit for compiled programs
    assert rec["float64_check"].startswith("float64 differs"), rec["float64_check"]


def test_compiled_mode_rounding_flip_passes_when_compiled_matches_the_audited_eager_run():
    # The per-op audit checks eager ops; in compiled mode it is consulted only once the
    # compiled run is shown to match the same model run eagerly on tpu (here: exactly, the
    # planted op runs the same kernel in both)
    rec = run_case(Case(zoo="test", name="threshold", build=lambda: _Threshold(True),
                        inputs=_inputs), "compile")
    assert rec["mode"] == "compile" and rec["status"] == "pass", json.dumps(rec, indent=1)
    assert "the compiled run matches the eager tpu run" in rec["float64_check"] and \
        "per-op audit" in rec["float64_check"], rec["float64_check"]


def test_compiled_mode_error_beyond_rounding_is_still_a_mismatch_by_the_audit():
    rec = run_case(Case(zoo="test", name="cancel", build=lambda: _Cancel(0.5), inputs=_inputs),
                   "compile")
    assert rec["status"] == "mismatch", rec
    assert rec["float64_check"].startswith("float64 matches, but"), rec["float64_check"]
    # the compiled run is as accurate as the eager tpu run (the same planted error), so the
    # audit of the eager ops decides, and it names the op
    assert "the eager tpu run's float32" in rec["float64_check"] and \
        "worst plant" in rec["float64_check"], rec["float64_check"]


class _UnusedHead(_Net):
    """A second head whose output the loss never reads, computed before a graph break in the
    graph that also computes what the loss reads (as in siglip2's and sam3's compiled
    forward): eager autograd leaves its gradients None; the graph's backward (AOTAutograd, on
    CPU's `aot_eager` as well) returns zeros for them. `tpu_leak` adds the head's output into
    the first output on tpu only, so that the head then gets a nonzero gradient on tpu alone."""

    def __init__(self, tpu_leak: float = 0.0):
        super().__init__()
        self.head = torch.nn.Linear(6, 2)
        self.tpu_leak = tpu_leak

    def forward(self, x):
        unused = self.head(x)
        y = self.lin(x)
        if x.device.type == "tpu" and self.tpu_leak:
            y = y + self.tpu_leak * unused.sum()
        torch._dynamo.graph_break()
        return torch.tanh(y), unused


def _first_output_loss(out):
    return out[0].sum()


def test_compiled_mode_zero_gradient_where_eager_has_none_is_compile_semantics():
    rec = run_case(Case(zoo="test", name="unused", build=_UnusedHead, inputs=_inputs,
                        loss=_first_output_loss), "compile")
    _assert_pass(rec)
    assert rec["info"]["zero_grad_where_eager_none"] == ["head.weight", "head.bias"], rec
    # two outputs, the loss, the 2 gradients eager has, and all 4 parameters after the SGD
    # step (the head's included)
    assert rec["compared"] == 2 + 1 + 2 + 4


def test_compiled_mode_nonzero_gradient_on_tpu_only_is_a_mismatch():
    rec = run_case(Case(zoo="test", name="unused", build=lambda: _UnusedHead(tpu_leak=1e-3),
                        inputs=_inputs, loss=_first_output_loss), "compile")
    assert rec["status"] == "mismatch", rec
    assert "grad head.weight" in rec["mismatched_tensors"], rec


def test_compiled_mode_error_names_the_cause_and_keeps_dynamo_counts():
    class Boom(_Net):
        def forward(self, x):
            if x.device.type == "tpu":
                raise RuntimeError("no lowering for this")
            return super().forward(x)
    rec = run_case(Case(zoo="test", name="boom", build=Boom, inputs=_inputs), "compile")
    assert rec["status"] == "error" and rec["phase"] == "forward", rec
    assert "no lowering for this" in rec["reason"] and "compile" in rec


def test_compiled_mode_cli_defaults_and_report(tmp_path):
    from torch_pjrt.models import report
    from torch_pjrt.models.__main__ import _default_out
    assert _default_out(["hf"]).endswith("results-hf.jsonl")
    assert _default_out(["hf"], "compile").endswith("results-hf-compile.jsonl")
    assert _default_out(["hf"], "eager", "defer_and_fuse").endswith(
        "results-hf-defer_and_fuse.jsonl")
    assert _default_out(["timm"], "compile", "defer_and_fuse").endswith(
        "results-timm-compile-defer_and_fuse.jsonl")
    rec = run_case(Case(zoo="hf", name="broken", build=_Broken, inputs=_inputs), "compile")
    rec["eager_mode"] = "strict"
    eager = [{"zoo": "hf", "name": "broken", "status": "pass", "eager_mode": "strict"},
             {"zoo": "hf", "name": "other", "status": "error", "phase": "train",
              "reason": "RuntimeError: x", "eager_mode": "strict"},
             {"zoo": "hf", "name": "broken", "status": "mismatch", "eager_mode": "defer_and_fuse"}]
    (tmp_path / "results-hf.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eager))
    (tmp_path / "results-hf-compile.jsonl").write_text(json.dumps(rec) + "\n")
    md = tmp_path / "models.md"
    report.write_report([str(tmp_path / "results-hf.jsonl"),
                         str(tmp_path / "results-hf-compile.jsonl")], str(md))
    text = md.read_text()
    # the eager sections keep the strict records only; each mode gets its column
    assert "| hf | 2 | 1 | 0 | 0 | 1 | 0 | 50% | 50% |" in text
    assert ("| zoo | strict | defer_and_fuse | strict on defer_and_fuse's models | compile |"
            " strict on compile's models |") in text
    assert ("| hf | 1/2 (50%); 1 error | 0/1 (0%); 1 mismatch | 1/1 (100%) | 1/1 (100%) |"
            " 1/1 (100%) |") in text
    assert "## Compiled mode (torch.compile)" in text
    assert "Call to `torch._dynamo.graph_break()`" in text  # the break reasons table
    assert "| hf/broken | pass | pass | " in text
