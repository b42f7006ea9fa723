"""The zoos by name, each a module with `available() -> (ok, reason)`, `names() -> [str]` and
`make_case(name) -> Case`."""
from __future__ import annotations

import importlib
import time
from typing import List, Tuple

from .compare import Case, Skip, first_line, run_case, where

ZOOS = {
    "hf": "torch_pjrt.models.hf",
    "timm": "torch_pjrt.models.timm_zoo",
    "torchvision": "torch_pjrt.models.torchvision_zoo",
    "diffusers": "torch_pjrt.models.diffusers_zoo",
    "pretrained": "torch_pjrt.models.pretrained_zoo",
}
# The name a zoo's whole sweep is recorded under when its library does not import (its model
# list cannot be known then).
ALL = "(all models)"


def module(zoo: str):
    return importlib.import_module(ZOOS[zoo])


def names(zoo: str) -> List[str]:
    """The zoo's model names; [ALL] when its library does not import."""
    mod = module(zoo)
    ok, _ = mod.available()
    return mod.names() if ok else [ALL]


def make_case(zoo: str, name: str) -> Case:
    mod = module(zoo)
    ok, why = mod.available()
    if not ok:
        def build():
            raise Skip(why)
        return Case(zoo=zoo, name=name, build=build)
    return mod.make_case(name)


def run_one(zoo: str, name: str, mode: str = "eager") -> dict:
    t0 = time.time()
    try:
        case = make_case(zoo, name)
    except Skip as s:
        return {"zoo": zoo, "name": name, "mode": mode, "status": "skipped", "reason": str(s),
                "phases": {}, "seconds": round(time.time() - t0, 2)}
    except Exception as e:  # a zoo bug: recorded, never fatal to the sweep
        return {"zoo": zoo, "name": name, "mode": mode, "status": "error", "phase": "harness",
                "reason": first_line(e), "where": where(e), "phases": {},
                "seconds": round(time.time() - t0, 2)}
    rec = run_case(case, mode)
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


def select(zoos: List[str], keyword: List[str], limit: int = 0) -> List[Tuple[str, str]]:
    out = []
    for zoo in zoos:
        for n in names(zoo):
            full = f"{zoo}/{n}"
            if keyword and not any(k.lower() in full.lower() for k in keyword):
                continue
            out.append((zoo, n))
    return out[:limit] if limit else out
