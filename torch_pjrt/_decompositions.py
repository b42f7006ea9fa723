"""Routes aten ops that have no StableHLO lowering through PyTorch's own decompositions.

An op reaching the tpu backend is handled, in order, by: a C lowering (csrc/ops), else a
decomposition from torch._decomp registered here as the op's PrivateUse1 kernel (it re-enters
the dispatcher with simpler ops), else the CPU fallback (csrc/bridge/dispatch.cpp). Only ops
without a lowering and without a CompositeImplicitAutograd kernel get a decomposition, so a
lowering always wins and composite ops keep decomposing above autograd as PyTorch intends.

A decomposition that bottoms out in a prim whose eager implementation is an aten op we do not
lower is not registered: on a tpu tensor that prim calls the aten op again, which lands back
in the same decomposition (i0.out -> refs.i0 -> prims.bessel_i0 -> aten::i0 -> i0.out -> ...,
a RecursionError). Such ops go to the CPU fallback until they get a lowering.
"""
import torch

_LIB = None
_KEYS_THAT_ALREADY_WORK = (
    "CompositeImplicitAutograd",
    "CompositeExplicitAutograd",
    "CompositeExplicitAutogradNonFunctional",
    "PrivateUse1",
)
registered: list = []


def _base_name(op: torch._ops.OpOverload) -> str:
    name = op._schema.name.split("::", 1)[1]
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return name


def _prims_called(fn) -> list:
    """Names of torch.ops.prims ops that the innermost function of fn refers to."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    code = getattr(fn, "__code__", None)
    if code is None or "prims" not in code.co_names:
        return []
    return [n for n in code.co_names if n != "prims" and hasattr(torch.ops.prims, n)]


def _prim_eager_target(name: str):
    """The aten base name a prim's eager implementation calls, or None if it is Python code."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get("prims::" + name)
    impl = getattr(opdef, "_init_fn", None)
    for cell in getattr(impl, "__closure__", None) or ():
        target = cell.cell_contents
        if type(target).__name__ == "builtin_function_or_method":
            return target.__name__.lstrip("_")
    return None


def _reenters_itself(fn, lowered: set) -> bool:
    """True if fn reaches a prim that calls an aten op without a lowering (see module doc)."""
    for prim in _prims_called(fn):
        target = _prim_eager_target(prim)
        if target is not None and target not in lowered:
            return True
    return False


def _heaviside_out_check(input, values, *, out):
    # CPU's heaviside meta function, which the reference's out= wrapper lacks: it promotes the
    # dtypes and then refuses the out= cast with its own message. CPU refuses complex tensors
    # first, then any two of input, values and out that differ, before any cast check.
    torch._check(not (input.is_complex() or values.is_complex() or out.is_complex()),
                 lambda: "heaviside is not yet implemented for complex tensors.")
    torch._check(input.dtype == values.dtype == out.dtype,
                 lambda: "heaviside is not yet implemented for tensors with different dtypes.")


# Checks that CPU's kernel makes before computing and the decomposition does not (its refusal
# differs or is missing), run before it: op name -> function of the op's own arguments. The
# functional and in-place forms of these ops keep their C++ composite kernels, whose meta
# functions make the checks, and reach the decomposition only as the out= form.
_CPU_CHECKS = {
    "aten::heaviside.out": _heaviside_out_check,
}


def _checked(check, fn):
    def decomposition(*args, **kwargs):
        check(*args, **kwargs)
        return fn(*args, **kwargs)
    return decomposition


# Decomposed ops whose CPU kernel takes complex32 (the decomposition computes what CPU does).
_COMPLEX32_DECOMPOSED = {"narrow_copy", "unfold_backward"}


def _involves_complex32(args, kwargs) -> bool:
    def has(v):
        if isinstance(v, torch.Tensor):
            return v.dtype is torch.complex32
        if isinstance(v, (list, tuple)):
            return any(has(e) for e in v)
        return v is torch.complex32
    return any(has(a) for a in args) or any(has(v) for v in kwargs.values())


def _complex32_to_cpu(op, fn):
    """CPU has no complex32 kernel for nearly all of these ops, while the decomposition would
    compute them from ops it has (channel_shuffle, glu, logaddexp, ...): a call involving
    complex32 goes to CPU's kernel through the fallback instead, which raises CPU's error (or,
    with TORCH_PJRT_CPU_FALLBACK=0, the fallback's), as for the lowered ops
    (csrc/bridge/complex32_ops.cpp)."""
    name, overload = op._schema.name, op._overloadname

    def decomposition(*args, **kwargs):
        if _involves_complex32(args, kwargs):
            from torch_pjrt import _C
            return _C._complex32_cpu_fallback(name, "" if overload == "default" else overload,
                                              *args, **kwargs)
        return fn(*args, **kwargs)
    return decomposition


def register(lowered: set) -> None:
    """Registers decompositions once per process (idempotent)."""
    global _LIB
    if _LIB is not None:
        return
    from torch._decomp import decomposition_table

    _LIB = torch.library.Library("aten", "IMPL")
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for op, fn in decomposition_table.items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            continue
        name = op.name()
        if _base_name(op) in lowered:
            continue
        if any(has_kernel(name, k) for k in _KEYS_THAT_ALREADY_WORK):
            continue
        if _reenters_itself(fn, lowered):
            continue
        if name in _CPU_CHECKS:
            fn = _checked(_CPU_CHECKS[name], fn)
        if _base_name(op) not in _COMPLEX32_DECOMPOSED:
            fn = _complex32_to_cpu(op, fn)
        try:
            _LIB.impl(op, fn, "PrivateUse1")
        except RuntimeError:
            continue  # already registered by someone else: theirs stands
        registered.append(name)
    _register_missing_meta(has_kernel)


def _geqrf_meta(a):
    torch._check(a.dim() >= 2, lambda: "torch.geqrf: input must have at least 2 dimensions.")
    k = min(a.shape[-2], a.shape[-1])
    return a.new_empty(a.shape), a.new_empty(a.shape[:-2] + (k,))


def _lstsq_out_meta(a, b, rcond=None, *, driver=None, solution, residuals, rank,
                    singular_values):
    # shapes as CPU's gels/gelsy drivers give them (csrc/ops/linalg_decomp.c lowers those);
    # gelsd/gelss have data-dependent residual shapes: NotImplementedError sends them to the CPU
    driver = driver or "gelsy"
    if driver not in ("gels", "gelsy"):
        raise NotImplementedError(f"linalg.lstsq driver {driver} is not lowered on tpu")
    torch._check(a.dim() >= 2, lambda: "torch.linalg.lstsq: input must have at least 2 dimensions.")
    torch._check(a.dim() - b.dim() in (0, 1), lambda: (
        "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
        "(input.dim() - other.dim()) <= 1"))
    vec = a.dim() - 1 == b.dim()
    b2 = b.unsqueeze(-1) if vec else b
    m, n, k = a.shape[-2], a.shape[-1], b2.shape[-1]
    torch._check(b2.shape[-2] == m, lambda: (
        f"torch.linalg.lstsq: input.size(-2) should match other.size(-2) ({m} vs {b2.shape[-2]})"))
    batch = torch.broadcast_shapes(a.shape[:-2], b2.shape[:-2])
    real = a.real.dtype if a.is_complex() else a.dtype
    solution.resize_(batch + ((n,) if vec else (n, k)))
    residuals.resize_(batch + (k,) if driver == "gels" and m > n else (0,))
    rank.resize_(batch if driver == "gelsy" else (0,))
    singular_values.resize_((0,))
    assert residuals.dtype == real
    return solution, residuals, rank, singular_values


def _rnn_cell_check(op, input_gates, hidden_gates, input_bias, hidden_bias, factor, prev):
    # the checks of PyTorch's CUDA kernels; PyTorch's own Python meta for the LSTM cell reads
    # .device of the optional biases and fails on None (bias=False modules)
    torch._check(input_gates.dim() == 2, lambda: f"{op}: input_gates must be 2-D")
    torch._check(input_gates.shape == hidden_gates.shape, lambda: (
        f"{op}: input_gates {tuple(input_gates.shape)} and hidden_gates "
        f"{tuple(hidden_gates.shape)} differ"))
    torch._check((input_bias is None) == (hidden_bias is None),
                 lambda: f"{op}: input_bias and hidden_bias must both be given or both be None")
    if input_bias is not None:
        torch._check(input_bias.dim() == 1 and input_bias.shape == hidden_bias.shape and
                     input_bias.numel() == input_gates.size(1),
                     lambda: f"{op}: the biases must be 1-D with {input_gates.size(1)} elements")
    torch._check(prev.dim() == 2 and input_gates.size(1) % factor == 0 and
                 prev.numel() == input_gates.size(0) * input_gates.size(1) // factor,
                 lambda: f"{op}: the state must be [{input_gates.size(0)}, "
                         f"{input_gates.size(1) // factor}]")


def _lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    _rnn_cell_check("_thnn_fused_lstm_cell", input_gates, hidden_gates, input_bias, hidden_bias,
                    4, cx)
    return (cx.new_empty(cx.shape), cx.new_empty(cx.shape),
            input_gates.new_empty(input_gates.shape))  # workspace: the 4 activated gates


def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    _rnn_cell_check("_thnn_fused_gru_cell", input_gates, hidden_gates, input_bias, hidden_bias,
                    3, hx)
    # workspace [B, 5H]: r, z, n, hx and the hidden side's n pre-activation (csrc/ops/rnn.c)
    return hx.new_empty(hx.shape), input_gates.new_empty((hx.size(0), 5 * hx.size(1)))


def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    torch._check(grad_hy.dim() == 2 and workspace.dim() == 2 and
                 workspace.shape == (grad_hy.size(0), 5 * grad_hy.size(1)),
                 lambda: "_thnn_fused_gru_cell_backward: workspace must be [B, 5 * H] for "
                         "grad_hy [B, H]")
    b, h = grad_hy.shape
    gates = (grad_hy.new_empty((b, 3 * h)), grad_hy.new_empty((b, 3 * h)),
             grad_hy.new_empty((b, h)))
    bias = (grad_hy.new_empty((3 * h,)), grad_hy.new_empty((3 * h,))) if has_bias else (None, None)
    return gates + bias


def _register_missing_meta(has_kernel) -> None:
    """Meta kernels for lowered ops that PyTorch ships without one (output shapes only): the
    bridge takes result shapes from Meta and would otherwise run them on the CPU."""
    if not has_kernel("aten::geqrf", "Meta"):
        _LIB.impl("geqrf", _geqrf_meta, "Meta")
    if not has_kernel("aten::linalg_lstsq.out", "Meta"):
        _LIB.impl("linalg_lstsq.out", _lstsq_out_meta, "Meta")
    # the fused RNN cells (lowered in csrc/ops/rnn.c): PyTorch has no Meta kernel for the GRU
    # ones, and its LSTM one rejects the None biases of bias=False modules, so ours replaces it
    _LIB.impl("_thnn_fused_lstm_cell", _lstm_cell_meta, "Meta", allow_override=True)
    if not has_kernel("aten::_thnn_fused_gru_cell", "Meta"):
        _LIB.impl("_thnn_fused_gru_cell", _gru_cell_meta, "Meta")
    if not has_kernel("aten::_thnn_fused_gru_cell_backward", "Meta"):
        _LIB.impl("_thnn_fused_gru_cell_backward", _gru_cell_backward_meta, "Meta")
