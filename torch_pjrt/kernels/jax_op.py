"""JAX (and Pallas) functions as PyTorch ops: ``jax_op("ns::name", fn)``.

For each combination of input dtypes, shapes and static-argument values the op meets, `fn` is
exported with ``jax.export`` for the plugin's platform on ``jax.ShapeDtypeStruct``s of the
inputs, and the exported StableHLO becomes a registered kernel (torch_pjrt/kernels/_module.py):
a call on the tpu device is one ``tpu::kernel_call``, inlined into the program of its neighbours.
The backward is another op, ``ns::name_bwd``, running a kernel exported the same way from
``jax.vjp`` of fn (or from a user-supplied JAX backward). The Meta/fake function comes from
``jax.eval_shape``; on CPU tensors the op runs fn with JAX's own CPU backend (a reference).
"""
from __future__ import annotations

import threading

import torch

from . import _module, _ops, _registry

INSTALL = "pip install jax==0.10.2 jaxlib==0.10.2"
_LIBS: dict[str, torch.library.Library] = {}


def _jax():
    try:
        import jax
        import jax.numpy  # noqa: F401
        from jax import export  # noqa: F401
    except ImportError as e:
        raise ImportError(f"torch_pjrt.kernels.jax_op needs JAX ({e}); install it with: "
                          f"{INSTALL}") from None
    return jax


def platform() -> str:
    """The plugin's platform as jax.export names it ("cpu", "cuda", "rocm", "tpu")."""
    from ..device import _C
    p = _C.platform_name().lower()
    return {"gpu": "cuda"}.get(p, p)


def _dtype_table() -> dict:
    import jax.numpy as jnp
    return {
        torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
        torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32,
        torch.int16: jnp.int16, torch.int8: jnp.int8, torch.uint8: jnp.uint8,
        torch.bool: jnp.bool_, torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
        torch.float8_e4m3fn: jnp.float8_e4m3fn, torch.float8_e5m2: jnp.float8_e5m2,
        torch.float8_e4m3fnuz: jnp.float8_e4m3fnuz, torch.float8_e5m2fnuz: jnp.float8_e5m2fnuz,
        torch.float8_e8m0fnu: jnp.float8_e8m0fnu,
    }


# The float8 dtypes are bytes on the device (docs/low_precision.md): a kernel takes and returns
# them as uint8 and bitcasts to JAX's float8 type inside (_bytes_at_edges). float4_e2m1fn_x2
# (two values per byte) has no JAX counterpart.
_BYTES = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
          torch.float8_e8m0fnu}


def _jax_dtype(dt: torch.dtype):
    table = _dtype_table()
    if dt not in table:
        raise TypeError(f"jax_op: tensors of dtype {dt} are not supported")
    return table[dt]


def _torch_dtype(dt) -> torch.dtype:
    import numpy as np
    for t, j in _dtype_table().items():
        if np.dtype(j) == np.dtype(dt):
            return t
    raise TypeError(f"jax_op: JAX dtype {dt} has no torch dtype here")


def _edge_dtype(t: torch.Tensor):
    """The JAX dtype a kernel takes a tensor as: uint8 for the float8 dtypes (their bytes)."""
    import jax.numpy as jnp
    return jnp.uint8 if t.dtype in _BYTES else _jax_dtype(t.dtype)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype in _BYTES else t


def _bytes_at_edges(f, tensors):
    """f over the tensors' own dtypes -> the same over their edge dtypes (_edge_dtype): float8
    inputs arrive as uint8 and are bitcast, float8 results leave as their uint8 bytes."""
    import numpy as np
    import jax.numpy as jnp
    from jax import lax
    kinds = [_jax_dtype(t.dtype) if t.dtype in _BYTES else None for t in tensors]
    f8 = [np.dtype(_jax_dtype(d)) for d in _BYTES]

    def g(*vals):
        vals = [v if k is None else lax.bitcast_convert_type(v, k) for v, k in zip(vals, kinds)]
        return tuple(lax.bitcast_convert_type(o, jnp.uint8) if np.dtype(o.dtype) in f8 else o
                     for o in f(*vals))
    return g


_X64 = {torch.float64, torch.int64, torch.complex128}


class _JaxOp:
    """One jax_op: its schema, the JAX function over the tensor arguments for given static
    values, and the kernels exported so far (per signature)."""

    def __init__(self, name, fn, params, nout, backward):
        self.name, self.fn, self.params, self.nout = name, fn, params, nout
        self.backward = backward
        self.tensor_pos = [i for i, p in enumerate(params) if p[1] == "Tensor"]
        self._lock = threading.Lock()
        self._kernels: dict[tuple, tuple] = {}

    # ---- arguments ----
    def normalize(self, args, kwargs):
        """The op's arguments in schema order, defaults filled in (the dispatcher passes a
        Python kernel what the caller passed)."""
        if len(args) > len(self.params):
            raise TypeError(f"{self.name}: takes {len(self.params)} arguments, got {len(args)}")
        full = list(args)
        for name, t, default in self.params[len(args):]:
            if name in kwargs:
                full.append(kwargs.pop(name))
            elif t != "Tensor" and default is not None:
                full.append(default)
            else:
                raise TypeError(f"{self.name}: missing argument '{name}'")
        if kwargs:
            raise TypeError(f"{self.name}: unexpected arguments {sorted(kwargs)}")
        return full

    def split(self, args):
        tensors = [args[i] for i in self.tensor_pos]
        static = tuple((i, args[i]) for i in range(len(args)) if i not in self.tensor_pos)
        return tensors, static

    def full_args(self, tensor_vals, static):
        args = [None] * len(self.params)
        for i, v in zip(self.tensor_pos, tensor_vals):
            args[i] = v
        for i, v in static:
            args[i] = v
        return args

    def flat_outputs(self, out):
        jax = _jax()
        leaves = jax.tree_util.tree_leaves(out)
        if len(leaves) != self.nout:
            raise ValueError(f"jax_op {self.name}: the function returns {len(leaves)} arrays, "
                             f"the op was defined with num_outputs={self.nout}")
        return leaves

    def forward_fn(self, static):
        def f(*tensor_vals):
            return tuple(self.flat_outputs(self.fn(*self.full_args(tensor_vals, static))))
        return f

    @staticmethod
    def differentiable(t) -> bool:
        return (t.dtype.is_floating_point and t.dtype not in _BYTES) or t.dtype.is_complex

    def backward_fn(self, static, diff):
        """JAX function (tensor inputs..., output cotangents...) -> gradients of the
        differentiable tensor inputs (diff: their positions among the tensor inputs)."""
        jax = _jax()
        n = len(self.tensor_pos)
        forward = self.forward_fn(static)

        def b(*vals):
            primals, cts = list(vals[:n]), vals[n:]
            if self.backward is not None:
                ct = cts[0] if self.nout == 1 else tuple(cts)
                grads = self.backward(*self.full_args(primals, static), ct)
                grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
                if len(grads) != n:
                    raise ValueError(f"jax_op {self.name}: backward returned {len(grads)} "
                                     f"gradients for {n} tensor arguments")
                return tuple(grads[i] for i in diff)

            def of_diff(*dv):
                vals_ = list(primals)
                for i, v in zip(diff, dv):
                    vals_[i] = v
                return forward(*vals_)
            _, pull = jax.vjp(of_diff, *(primals[i] for i in diff))
            return tuple(pull(tuple(cts)))
        return b

    # ---- kernels ----
    def call(self, kind, f, tensors, static) -> list[torch.Tensor]:
        """Runs f's kernel for these tensors' signature (exported on first use) on them."""
        k, kept, views = self.kernel(kind, f, tensors, static)
        outs = _registry.call(k, [tensors[i] for i in kept])
        # float8 results come back as their bytes (_bytes_at_edges)
        return [o if dt is None else o.view(dt) for o, dt in zip(outs, views)]

    def kernel(self, kind, f, tensors, static):
        """The kernel for this signature, the positions of the tensors it takes (jax.export
        drops arguments the function does not use: module_kept_var_idx) and, per result, the
        float8 dtype its bytes are to be viewed as (else None)."""
        sig = (kind, tuple((t.dtype, tuple(t.shape)) for t in tensors), static)
        with self._lock:
            found = self._kernels.get(sig)
        if found is not None:
            return found
        jax = _jax()
        from jax import export
        structs = [jax.ShapeDtypeStruct(tuple(int(s) for s in t.shape), _edge_dtype(t))
                   for t in tensors]
        with jax.enable_x64(any(t.dtype in _X64 for t in tensors)):
            exported = export.export(jax.jit(_bytes_at_edges(f, tensors)),
                                     platforms=[platform()])(*structs)
            text = exported.mlir_module()
        kept = tuple(sorted(exported.module_kept_var_idx))
        views = tuple(dt if dt in _BYTES else None for dt in
                      (_torch_dtype(v.dtype) for v in jax.tree_util.tree_leaves(
                          self.shapes(f, tensors))))
        k = _registry.register(_module.prepare(text))
        if len(k.args) != len(kept):
            raise RuntimeError(f"jax_op {self.name}: the exported module takes {len(k.args)} "
                               f"arguments, jax.export kept {len(kept)}")
        with self._lock:
            self._kernels[sig] = (k, kept, views)
        return k, kept, views

    def shapes(self, f, tensors):
        jax = _jax()
        structs = [jax.ShapeDtypeStruct(tuple(int(s) for s in t.shape), _jax_dtype(t.dtype))
                   for t in tensors]
        with jax.enable_x64(any(t.dtype in _X64 for t in tensors)):
            return jax.eval_shape(f, *structs)

    def run_cpu(self, f, tensors):
        """fn on JAX's own CPU backend (the CPU implementation: a reference for tests)."""
        jax = _jax()
        with jax.enable_x64(any(t.dtype in _X64 for t in tensors)):
            cpu = jax.devices("cpu")[0]
            vals = [jax.device_put(jax.dlpack.from_dlpack(_bytes_of(t.detach().contiguous())),
                                   cpu) for t in tensors]
            outs = [torch.from_dlpack(o).clone()
                    for o in jax.jit(_bytes_at_edges(f, tensors))(*vals)]
            if all(o.dtype != torch.uint8 for o in outs):
                return outs
            # uint8 results may be float8 bytes (_bytes_at_edges): f's own result dtypes say
            dts = [_torch_dtype(v.dtype) for v in jax.tree_util.tree_leaves(self.shapes(f, tensors))]
            return [o.view(dt) for o, dt in zip(outs, dts)]


def jax_op(name: str, fn, *, schema: str | None = None, num_outputs: int = 1, backward=None):
    """Defines the op `name` ("namespace::name") computing the JAX function `fn`.

    fn's parameters without a default are tensors (JAX arrays inside fn); parameters with a
    bool/int/float/str default are static arguments (Python values inside fn; each value gets
    its own exported kernel). `schema` ("(Tensor x, float scale=1.0)", arguments only) replaces
    the one derived from fn's signature. fn returns `num_outputs` arrays (an array, or a tuple).

    Gradients: ``jax.vjp`` of fn by default; `backward`, a JAX function called as
    ``backward(*args, g)`` (the op's arguments in order, g the output cotangent, a tuple for
    several outputs) returning one gradient per tensor argument, replaces it. Gradients flow to
    floating-point and complex tensor arguments.

    Returns the op (``torch.ops.namespace.name``): on tpu tensors the exported kernel is inlined
    into the program (fused in defer_and_fuse and torch.compile, which traces the op as one
    node); on CPU tensors fn runs on JAX's CPU backend. Raises ImportError without JAX."""
    _jax()
    ns, op = _ops.split_name(name)
    if not callable(fn):
        raise TypeError(f"jax_op {name}: fn must be callable")
    if backward is not None and not callable(backward):
        raise TypeError(f"jax_op {name}: backward must be callable")
    if not isinstance(num_outputs, int) or num_outputs < 1:
        raise ValueError(f"jax_op {name}: num_outputs must be a positive int")
    params = _ops.params_from_schema(schema) if schema else _ops.params_from_signature(fn)
    if not any(p[1] == "Tensor" for p in params):
        raise ValueError(f"jax_op {name}: the op needs at least one Tensor argument")
    j = _JaxOp(name, fn, params, num_outputs, backward)
    args = _ops.args_text(params)
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define(op + args + " -> " + _ops.returns_text(num_outputs))
    lib.define(op + "_bwd" + args[:-1] + (", " if params else "") + "Tensor[] grads) -> Tensor[]")

    def pack(outs):
        return outs[0] if num_outputs == 1 else tuple(outs)

    def diff_of(tensors):
        return tuple(i for i, t in enumerate(tensors) if j.differentiable(t))

    # forward
    def fwd_fake(*a, **kw):
        tensors, static = j.split(j.normalize(a, kw))
        avals = j.flat_outputs(j.shapes(j.forward_fn(static), tensors))
        dev = tensors[0].device
        return pack([torch.empty(v.shape, dtype=_torch_dtype(v.dtype), device=dev)
                     for v in avals])

    def fwd_tpu(*a, **kw):
        tensors, static = j.split(j.normalize(a, kw))
        _ops.on_tpu(name, tensors)
        return pack(j.call("fwd", j.forward_fn(static), tensors, static))

    def fwd_cpu(*a, **kw):
        tensors, static = j.split(j.normalize(a, kw))
        return pack(j.run_cpu(j.forward_fn(static), tensors))

    # backward: (op args..., grads) -> gradients of the differentiable tensor args
    def bwd_parts(a, kw):
        a = list(a)
        grads = list(kw.pop("grads") if "grads" in kw else a.pop())
        tensors, static = j.split(j.normalize(a, kw))
        return tensors, static, grads, diff_of(tensors)

    def bwd_fake(*a, **kw):
        tensors, _, _, diff = bwd_parts(a, kw)
        return [torch.empty_like(tensors[i]) for i in diff]

    def bwd_tpu(*a, **kw):
        tensors, static, grads, diff = bwd_parts(a, kw)
        _ops.on_tpu(name + "_bwd", tensors + grads)
        return j.call(("bwd", diff), j.backward_fn(static, diff), tensors + grads, static)

    def bwd_cpu(*a, **kw):
        tensors, static, grads, diff = bwd_parts(a, kw)
        return j.run_cpu(j.backward_fn(static, diff), tensors + grads)

    torch.library.register_fake(name, fwd_fake, lib=lib)
    torch.library.register_fake(name + "_bwd", bwd_fake, lib=lib)
    lib.impl(op, fwd_tpu, "PrivateUse1")
    lib.impl(op, fwd_cpu, "CPU")
    lib.impl(op + "_bwd", bwd_tpu, "PrivateUse1")
    lib.impl(op + "_bwd", bwd_cpu, "CPU")

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*(inputs[i] for i in j.tensor_pos))
        ctx.static = [(i, inputs[i]) for i in range(len(inputs)) if i not in j.tensor_pos]

    def autograd_backward(ctx, *gouts):
        tensors = list(ctx.saved_tensors)
        outs_meta = None
        grads = []
        for k, g in enumerate(gouts):
            if g is None:  # an unused output: zeros of its shape
                if outs_meta is None:
                    outs_meta = fwd_fake(*j.full_args(tensors, ctx.static))
                    outs_meta = [outs_meta] if num_outputs == 1 else list(outs_meta)
                g = torch.zeros_like(outs_meta[k])
            grads.append(g)
        bargs = j.full_args(tensors, ctx.static) + [grads]
        got = getattr(getattr(torch.ops, ns), op + "_bwd")(*bargs)
        result = [None] * len(params)
        for i, gi in zip(diff_of(tensors), got):
            result[j.tensor_pos[i]] = gi
        return tuple(result)

    torch.library.register_autograd(name, autograd_backward, setup_context=setup_context,
                                    lib=lib)
    _LIBS[name] = lib
    return getattr(getattr(torch.ops, ns), op)
