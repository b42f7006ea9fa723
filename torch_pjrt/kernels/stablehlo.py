"""Raw StableHLO kernels as PyTorch ops: ``stablehlo_op("ns::name", module_text, out_shapes_fn)``.

The module's ``@main`` is the kernel; its argument types are the op's (static shapes and
dtypes: the op takes exactly those), and ``out_shapes_fn(*inputs)`` gives the results' shapes
and dtypes for PyTorch (the op's Meta/fake function, which torch.compile traces with). Both are
checked at registration: the module must parse (with JAX's MLIR bindings where JAX is
installed, else by a trial compile on the device's plugin) and out_shapes_fn's answer for the
module's argument types must equal the module's result types; a mismatch is a ValueError.
"""
from __future__ import annotations

import torch

from . import _module, _ops, _registry

_LIBS: dict[str, torch.library.Library] = {}


def _as_types(what: str, answer) -> tuple[_module.TensorType, ...]:
    if (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], torch.dtype)):
        answer = [answer]
    try:
        out = []
        for item in answer:
            if isinstance(item, torch.Tensor):
                out.append(_module.TensorType(tuple(int(s) for s in item.shape), item.dtype))
            else:
                shape, dtype = item
                if not isinstance(dtype, torch.dtype):
                    raise TypeError
                out.append(_module.TensorType(tuple(int(s) for s in shape), dtype))
        return tuple(out)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: out_shapes_fn must return (shape, dtype) pairs (or tensors), "
                        f"got {answer!r}") from None


def stablehlo_op(name: str, module_text: str, out_shapes_fn, *, parse: bool = True):
    """Defines the op `name` ("namespace::name") running the StableHLO module `module_text`.

    out_shapes_fn(*inputs) returns the results' (shape, dtype) pairs (one pair for one result)
    or tensors of those shapes and dtypes; it is called with meta or fake tensors. Returns the
    op (``torch.ops.namespace.name``). On the tpu device the module is inlined as a call in the
    program of each call site (fused with its neighbours in defer_and_fuse and torch.compile);
    there is no CPU implementation and no autograd formula. parse=False processes the text
    without JAX's MLIR bindings even where they are installed (then the module is checked by a
    trial compile on the device)."""
    ns, op = _ops.split_name(name)
    if not callable(out_shapes_fn):
        raise TypeError(f"stablehlo_op {name}: out_shapes_fn must be callable")
    try:
        kernel = _module.prepare(module_text, parse=parse)
    except ValueError as e:
        raise ValueError(f"stablehlo_op {name}: {e}") from None
    declared = _as_types(name, out_shapes_fn(
        *(torch.empty(a.shape, dtype=a.dtype, device="meta") for a in kernel.args)))
    if declared != kernel.results:
        raise ValueError(
            f"stablehlo_op {name}: out_shapes_fn gives {[str(t) for t in declared]} for the "
            f"module's arguments {[str(t) for t in kernel.args]}, but the module returns "
            f"{[str(t) for t in kernel.results]}")
    kernel = _registry.register(kernel)
    if not parse or _module._mlir() is None:
        _trial_compile(name, kernel)
    params = [(f"x{i}", "Tensor", None) for i in range(len(kernel.args))]
    nres = len(kernel.results)
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define(op + _ops.args_text(params) + " -> " + _ops.returns_text(nres))

    def fake(*inputs):
        _registry.check_inputs(name, kernel, inputs)
        outs = [torch.empty(r.shape, dtype=r.dtype, device=inputs[0].device if inputs else "meta")
                for r in _as_types(name, out_shapes_fn(*inputs))]
        return outs[0] if nres == 1 else tuple(outs)

    def tpu_impl(*inputs):
        _registry.check_inputs(name, kernel, inputs)
        _ops.on_tpu(name, inputs)
        outs = _registry.call(kernel, inputs)
        return outs[0] if nres == 1 else tuple(outs)

    torch.library.register_fake(name, fake, lib=lib)
    lib.impl(op, tpu_impl, "PrivateUse1")
    _LIBS[name] = lib
    return getattr(getattr(torch.ops, ns), op)


def _trial_compile(name: str, kernel) -> None:
    """Without JAX nothing here parses StableHLO: one call on zeros makes the plugin compile
    the module now (a program cached for later calls of these types), so a bad module fails at
    registration, not at the user's first call."""
    from .. import modes
    zeros = [torch.zeros(a.shape, dtype=a.dtype, device="tpu") for a in kernel.args]
    try:
        with modes.eager_mode("strict"):
            outs = _registry.call(kernel, zeros)
            for o in outs[:1]:
                o.cpu()
    except RuntimeError as e:
        raise ValueError(f"stablehlo_op {name}: the module does not compile on the device's "
                         f"plugin: {e}") from None
