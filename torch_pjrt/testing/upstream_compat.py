"""What the upstream runner changes in a child process before it imports an upstream test file.

Two things, both at run time and never by editing the files:

1. **Adaptations** (``ADAPTATIONS``): the files in ``../shared/upstream-tests/`` come from
   several PyTorch commits, some older than the installed torch, so a helper they import may be
   missing or renamed in the installed ``torch.testing._internal``. Each adaptation supplies the
   name the file expects, built from what the installed torch has, and is reported by the runner
   (``describe()``) so nobody mistakes an adapted file for an untouched one.
2. **Exclusions** through the device test base: tests that cannot apply to this device are
   removed from the ``tpu`` classes with ``PrivateUse1TestBase.test_exclusions``, the mechanism
   ``common_device_type`` gives out-of-tree backends (the CPU classes keep them). Every
   exclusion carries its reason (``upstream_exclusions.EXCLUSIONS``), and the report lists them.
"""
from __future__ import annotations

import functools

from torch_pjrt.testing.upstream_exclusions import EXCLUSIONS

# (module, missing name, how it is supplied): the runner prints this table with each report.
ADAPTATIONS = [
    ("common_methods_invocations", "binary_ufuncs_and_refs",
     "the old name of binary_ufuncs (both are the BinaryUfuncInfos of op_db + python_ref_db)"),
    ("common_methods_invocations", "foreach_lerp_op_db",
     "the _foreach_lerp entries, taken out of the list that holds them in this torch so they "
     "are instantiated once"),
    ("common_device_type", "onlyOnCPUAndCUDA", "the old name of onlyNativeDeviceTypes"),
    ("common_utils", "skipIfMps", "the old name of skipIfMPS"),
    ("common_cuda", "tf32_is_not_fp32",
     "the old helper: whether TF32 differs from float32 on this machine's CUDA device (False "
     "without an Ampere-or-newer CUDA device)"),
    ("opinfo.core", "ForeachFuncInfo.has_no_out_of_place",
     "the old attribute: the negation of ForeachFuncInfo.supports_out (the op has only an "
     "in-place form)"),
    ("common_utils", "skipIfTorchDynamo",
     "accepts the bare-decorator form (@skipIfTorchDynamo without a message) older files use"),
]


def describe():
    return [f"torch.testing._internal.{m}.{name}: {how}" for m, name, how in ADAPTATIONS]


def _adapt():
    from torch.testing._internal import common_device_type as cdt
    from torch.testing._internal import common_methods_invocations as cmi
    from torch.testing._internal import common_utils as cu

    if not hasattr(cmi, "binary_ufuncs_and_refs"):
        cmi.binary_ufuncs_and_refs = tuple(cmi.binary_ufuncs)
    if not hasattr(cmi, "foreach_lerp_op_db"):
        lerp = []
        for name in ("foreach_pointwise_op_db", "foreach_other_op_db", "foreach_binary_op_db"):
            db = getattr(cmi, name, None)
            if db is None:
                continue
            found = [op for op in db if op.name == "_foreach_lerp"]
            for op in found:
                db.remove(op)
            lerp.extend(found)
        cmi.foreach_lerp_op_db = lerp
    if not hasattr(cdt, "onlyOnCPUAndCUDA"):
        cdt.onlyOnCPUAndCUDA = cdt.onlyNativeDeviceTypes
    from torch.testing._internal import common_cuda as cc
    from torch.testing._internal.opinfo import core as opinfo_core

    if not hasattr(cc, "tf32_is_not_fp32"):
        def tf32_is_not_fp32():
            import torch

            if not torch.cuda.is_available():
                return False
            return torch.cuda.get_device_properties(torch.cuda.current_device()).major >= 8

        cc.tf32_is_not_fp32 = tf32_is_not_fp32
    if not hasattr(opinfo_core.ForeachFuncInfo, "has_no_out_of_place"):
        opinfo_core.ForeachFuncInfo.has_no_out_of_place = property(
            lambda self: not self.supports_out)
    if not hasattr(cu, "skipIfMps"):
        cu.skipIfMps = cu.skipIfMPS
    original = cu.skipIfTorchDynamo
    if not getattr(original, "_tpj_adapted", False):
        @functools.wraps(original)
        def skip_if_torch_dynamo(msg="test doesn't currently work with dynamo"):
            if callable(msg):  # bare @skipIfTorchDynamo
                return original()(msg)
            return original(msg)

        skip_if_torch_dynamo._tpj_adapted = True
        cu.skipIfTorchDynamo = skip_if_torch_dynamo


def _exclude():
    from torch.testing._internal.common_device_type import PrivateUse1TestBase

    table = {}
    for cls, tests in EXCLUSIONS.items():
        table[cls] = "*" if tests == "*" else list(tests)
    PrivateUse1TestBase.test_exclusions = table
    # test_exclusions names generic members; one variant of a parametrized member
    # (test_broadcast's fn=map) is named only once instantiated, so those are dropped then
    # (as out-of-tree backends' own instantiate_test skip lists do)
    instantiate = PrivateUse1TestBase.instantiate_test.__func__
    if getattr(instantiate, "_tpj_adapted", False):
        return

    def instantiate_test(cls, name, test, *, generic_cls=None):
        before = set(vars(cls))
        instantiate(cls, name, test, generic_cls=generic_cls)
        excluded = EXCLUSIONS.get(generic_cls.__name__ if generic_cls is not None else "", {})
        if excluded == "*" or not excluded:
            return
        for attr in set(vars(cls)) - before:
            if attr.split("_" + cls.device_type)[0] in excluded:
                delattr(cls, attr)

    instantiate_test._tpj_adapted = True
    PrivateUse1TestBase.instantiate_test = classmethod(instantiate_test)


def install(device: str) -> None:
    """Called by the child's pytest plugin before collection. ``device`` is ``cpu`` or
    ``privateuse1``; exclusions only touch the latter's classes anyway."""
    _adapt()
    if device != "cpu":
        _exclude()
