"""The first tpu op of a process without importing torch._dynamo.

The output metadata of many ops comes from PyTorch's Python reference implementations, which
are registered as their Meta kernels (dispatch.cpp's meta_returns calls them). Those refs are
wrapped in ``torch._disable_dynamo``, whose wrapper imports ``torch._dynamo`` on its first
call, to build the "not traced by Dynamo" version of the function. That import took about
1.4 s of the first ``x * 2`` of a process on this machine, although nothing can be tracing
while Dynamo is not even imported.

Each such wrapper keeps the version it built as an attribute of the wrapped function
(``fn.__dynamo_disable``) and builds it only while that attribute is missing. This module
sets it, for every wrapped function reachable from the refs and the Meta kernel tables, to an
object that calls the function directly while ``torch._dynamo`` is not imported and, from the
first call after it is, builds and uses exactly what the wrapper would have built. So the
behaviour is the wrapper's own at every moment; only the import is no longer forced.
"""
from __future__ import annotations

import sys
import types

import torch


class _UntilDynamo:
    """``fn.__dynamo_disable`` until Dynamo is imported: a direct call (nothing can trace
    ``fn`` then); afterwards ``torch._dynamo.disable(fn, recursive, wrapping=False)``, which is
    what ``torch._disable_dynamo``'s wrapper computes on its own first call."""

    __slots__ = ("fn", "recursive", "disabled")

    def __init__(self, fn, recursive):
        self.fn = fn
        self.recursive = recursive
        self.disabled = None

    def __call__(self, *args, **kwargs):
        if self.disabled is None:
            dynamo = sys.modules.get("torch._dynamo")
            disable = getattr(dynamo, "disable", None) if dynamo is not None else None
            if disable is None:  # not imported (or still importing): nothing traces
                return self.fn(*args, **kwargs)
            self.disabled = disable(self.fn, self.recursive, wrapping=False)
        return self.disabled(*args, **kwargs)


def _skip_in_dynamo(code) -> None:
    """Tells Dynamo's frame hook never to compile frames of `code` (what
    ``torch._dynamo.eval_frame.skip_code`` does, through the C extension, so torch._dynamo is
    not imported). ``_UntilDynamo.__call__`` runs inside eager ops (their Meta kernels), also
    in the eager parts of a ``torch.compile``'d function (after a graph break, or code Dynamo
    leaves to eager): the wrapper it replaces is in torch/, which Dynamo skips, but this file
    is not, so without this Dynamo compiled a frame per Meta kernel call there (graph breaks
    on the ``disable``d function, recompiles on each new input rank)."""
    try:
        from torch._C._dynamo import eval_frame as ef

        ef.set_code_exec_strategy(
            code, ef._FrameExecStrategy(ef._FrameAction.SKIP, ef._FrameAction.DEFAULT))
    except (ImportError, AttributeError, TypeError):  # another torch: Dynamo may trace it
        pass


_skip_in_dynamo(_UntilDynamo.__call__.__code__)


def _wrapper_code():
    probe = torch._disable_dynamo(lambda: None)
    return probe.__code__


def install() -> int:
    """Sets the attribute on every ``_disable_dynamo`` wrapper reachable from PyTorch's refs,
    prims and Meta kernel tables that has not built its version yet. Returns how many."""
    code = _wrapper_code()
    if set(code.co_freevars) != {"fn", "recursive"}:
        return 0  # another torch whose wrapper looks different: leave it alone
    fn_at = code.co_freevars.index("fn")
    rec_at = code.co_freevars.index("recursive")
    seen: set[int] = set()
    count = 0

    def visit(obj) -> None:
        # Wrappers reach the function they wrap through ``__wrapped__`` or a closure cell:
        # PyTorch's elementwise refs are out_wrapper(type_promotion(_disable_dynamo(ref))) and
        # functools.wraps makes ``__wrapped__`` skip straight to the ref, so the
        # _disable_dynamo layer is only reachable through the cells.
        nonlocal count
        stack = [(obj, 0)]
        while stack:
            obj, depth = stack.pop()
            if obj is None or depth >= 8 or id(obj) in seen:
                continue
            seen.add(id(obj))
            if not isinstance(obj, types.FunctionType):
                stack.append((getattr(obj, "__wrapped__", None), depth + 1))
                continue
            if obj.__code__ is code and obj.__closure__:
                fn = obj.__closure__[fn_at].cell_contents
                recursive = obj.__closure__[rec_at].cell_contents
                if getattr(fn, "__dynamo_disable", None) is None:
                    fn.__dynamo_disable = _UntilDynamo(fn, recursive)
                    count += 1
            stack.append((getattr(obj, "__wrapped__", None), depth + 1))
            for cell in obj.__closure__ or ():
                try:
                    inner = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if isinstance(inner, types.FunctionType):
                    stack.append((inner, depth + 1))

    modules = [m for name, m in list(sys.modules.items())
               if m is not None and (name.startswith("torch._refs") or
                                     name.startswith("torch._prims") or
                                     name in ("torch._decomp.decompositions",
                                              "torch._meta_registrations"))]
    for m in modules:
        for v in list(vars(m).values()):
            if callable(v):
                visit(v)
    from torch._decomp import global_decomposition_table

    for table in global_decomposition_table.values():
        for v in list(table.values()):
            visit(v)
    return count
