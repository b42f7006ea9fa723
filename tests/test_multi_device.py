"""Several devices in one process (TORCH_PJRT_CPU_DEVICE_COUNT=N gives tpu:0..N-1), with CUDA as
the reference: device selection and its errors, factories, copies between devices, the same-device
rule, device guards, autograd, per-device memory statistics and counters, streams and events,
per-device generators, and the persistent cache serving every device.

The device count is fixed when the runtime starts, so each group of checks runs in a fresh
interpreter (conftest.run_python); a group prints "ok" as its last line once every check passed.
Values are compared with the same computation on the CPU. "Which device ran it" comes from
torch.tpu.metrics(i), the per-device counters of the runtime.
"""
from __future__ import annotations

import tempfile
import textwrap

from conftest import run_python

PRELUDE = """
import threading
import torch
import torch_pjrt  # noqa: F401  (explicit in case autoload is off)
from torch.testing import assert_close

def raises(exc, fn, match=None):
    try:
        fn()
    except exc as e:
        assert match is None or match in str(e), (match, str(e))
        return e
    except Exception as e:
        raise AssertionError(f"expected {exc.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"expected {exc.__name__}, nothing raised")

def execs(i):
    torch.tpu.synchronize(i)
    return torch.tpu.metrics(i)["executions"]

SAME = "Expected all tensors to be on the same device"
"""


def _run(code: str, count: int = 2, **env: str) -> None:
    r = run_python(PRELUDE + textwrap.dedent(code), TORCH_PJRT_CPU_DEVICE_COUNT=str(count), **env)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and lines and lines[-1] == "ok", (
        f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-6000:]}")


def test_device_selection_and_errors():
    _run("""
    assert torch.tpu.device_count() == 4 and torch.accelerator.device_count() == 4
    assert torch.tpu.is_available() and torch.accelerator.current_accelerator().type == "tpu"
    assert torch.tpu.current_device() == 0 and torch.accelerator.current_device_index() == 0

    torch.tpu.set_device(2)
    assert torch.tpu.current_device() == 2 and torch.accelerator.current_device_index() == 2
    torch.accelerator.set_device_index(3)
    assert torch.tpu.current_device() == 3
    torch.tpu.set_device("tpu:1")
    assert torch.tpu.current_device() == 1
    torch.tpu.set_device(torch.device("tpu", 0))
    torch.tpu.set_device(-1)  # as torch.cuda.set_device(-1): no change
    assert torch.tpu.current_device() == 0

    # the current device is per thread and starts at 0 in a new thread, as on CUDA
    torch.tpu.set_device(2)
    seen = []
    th = threading.Thread(target=lambda: seen.append(torch.tpu.current_device()))
    th.start(); th.join()
    assert seen == [0] and torch.tpu.current_device() == 2
    torch.tpu.set_device(0)

    # context managers nest and restore, also when the block raises
    with torch.tpu.device(1):
        assert torch.tpu.current_device() == 1
        with torch.tpu.device("tpu:3"):
            assert torch.tpu.current_device() == 3
        assert torch.tpu.current_device() == 1
    assert torch.tpu.current_device() == 0
    try:
        with torch.tpu.device(2):
            raise KeyError("inside")
    except KeyError:
        pass
    assert torch.tpu.current_device() == 0
    with torch.accelerator.device_index(3):
        assert torch.tpu.current_device() == 3
    assert torch.tpu.current_device() == 0
    with torch.tpu.device(None):
        assert torch.tpu.current_device() == 0
    x2 = torch.ones(2, device="tpu:2")
    with torch.tpu.device_of(x2):
        assert torch.tpu.current_device() == 2
    with torch.tpu.device_of(torch.ones(2)):  # not a tpu tensor: no change
        assert torch.tpu.current_device() == 0
    assert torch.tpu.current_device() == 0
    assert torch.get_device_module("tpu") is torch.tpu

    # bad indices: torch.AcceleratorError (a RuntimeError) as CUDA's "invalid device ordinal"
    for fn in (lambda: torch.tpu.set_device(4),
               lambda: torch.accelerator.set_device_index(9),
               lambda: torch.tpu.device(4).__enter__(),
               lambda: torch.accelerator.device_index(4).__enter__(),
               lambda: torch.empty(2, device="tpu:4"),
               lambda: torch.ones(2).to("tpu:5"),
               lambda: torch.zeros(2, device="tpu:4"),
               lambda: torch.tpu.synchronize(4),
               lambda: torch.accelerator.synchronize(4),
               lambda: torch.tpu.Stream(4),
               lambda: torch.Generator("tpu:4"),
               lambda: torch.tpu.default_generator(4)):
        e = raises(RuntimeError, fn)
        assert isinstance(e, torch.AcceleratorError), type(e)
        assert "tpu device index" in str(e) and "out of range" in str(e), e
    # memory statistics: RuntimeError as CUDA's "Invalid device argument"
    for fn in (lambda: torch.tpu.memory_allocated(4), lambda: torch.tpu.max_memory_allocated(7),
               lambda: torch.tpu.memory_stats(4), lambda: torch.tpu.reset_peak_memory_stats(4),
               lambda: torch.accelerator.memory_allocated(4),
               lambda: torch.accelerator.memory_stats(5),
               lambda: torch.accelerator.reset_peak_memory_stats(4),
               lambda: torch.tpu.metrics(4)):
        raises(RuntimeError, fn, "Invalid device argument")
    # properties: AssertionError("Invalid device id"), as torch.cuda.get_device_properties
    raises(AssertionError, lambda: torch.tpu.get_device_properties(4), "Invalid device id")
    raises(AssertionError, lambda: torch.tpu.get_device_name(4), "Invalid device id")
    # another device type: ValueError, as torch.cuda's _get_device_index
    raises(ValueError, lambda: torch.tpu.set_device("cpu"))
    raises(ValueError, lambda: torch.tpu.device("cpu"))
    assert torch.tpu.current_device() == 0  # failed calls changed nothing
    assert [torch.tpu.get_device_properties(i).index for i in range(4)] == [0, 1, 2, 3]
    assert torch.tpu.get_device_name(3) == torch.tpu.get_device_name(0)

    # a ring of copies over all four devices keeps the values
    ref = torch.randn(5, 3)
    t = ref.to("tpu:0")
    for i in (1, 2, 3, 0):
        t = t.to(f"tpu:{i}")
        assert t.device == torch.device("tpu", i)
    assert torch.equal(t.cpu(), ref)
    print("ok")
    """, count=4)


def test_factories_copies_and_same_device_rule():
    _run("""
    torch.tpu.set_device(1)
    for make in (lambda d: torch.empty(3, device=d), lambda d: torch.zeros(3, device=d),
                 lambda d: torch.randn(3, device=d), lambda d: torch.tensor([1, 2], device=d),
                 lambda d: torch.arange(4, device=d), lambda d: torch.eye(2, device=d),
                 lambda d: torch.tril_indices(3, 3, device=d), lambda d: torch.ones(2).to(d),
                 lambda d: torch.ones(2).tpu()):
        assert make("tpu").device == torch.device("tpu", 1)  # "tpu" is the current device
    torch.tpu.set_device(0)
    assert torch.ones(2).tpu(1).device == torch.device("tpu", 1)
    for make, ref in ((lambda: torch.arange(5, device="tpu:1"), torch.arange(5)),
                      (lambda: torch.full((2, 2), 3.5, device="tpu:1"), torch.full((2, 2), 3.5)),
                      (lambda: torch.eye(3, device="tpu:1"), torch.eye(3)),
                      (lambda: torch.linspace(0, 1, 5, device="tpu:1"), torch.linspace(0, 1, 5)),
                      (lambda: torch.tril_indices(3, 3, device="tpu:1"), torch.tril_indices(3, 3)),
                      (lambda: torch.ones(2, device="tpu:1").new_zeros(3), torch.zeros(3))):
        t = make()
        assert t.device == torch.device("tpu", 1), t.device  # explicit index, current is 0
        assert_close(t.cpu(), ref)

    # copies between devices: both directions, views, non-contiguous, dtype changes
    a = torch.randn(4, 6)
    a0 = a.to("tpu:0")
    torch.tpu.synchronize()
    torch.tpu.reset_metrics()
    a1 = a0.to("tpu:1")
    assert a1.device == torch.device("tpu", 1) and torch.equal(a1.cpu(), a)
    m = torch.tpu.metrics()
    assert m["transfers_device_to_device"] == 1 and m["transfers_to_host"] == 1, m  # .cpu() only
    assert torch.tpu.metrics(1)["transfers_from_other_devices"] == 1
    assert torch.tpu.metrics(0)["transfers_to_other_devices"] == 1
    assert torch.equal(a1.to("tpu:0").cpu(), a)
    assert torch.equal(a0.t().to("tpu:1").cpu(), a.t())                  # non-contiguous source
    assert torch.equal(a0[1:3, ::2].to("tpu:1").cpu(), a[1:3, ::2])      # strided view
    assert torch.equal(a1.to("tpu:0", torch.float64).cpu(), a.double())  # dtype change
    assert torch.equal(a1.to(device="tpu:0", dtype=torch.int32).cpu(), a.int())

    d = torch.zeros(6, 4, dtype=torch.float64, device="tpu:1")
    d.copy_(a0.t())                                   # tpu:0 -> tpu:1, transposed, f32 -> f64
    assert torch.equal(d.cpu(), a.t().double())
    e = torch.zeros(8, 6, device="tpu:0")
    e[::2].copy_(a1.to(torch.float16))                # tpu:1 -> a strided view on tpu:0
    ref = torch.zeros(8, 6); ref[::2] = a.half().float()
    assert torch.equal(e.cpu(), ref)
    f = torch.zeros(4, 6, device="tpu:1")
    f[:, 1:3].copy_(a0[:, :2])                         # view into view, across devices
    ref = torch.zeros(4, 6); ref[:, 1:3] = a[:, :2]
    assert torch.equal(f.cpu(), ref)
    b0 = torch.zeros(4, 6, device="tpu:0"); b0.copy_(a1)
    assert torch.equal(b0.cpu(), a)
    assert torch.equal(torch.ones(3, dtype=torch.int64, device="tpu:1").to("tpu:0").cpu(),
                       torch.ones(3, dtype=torch.int64))
    assert torch.equal(torch.tensor([True, False], device="tpu:0").to("tpu:1").cpu(),
                       torch.tensor([True, False]))
    p = torch.arange(3.).pin_memory().to("tpu:1", non_blocking=True)
    assert p.device == torch.device("tpu", 1) and torch.equal(p.cpu(), torch.arange(3.))

    # ops on tensors of two devices raise CUDA's error
    x0, x1 = torch.randn(3, 3, device="tpu:0"), torch.randn(3, 3, device="tpu:1")
    for fn in (lambda: x0 + x1, lambda: torch.cat([x0, x1]), lambda: torch.stack([x1, x0]),
               lambda: x0 @ x1, lambda: torch.where(x0 > 0, x0, x1), lambda: x1.add_(x0),
               lambda: torch.add(x0, x0, out=torch.empty(3, 3, device="tpu:1")),
               lambda: torch.addcmul(x0, x0, x1), lambda: torch._foreach_add([x0], [x1]),
               lambda: torch.nn.functional.linear(x0, x1)):
        raises(RuntimeError, fn, SAME)
    assert_close((x1 + torch.tensor(2.0)).cpu(), x1.cpu() + 2)  # a 0-d CPU tensor may mix
    raises(RuntimeError, lambda: x1 + torch.ones(3), SAME)

    # an op without a lowering (the CPU fallback) follows the same rule
    lib = torch.library.Library("pjrt_md_test", "DEF")
    lib.define("add2(Tensor x, Tensor y) -> Tensor")
    lib.impl("add2", lambda x, y: x + y, "CPU")
    r = torch.ops.pjrt_md_test.add2(x1, x1)
    assert r.device == torch.device("tpu", 1) and torch.equal(r.cpu(), x1.cpu() * 2)
    raises(RuntimeError, lambda: torch.ops.pjrt_md_test.add2(x0, x1), SAME)

    # _foreach_* over lists spanning devices: each element computed on its own device (as
    # CUDA's slow path), results back in order
    ys = [torch.randn(3), torch.randn(4), torch.randn(2)]
    ts = [ys[0].to("tpu:0"), ys[1].to("tpu:1"), ys[2].to("tpu:0")]
    out = torch._foreach_add(ts, ts, alpha=2)
    assert [o.device.index for o in out] == [0, 1, 0]
    for o, y in zip(out, ys):
        assert_close(o.cpu(), y * 3)
    out = torch._foreach_mul(ts, [2.0, 3.0, 4.0])
    for o, y, s in zip(out, ys, (2.0, 3.0, 4.0)):
        assert_close(o.cpu(), y * s)
    torch._foreach_add_(ts, 1.0)
    for t, y in zip(ts, ys):
        assert_close(t.cpu(), y + 1)
    print("ok")
    """)


def test_guards_autograd_and_modes():
    _run("""
    # ops run on their inputs' device whatever the current device is, and leave it unchanged
    w_cpu = torch.randn(8, 8)
    x_cpu = torch.randn(4, 8)
    w = w_cpu.to("tpu:1").requires_grad_()
    x = x_cpu.to("tpu:1")
    torch.tpu.set_device(0)
    e0, e1 = execs(0), execs(1)
    y = (x @ w).tanh()
    assert y.device == torch.device("tpu", 1) and torch.tpu.current_device() == 0
    assert execs(0) == e0 and execs(1) > e1, (execs(0), e0, execs(1), e1)
    with torch.tpu.device(0):
        z = y * 2 + 1                      # current device 0, inputs on 1: runs on 1
    assert z.device == torch.device("tpu", 1)

    # autograd: the backward of tpu:1 tensors runs on tpu:1 (its worker thread's device)
    loss = z.sum()
    e0, e1 = execs(0), execs(1)
    loss.backward()
    assert execs(0) == e0 and execs(1) > e1
    assert w.grad.device == torch.device("tpu", 1)
    wc = w_cpu.clone().requires_grad_()
    ((x_cpu @ wc).tanh() * 2 + 1).sum().backward()
    assert_close(w.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-5)
    assert torch.tpu.current_device() == 0

    # a training step of a model on tpu:1 matches the CPU; tpu:0 does nothing meanwhile
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model.load_state_dict(ref.state_dict())
    model.to("tpu:1")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    data, target = torch.randn(16, 8), torch.randn(16, 2)
    e0 = execs(0)
    for _ in range(3):
        for m, o, dev in ((model, opt, "tpu:1"), (ref, ref_opt, "cpu")):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(data.to(dev)), target.to(dev)).backward()
            o.step()
    assert execs(0) == e0
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.device == torch.device("tpu", 1)
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)

    # a model split over two devices (pipeline style): activations cross with .to()
    first, second = torch.nn.Linear(8, 8).to("tpu:0"), torch.nn.Linear(8, 3).to("tpu:1")
    out = second(first(x_cpu.to("tpu:0")).relu().to("tpu:1"))
    out.sum().backward()
    assert first.weight.grad.device.index == 0 and second.weight.grad.device.index == 1
    f_ref = torch.nn.Linear(8, 8); f_ref.load_state_dict({k: v.cpu() for k, v in first.state_dict().items()})
    s_ref = torch.nn.Linear(8, 3); s_ref.load_state_dict({k: v.cpu() for k, v in second.state_dict().items()})
    s_ref(f_ref(x_cpu).relu()).sum().backward()
    assert_close(first.weight.grad.cpu(), f_ref.weight.grad, rtol=1e-4, atol=1e-5)
    assert_close(second.weight.grad.cpu(), s_ref.weight.grad, rtol=1e-4, atol=1e-5)
    clip = torch.nn.utils.clip_grad_norm_(list(first.parameters()) + list(second.parameters()), 1e9)
    clip_ref = torch.nn.utils.clip_grad_norm_(list(f_ref.parameters()) + list(s_ref.parameters()), 1e9)
    assert_close(clip.cpu(), clip_ref, rtol=1e-4, atol=1e-5)

    # defer_and_fuse: recorded ops of two devices, copies between them of pending values
    torch.tpu.set_eager_mode("defer_and_fuse")
    a = torch.arange(6., device="tpu:0").reshape(2, 3)
    b = (a * 2).t()                                   # recorded on tpu:0
    c = torch.empty(3, 2, dtype=torch.float64, device="tpu:1")
    c.copy_(b)
    d = c + 1                                         # recorded on tpu:1
    g = d.to("tpu:0") * b
    torch.tpu.set_eager_mode("strict")
    ar = torch.arange(6.).reshape(2, 3)
    assert torch.equal(d.cpu(), (ar * 2).t().double() + 1)
    assert g.device.index == 0 and torch.equal(g.cpu(), ((ar * 2).t().double() + 1) * (ar * 2).t())

    # torch.compile: a captured graph runs on its inputs' device, one program each
    @torch.compile(backend="tpu")
    def fn(u, v):
        return (u * v).sin() + u
    for dev in ("tpu:1", "tpu:0", "tpu:1"):
        u, v = torch.randn(5), torch.randn(5)
        e0, e1 = execs(0), execs(1)
        r = fn(u.to(dev), v.to(dev))
        assert r.device == torch.device(dev)
        assert_close(r.cpu(), (u * v).sin() + u)
        mine = int(dev[-1])
        assert (execs(0) - e0, execs(1) - e1) == ((1, 0) if mine == 0 else (0, 1))
    print("ok")
    """)


def test_per_device_memory_stats():
    _run("""
    x = torch.ones(1, device="tpu:0"); torch.ones(1, device="tpu:1")  # start the runtime
    torch.tpu.synchronize()
    base = [torch.tpu.memory_allocated(i) for i in range(2)]
    for i in range(2):
        torch.tpu.reset_peak_memory_stats(i)
    t = torch.empty(1000, device="tpu:1")             # 4000 bytes on tpu:1 only
    assert [torch.tpu.memory_allocated(i) - base[i] for i in range(2)] == [0, 4000]
    assert torch.accelerator.memory_allocated(1) - base[1] == 4000
    assert torch.accelerator.memory_allocated(0) == base[0]
    assert torch.tpu.memory_stats(1)["allocated_bytes.all.current"] - base[1] == 4000
    assert torch.tpu.memory_stats(0)["allocated_bytes.all.current"] == base[0]
    assert torch.accelerator.memory_stats(1)["allocated_bytes.all.current"] - base[1] == 4000
    live = [torch.tpu.memory_stats(i)["num_live_storages"] for i in range(2)]
    u = torch.empty(10, device="tpu:0")
    assert [torch.tpu.memory_stats(i)["num_live_storages"] for i in range(2)] == [live[0] + 1, live[1]]
    del u
    with torch.tpu.device(1):
        assert torch.tpu.memory_allocated() - base[1] == 4000  # default: the current device
        assert torch.accelerator.memory_allocated() - base[1] == 4000
    del t
    assert [torch.tpu.memory_allocated(i) for i in range(2)] == base
    peaks = [torch.tpu.max_memory_allocated(i) - base[i] for i in range(2)]
    assert peaks == [40, 4000], peaks
    assert torch.accelerator.max_memory_allocated(1) - base[1] == 4000
    assert torch.tpu.memory_stats(1)["allocated_bytes.all.peak"] - base[1] == 4000
    torch.tpu.reset_peak_memory_stats(1)               # resets tpu:1's peak only
    assert torch.tpu.max_memory_allocated(1) == base[1]
    assert torch.tpu.max_memory_allocated(0) - base[0] == 40
    torch.accelerator.reset_peak_memory_stats(0)
    assert torch.accelerator.max_memory_allocated(0) == base[0]
    assert torch.tpu.memory_allocated("tpu:1") == torch.tpu.memory_allocated(torch.device("tpu", 1))
    print("ok")
    """)


def test_streams_events_and_synchronize():
    _run("""
    s1 = torch.tpu.Stream(1)
    assert s1.device == torch.device("tpu", 1)
    assert torch.tpu.current_stream(1).device == torch.device("tpu", 1)
    assert torch.accelerator.current_stream(1).device == torch.device("tpu", 1)
    with torch.tpu.stream(s1):
        assert torch.tpu.current_device() == 1
    assert torch.tpu.current_device() == 0

    a = torch.randn(600, 600, device="tpu:1")
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record(s1)
    b = a @ a @ a
    end.record(s1)
    assert end.device == torch.device("tpu", 1)
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0
    with torch.tpu.device(1):
        ev = torch.tpu.Event()
        ev.record()                                    # the current stream: tpu:1's
    assert ev.device == torch.device("tpu", 1)
    ev.wait()

    # synchronize(i) waits for device i's work, a device-to-device copy included
    c = (a @ a).to("tpu:0")
    torch.tpu.synchronize(1)
    assert torch.tpu.pending_executions(1) == 0
    torch.tpu.synchronize(0)
    torch.accelerator.synchronize(1)
    assert_close(c.cpu(), a.cpu() @ a.cpu(), rtol=1e-4, atol=1e-3)
    assert torch.tpu.pending_executions() == 0
    print("ok")
    """)


def test_per_device_generators():
    _run("""
    torch.manual_seed(123)                             # seeds every device
    assert [g.initial_seed() for g in torch.tpu.default_generators] == [123, 123]
    first0 = torch.randn(6, device="tpu:0").cpu()
    first1 = torch.randn(6, device="tpu:1").cpu()
    assert torch.equal(first0, first1)                 # same seed, separate streams

    # tpu:1's stream does not move when tpu:0 draws
    torch.tpu.manual_seed_all(7)
    ref = torch.randn(6, device="tpu:1").cpu()
    torch.tpu.manual_seed_all(7)
    torch.randn(100, device="tpu:0"); torch.rand(3, device="tpu:0")
    assert torch.equal(torch.randn(6, device="tpu:1").cpu(), ref)
    assert torch.tpu.get_rng_state(0).tolist() != torch.tpu.get_rng_state(1).tolist()

    # manual_seed seeds the current device only, as torch.cuda.manual_seed
    torch.tpu.manual_seed_all(1)
    with torch.tpu.device(1):
        torch.tpu.manual_seed(99)
        assert torch.tpu.initial_seed() == 99
        r1 = torch.randn(4, device="tpu").cpu()
    assert torch.tpu.initial_seed() == 1
    assert torch.tpu.default_generator(1).initial_seed() == 99
    torch.tpu.set_device(1); torch.tpu.manual_seed(99); torch.tpu.set_device(0)
    assert torch.equal(torch.randn(4, device="tpu:1").cpu(), r1)

    # saved state of one device replays that device's numbers
    state = torch.tpu.get_rng_state(1)
    u = torch.rand(5, device="tpu:1").cpu()
    torch.rand(5, device="tpu:0")
    torch.tpu.set_rng_state(state, 1)
    assert torch.equal(torch.rand(5, device="tpu:1").cpu(), u)
    states = torch.tpu.get_rng_state_all()
    v = [torch.randn(3, device=f"tpu:{i}").cpu() for i in range(2)]
    torch.tpu.set_rng_state_all(states)
    assert all(torch.equal(torch.randn(3, device=f"tpu:{i}").cpu(), v[i]) for i in range(2))
    with torch.random.fork_rng(device_type="tpu", devices=[1]):
        torch.randn(10, device="tpu:1")
    assert torch.equal(torch.tpu.get_rng_state(1), torch.tpu.get_rng_state_all()[1])

    # a generator object of its own on tpu:1
    g = torch.Generator("tpu:1").manual_seed(5)
    assert g.device == torch.device("tpu", 1)
    w1 = torch.randn(4, device="tpu:1", generator=g).cpu()
    g.manual_seed(5)
    assert torch.equal(torch.randn(4, device="tpu:1", generator=g).cpu(), w1)
    with torch.tpu.device(1):
        assert torch.Generator("tpu").device == torch.device("tpu", 1)
    print("ok")
    """)


def test_persistent_cache_serves_every_device():
    # Programs are compiled device-independent (portable): one compiled on tpu:0 in one process
    # is loaded from the persistent cache and runs on tpu:1 in another.
    cache = tempfile.mkdtemp(prefix="torch_pjrt_md_cache_")
    code = """
    dev = DEV
    x = torch.linspace(-2, 2, 7)
    y = ((x.to(dev) * 3).sin() + 1).cpu()
    assert_close(y, (x * 3).sin() + 1)
    s = torch.tpu.cache_stats()
    print("stats", s["disk_cache_hits"], s["disk_cache_stores"])
    print("ok")
    """
    r0 = run_python(PRELUDE + "DEV = 'tpu:0'\n" + textwrap.dedent(code), TORCH_PJRT_CPU_DEVICE_COUNT="2",
                    TORCH_PJRT_CACHE_DIR=cache)
    assert r0.returncode == 0 and r0.stdout.strip().endswith("ok"), r0.stdout + r0.stderr[-4000:]
    r1 = run_python(PRELUDE + "DEV = 'tpu:1'\n" + textwrap.dedent(code), TORCH_PJRT_CPU_DEVICE_COUNT="2",
                    TORCH_PJRT_CACHE_DIR=cache)
    assert r1.returncode == 0 and r1.stdout.strip().endswith("ok"), r1.stdout + r1.stderr[-4000:]
    hits = int(next(l for l in r1.stdout.splitlines() if l.startswith("stats")).split()[1])
    assert hits > 0, r1.stdout
