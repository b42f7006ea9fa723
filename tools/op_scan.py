"""Which aten ops of a model zoo have no tpu kernel, found without running anything on tpu.

Each model of the zoo is built on the meta device (no memory, no compute), run forward in train
mode on a meta batch of 2 images at the harness's input size, and backpropagated, under a
dispatch mode that records every aten op reaching the backend. An op counts as handled on tpu
when it has a StableHLO lowering (csrc/ops), a PrivateUse1 kernel (a decomposition or a
Python kernel of torch_pjrt), or a composite kernel; any other op would take the CPU fallback.
The full sweep (`python -m torch_pjrt.models`) runs for hours; this scan takes minutes, so it
finds missing ops first. Models over the zoo's size limit are counted, not run; a model that
fails on meta (data-dependent code) is listed with its error.

    python tools/op_scan.py --zoo timm [--out scan.jsonl] [-k SUBSTR]

One JSON line per model goes to --out (resumable); a summary goes to stdout.
"""
import argparse
import collections
import json
import os
import signal

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_pjrt  # noqa: F401
from torch_pjrt import device as tpu_device
from torch_pjrt._decompositions import _KEYS_THAT_ALREADY_WORK, _base_name


class _Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def _handled(op, lowered) -> bool:
    if op.namespace != "aten":
        return True
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return _base_name(op) in lowered or any(has(op.name(), k) for k in _KEYS_THAT_ALREADY_WORK)


def _timm_plan(name):
    import timm
    from torch_pjrt.models import timm_zoo
    with torch.device("meta"):
        n = sum(p.numel() for p in timm.create_model(name, pretrained=False,
                                                     num_classes=10).parameters())
    if n > timm_zoo.MAX_PARAMS:
        return None, None, n
    kw, size, _ = timm_zoo._plan(name)
    return (lambda: timm.create_model(name, pretrained=False, num_classes=10, **kw)), size, n


def _timm_names():
    from torch_pjrt.models import timm_zoo
    return timm_zoo.names()


ZOOS = {"timm": (_timm_names, _timm_plan)}  # zoo -> (model names, plan of one model)


def _timeout(*_):
    raise TimeoutError("no result in 60 s")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", choices=sorted(ZOOS), default="timm")
    ap.add_argument("--out", default="op_scan.jsonl")
    ap.add_argument("-k", dest="filter", default="")
    a = ap.parse_args()
    list_names, plan = ZOOS[a.zoo]
    lowered = set(tpu_device._C._lowered_ops())
    done = set()
    if os.path.exists(a.out):
        done = {json.loads(line)["name"] for line in open(a.out)}
    signal.signal(signal.SIGALRM, _timeout)
    with open(a.out, "a") as out:
        for name in list_names():
            if name in done or a.filter not in name:
                continue
            rec = {"zoo": a.zoo, "name": name}
            signal.alarm(60)
            try:
                build, size, n = plan(name)
                rec["params"] = n
                if build is None:
                    rec["skipped"] = "too large"
                else:
                    with torch.device("meta"):
                        m = build().train()
                    mode = _Record()
                    with mode:
                        y = m(torch.randn(2, *size, device="meta"))
                        (y if isinstance(y, torch.Tensor) else y[0]).float().sum().backward()
                    rec["missing"] = sorted(str(o) for o in mode.ops if not _handled(o, lowered))
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            finally:
                signal.alarm(0)
            out.write(json.dumps(rec) + "\n")
            out.flush()
    recs = [json.loads(line) for line in open(a.out)]
    scanned = [r for r in recs if "missing" in r]
    missing = collections.Counter(o for r in scanned for o in r["missing"])
    print(f"{len(recs)} models: {len(scanned)} scanned, "
          f"{sum('skipped' in r for r in recs)} over the size limit, "
          f"{sum('error' in r for r in recs)} failed on meta")
    print(f"models using an op without a tpu kernel: {sum(bool(r['missing']) for r in scanned)}")
    for op, k in missing.most_common():
        print(f"  {op}: {k} models")


if __name__ == "__main__":
    main()
