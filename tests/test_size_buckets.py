"""Size buckets (csrc/graph/bucket.c): a small elementwise op or 1-D scan over a whole
contiguous storage runs the program of its size bucket (the next power of two, at least 16), so
sizes 17..32 share one compile. Checked here: the values equal CPU's and, bit for bit, the exact
program's (the same op on a view that is not its whole storage, which is never bucketed); new
sizes within a bucket compile nothing; random draws do not depend on the path; and every reader
of a padded storage (host copies, views, other ops, in-place writes, resize_, compiled graphs,
defer_and_fuse, a second device) sees exactly its elements."""
import pytest
import torch
import torch_pjrt  # noqa: F401

from conftest import run_python


def compiles():
    torch.tpu.synchronize()
    return torch.tpu.metrics()["compiles"]


def exact(t):
    """t's values in a view that is not its whole storage: the op on it runs the exact program."""
    return torch.cat([t, t])[: t.shape[0]]


OPS = {
    "mul_add_abs": lambda a, b: (a * 2.5 + b).abs(),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "to_int64": lambda a, b: a.long(),
    "to_float64": lambda a, b: a.double() * b.double(),
    "clamp": lambda a, b: a.clamp(-0.5, 0.5),
    "cumsum": lambda a, b: a.cumsum(0),
    "cumprod": lambda a, b: (a * 0.5 + 1).cumprod(0),
    "div": lambda a, b: a / (b + 1),
    "bool_ops": lambda a, b: (a > 0) & (b < 0.5),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_bucketed_matches_cpu_and_exact_program(name):
    f = OPS[name]
    for n in (1, 2, 7, 16, 17, 31, 100, 1000):
        a, b = torch.randn(n), torch.rand(n)
        ta, tb = a.to("tpu"), b.to("tpu")
        got = f(ta, tb)
        want = f(a, b)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-4)  # scans: tree order
        assert torch.equal(got.cpu(), f(exact(ta), exact(tb)).cpu()), (name, n)


REDUCTIONS = {
    "max": lambda a: a.max(),
    "min": lambda a: a.min(),
    "amax": lambda a: a.amax(),
    "amin_dim0": lambda a: a.amin(0),
    "aminmax": lambda a: torch.aminmax(a),
    "max_dim0": lambda a: torch.max(a, 0),  # values and the first index of the maximum
    "any": lambda a: (a > 0.5).any(),
    "all": lambda a: (a > -0.5).all(),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_bucketed_reductions_see_only_the_true_elements(name):
    f = REDUCTIONS[name]
    for n in (1, 3, 17, 100):
        cases = [torch.randn(n), -torch.rand(n) - 1, torch.zeros(n)]  # all negative: padding
        if n > 2:  # would win if it were zeros; ties and NaN at the first and a later place
            t = torch.randn(n)
            t[n // 2] = float("nan")
            cases += [t, torch.full((n,), 2.0), torch.tensor([float("nan")] + [1.0] * (n - 1))]
        for a in cases:
            ta = a.to("tpu") * 1  # a bucketed op's result: a padded storage
            got, want, ref = f(ta), f(a), f(exact(ta))
            got, want, ref = [tuple(x) if isinstance(x, tuple) else (x,) for x in (got, want, ref)]
            for g, w, r in zip(got, want, ref):
                torch.testing.assert_close(g.cpu(), w, equal_nan=True)
                assert torch.equal(g.cpu(), r.cpu()) or (g.isnan().all() and r.isnan().all())
    # a 2-d tensor reduced whole is bucketed too
    m = torch.randn(5, 7)
    assert torch.equal((m.to("tpu") * 1).max().cpu(), m.max())


def test_sizes_within_a_bucket_compile_nothing_new():
    def step(n):
        x = torch.rand(n, device="tpu")
        y = torch.randn(n, device="tpu")
        z = (x * 3 - y).abs().cumsum(0).long()
        return z.cpu(), z.max().cpu(), (y > 0).any().cpu()

    step(33)  # bucket 64: compiles its programs
    before = compiles()
    for n in range(34, 65):
        step(n)
    assert compiles() == before
    # multi-dimensional contiguous tensors share the same flat bucket
    before = compiles()
    for shape in [(5, 9), (6, 7), (2, 3, 8)]:
        t = torch.rand(shape, device="tpu")
        torch.testing.assert_close((t * 3).cpu(), t.cpu() * 3)
    assert compiles() == before


def test_random_draws_do_not_depend_on_the_path():
    for n in (5, 20, 300):
        torch.manual_seed(123)
        a = torch.empty(n, device="tpu").uniform_(-1, 1)
        b = torch.randn(n, device="tpu")
        torch.manual_seed(123)
        a2 = torch.empty(2 * n, device="tpu").narrow(0, 0, n).uniform_(-1, 1)
        b2 = torch.empty(2 * n, device="tpu").narrow(0, 0, n).normal_()
        assert torch.equal(a.cpu(), a2.cpu()) and torch.equal(b.cpu(), b2.cpu())
        assert a.cpu().abs().max() <= 1


def test_padded_storage_readers():
    x = torch.rand(5, device="tpu") * 4  # padded to 16
    host = x.cpu()
    assert host.shape == (5,)
    assert x.tolist() == host.tolist()
    assert x[3].item() == host[3].item()
    assert torch.equal(x[1:4].cpu(), host[1:4])
    assert torch.equal(x.view(torch.int32).cpu(), host.view(torch.int32))
    assert torch.equal(x.sum().cpu(), host.sum())
    assert torch.equal(x.max().cpu(), host.max())
    assert torch.equal(torch.sort(x).values.cpu(), torch.sort(host).values)
    assert torch.equal(torch.cat([x, x]).cpu(), torch.cat([host, host]))
    # a partial in-place write keeps the padding and the other elements
    x[1:3].add_(10)
    host[1:3] += 10
    assert torch.equal(x.cpu(), host)
    # then a bucketed in-place op over the whole storage
    x.mul_(2)
    host *= 2
    assert torch.equal(x.cpu(), host)
    # resize_ keeps the elements it had
    x.resize_(40)
    assert torch.equal(x[:5].cpu(), host)
    # uploads of small tensors are padded too, and read back exactly
    u = torch.tensor([1.5, -2.0, 3.0], device="tpu")
    assert u.cpu().tolist() == [1.5, -2.0, 3.0]
    assert (u + 1).cpu().tolist() == [2.5, -1.0, 4.0]


def test_compiled_graph_takes_padded_inputs():
    f = torch.compile(lambda a, b: torch.relu(a * 3 - b).sum(), backend="tpu")
    for n in (5, 9):
        a = torch.rand(n, device="tpu") - 0.5  # produced by bucketed ops: padded
        b = torch.rand(n, device="tpu") * 0.1
        torch.testing.assert_close(f(a, b).cpu(), torch.relu(a.cpu() * 3 - b.cpu()).sum())
        # and eager ops on the same tensors afterwards
        torch.testing.assert_close((a + b).cpu(), a.cpu() + b.cpu())


def test_defer_and_fuse_reads_padded_storages():
    a = torch.rand(11, device="tpu")
    b = (a * 2).abs()  # padded, by Strict
    with torch.tpu.eager_mode("defer_and_fuse"):
        c = (b + a).sin() * 3
        d = c.sum()
    torch.testing.assert_close(c.cpu(), ((a.cpu() * 2).abs() + a.cpu()).sin() * 3)
    torch.testing.assert_close(d.cpu(), c.cpu().sum())
    e = c + 1  # Strict again, on a storage the fused run wrote
    torch.testing.assert_close(e.cpu(), c.cpu() + 1)


def test_padded_storage_moves_between_devices():
    r = run_python(
        """
import torch, torch_pjrt
x = torch.rand(7, device="tpu:0") * 5
y = x.to("tpu:1")
assert y.device == torch.device("tpu:1")
assert torch.equal(y.cpu(), x.cpu())
assert torch.equal((y + 1).cpu(), x.cpu() + 1)
print("ok")
""",
        TORCH_PJRT_CPU_DEVICE_COUNT="2",
    )
    assert r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_products_read_exact_buffers():
    """A matmul or convolution trims a padded input first (a product of a slice compiles and runs
    slower on XLA:CPU); the storage stays exact, later bucketed ops read it as it is."""
    a = torch.randn(7, 9, device="tpu")  # 63 elements in a bucket of 64: padded
    b = torch.randn(9, 5, device="tpu")
    torch.tpu.synchronize()
    before = torch.tpu.metrics()["bucket_trims"]
    got = a @ b
    torch.testing.assert_close(got.cpu(), a.cpu() @ b.cpu())
    assert torch.tpu.metrics()["bucket_trims"] - before == 2
    torch.testing.assert_close((a * 2).cpu(), a.cpu() * 2)
    for n in (4, 6):  # square: both operands the same size, which an elementwise op would share
        s = torch.randn(n, n, device="tpu")
        torch.testing.assert_close((s @ s).cpu(), s.cpu() @ s.cpu())
        torch.testing.assert_close(torch.addmm(s, s, s).cpu(), torch.addmm(s.cpu(), s.cpu(), s.cpu()))
    w = torch.randn(4, 3, 3, 3, device="tpu")
    x = torch.randn(1, 3, 6, 6, device="tpu")
    torch.testing.assert_close(torch.nn.functional.conv2d(x, w).cpu(),
                               torch.nn.functional.conv2d(x.cpu(), w.cpu()), rtol=1e-4, atol=1e-5)


def test_switch_off_keeps_padded_storages_readable():
    a = torch.rand(20, device="tpu")  # padded
    old = torch_pjrt._C._size_buckets()
    torch_pjrt._C._set_size_buckets(False)
    try:
        torch.tpu.synchronize()
        before = torch.tpu.metrics()["bucket_calls"]
        b = a * 2 + 1
        torch.testing.assert_close(b.cpu(), a.cpu() * 2 + 1)
        assert torch.tpu.metrics()["bucket_calls"] == before
    finally:
        torch_pjrt._C._set_size_buckets(old)
