"""A kernel's StableHLO module text made ready to be inlined into torch_pjrt programs.

A module (from ``jax.export`` or written by hand) becomes a list of ``func.func`` definitions,
all private, without debug locations, module attributes or argument/result attributes, whose
symbols carry a prefix derived from a fingerprint of the text: the C side
(csrc/ops/kernel.c) appends them after the program's ``@main`` and calls the entry function, so
two kernels, or one kernel called twice, never clash in one program, and the fingerprint (the
kernel's id, part of every program key that calls it) names exactly this text.

With JAX installed the module is parsed by the MLIR bindings jaxlib ships (so a malformed
module is an error here, with the parser's diagnostics) and printed back without debug
information. Without JAX the text is processed as text (locations removed, the module wrapper
unwrapped); the plugin's compiler is then the parser (torch_pjrt.kernels.stablehlo_op makes a
trial compile at registration).
"""
from __future__ import annotations

import dataclasses
import hashlib
import re

import torch

# StableHLO element types -> torch dtypes (those torch_pjrt can hold)
_ELEMENT = {
    "f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
    "ui8": torch.uint8, "i1": torch.bool,
    "complex<f32>": torch.complex64, "complex<f64>": torch.complex128,
}


@dataclasses.dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A processed kernel: id (fingerprint, also the symbol prefix), the entry function's
    symbol, the functions' text, and the entry's argument and result types."""
    id: str
    callee: str
    text: str
    args: tuple[TensorType, ...]
    results: tuple[TensorType, ...]


def _mlir():
    """(ir, context factory) from jaxlib's MLIR bindings, or None without JAX."""
    try:
        from jax._src.interpreters import mlir as jax_mlir
        from jax._src.lib.mlir import ir
    except ImportError:
        return None
    return ir, jax_mlir.make_ir_context


def _functions_with_mlir(text: str, mlir) -> list[str]:
    ir, make_context = mlir
    with make_context():
        try:
            module = ir.Module.parse(text)
        except Exception as e:  # jaxlib raises MLIRError (an Exception) with the diagnostics
            raise ValueError(f"the StableHLO module does not parse: {e}") from None
        funcs = []
        for op in module.body.operations:
            op = op.operation
            if op.name != "func.func":
                raise ValueError(f"the StableHLO module has a top-level '{op.name}' operation; "
                                 "only func.func definitions can be inlined")
            for name in ("arg_attrs", "res_attrs"):
                if name in op.attributes:
                    del op.attributes[name]
            op.attributes["sym_visibility"] = ir.StringAttr.get("private")
            funcs.append(op.get_asm(enable_debug_info=False))
        return funcs


def _strip_locations(text: str) -> str:
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#loc"))
    out, i = [], 0
    for m in re.finditer(r"\bloc\(", text):
        if m.start() < i:
            continue
        depth, j = 0, m.end() - 1
        while j < len(text):
            depth += text[j] == "("
            depth -= text[j] == ")"
            j += 1
            if depth == 0:
                break
        out.append(text[i:m.start()])
        i = j
    out.append(text[i:])
    return "".join(out)


def _functions_as_text(text: str) -> list[str]:
    text = _strip_locations(text)
    m = re.match(r"\s*module\b[^{]*\{", text)
    if m:
        end = text.rfind("}")
        if end < m.end():
            raise ValueError("the StableHLO module's braces do not match")
        text = text[m.end():end]
    if "func.func" not in text:
        raise ValueError("the StableHLO module defines no function")
    text = re.sub(r"func\.func\s+(?:public\s+|private\s+)?@", "func.func private @", text)
    return [text.strip()]


def _split_types(segment: str, what: str) -> tuple[TensorType, ...]:
    types = []
    for body in re.findall(r"tensor<([^>]*(?:<[^>]*>)?[^>]*)>", segment):
        parts = body.split("x") if not body.startswith("complex") else [body]
        # dims are the leading integer parts; the rest is the element type (complex<f32> has
        # no 'x' of its own)
        dims = []
        while parts and re.fullmatch(r"\d+", parts[0]):
            dims.append(int(parts.pop(0)))
        element = "x".join(parts)
        if element.startswith("?") or "?" in body:
            raise ValueError(f"{what} type tensor<{body}> has a dynamic dimension; kernels need "
                             "static shapes")
        if element not in _ELEMENT:
            raise ValueError(f"{what} type tensor<{body}>: element type '{element}' is not "
                             "supported")
        types.append(TensorType(tuple(dims), _ELEMENT[element]))
    return tuple(types)


def _signature(text: str, callee: str):
    m = re.search(r"func\.func\s+private\s+@" + re.escape(callee) + r"\(", text)
    if not m:
        raise ValueError("the StableHLO module has no function @main (the kernel's entry)")
    depth, j = 1, m.end()
    while j < len(text) and depth:
        depth += text[j] == "("
        depth -= text[j] == ")"
        j += 1
    args = text[m.end():j - 1]
    rest = text[j:]
    body = re.search(r"\{\s*$", rest, re.M)  # the '{' opening the body ends the signature line
    results = rest[:body.start()] if body else ""
    return _split_types(args, "argument"), _split_types(results, "result")


def prepare(text: str, *, parse: bool = True) -> Kernel:
    """The kernel of a module text (ValueError when it cannot be one). parse=False skips the
    MLIR bindings even where JAX is installed (the text route, for tests of it)."""
    if not isinstance(text, str):
        raise TypeError(f"a StableHLO module must be a str, got {type(text).__name__}")
    mlir = _mlir() if parse else None
    funcs = _functions_with_mlir(text, mlir) if mlir else _functions_as_text(text)
    body = "\n".join(funcs)
    if '@"' in body:
        raise ValueError("quoted symbol names are not supported in kernel modules")
    kid = "pjk_" + hashlib.sha256(body.encode()).hexdigest()[:32]
    names = set(re.findall(r"func\.func\s+private\s+@([A-Za-z_][\w$.]*)", body))
    for name in sorted(names, key=len, reverse=True):
        body = re.sub(r"@" + re.escape(name) + r"(?![\w$.])", f"@{kid}_{name}", body)
    callee = f"{kid}_main"
    args, results = _signature(body, callee)
    return Kernel(kid, callee, body, args, results)
