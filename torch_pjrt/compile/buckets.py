"""Shape buckets: ``options={"buckets": {...}}`` bounds the programs a dynamic-shape graph makes.

With dynamic shapes Dynamo traces one symbolic graph, and the backend captures one program per
distinct concrete input signature (graph_runner.py), so a sequence length that takes 100 values
makes 100 programs. With buckets, the callable Dynamo gets pads the declared dimensions of the
declared arguments up to the next bucket size before calling AOTAutograd's compiled function,
passes the bucket size for the integer arguments Dynamo derived from those sizes, and cuts every
output dimension of that size back to the real size: one program per bucket.

    options={"buckets": {"sizes": [16, 32, 64, 128], "dims": {"idx": 1}, "value": 0}}

- ``sizes``: strictly increasing positive ints. A size above the largest bucket (and a size that
  is a bucket) runs unpadded, as without buckets (its own program).
- ``dims``: argument name of the compiled function (for a module, of its ``forward``) -> a dim or
  a list of dims of that tensor argument. Dims of one size symbol (Dynamo's duck sizing: equal
  sizes at the first trace share a symbol) must all be declared, since they are padded together.
- ``value``: what the padding holds (default 0).

Declaring a dim says that padding it at the end is safe for the model: the outputs at the real
positions do not depend on the padded positions nor on the padded size (a causal model's
sequence dimension, a batch dimension of a model without cross-batch ops). Nothing can check
that claim; what is checked, at compile time, is everything that would make the cut-back
results differ from an unpadded run whatever the model computes; those graphs are refused with
ValueError naming the cause:

- an output that depends on a padded size must have a dimension of exactly that size (it is
  cut back): a size like 2*s (a concat) or an output without such a dimension (a reduction, a
  loss, an index into the padded dimension) cannot be cut back exactly;
- a graph that mutates any input (the padded copy, not the caller's tensor, would be mutated,
  and other inputs, e.g. batch-norm statistics or a cache, would take in padded positions),
  outputs that alias a padded input (a view of the padded copy), outputs sharing a storage with
  another cut-back output (cut-back outputs are rebuilt in their unpadded layout);
- the padded symbol appearing anywhere else among the graph's inputs (an undeclared tensor dim,
  an int argument Dynamo equated with it, a stride or offset), and a padded argument traced
  non-contiguous (the padded copy is contiguous, and the graph's views were traced for the
  argument's strides).

A declared argument is padded when it is a tensor passed directly (not inside a list or dict).
Each padded call costs the padding copy of those arguments and, for an output whose cut view
does not have the unpadded strides, a copy of it.

At run time, the padded sizes must also satisfy the shape guards the symbolic graph was traced
under (e.g. a branch taken for ``s <= 40`` is not valid at 64); when they do not, that call runs
unpadded. Cut-back outputs get the strides an unpadded run would give (a copy when the cut view
has other strides), so ``.view()`` on them works as in eager.

Names are matched against the arguments of the frame each graph was traced from: the compiled
function's, or, when a graph break happens inside a function it calls, that function's, which
Dynamo compiles as a frame of its own (prefer names only the compiled function uses, or
``fullgraph=True``). A name that is not an argument of the frame pads nothing in its graph (a
warning names it: it may be misspelt). Graphs of resumed frames (the code after a graph break)
are not padded: their arguments are live locals, which may have been rebound to other tensors
of the same name. A dim that Dynamo made static (``dynamic=False``, a size-1 dim, the first call
under automatic dynamic shapes) is not padded either: its graph is valid for that size only.
"""
from __future__ import annotations

import warnings

import sympy
import torch
import torch.nn.functional as F

KEYS = ("sizes", "dims", "value")
_RESUME_PREFIX = "torch_dynamo_resume_in"
_UNPADDED = object()  # cache entry: this call's sizes run without padding


def parse(spec) -> dict | None:
    """Validates the ``buckets`` option: {"sizes": tuple, "dims": {name: tuple}, "value"}."""
    if spec is None:
        return None
    where = "torch.compile(backend='tpu'): options['buckets']"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be a dict with keys {', '.join(KEYS)}, got {spec!r}")
    unknown = sorted(set(spec) - set(KEYS), key=str)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"known keys: {', '.join(KEYS)}")
    for key in ("sizes", "dims"):
        if key not in spec:
            raise ValueError(f"{where}: {key!r} is required")

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    sizes = spec["sizes"]
    if (not isinstance(sizes, (list, tuple)) or not sizes
            or not all(is_int(s) and s >= 1 for s in sizes)):
        raise ValueError(f"{where}['sizes'] must be a non-empty list of positive ints, "
                         f"got {sizes!r}")
    if any(a >= b for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"{where}['sizes'] must be strictly increasing, got {list(sizes)}")
    dims_in = spec["dims"]
    if not isinstance(dims_in, dict) or not dims_in:
        raise ValueError(f"{where}['dims'] must be a non-empty dict: argument name -> dim or "
                         f"list of dims, got {dims_in!r}")
    dims = {}
    for name, d in dims_in.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{where}['dims']: keys are argument names, got {name!r}")
        ds = (d,) if is_int(d) else tuple(d) if isinstance(d, (list, tuple)) else None
        if not ds or not all(is_int(x) for x in ds):
            raise ValueError(f"{where}['dims'][{name!r}] must be an int or a non-empty list of "
                             f"ints, got {d!r}")
        dims[name] = ds
    value = spec.get("value", 0)
    if not isinstance(value, (int, float)):  # bool is an int
        raise ValueError(f"{where}['value'] must be a number, got {value!r}")
    return {"sizes": tuple(sizes), "dims": dims, "value": value}


def wrap(gm: torch.fx.GraphModule, compiled, spec: dict):
    """`compiled` (AOTAutograd's function for Dynamo's graph `gm`), padding as `spec` declares;
    `compiled` itself when nothing in this graph is padded. Raises ValueError for a graph whose
    results cannot be cut back exactly (the module docstring lists the causes)."""
    plan = _Plan(gm, spec)
    if not plan.pads:
        return compiled
    return plan.runner(compiled)


def _expr(shape_env, v):
    """The sympy expression of a size, stride or int (replacements applied)."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return shape_env.replace(v.node.expr)
    return sympy.sympify(v)


def _tensor_exprs(shape_env, t):
    return ([_expr(shape_env, s) for s in t.shape], [_expr(shape_env, s) for s in t.stride()],
            _expr(shape_env, t.storage_offset()))


def _contiguous_strides(sizes):
    strides, acc = [None] * len(sizes), sympy.Integer(1)
    for d in reversed(range(len(sizes))):
        strides[d] = acc
        acc = acc * sizes[d]
    return strides


class _Plan:
    """What to pad and what to cut back for one Dynamo graph (all decided at compile time)."""

    def __init__(self, gm, spec):
        from torch._dynamo.source import LocalSource, TensorProperty, TensorPropertySource

        self.sizes, self.value = spec["sizes"], spec["value"]
        # pads: [(placeholder index, ((dim, symbol), ...))]; sym_ints: [(placeholder index, symbol)]
        self.pads, self.sym_ints = [], []
        tc = torch._guards.TracingContext.try_get()
        codes = getattr(tc, "traced_code", None) if tc is not None else None
        if not codes:
            raise ValueError("torch.compile(backend='tpu'): buckets: cannot tell which function "
                             "this graph was traced from (no Dynamo tracing context)")
        root = codes[0]
        if root.co_name.startswith(_RESUME_PREFIX):
            return  # after a graph break: locals may be rebound (module docstring)
        params = root.co_varnames[:root.co_argcount + root.co_kwonlyargcount]
        unknown = [name for name in spec["dims"] if name not in params]
        if unknown:
            # not an error: Dynamo also compiles, as frames of their own, functions the compiled
            # one calls when a graph break happens inside them, and their arguments differ; but
            # a misspelt name would silently pad nothing, so say so
            warnings.warn(f"torch.compile(backend='tpu'): buckets: {root.co_name}"
                          f"({', '.join(params)}) ({root.co_filename}:{root.co_firstlineno}) has "
                          f"no argument {', '.join(map(repr, unknown))}: not padded in its graph",
                          stacklevel=2)
        shape_env = tc.fake_mode.shape_env if tc.fake_mode is not None else None
        self.shape_env = shape_env
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        values = [n.meta.get("example_value") for n in self.placeholders]
        sources = [getattr(n.meta.get("grapharg"), "source", None) for n in self.placeholders]
        if shape_env is None:
            return  # no symbolic sizes: every dim is static

        # 1. the declared dims whose size is a plain symbol: padded
        padded = {}  # symbol -> [(placeholder index, dim)]
        arg_index = {}  # argument name -> placeholder index
        for i, (v, src) in enumerate(zip(values, sources)):
            if not (isinstance(v, torch.Tensor) and isinstance(src, LocalSource)
                    and src.local_name in spec["dims"]):
                continue
            name = src.local_name
            arg_index[name] = i
            dims = []
            for d in spec["dims"][name]:
                if not -v.dim() <= d < v.dim():
                    raise ValueError(f"torch.compile(backend='tpu'): buckets: dim {d} of "
                                     f"argument {name!r} is out of range ({v.dim()} dims)")
                d %= v.dim()
                if d in (x for x, _ in dims):
                    raise ValueError(f"torch.compile(backend='tpu'): buckets: argument {name!r} "
                                     f"lists dim {d} twice")
                e = _expr(shape_env, v.shape[d])
                if isinstance(e, sympy.Symbol):  # static (or derived) sizes are not padded
                    dims.append((d, e))
                    padded.setdefault(e, []).append((i, d))
            if dims:
                self.pads.append((i, tuple(dims)))
        if not self.pads:
            return
        syms = frozenset(padded)
        pad_dims = {i: dict(dims) for i, dims in self.pads}

        def refuse(msg):
            raise ValueError(f"torch.compile(backend='tpu'): buckets cannot pad this graph: {msg}")

        def src_name(i):
            return sources[i].name if sources[i] is not None else self.placeholders[i].name

        # 2. the padded symbols appear nowhere else among the inputs; padded tensors were traced
        # contiguous (F.pad makes contiguous tensors, and the graph's views were traced for the
        # traced strides)
        self.locations = {}  # symbol -> where its value is read from the arguments
        for i, (v, src) in enumerate(zip(values, sources)):
            if isinstance(v, torch.Tensor):
                sizes, strides, offset = _tensor_exprs(shape_env, v)
                for d, e in enumerate(sizes):
                    if isinstance(e, sympy.Symbol):
                        self.locations.setdefault(e, ("size", i, d))
                    if e.free_symbols & syms and pad_dims.get(i, {}).get(d) != e:
                        which = ", ".join(sorted(map(str, e.free_symbols & syms)))
                        refuse(f"{src_name(i)} dim {d} has size {e}, which involves a padded "
                               f"size ({which}); "
                               f"declare that dim in 'dims' too, or, if the sizes were only equal "
                               f"by chance at the first call (Dynamo's duck sizing), compile with "
                               f"differing sizes first")
                for d, e in enumerate(strides):
                    if isinstance(e, sympy.Symbol):
                        self.locations.setdefault(e, ("stride", i, d))
                if i in pad_dims:
                    for d, (e, c) in enumerate(zip(strides, _contiguous_strides(sizes))):
                        if sizes[d] != 1 and sympy.expand(e - c) != 0:
                            refuse(f"padded argument {src_name(i)} was traced with strides "
                                   f"{tuple(strides)}, not contiguous; pass a contiguous tensor")
                elif any(e.free_symbols & syms for e in strides):
                    refuse(f"{src_name(i)} has strides {tuple(strides)}, which involve a "
                           f"padded size")
                if offset.free_symbols & syms:
                    refuse(f"{src_name(i)} has storage offset {offset}, which involves a "
                           f"padded size")
            elif isinstance(v, (torch.SymInt, int)) and not isinstance(v, bool):
                e = _expr(shape_env, v)
                if isinstance(e, sympy.Symbol):
                    self.locations.setdefault(e, ("int", i))
                if not e.free_symbols & syms:
                    continue
                # Dynamo lifts each size symbol as an int input; the bucket size replaces it
                # only when it is the size of a padded dim (an int argument equal to it by duck
                # sizing keeps the caller's value, so the graph cannot be padded)
                if (e in syms and isinstance(src, TensorPropertySource)
                        and src.prop is TensorProperty.SIZE and isinstance(src.base, LocalSource)
                        and pad_dims.get(arg_index.get(src.base.local_name), {}).get(src.idx) == e):
                    self.sym_ints.append((i, e))
                else:
                    refuse(f"int input {src_name(i)} = {e} involves a padded size")
            elif isinstance(v, (torch.SymFloat, torch.SymBool)):
                if _expr(shape_env, v).free_symbols & syms:
                    refuse(f"input {src_name(i)} involves a padded size")

        # 3. no input mutations: AOTAutograd's analysis of the graph it just traced, one entry
        # per graph input (data and metadata mutations); a count that differs (inputs merged by
        # its deduplication) cannot be matched to the inputs
        meta = getattr(tc, "fw_metadata", None)
        if meta is None or len(meta.input_info) != len(values):
            refuse("no AOTAutograd metadata to check its input mutations against")
        for i, info in enumerate(meta.input_info):
            if info.mutates_data or info.mutates_metadata:
                refuse(f"it mutates input {src_name(i)}")

        # 4. outputs: which padded symbols each node depends on, then what each output needs
        def node_syms(node):  # symbols an int-valued node's value is a function of
            v = node.meta.get("example_value")
            if isinstance(v, (torch.SymInt, int)) and not isinstance(v, bool):
                return _expr(shape_env, v).free_symbols & syms
            return None

        index = {n: i for i, n in enumerate(self.placeholders)}
        deps = {}
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                i = index[node]
                deps[node] = (frozenset(e for _, e in pad_dims.get(i, {}).items())
                              | frozenset(e for j, e in self.sym_ints if j == i))
            elif node.op != "output":
                exact = node_syms(node)
                deps[node] = (frozenset(exact) if exact is not None else
                              frozenset().union(*(deps[a] for a in node.all_input_nodes)))
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        outs = out_node.args[0]
        if not isinstance(outs, (list, tuple)):
            refuse("its output is not a sequence")
        from torch.multiprocessing.reductions import StorageWeakRef

        padded_storages = {StorageWeakRef(values[i].untyped_storage()): src_name(i)
                           for i in pad_dims}
        self.cut, self.int_outs = [], []  # [(out index, ((dim, symbol), ...), stride exprs)]
        cut_storages = {}
        for j, a in enumerate(outs):
            if not isinstance(a, torch.fx.Node):
                continue  # a constant
            v = a.meta.get("example_value")
            what = f"output {j} ({a.name})"
            if isinstance(v, torch.Tensor):
                ref = StorageWeakRef(v.untyped_storage())
                if ref in padded_storages:
                    refuse(f"{what} is a view of padded argument {padded_storages[ref]}")
                sizes, strides, _ = _tensor_exprs(shape_env, v)
                dims = tuple((d, e) for d, e in enumerate(sizes) if e in syms)
                for d, e in enumerate(sizes):
                    if e.free_symbols & syms and e not in syms:
                        refuse(f"{what} has size {e} in dim {d}, which is not a padded size "
                               f"itself, so it cannot be cut back to the real size")
                missing = deps[a] - {e for _, e in dims}
                if missing:
                    refuse(f"{what} (shape {tuple(sizes)}) depends on the padded size(s) "
                           f"{', '.join(sorted(map(str, missing)))} but has no dim of that size "
                           f"(a reduction over it, a loss, an index into it): its values would "
                           f"include padded positions")
                if not dims:
                    continue
                # (an output sharing a storage with a cut-back one depends on its padded size,
                # so it is cut back too or refused above)
                if ref in cut_storages:
                    refuse(f"{what} shares a storage with output {cut_storages[ref]}; cut-back "
                           f"outputs are rebuilt separately")
                cut_storages[ref] = j
                for e in strides:
                    for s in e.free_symbols - set(self.locations):
                        refuse(f"{what} has stride {e}, and no input gives the value of {s}")
                self.cut.append((j, dims, tuple(strides)))
            elif isinstance(v, (torch.SymInt, int)) and not isinstance(v, bool):
                e = _expr(shape_env, v)
                if e.free_symbols & syms:
                    if e not in syms:
                        refuse(f"{what} = {e} involves a padded size")
                    self.int_outs.append((j, e))
            elif deps[a]:
                refuse(f"{what} ({type(v).__name__}) depends on a padded size")
        # every padded symbol has a location: a padded dim's size is that symbol itself
        self.symbols = tuple(self.locations)
        self.padded_symbols = syms

    def runner(self, compiled):
        """The function Dynamo calls (unboxed, like AOTAutograd's): pads, calls `compiled`, cuts
        the outputs back."""
        symbols, locations = self.symbols, self.locations
        readers = []
        for s in symbols:
            loc = locations[s]
            if loc[0] == "int":
                readers.append(lambda args, i=loc[1]: int(args[i]))
            elif loc[0] == "size":
                readers.append(lambda args, i=loc[1], d=loc[2]: args[i].shape[d])
            else:
                readers.append(lambda args, i=loc[1], d=loc[2]: args[i].stride(d))
        # symbol values of a call (all symbols of the inputs) -> _UNPADDED or
        # ({symbol: (real size, bucket size)} for the padded symbols, expected output strides)
        cache: dict[tuple, object] = {}
        guards = []  # [code] once built: the graph's shape guards as one expression

        def run(*args):
            values = tuple(r(args) for r in readers)
            entry = cache.get(values)
            padded = None
            if entry is None:
                entry, padded = self._prepare(args, dict(zip(symbols, values)), guards)
                cache[values] = entry
            if entry is _UNPADDED:
                return compiled(*args)
            change, strides = entry
            if padded is None:
                padded = self._pad(args, change)
            outs = compiled(*padded)
            del padded
            return self._cut(outs, change, strides)

        return run

    def _prepare(self, args, values, guards):
        change = {}
        for s in self.padded_symbols:
            real = values[s]
            bucket = next((b for b in self.sizes if b >= real), None)
            if bucket is not None and bucket != real:
                change[s] = (real, bucket)
        if not change:
            return _UNPADDED, None
        padded = self._pad(args, change)
        if not guards:
            # built at the first padded call, when Dynamo and AOTAutograd have added all their
            # guards to the shape environment
            guards.append(self.shape_env.produce_guards_expression(
                [n.meta["example_value"] for n in self.placeholders]))
        if guards[0] and not self.shape_env.evaluate_guards_expression(guards[0], padded):
            return _UNPADDED, None  # the symbolic graph is not valid at the bucket sizes
        subs = {s: sympy.Integer(v) for s, v in values.items()}
        strides = {j: tuple(int(e.xreplace(subs)) for e in exprs) for j, _, exprs in self.cut}
        return (change, strides), padded

    def _pad(self, args, change):
        new = list(args)
        for i, dims in self.pads:
            t = args[i]
            spec = [0] * (2 * t.dim())
            for d, s in dims:
                if s in change:
                    real, bucket = change[s]
                    spec[2 * (t.dim() - 1 - d) + 1] = bucket - real
            if any(spec):
                # F.pad is an eager op (autograd-tracked: a padded input's gradient is the
                # slice of the padded one); contiguous() is a no-op for its dense result
                new[i] = F.pad(t, spec, value=self.value).contiguous()
        for i, s in self.sym_ints:
            if s in change:
                new[i] = change[s][1]
        return new

    def _cut(self, outs, change, strides):
        result = list(outs)
        for j, dims, _ in self.cut:
            o = result[j]
            cut = False
            for d, s in dims:
                if s in change:
                    o = o.narrow(d, 0, change[s][0])
                    cut = True
            if cut and o.stride() != strides[j]:
                # the layout an unpadded run returns (narrow keeps the bucket's strides);
                # copy_ is autograd-tracked like narrow
                o = torch.empty_strided(o.shape, strides[j], dtype=o.dtype,
                                        device=o.device).copy_(o)
            result[j] = o
        for j, s in self.int_outs:
            if s in change:
                result[j] = change[s][0]
        return type(outs)(result) if isinstance(outs, tuple) else result
