"""Device-side index checks (csrc/runtime/index_checks.c): in Strict and defer_and_fuse modes an
out-of-range index raises CPU's exception, with CPU's message, at the next synchronizing point
(a read to the host, synchronize, an event wait), naming the op and the Python line; Debug mode
raises at once. The error is sticky until read, the first failure wins, and valid indices
(negative ones where CPU accepts them, nll_loss's ignore_index) never raise."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import run_python

TPU = torch.device("tpu")
THIS_FILE = __file__


def t(values, d):
    return torch.tensor(values, device=d)


def ones(*shape, d):
    return torch.ones(*shape, device=d)


# name -> fn(device): one op with one bad index
BAD = {
    "index": lambda d: ones(4, d=d)[t([1, 10], d)],
    "index_negative": lambda d: ones(4, d=d)[t([-5], d)],
    "index_second_tensor": lambda d: ones(3, 4, d=d)[t([0], d), t([9], d)],
    "index_after_slice": lambda d: ones(3, 4, d=d)[:, t([1, 10], d)],
    "unsafe_index": lambda d: torch.ops.aten._unsafe_index(ones(4, d=d), [t([7], d)]),
    "gather": lambda d: ones(4, d=d).gather(0, t([7], d)),
    "gather_negative": lambda d: ones(4, d=d).gather(0, t([-1], d)),
    "gather_dim1": lambda d: ones(4, 3, d=d).gather(1, t([[0], [5], [1], [2]], d)),
    "index_select": lambda d: ones(4, d=d).index_select(0, t([7], d)),
    "index_select_negative": lambda d: ones(4, d=d).index_select(0, t([-1], d)),
    "index_select_dim1": lambda d: ones(4, 3, d=d).index_select(1, t([3], d)),
    "index_select_2d_dim0": lambda d: ones(4, 3, d=d).index_select(0, t([4], d)),
    "embedding": lambda d: F.embedding(t([[1, 7]], d), ones(4, 2, d=d)),
    "scatter": lambda d: ones(4, d=d).scatter(0, t([7], d), ones(1, d=d)),
    "scatter_add": lambda d: ones(4, d=d).scatter_add(0, t([7], d), ones(1, d=d)),
    "scatter_reduce": lambda d: ones(4, d=d).scatter_reduce(0, t([7], d), ones(1, d=d), "amax"),
    "index_put": lambda d: ones(4, d=d).index_put_((t([7], d),), ones(1, d=d)),
    "index_put_accumulate": lambda d: ones(4, d=d).index_put_((t([7], d),), ones(1, d=d),
                                                              accumulate=True),
    # writes into non-contiguous views (their own lowering, _pj_view_put)
    "index_put_into_view": lambda d: ones(4, 4, d=d).diagonal(1, 0, 1).index_put_(
        (t([7], d),), ones(1, d=d)),
    "index_copy_into_view": lambda d: ones(4, 4, d=d)[:, 1].index_copy_(0, t([7], d), ones(1, d=d)),
    "index_add_into_view": lambda d: ones(4, 4, d=d)[:, 1].index_add_(0, t([-5], d), ones(1, d=d)),
    "scatter_into_view": lambda d: ones(4, 4, d=d)[:, 1].scatter_(0, t([7], d), ones(1, d=d)),
    "setitem": lambda d: ones(4, 2, d=d).__setitem__(t([1, 6], d), 0.0),
    "index_add": lambda d: ones(4, d=d).index_add(0, t([7], d), ones(1, d=d)),
    "index_add_2d": lambda d: ones(4, 3, d=d).index_add(1, t([5], d), ones(4, 1, d=d)),
    "index_copy": lambda d: ones(4, d=d).index_copy(0, t([7], d), ones(1, d=d)),
    "index_fill": lambda d: ones(4, d=d).index_fill(0, t([7], d), 1.0),
    "index_reduce": lambda d: ones(4, d=d).index_reduce(0, t([7], d), ones(1, d=d), "prod"),
    "take": lambda d: ones(4, d=d).take(t([7], d)),
    "take_negative": lambda d: ones(4, d=d).take(t([-5], d)),
    "put": lambda d: ones(4, d=d).put(t([7], d), ones(1, d=d)),
    "nll_loss": lambda d: F.nll_loss(ones(2, 3, d=d), t([0, 5], d)),
    "nll_loss_negative": lambda d: F.nll_loss(ones(2, 3, d=d), t([0, -1], d)),
    "nll_loss_none": lambda d: F.nll_loss(ones(2, 3, d=d), t([0, 5], d), reduction="none"),
    "nll_loss2d": lambda d: F.nll_loss(ones(2, 3, 2, 2, d=d), torch.full((2, 2, 2), 5, device=d)),
    "cross_entropy": lambda d: F.cross_entropy(ones(2, 3, d=d), t([0, 3], d)),
    "embedding_bag": lambda d: F.embedding_bag(t([1, 7], d), ones(4, 2, d=d), t([0], d)),
}

# the same ops with indices CPU accepts: results must equal CPU's and nothing may raise
GOOD = {
    "index": lambda d: ones(4, d=d).cumsum(0)[t([1, -4, 3], d)],
    "gather": lambda d: torch.arange(12.0, device=d).view(4, 3).gather(1, t([[0], [2], [1], [2]], d)),
    "index_select": lambda d: torch.arange(4.0, device=d).index_select(0, t([3, 0], d)),
    "embedding": lambda d: F.embedding(t([[3, 0]], d), torch.arange(8.0, device=d).view(4, 2)),
    "scatter": lambda d: torch.zeros(4, device=d).scatter(0, t([3], d), ones(1, d=d)),
    "index_put_negative": lambda d: torch.zeros(4, device=d).index_put_((t([-1], d),), ones(1, d=d)),
    "index_fill_negative": lambda d: torch.zeros(4, device=d).index_fill(0, t([-1], d), 2.0),
    "take_negative": lambda d: torch.arange(4.0, device=d).take(t([-4, 3], d)),
    "nll_loss_ignore_index": lambda d: F.nll_loss(torch.arange(6.0, device=d).view(2, 3),
                                                  t([1, -100], d)),
    "nll_loss_custom_ignore": lambda d: F.nll_loss(torch.arange(6.0, device=d).view(2, 3),
                                                   t([1, 3], d), ignore_index=3),
}


def cpu_error(fn):
    with pytest.raises(Exception) as e:
        fn("cpu")
    return e


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", list(BAD))
def test_bad_index_raises_cpus_error_at_the_next_sync(name, mode):
    fn = BAD[name]
    cpu = cpu_error(fn)
    with torch.tpu.eager_mode(mode):
        r = fn(TPU)  # asynchronous: nothing is known yet
        with pytest.raises(Exception) as tpu:
            torch.tpu.synchronize()
    assert tpu.type is cpu.type, f"CPU: {cpu.value!r}\ntpu: {tpu.value!r}"
    msg = str(tpu.value)
    assert msg.startswith(str(cpu.value).splitlines()[0]), msg
    assert f"{THIS_FILE}:" in msg, msg  # the Python line of the op
    # read once: the next synchronization is clean, and the results are still readable
    torch.tpu.synchronize()
    if isinstance(r, torch.Tensor):
        r.cpu()


@pytest.mark.parametrize("name", list(BAD))
def test_debug_mode_raises_at_once(name):
    fn = BAD[name]
    cpu = cpu_error(fn)
    with torch.tpu.eager_mode("debug"):
        with pytest.raises(Exception) as tpu:
            fn(TPU)
    assert tpu.type is cpu.type
    assert str(cpu.value).splitlines()[0] in str(tpu.value)
    torch.tpu.synchronize()


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", list(GOOD))
def test_valid_indices_never_raise(name, mode):
    fn = GOOD[name]
    expect = fn("cpu")
    with torch.tpu.eager_mode(mode):
        got = fn(TPU)
        torch.tpu.synchronize()
        torch.testing.assert_close(got.cpu(), expect)


@pytest.mark.parametrize("sync", ["item", "cpu", "synchronize", "event", "print"])
def test_every_synchronizing_point_reports(sync):
    x = torch.arange(4.0, device=TPU)
    y = x[t([1, 9], TPU)]
    s = (x * 2).sum()
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 4"):
        if sync == "item":
            s.item()
        elif sync == "cpu":
            s.cpu()
        elif sync == "synchronize":
            torch.tpu.synchronize()
        elif sync == "event":
            ev = torch.Event(device="tpu")
            ev.record()
            ev.synchronize()
        else:
            str(y)
    assert s.item() == 12.0  # sticky until read: read once, then gone


def test_first_failure_wins_and_names_its_line():
    x = torch.arange(4.0, device=TPU)
    x.gather(0, t([8], TPU))  # first: RuntimeError
    line = test_first_failure_wins_and_names_its_line.__code__.co_firstlineno + 2
    x[t([6], TPU)]  # second: would be IndexError
    with pytest.raises(RuntimeError, match="index 8 is out of bounds") as e:
        torch.tpu.synchronize()
    assert f"{THIS_FILE}:{line}" in str(e.value)
    assert "aten::gather" in str(e.value)
    torch.tpu.synchronize()


def test_error_in_a_fused_run_names_the_failing_op():
    with torch.tpu.eager_mode("defer_and_fuse"):
        x = torch.arange(6.0, device=TPU)
        y = (x * 2 + 1)[t([0, 1], TPU)]
        z = y.index_select(0, t([5], TPU))  # out of range for y's 2 elements
        w = z.exp() - 1
        with pytest.raises(IndexError, match="index out of range in self") as e:
            w.cpu()
    assert "aten::index_select" in str(e.value)


def test_training_step_after_an_error_matches_cpu():
    # the process stays usable: a bad batch raises, the next good step equals CPU's
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Flatten(), torch.nn.Linear(8, 3))
    dev = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Flatten(), torch.nn.Linear(8, 3))
    dev.load_state_dict(ref.state_dict())
    dev.to(TPU)
    with pytest.raises(IndexError):
        dev(t([[1, 8]], TPU)).sum().item()
    dev.zero_grad()
    ids, target = torch.tensor([[1, 7], [0, 3]]), torch.tensor([2, 0])
    F.cross_entropy(ref(ids), target).backward()
    loss = F.cross_entropy(dev(ids.to(TPU)), target.to(TPU))
    loss.backward()
    assert loss.item() == pytest.approx(F.cross_entropy(ref(ids), target).item(), rel=1e-6)
    for (n, p), q in zip(ref.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=n)


def test_indexed_write_into_a_view_checks_its_own_dim():
    # index_put_ into a non-contiguous view takes the O(slice) path (view_index_put.cpp): the
    # error names the view's dim and size, not the storage's end
    kv = torch.zeros(4, 3, 8, device=TPU)
    kc = kv.chunk(2, dim=2)[0]  # [4, 3, 4], strided
    cpu = torch.zeros(4, 3, 8).chunk(2, dim=2)[0]
    with pytest.raises(IndexError) as ce:
        cpu[torch.tensor([0]), :, torch.tensor([4])] = 1.0
    kc[t([0], TPU), :, t([4], TPU)] = 1.0
    with pytest.raises(IndexError) as te:
        torch.tpu.synchronize()
    assert str(te.value).startswith(str(ce.value))
    kc[t([1, 2], TPU), :, t([3, -1], TPU)] = 2.0  # valid, negative included: written
    ref = torch.zeros(4, 3, 8)
    ref.chunk(2, dim=2)[0][torch.tensor([1, 2]), :, torch.tensor([3, -1])] = 2.0
    torch.testing.assert_close(kv.cpu(), ref)


def test_compiled_graph_checks_too():
    emb = torch.nn.Embedding(10, 4).to(TPU)
    fn = torch.compile(lambda ids: emb(ids).sum(-1), backend="tpu")
    good = t([1, 2, 3], TPU)
    torch.testing.assert_close(fn(good).cpu(), emb(good).sum(-1).cpu())
    r = fn(t([1, 12, 3], TPU))
    with pytest.raises(IndexError, match="index out of range in self") as e:
        r.cpu()
    # the user's line of the embedding (the lambda above), not the graph's generated code
    line = test_compiled_graph_checks_too.__code__.co_firstlineno + 2
    assert f"{THIS_FILE}:{line} (in a compiled graph)" in str(e.value)
    torch.testing.assert_close(fn(good).cpu(), emb(good).sum(-1).cpu())


def test_check_bounds_0_turns_the_checks_off():
    # XLA's behaviour: gathered indices clamp, nothing raises
    r = run_python(
        "import torch\n"
        "x = torch.arange(4.0, device='tpu')\n"
        "print(x[torch.tensor([1, 9], device='tpu')].tolist())\n"
        "torch.tpu.synchronize()\n",
        TORCH_PJRT_CHECK_BOUNDS="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[1.0, 3.0]"


# In-place indexed writes with one bad index among good ones leave the destination unchanged
# on tpu (all or nothing). CPU raises the same exception but, for some of these (index_put_),
# has written the rows before the bad one by then: only the exception is compared with CPU.
WRITES = {
    "index_put_": lambda x, d: x.index_put_((t([0, 9], d),), torch.full((2, 3), 5.0, device=d)),
    "index_put_accumulate": lambda x, d: x.index_put_((t([1, -9], d),),
                                                      torch.full((2, 3), 5.0, device=d),
                                                      accumulate=True),
    "setitem_2d": lambda x, d: x.__setitem__((t([0, 1], d), t([2, 3], d)), 7.0),
    "scatter_": lambda x, d: x.scatter_(1, t([[0], [7], [1], [2]], d), 3.0),
    "scatter_add_": lambda x, d: x.scatter_add_(0, t([[0, 1, 4]], d), ones(1, 3, d=d)),
    "index_add_": lambda x, d: x.index_add_(0, t([2, 4], d), ones(2, 3, d=d)),
    "index_copy_": lambda x, d: x.index_copy_(0, t([1, 5], d), ones(2, 3, d=d)),
    "index_fill_": lambda x, d: x.index_fill_(1, t([0, 3], d), -1.0),
    "put_": lambda x, d: x.put_(t([0, 12], d), ones(2, d=d)),
    "view_setitem": lambda x, d: x[:, :2].__setitem__((t([0, 5], d),), 9.0),
}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", list(WRITES))
def test_indexed_write_with_a_bad_index_writes_nothing(name, mode):
    fn = WRITES[name]
    ref = torch.arange(12.0).view(4, 3)
    cpu = ref.clone()
    with pytest.raises(Exception) as ce:
        fn(cpu, "cpu")
    with torch.tpu.eager_mode(mode):
        x = ref.to(TPU)
        fn(x, TPU)
        with pytest.raises(Exception) as te:
            torch.tpu.synchronize()
        assert te.type is ce.type
        torch.testing.assert_close(x.cpu(), ref)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_switching_checks_in_process_keeps_both_programs_apart(mode):
    from torch_pjrt import _C
    x = torch.arange(4.0, device=TPU)
    bad = t([1, 9], TPU)
    with torch.tpu.eager_mode(mode):
        _C._set_index_checks(False)
        try:
            assert x[bad].tolist() == [1.0, 3.0]  # XLA's clamping, nothing raised
        finally:
            _C._set_index_checks(True)
        y = x[bad]  # same op and shapes: its checked program, not the cached unchecked one
        with pytest.raises(IndexError, match="index 9 is out of bounds"):
            y.cpu()


def _z(*shape, d, dtype=None):
    return torch.zeros(*shape, device=d, dtype=dtype)


# Out-of-range indices where CPU raises a particular exception, or none (fuzz gaps G1-G3,
# docs/reliability.md): CPU checks an index where it reads or writes an element, except for
# its shape-only refusals.
GAPS = {
    # G1: an empty result reads no element, so its indices go unchecked
    "index_empty_result": lambda d: _z(0, 1, d=d)[:, t([-5], d)],
    "index_add_empty_self": lambda d: _z(0, 1, d=d).index_add_(1, t([-5, 4], d), _z(0, 2, d=d)),
    "index_add_empty_indexed_dim": lambda d: _z(2, 0, d=d).index_add_(1, t([5], d), _z(2, 1, d=d)),
    # ... but an indexed dim of size 0 with a non-empty index is refused by its shape alone
    "index_empty_dim_empty_result": lambda d: _z(0, 0, d=d)[:, t([5], d)],
    "index_empty_dim": lambda d: _z(3, 0, d=d)[:, t([5], d)],
    "index_1d_empty_index_ok": lambda d: _z(0, d=d)[t([], d).long()],
    # G3: that refusal comes before index_put_'s value-shape check
    "index_put_accumulate_empty_bad_value": lambda d: _z(0, 3, d=d).index_put_(
        (t([5], d),), _z(2, d=d), accumulate=True),
    "index_put_empty_bad_value": lambda d: _z(0, 3, d=d).index_put_((t([1], d),), _z(2, d=d)),
    "setitem_empty_dim_of_a_view": lambda d: _z(4, 0, d=d)[1:3].__setitem__(
        (slice(None), t([5], d)), 1.0),
    # G2: index_add_ into rank > 1 raises scatter_add's RuntimeError along the first or last
    # dim with an int64 index and alpha 1, else IndexError ("index out of range in self")
    "index_add_dim2_of_4d": lambda d: _z(2, 3, 4, 5, d=d).index_add_(2, t([0, 7], d),
                                                                     ones(2, 3, 2, 5, d=d)),
    "index_add_dim1_of_4d_negative": lambda d: _z(2, 3, 4, 5, d=d).index_add_(
        1, t([0, -1], d), ones(2, 2, 4, 5, d=d)),
    "index_add_last_dim": lambda d: _z(2, 3, 4, 5, d=d).index_add_(3, t([0, 7], d),
                                                                   ones(2, 3, 4, 2, d=d)),
    "index_add_first_dim": lambda d: _z(2, 3, d=d).index_add_(0, t([0, 7], d), ones(2, 3, d=d)),
    "index_add_first_dim_alpha_2": lambda d: _z(2, 3, d=d).index_add_(
        0, t([0, 7], d), ones(2, 3, d=d), alpha=2),
    "index_add_first_dim_alpha_1_0": lambda d: _z(2, 3, d=d).index_add_(
        0, t([0, 7], d), ones(2, 3, d=d), alpha=1.0),
    "index_add_int32_index": lambda d: _z(2, 3, d=d).index_add_(
        0, t([0, 7], d).int(), ones(2, 3, d=d)),
    "index_add_bool_alpha_true": lambda d: _z(4, 5, d=d, dtype=torch.bool).index_add_(
        1, t([0, 7], d), _z(4, 2, d=d, dtype=torch.bool), alpha=True),
    "index_add_1d": lambda d: _z(4, d=d).index_add_(0, t([7], d), ones(1, d=d)),
    "index_add_1d_empty": lambda d: _z(0, d=d).index_add_(0, t([3], d), ones(1, d=d)),
    # the same into partial views (view_index_put.cpp's path)
    "index_add_view_dim2": lambda d: _z(2, 3, 4, 6, d=d)[..., :5].index_add_(
        2, t([0, 7], d), ones(2, 3, 2, 5, d=d)),
    "index_add_view_last_dim": lambda d: _z(2, 3, 6, 5, d=d)[:, :, :4].index_add_(
        3, t([0, 7], d), ones(2, 3, 4, 2, d=d)),
    "index_add_view_alpha_2": lambda d: _z(4, 6, d=d)[:, :5].index_add_(
        1, t([0, 7], d), ones(4, 2, d=d), alpha=2),
}


def _outcome(fn, d, mode=None):
    """("ok", result on the host) or (exception type, None); tpu: in `mode`, through the next
    synchronization."""
    if d == "cpu":
        try:
            return "ok", fn("cpu")
        except Exception as e:  # noqa: BLE001
            return type(e), None
    try:
        with torch.tpu.eager_mode(mode):
            r = fn(TPU)
            torch.tpu.synchronize()
            return "ok", r.cpu() if isinstance(r, torch.Tensor) else r
    except Exception as e:  # noqa: BLE001
        try:
            torch.tpu.synchronize()  # nothing may stay behind for the next case
        except Exception:  # noqa: BLE001
            pass
        return type(e), None


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
@pytest.mark.parametrize("name", list(GAPS))
def test_index_check_gaps_g1_g3_raise_what_cpu_raises(name, mode):
    want = _outcome(GAPS[name], "cpu")
    got = _outcome(GAPS[name], TPU, mode)
    assert got[0] == want[0], (want[0], got[0])
    if want[0] == "ok" and isinstance(want[1], torch.Tensor):
        assert got[1].shape == want[1].shape and torch.equal(got[1], want[1])
    torch.tpu.synchronize()  # and nothing is reported later
