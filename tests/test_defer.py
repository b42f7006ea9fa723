"""The defer_and_fuse eager mode: recorded ops give Strict's (and CPU's) results with the same view
and in-place semantics; every flush trigger runs the pending graph; the size bound and the
loop-period detector cut graphs so that a loop reuses one program; dead intermediates are never
materialized; bad input still raises CPU's exception at the op."""
import pytest
import torch

TPU = torch.device("tpu")


@pytest.fixture
def defer():
    torch.tpu.set_eager_mode("defer_and_fuse")
    torch_pjrt_C = torch.tpu._C
    max_ops = torch_pjrt_C._defer_max_ops()
    torch_pjrt_C._defer_reset_detector()
    try:
        yield torch_pjrt_C
    finally:
        torch.tpu.set_eager_mode("strict")
        torch_pjrt_C._defer_set_max_ops(max_ops)
        torch_pjrt_C._defer_reset_detector()


def metric(name):
    return torch.tpu.metrics()[name]


def program(x):
    """Views, in-place updates through views, out=, broadcasting and reductions."""
    y = x * 2 + 1
    t = y.t()                      # a transposed view
    t[1:3].mul_(-1)                # in-place through a slice of the view: y changes
    z = torch.empty(0, device=x.device)
    torch.add(y, t, alpha=0.5, out=z)   # out= with a resize
    d = z.diagonal()
    d.add_(100)                    # writes the diagonal of z
    s = z.softmax(-1).sum(0)
    return y, z, s, z.sum()


def test_results_views_and_in_place_match_cpu_and_strict(defer):
    x = torch.randn(5, 5)
    want = program(x.clone())
    got = program(x.to(TPU))
    assert defer._defer_pending_ops() > 0           # nothing ran yet
    for w, g in zip(want, got):
        torch.testing.assert_close(g.cpu(), w)      # the read flushes
    assert defer._defer_pending_ops() == 0
    with torch.tpu.eager_mode("strict"):
        strict = program(x.to(TPU))
    for s, g in zip(strict, got):
        torch.testing.assert_close(g.cpu(), s.cpu())


def test_aliases_see_writes_and_storages_keep_identity(defer):
    base = torch.zeros(4, 4, device=TPU)
    ptr = base.data_ptr()
    row = base[2]
    row.fill_(3)
    base.add_(1)
    col = base[:, 1]
    col.mul_(2)
    assert base.data_ptr() == ptr
    want = torch.zeros(4, 4)
    want[2] = 3
    want += 1
    want[:, 1] *= 2
    torch.testing.assert_close(row.cpu(), want[2])
    torch.testing.assert_close(base.cpu(), want)


@pytest.mark.parametrize("trigger", ["item", "cpu", "repr", "synchronize", "mode_switch",
                                     "event", "numpy"])
def test_flush_triggers(defer, trigger):
    x = torch.arange(6.0, device=TPU)
    y = (x * 3).sum()
    assert defer._defer_pending_ops() == 3   # arange, mul, sum
    assert "aten::mul" in torch.tpu.pending_graph() and "aten::sum" in torch.tpu.pending_graph()
    flushes = metric("defer_flushes")
    if trigger == "item":
        assert y.item() == 45.0
    elif trigger == "cpu":
        assert y.cpu().item() == 45.0
    elif trigger == "repr":
        assert "45." in repr(y)
    elif trigger == "synchronize":
        torch.tpu.synchronize()
    elif trigger == "mode_switch":
        torch.tpu.set_eager_mode("strict")
    elif trigger == "event":
        torch.tpu.Event().record()
    elif trigger == "numpy":
        assert y.cpu().numpy() == 45.0
    assert defer._defer_pending_ops() == 0
    # printing runs formatting ops of its own (each read flushes them): at least one flush
    assert metric("defer_flushes") >= flushes + 1
    if trigger != "repr":
        assert metric("defer_flushes") == flushes + 1
    assert y.cpu().item() == 45.0


def test_host_upload_into_a_pending_storage_keeps_program_order(defer):
    x = torch.zeros(3, device=TPU)
    x.add_(5)                         # recorded
    x.copy_(torch.tensor([1.0, 2.0, 3.0]))  # an upload: must land after the recorded add
    x.mul_(2)
    torch.testing.assert_close(x.cpu(), torch.tensor([2.0, 4.0, 6.0]))


def test_size_bound_cuts_graphs(defer):
    defer._defer_set_max_ops(4)
    flushes = metric("defer_flushes")
    x = torch.ones(8, device=TPU)
    for _ in range(10):
        x = x * 2
        assert defer._defer_pending_ops() <= 4
    assert x.cpu()[0].item() == 1024.0
    assert metric("defer_flushes") - flushes >= 3   # 11 ops (ones + 10 muls), at most 4 a graph


def test_loop_without_syncs_reuses_one_program(defer):
    """A loop that never reads a result hits the size bound once; the detector then learns the
    iteration's op sequence and cuts every graph at the same phase, so one program repeats."""
    def body(x, w):
        h = torch.tanh(x @ w) * 0.5 + x
        return h / h.norm()

    defer._defer_set_max_ops(100)
    x0, w0 = torch.randn(8, 8), torch.randn(8, 8)
    x, w = x0.to(TPU), w0.to(TPU)
    compiles, cuts, flushes = metric("compiles"), metric("defer_loop_cuts"), metric("defer_flushes")
    for _ in range(200):
        x = body(x, w)
    cuts = metric("defer_loop_cuts") - cuts
    got = x.cpu()
    compiles = metric("compiles") - compiles
    flushes = metric("defer_flushes") - flushes
    want = x0
    for _ in range(200):
        want = body(want, w0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert cuts >= 5, "the detector found no loop boundary"
    # the bound-cut graph, the learning graph, the steady-state program, the final remainder
    assert compiles <= 4 < flushes, (compiles, flushes)


def test_loop_with_a_read_per_iteration_is_not_cut(defer):
    x = torch.ones(4, device=TPU)
    cuts, flushes = metric("defer_loop_cuts"), metric("defer_flushes")
    for _ in range(30):
        for _ in range(5):         # a repeated inner pattern must not cut the iteration
            x = x * 1.5 - 0.25
        x.sum().item()
    assert metric("defer_loop_cuts") == cuts
    assert metric("defer_flushes") - flushes == 30


def test_dead_intermediates_are_not_materialized(defer):
    elided = metric("defer_elided_storages")
    x = torch.randn(16, device=TPU)
    y = ((x + 1) * 2).exp().sum()   # three intermediates die before the flush
    y.item()
    assert metric("defer_elided_storages") - elided >= 3


def test_bad_input_raises_cpus_exception_at_the_op(defer):
    a, b = torch.ones(3, device=TPU), torch.ones(4, device=TPU)
    good = a * 2
    with pytest.raises(RuntimeError, match="must match the size"):
        a + b
    torch.testing.assert_close(good.cpu(), torch.full((3,), 2.0))


def test_random_ops_match_strict_under_a_seed(defer):
    torch.manual_seed(7)
    a = torch.randn(5, device=TPU)
    d = torch.nn.functional.dropout(torch.ones(100, device=TPU), 0.5)
    a, d = a.cpu(), d.cpu()
    torch.tpu.set_eager_mode("strict")
    torch.manual_seed(7)
    b = torch.randn(5, device=TPU).cpu()
    e = torch.nn.functional.dropout(torch.ones(100, device=TPU), 0.5).cpu()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(d, e)


def test_dtype_reinterpreting_view_of_a_pending_result(defer):
    x = torch.tensor([1.0, -2.0], device=TPU) * 2
    bits = x.view(torch.int32)
    torch.testing.assert_close(bits.cpu(), torch.tensor([2.0, -4.0]).view(torch.int32))


def test_autograd_in_defer_mode_matches_cpu(defer):
    w0 = torch.randn(4, 3)
    for dev in ("cpu", TPU):
        w = w0.clone().to(dev).requires_grad_()
        loss = (torch.sin(w) @ torch.ones(3, device=dev)).pow(2).sum()
        loss.backward()
        if dev == "cpu":
            want = w.grad.clone()
        else:
            torch.testing.assert_close(w.grad.cpu(), want)


def _raises(fn):
    """(exception type, message) fn raises, or None."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), str(e)
    return None


@pytest.mark.parametrize("case", ["argmin_bool", "softmax_bad_dim"])
def test_result_of_an_op_that_failed_at_the_flush_raises_on_every_read(defer, case):
    # A check made by the lowering surfaces at the flush (docs/reliability.md F9); the failed
    # op's result tensor then read back zeros (argmin of bool: tensor(0)). CPU raises at the
    # call, so no such tensor exists there: every read must raise CPU's exception type again.
    ops = {"argmin_bool": lambda d: torch.argmin(torch.tensor([True, False], device=d)),
           "softmax_bad_dim": lambda d: torch.softmax(torch.zeros(2, 3, device=d), dim=3)}
    want = _raises(lambda: ops[case]("cpu"))
    assert want is not None
    r = ops[case](TPU)                               # recorded: nothing raised yet
    assert _raises(r.cpu)[0] is want[0]              # the flush
    for read in (r.cpu, r.item if r.numel() == 1 else r.tolist, lambda: repr(r)):
        got = _raises(read)
        assert got is not None and got[0] is want[0], (read, got)
        assert want[1] in got[1]                     # names CPU's error
    dep = r + 1                                      # recorded after the flush: reads r
    assert _raises(dep.cpu)[0] is want[0]
    assert _raises(dep.cpu)[0] is want[0]            # and stays undefined
    torch.tpu.set_eager_mode("strict")
    assert _raises(lambda: (r * 2).cpu())[0] is want[0]


def test_ops_recorded_after_a_failed_op_never_ran_and_their_results_raise(defer):
    # CPU has no bool kernel for floor_: the check is the lowering's, so the recorded op fails
    # at the flush. The ops before it ran; its in-place destination keeps its contents (as
    # CPU's when the op raises); what the ops recorded after it were to write never got
    # written, so reading it raises too (it read back stale or zero contents before).
    mask = torch.tensor([True, False, True])
    a = mask.to(TPU)
    before = a.float() * 2
    a.floor_()
    after = a.logical_not()
    b = torch.ones(3, device=TPU)
    b.add_(1)                                        # in place, on a tensor with contents
    with pytest.raises(NotImplementedError, match="floor"):
        a.cpu()
    assert torch.equal(a.cpu(), mask)
    assert torch.equal(before.cpu(), mask.float() * 2)
    for t in (after, b):
        with pytest.raises(NotImplementedError, match="never ran.*floor"):
            t.cpu()
    b.copy_(torch.full((3,), 5.0))                   # a whole write defines it again
    assert torch.equal(b.cpu(), torch.full((3,), 5.0))
