"""What jax_op and stablehlo_op share: op names and schemas, torch.library definitions."""
from __future__ import annotations

import inspect

import torch

_SCALAR_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}


def split_name(name: str) -> tuple[str, str]:
    if not isinstance(name, str) or name.count("::") != 1:
        raise ValueError(f"a kernel op's name is 'namespace::name', got {name!r}")
    ns, op = name.split("::")
    if not ns.isidentifier() or not op.isidentifier():
        raise ValueError(f"a kernel op's name is 'namespace::name' of identifiers, got {name!r}")
    return ns, op


def params_from_signature(fn) -> list[tuple[str, str, object]]:
    """(name, schema type, default) per parameter of fn: parameters without a default are
    Tensors; ones with a bool/int/float/str default are static arguments of that type."""
    params = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"{fn.__name__}: *args/**kwargs parameters cannot form an op schema;"
                             " pass schema=")
        if p.default is inspect.Parameter.empty:
            params.append((p.name, "Tensor", None))
        elif type(p.default) in _SCALAR_TYPES:
            params.append((p.name, _SCALAR_TYPES[type(p.default)], p.default))
        else:
            raise ValueError(f"{fn.__name__}: parameter {p.name} has a default of type "
                             f"{type(p.default).__name__}; static arguments are bool, int, float "
                             "or str (pass schema= otherwise)")
    return params


def params_from_schema(args: str) -> list[tuple[str, str, object]]:
    """(name, type, default) per argument of a schema's argument list "(Tensor x, float a=1.0)"."""
    schema = torch._C.parse_schema(f"_pj_probe::f{args} -> ()")
    out = []
    for a in schema.arguments:
        t = str(a.type)
        if t not in ("Tensor", "bool", "int", "float", "str"):
            raise ValueError(f"kernel op argument {a.name}: type {t} is not supported (Tensor, "
                             "bool, int, float, str)")
        out.append((a.name, t, a.default_value if a.has_default_value() else None))
    return out


def args_text(params) -> str:
    parts = []
    for name, t, default in params:
        if t == "Tensor" or default is None:
            parts.append(f"{t} {name}")
        elif t == "str":
            parts.append(f"{t} {name}={default!r}".replace("'", '"'))
        else:
            parts.append(f"{t} {name}={default!r}")
    return "(" + ", ".join(parts) + ")"


def returns_text(n: int) -> str:
    if n < 1:
        raise ValueError("a kernel op returns at least one tensor")
    return "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"


def on_tpu(what: str, tensors) -> None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least "
                           f"two devices, {sorted(map(str, devices))[0]} and "
                           f"{sorted(map(str, devices))[1]}! ({what})")
