"""Custom kernels as PyTorch ops (torch_pjrt.kernels, docs/kernels.md): JAX functions, Pallas
kernels (interpret mode on the CPU plugin) and raw StableHLO modules, forward and backward, in
strict, defer_and_fuse and torch.compile, checked against plain torch on CPU; each kernel is
inlined into its neighbours' program (one execution, from torch.tpu.metrics())."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import TPU, delta, metrics, run_python

HAVE_JAX = importlib.util.find_spec("jax") is not None
needs_jax = pytest.mark.skipif(
    not HAVE_JAX, reason="JAX is not installed (pip install jax==0.10.2 jaxlib==0.10.2)")

from torch_pjrt import kernels  # noqa: E402


def close(a, b, **kw):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), **kw)


# ---- the kernels (torch.library names are per process: defined once) ----

_OPS: dict = {}
_F8_OPS: dict = {}


def jax_ops():
    if not _OPS:
        import jax
        import jax.numpy as jnp
        from jax.experimental import pallas as pl

        def mix(x, y, scale=1.0):
            return jnp.tanh(x) * y * scale + jnp.sin(y)

        def two(x):
            return jnp.sin(x), x * x

        def mm_kernel(x_ref, y_ref, o_ref):
            o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        def pallas_mm(x, y):
            bm, bn = 16, 16  # interpret mode reads padding past a partial block: whole blocks only
            if x.shape[0] % bm or y.shape[1] % bn:
                raise ValueError(f"pallas_mm: {x.shape} @ {y.shape} is not in {bm}x{bn} blocks")
            return pl.pallas_call(
                mm_kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype),
                grid=(x.shape[0] // bm, y.shape[1] // bn),
                in_specs=[pl.BlockSpec((bm, x.shape[1]), lambda i, j: (i, 0)),
                          pl.BlockSpec((x.shape[1], bn), lambda i, j: (0, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
                interpret=kernels.platform() == "cpu")(x, y)

        def pallas_mm_bwd(x, y, g):  # pallas_call has no vjp: a user backward, Pallas too
            return pallas_mm(g, y.T), pallas_mm(x.T, g)

        _OPS.update(
            mix=kernels.jax_op("pjtest::mix", mix),
            two=kernels.jax_op("pjtest::two", two, num_outputs=2),
            sin=kernels.jax_op("pjtest::sin", jnp.sin, schema="(Tensor x)"),
            cos=kernels.jax_op("pjtest::cos", jnp.cos, schema="(Tensor x)"),
            mm=kernels.jax_op("pjtest::pallas_mm", pallas_mm, backward=pallas_mm_bwd),
        )
    return _OPS


def mix_ref(x, y, scale=1.0):
    return torch.tanh(x) * y * scale + torch.sin(y)


@pytest.fixture
def eager(request):
    torch.tpu.set_eager_mode(request.param)
    try:
        yield request.param
    finally:
        torch.tpu.set_eager_mode("strict")


def leaves(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = [torch.randn(*s, generator=g, requires_grad=True) for s in shapes]
    tpu = [t.detach().to(TPU).requires_grad_() for t in cpu]
    return cpu, tpu


# ---- JAX functions ----

@needs_jax
@pytest.mark.parametrize("eager", ["strict", "defer_and_fuse"], indirect=True)
def test_jax_op_forward_backward(eager):
    ops = jax_ops()
    (xc, yc, wc), (xt, yt, wt) = leaves((5, 7), (5, 7), (5, 7))
    out = ops["mix"](xt, yt, 0.5)
    ref = mix_ref(xc, yc, 0.5)
    assert out.device.type == "tpu" and out.dtype == ref.dtype and out.shape == ref.shape
    close(out, ref)
    (out * wt).sum().backward()
    (ref * wc).sum().backward()
    close(xt.grad, xc.grad)
    close(yt.grad, yc.grad)
    assert wt.grad is not None
    # the CPU implementation (JAX's CPU backend) agrees too
    close(ops["mix"](xc, yc, 0.5), ref)


@needs_jax
def test_jax_op_strict_is_one_execution_and_cached():
    ops = jax_ops()
    x, y = torch.randn(3, 4, device=TPU), torch.randn(3, 4, device=TPU)
    ops["mix"](x, y, 2.0)
    torch.tpu.synchronize()
    before = metrics()
    out = ops["mix"](x, y, 2.0)
    torch.tpu.synchronize()
    d = delta(before, metrics())
    assert d.get("executions") == 1 and "compiles" not in d, d
    close(out, mix_ref(x.cpu(), y.cpu(), 2.0))
    # a static argument's value is part of the kernel: another value, another kernel
    close(ops["mix"](x, y, -1.0), mix_ref(x.cpu(), y.cpu(), -1.0))


@needs_jax
def test_jax_op_fused_with_neighbours_in_defer():
    ops = jax_ops()
    x, y = torch.randn(6, device=TPU), torch.randn(6, device=TPU)
    xc, yc = x.cpu(), y.cpu()
    with torch.tpu.eager_mode("defer_and_fuse"):
        for _ in range(2):  # the second run is a cache hit of the same fused program
            torch.tpu.synchronize()
            before = metrics()
            a = x * 2
            b = ops["mix"](a, y)
            c = ops["mix"](b, a)  # the same kernel twice in one program
            s, q = ops["two"](c + 1)
            got = (s - q).cpu()
            d = delta(before, metrics())
            assert d.get("executions") == 1, d
    b_ref = mix_ref(xc * 2, yc)
    s_ref = mix_ref(b_ref, xc * 2) + 1
    close(got, torch.sin(s_ref) - s_ref * s_ref)


@needs_jax
def test_two_kernels_with_equal_types_never_share_a_program():
    ops = jax_ops()
    x = torch.randn(9, device=TPU)
    close(ops["sin"](x), torch.sin(x.cpu()))
    close(ops["cos"](x), torch.cos(x.cpu()))
    with torch.tpu.eager_mode("defer_and_fuse"):
        close(ops["cos"](x) + 0, torch.cos(x.cpu()))
        close(ops["sin"](x) + 0, torch.sin(x.cpu()))


@needs_jax
def test_multi_output_and_unused_output_gradient():
    ops = jax_ops()
    (xc,), (xt,) = leaves((4, 3), seed=3)
    s, q = ops["two"](xt)
    close(s, torch.sin(xc))
    close(q, xc * xc)
    s.sum().backward()  # q unused: its cotangent is zeros
    close(xt.grad, torch.cos(xc))


@needs_jax
def test_jax_op_views_and_errors():
    ops = jax_ops()
    base = torch.randn(4, 6)
    x = base.to(TPU).t()  # a strided view in
    close(ops["sin"](x), torch.sin(base.t()))
    with pytest.raises(RuntimeError, match="same device"):
        ops["mix"](torch.zeros(3, device=TPU), torch.zeros(3))
    with pytest.raises(ValueError):
        kernels.jax_op("no_namespace", lambda x: x)


@needs_jax
@pytest.mark.parametrize("eager", ["strict", "defer_and_fuse"], indirect=True)
def test_float8_arguments_and_results(eager, fallbacks):
    """float8 tensors (bytes on the device) go into and come out of a kernel as JAX's float8
    types: a quantizing kernel and a dequantizing one, bit for bit against CPU's casts (values
    in range, where CPU's and XLA's conversions agree), one execution together in defer."""
    import jax.numpy as jnp
    if not _F8_OPS:  # not in _OPS: jax_ops() fills that one only while it is empty
        _F8_OPS["qz8"] = kernels.jax_op("pjtest::qz8",
                                        lambda x, s: (x / s).astype(jnp.float8_e4m3fn))
        _F8_OPS["dq8"] = kernels.jax_op("pjtest::dq8", lambda q, s: q.astype(jnp.float32) * s)
    qz, dq = _F8_OPS["qz8"], _F8_OPS["dq8"]
    g = torch.Generator().manual_seed(4)
    x, s = torch.randn(8, 16, generator=g) * 40, torch.rand(8, 1, generator=g) + 0.5
    q = (x / s).to(torch.float8_e4m3fn)
    assert q.float().abs().max() < 448  # in range
    xt, st = x.to(TPU), s.to(TPU)
    for _ in range(2):  # the second round runs from the caches
        torch.tpu.synchronize()
        before = metrics()
        qt = qz(xt, st)
        back = dq(qt, st)
        assert qt.dtype == torch.float8_e4m3fn and qt.device.type == "tpu"
        assert torch.equal(qt.cpu().view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(back.cpu(), q.float() * s)
    if eager == "defer_and_fuse":
        assert delta(before, metrics()).get("executions") == 1
    assert torch.equal(qz(x, s).view(torch.uint8), q.view(torch.uint8))  # CPU: JAX's backend
    assert fallbacks.delta == 0, fallbacks.new_ops()


@needs_jax
def test_integer_and_float64_arguments_and_arguments_export_drops():
    """An integer tensor gets no gradient; the backward of x * n does not use x, and jax.export
    drops unused arguments from the module (the op passes only the ones it kept); float64
    exports under x64."""
    import jax.numpy as jnp
    op = _OPS.get("scale") or kernels.jax_op("pjtest::scale", lambda x, n: x * n)
    _OPS["scale"] = op
    for dt in (torch.float32, torch.float64):
        xc = torch.randn(3, dtype=dt, requires_grad=True)
        n = torch.tensor([1, -2, 3])
        xt = xc.detach().to(TPU).requires_grad_()
        out = op(xt, n.to(TPU))
        ref = xc * n
        assert out.dtype == ref.dtype == dt
        close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        close(xt.grad, xc.grad)
    unused = _OPS.get("first") or kernels.jax_op("pjtest::first", lambda x, y: jnp.cos(x))
    _OPS["first"] = unused
    a, b = torch.randn(4), torch.randn(4)
    close(unused(a.to(TPU), b.to(TPU)), torch.cos(a))


# ---- Pallas ----

@needs_jax
@pytest.mark.parametrize("eager", ["strict", "defer_and_fuse"], indirect=True)
def test_pallas_kernel_forward_backward(eager):
    ops = jax_ops()
    (xc, yc), (xt, yt) = leaves((32, 16), (16, 48), seed=1)
    out = ops["mm"](xt, yt)
    ref = xc @ yc
    close(out, ref, rtol=1e-4, atol=1e-4)  # float32 sums in another order
    (out.sin()).sum().backward()
    (ref.sin()).sum().backward()
    close(xt.grad, xc.grad, rtol=1e-4, atol=1e-4)
    close(yt.grad, yc.grad, rtol=1e-4, atol=1e-4)
    if eager == "defer_and_fuse":
        # forward and backward (three inlined kernel calls) with their neighbours: one program
        for _ in range(2):
            xt.grad = yt.grad = None
            torch.tpu.synchronize()
            before = metrics()
            (ops["mm"](xt * 2, yt) + 1).sin().sum().backward()
            got = torch.stack([xt.grad.sum(), yt.grad.sum()]).cpu()
            assert delta(before, metrics()).get("executions") == 1
        xc.grad = yc.grad = None
        (((xc * 2) @ yc) + 1).sin().sum().backward()
        close(got, torch.stack([xc.grad.sum(), yc.grad.sum()]), rtol=1e-4, atol=1e-3)


# ---- torch.compile ----

@needs_jax
@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_jax_and_pallas_ops_one_program():
    ops = jax_ops()

    def step(x, y, w):
        h = ops["mm"](x * 2, y)
        return (ops["mix"](h, w, 0.25) + 1).sum()

    compiled = torch.compile(step, backend="tpu", fullgraph=True)  # one graph: ops are nodes
    (xc, yc, wc), (xt, yt, wt) = leaves((16, 16), (16, 32), (16, 32), seed=2)
    loss = compiled(xt, yt, wt)
    ref = (mix_ref((xc * 2) @ yc, wc, 0.25) + 1).sum()
    close(loss, ref, rtol=1e-5, atol=1e-4)
    loss.backward()
    ref.backward()
    for t, c in ((xt, xc), (yt, yc), (wt, wc)):
        close(t.grad, c.grad, rtol=1e-5, atol=1e-4)
    # a training call: the forward graph and the backward graph (the kernels' backward ops
    # inside) are one program execution each (the seed gradient is made beforehand)
    seed = torch.ones((), device=TPU)
    for t in (xt, yt, wt):
        t.grad = None
    torch.tpu.synchronize()
    before = metrics()
    loss = compiled(xt, yt, wt)
    torch.tpu.synchronize()
    middle = metrics()
    loss.backward(seed)
    torch.tpu.synchronize()
    fwd, bwd = delta(before, middle), delta(middle, metrics())
    assert fwd.get("executions") == 1 and fwd.get("graph_runs") == 1, fwd
    assert bwd.get("executions") == 1 and bwd.get("graph_runs") == 1, bwd
    close(xt.grad, xc.grad, rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        compiled(xt, yt, wt)
        torch.tpu.synchronize()
        before = metrics()
        out = compiled(xt, yt, wt)
        torch.tpu.synchronize()
        d = delta(before, metrics())
    assert d.get("executions") == 1 and d.get("graph_runs") == 1, d
    close(out, ref, rtol=1e-5, atol=1e-4)


@needs_jax
@pytest.mark.usefixtures("fresh_dynamo")
def test_dynamo_traces_a_kernel_op_as_one_node():
    ops = jax_ops()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    f = torch.compile(lambda x, y: ops["mix"](x, y, 2.0) * 3, backend=backend, fullgraph=True)
    x, y = torch.randn(3), torch.randn(3)
    close(f(x.to(TPU), y.to(TPU)), mix_ref(x, y, 2.0) * 3)
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.pjtest.mix) == 1, targets
    assert len(targets) == 2, targets  # the op and the multiplication, nothing of JAX's


# ---- raw StableHLO ----

SHLO = textwrap.dedent("""\
    module @axpy {
      func.func private @helper(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.multiply %a, %b : tensor<4xf32>
        return %0 : tensor<4xf32>
      }
      func.func public @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>) {
        %0 = func.call @helper(%x, %y) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
        %1 = stablehlo.add %0, %x : tensor<4xf32>
        %z = stablehlo.constant dense<0.0> : tensor<f32>
        %2 = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
        return %1, %2 : tensor<4xf32>, tensor<f32>
      }
    }
    """)


def shlo_shapes(x, y):
    return [(x.shape, x.dtype), ((), x.dtype)]


def shlo_ref(x, y):
    r = x * y + x
    return r, r.sum()


_SHLO_OPS: dict = {}


def shlo_op(parse=True):
    if parse not in _SHLO_OPS:
        name = "pjtest::axpy" if parse else "pjtest::axpy_text"
        _SHLO_OPS[parse] = kernels.stablehlo_op(name, SHLO, shlo_shapes, parse=parse)
    return _SHLO_OPS[parse]


@pytest.mark.parametrize("parse", [True, False], ids=["mlir", "text"])
def test_stablehlo_op_modes(parse):
    if parse and not HAVE_JAX:
        pytest.skip("the MLIR route needs JAX (pip install jax==0.10.2 jaxlib==0.10.2)")
    op = shlo_op(parse)
    x, y = torch.randn(4), torch.randn(4)
    ref = shlo_ref(x, y)
    for mode in ("strict", "defer_and_fuse"):
        with torch.tpu.eager_mode(mode):
            r, s = op(x.to(TPU), y.to(TPU))
            close(r, ref[0])
            close(s, ref[1])
    # fused with its neighbours, the same helper symbol twice in one program
    with torch.tpu.eager_mode("defer_and_fuse"):
        xt, yt = x.to(TPU), y.to(TPU)
        torch.tpu.synchronize()
        before = metrics()
        r1, _ = op(xt + 1, yt)
        r2, s2 = op(r1, yt)
        got = (r2 * 2).cpu(), s2.cpu()
        assert delta(before, metrics()).get("executions") == 1
    e1 = shlo_ref(x + 1, y)[0]
    close(got[0], shlo_ref(e1, y)[0] * 2)
    close(got[1], shlo_ref(e1, y)[1])


@pytest.mark.usefixtures("fresh_dynamo")
def test_stablehlo_op_compiled():
    op = shlo_op(HAVE_JAX)
    f = torch.compile(lambda a, b: op(a.cos(), b)[1] * 3, backend="tpu", fullgraph=True)
    x, y = torch.randn(4), torch.randn(4)
    close(f(x.to(TPU), y.to(TPU)), shlo_ref(x.cos(), y)[1] * 3)


def test_stablehlo_op_bad_input_types():
    op = shlo_op(HAVE_JAX)
    with pytest.raises(TypeError, match="float32"):
        op(torch.zeros(4, device=TPU, dtype=torch.float64), torch.zeros(4, device=TPU))
    with pytest.raises(ValueError, match="shape"):
        op(torch.zeros(5, device=TPU), torch.zeros(5, device=TPU))


BAD = SHLO.replace("stablehlo.add %0, %x", "stablehlo.add %0, %nope")


@pytest.mark.parametrize("parse", [True, False], ids=["mlir", "text"])
def test_stablehlo_op_bad_module(parse):
    if parse and not HAVE_JAX:
        pytest.skip("the MLIR route needs JAX (pip install jax==0.10.2 jaxlib==0.10.2)")
    tag = "m" if parse else "t"
    with pytest.raises(ValueError, match="pjtest::bad_" + tag):
        kernels.stablehlo_op("pjtest::bad_" + tag, BAD, shlo_shapes, parse=parse)
    # declared result types that the module does not return
    with pytest.raises(ValueError, match="module returns"):
        kernels.stablehlo_op("pjtest::wrong_" + tag, SHLO,
                             lambda x, y: [(x.shape, x.dtype), ((1,), x.dtype)], parse=parse)
    with pytest.raises(ValueError, match="@main"):
        kernels.stablehlo_op("pjtest::nomain_" + tag, SHLO.replace("@main", "@other"),
                             shlo_shapes, parse=parse)
    with pytest.raises(TypeError):
        kernels.stablehlo_op("pjtest::notext_" + tag, 42, shlo_shapes, parse=parse)


def test_without_jax_jax_op_says_what_to_install_and_stablehlo_works():
    code = textwrap.dedent(f"""
        import sys
        for m in [m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jaxlib"))]:
            del sys.modules[m]
        sys.modules["jax"] = None  # import jax fails as where it is not installed
        import torch, torch_pjrt
        from torch_pjrt import kernels
        try:
            kernels.jax_op("nojax::f", lambda x: x)
        except ImportError as e:
            assert "pip install jax==0.10.2 jaxlib==0.10.2" in str(e), e
        else:
            raise AssertionError("no ImportError")
        SHLO = {SHLO!r}
        op = kernels.stablehlo_op("nojax::axpy", SHLO,
                                  lambda x, y: [(x.shape, x.dtype), ((), x.dtype)])
        x, y = torch.randn(4), torch.randn(4)
        r, s = op(x.to("tpu"), y.to("tpu"))
        torch.testing.assert_close(r.cpu(), x * y + x)
        assert "jax" not in [m.split(".")[0] for m in sys.modules if sys.modules[m]]
        print("ok")
        """)
    r = run_python(code)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


@needs_jax
def test_kernel_programs_on_disk_are_keyed_by_the_kernel(tmp_path):
    """A restarted process exporting the same kernel finds its program on disk (the fingerprint
    is stable); another kernel with the same argument types does not (its key differs)."""
    code = textwrap.dedent("""
        import sys, torch, torch_pjrt, jax.numpy as jnp
        from torch_pjrt import kernels
        ops = [kernels.jax_op(f"disk::f{k}", lambda x, k=k: jnp.exp(x) * k, schema="(Tensor x)")
               for k in (3, 4)]
        x = torch.linspace(-1, 1, 5)
        for k in map(int, sys.argv[1:]):
            before = torch.tpu.cache_stats()["disk_cache_hits"]
            got = ops[k - 3](x.to("tpu")).cpu()
            torch.testing.assert_close(got, torch.exp(x) * k)
            print(k, torch.tpu.cache_stats()["disk_cache_hits"] - before)
        """)
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": str(tmp_path)}

    def run(*ks):
        r = subprocess.run([sys.executable, "-c", code, *map(str, ks)], capture_output=True,
                           text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout.split()

    assert run(3) == ["3", "0"]            # compiled and stored
    assert run(3, 4) == ["3", "1", "4", "0"]  # loaded; the other kernel compiled, not loaded


@needs_jax
def test_tokamax_xla_implementation_as_an_op():
    """Tokamax (PyPI tokamax) where installed: its Pallas kernels need a GPU or a TPU (v5+)
    (docs/kernels.md), so on the CPU plugin its portable 'xla' implementation runs, here SwiGLU
    as a jax_op with jax.vjp's backward."""
    tokamax = pytest.importorskip(
        "tokamax", reason="tokamax is not installed (pip install tokamax; its qwix needs flax)")
    import jax
    from absl import flags  # tokamax reads its options as absl flags parsed from sys.argv,
    if not flags.FLAGS.is_parsed():  # which holds pytest's options here
        flags.FLAGS.mark_as_parsed()

    def swiglu(x, w_gate, w_up):
        return tokamax.gated_linear_unit(x, (w_gate, w_up), activation=jax.nn.swish,
                                         implementation="xla")
    op = kernels.jax_op("pjtest::tk_swiglu", swiglu)
    cpu, tpu = leaves((8, 16), (16, 32), (16, 32), seed=4)
    out = op(*tpu)
    ref = torch.nn.functional.silu(cpu[0] @ cpu[1]) * (cpu[0] @ cpu[2])
    close(out, ref, rtol=1e-4, atol=1e-4)
    out.sum().backward()
    ref.sum().backward()
    for t, c in zip(tpu, cpu):
        close(t.grad, c.grad, rtol=1e-4, atol=1e-4)
