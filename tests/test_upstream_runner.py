"""The upstream-test runner (torch_pjrt/testing/upstream.py): ids paired across devices, seeded
samples, the headline's arithmetic, and a whole run over a small device-generic file written
here in PyTorch's style, with a test that fails only on tpu, one that kills its process and
one that hangs."""
import json
import os
import subprocess
import sys
import textwrap

from torch_pjrt.testing import upstream, upstream_ids

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ids_pair_cpu_and_both_tpu_spellings():
    cpu = upstream_ids.normalize("f.py::TestFooCPU::test_bar_cpu_float32")
    first = upstream_ids.normalize("f.py::TestFooPRIVATEUSE1::test_bar_privateuse1_float32")
    later = upstream_ids.normalize("f.py::TestFooTPU::test_bar_tpu_float32")
    assert cpu == first == later == "TestFooDEV::test_bar_dev_float32"
    # a parameter spelled like a device normalizes the same way on both sides
    assert (upstream_ids.normalize("f.py::TCPU::test_to_cpu_cpu")
            == upstream_ids.normalize("f.py::TTPU::test_to_cpu_tpu"))
    assert upstream_ids.generic_class(cpu) == "TestFoo"


def test_sample_is_seeded_and_roughly_the_fraction():
    ids = [f"T::test_{i}" for i in range(4000)]
    a = [i for i in ids if upstream_ids.in_sample(i, 0.1, "0")]
    b = [i for i in ids if upstream_ids.in_sample(i, 0.1, "0")]
    c = [i for i in ids if upstream_ids.in_sample(i, 0.1, "1")]
    assert a == b and a != c
    assert 300 < len(a) < 500


def _res(**outcomes):
    return {"tests": {k: {"outcome": v, "message": f"RuntimeError: {k} 12x34"}
                      for k, v in outcomes.items()}}


def test_compare_counts_only_cpu_passing_twins_that_ran():
    cpu = _res(a="passed", b="passed", c="passed", d="failed", e="passed", f="passed")
    tpu = _res(a="passed", b="failed", c="skipped", d="passed", f="crashed")
    c = upstream.compare(cpu, tpu)
    assert c["cpu_passed"] == 5
    assert c["twins_ran"] == 3  # a, b, f (c skipped, d failed on CPU, e not instantiated)
    assert c["twins_passed"] == 1 and c["twins_skipped"] == 1 and c["not_instantiated"] == 1
    assert abs(c["share"] - 1 / 3) < 1e-9
    causes = {g[1] for g in c["groups"]}
    assert "RuntimeError: b NxN" in causes  # numbers and shapes blurred into one cause


FILE = '''
import os, time, torch
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.common_device_type import instantiate_device_type_tests, dtypes

class TestMini(TestCase):
    @dtypes(torch.float32, torch.int64)
    def test_add(self, device, dtype):
        a = torch.arange(6, device=device).to(dtype)
        self.assertEqual((a + a).cpu(), torch.arange(6).to(dtype) * 2)

    def test_on_cpu_only(self, device):  # "cpu" in a name normalizes like a device
        self.assertEqual(torch.device(device).type, "cpu")

    def test_dies(self, device):
        if torch.device(device).type != "cpu":
            os._exit(3)

    def test_hangs(self, device):
        if torch.device(device).type != "cpu":
            time.sleep(600)

    def test_after(self, device):
        self.assertEqual(torch.ones(2, device=device).sum().item(), 2.0)

instantiate_device_type_tests(TestMini, globals())

if __name__ == "__main__":
    run_tests()
'''


def test_whole_run_survives_a_crash_and_a_hang(tmp_path):
    (tmp_path / "test_mini.py").write_text(textwrap.dedent(FILE))
    out = tmp_path / "r.json"
    baseline = tmp_path / "b.json"
    baseline.write_text(json.dumps({"twins_passed": {"test_mini.py": 4}}))
    r = subprocess.run(
        [sys.executable, "-m", "torch_pjrt.testing.upstream", "test_mini", "--dir",
         str(tmp_path), "--timeout", "10", "--json", str(out), "--check-against",
         str(baseline)], capture_output=True, text=True, timeout=900, cwd=REPO)
    report = json.loads(out.read_text())
    s = report["files"]["test_mini.py"]
    tpu = s["tests"]["tpu"]
    assert tpu["TestMiniDEV::test_add_dev_float32"]["outcome"] == "passed"
    assert tpu["TestMiniDEV::test_on_dev_only_dev"]["outcome"] == "failed"
    assert tpu["TestMiniDEV::test_dies_dev"]["outcome"] == "crashed"
    assert tpu["TestMiniDEV::test_hangs_dev"]["outcome"] == "hung"
    assert tpu["TestMiniDEV::test_after_dev"]["outcome"] == "passed"  # ran after restarts
    c = s["compare"]
    assert c["cpu_passed"] == 6 and c["twins_ran"] == 6 and c["twins_passed"] == 3
    # below the baseline's 4, and crashed: the check fails the command
    assert r.returncode == 1, r.stdout + r.stderr
    assert "below the recorded 4" in r.stderr and "crashed or hung" in r.stderr


PARAM_FILE = '''
import ctypes, torch
from torch.testing._internal.common_utils import TestCase, parametrize, run_tests
from torch.testing._internal.common_device_type import instantiate_device_type_tests

class TestTorchDeviceType(TestCase):
    @parametrize("fn", ["map", "add"])
    def test_broadcast(self, device, fn):
        self.assertEqual(torch.ones(2, device=device).sum().item(), 2.0)

    def test_segfault(self, device):
        if torch.device(device).type != "cpu":
            ctypes.string_at(0)

instantiate_device_type_tests(TestTorchDeviceType, globals())

if __name__ == "__main__":
    run_tests()
'''


def test_one_variant_of_a_parametrized_test_is_excluded_and_a_crash_names_its_signal(tmp_path):
    """upstream_exclusions names test_broadcast_fn_map (TestTorchDeviceType): only that variant
    of the parametrized member is dropped for tpu, with its reason; a segfault's report names
    the signal and the innermost frame (faulthandler's)."""
    (tmp_path / "test_param.py").write_text(textwrap.dedent(PARAM_FILE))
    out = tmp_path / "r.json"
    subprocess.run(
        [sys.executable, "-m", "torch_pjrt.testing.upstream", "test_param", "--dir",
         str(tmp_path), "--timeout", "60", "--json", str(out)],
        capture_output=True, text=True, timeout=900, cwd=REPO)
    s = json.loads(out.read_text())["files"]["test_param.py"]
    tpu = s["tests"]["tpu"]
    assert tpu["TestTorchDeviceTypeDEV::test_broadcast_fn_add_dev"]["outcome"] == "passed"
    assert "TestTorchDeviceTypeDEV::test_broadcast_fn_map_dev" not in tpu
    assert s["compare"]["excluded"] == 1
    crash = tpu["TestTorchDeviceTypeDEV::test_segfault_dev"]
    assert crash["outcome"] == "crashed"
    assert "Segmentation fault" in crash["message"] and "test_param.py" in crash["message"]
