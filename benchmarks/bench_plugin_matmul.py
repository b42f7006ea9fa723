"""Matrix products on the `tpu` device against the same on PyTorch's own devices, in one run.

    python benchmarks/bench_plugin_matmul.py [--sizes 1024,4096,8192] [--dtypes bfloat16,float32]

On a GPU machine run it with TORCH_PJRT_PLUGIN=cuda: it then compares the CUDA PJRT plugin's
products (through torch_pjrt, eager Strict mode and torch.compile(backend="tpu")) with PyTorch's
own CUDA device; on the CPU plugin it compares with CPU eager. Each figure is the median of
--reps timed calls after --warmup calls, each call synchronized (`torch.tpu.synchronize()` /
`torch.cuda.synchronize()`), in TFLOP/s (2*n^3 per product). The first differences of the
tpu result from the reference device's result are printed too (a product run at reduced
precision, TF32 say, shows there).
"""
import argparse
import statistics
import time

import torch

import torch_pjrt  # noqa: F401


def timed(fn, sync, warmup, reps):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,4096,8192")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    ref = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    ref_sync = torch.cuda.synchronize if ref.type == "cuda" else (lambda: None)
    print(f"tpu device: {torch.tpu.get_device_name()}; reference: {ref}")
    print(f"{'dtype':>9} {'n':>6} {'tpu eager':>10} {'tpu compiled':>13} {ref.type + ' eager':>11}"
          f" {'max |tpu-ref|/max|ref|':>23}  (TFLOP/s, medians)")
    mm = torch.compile(torch.mm, backend="tpu", dynamic=False)
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for n in map(int, args.sizes.split(",")):
            g = torch.Generator().manual_seed(n)
            a = torch.randn(n, n, generator=g).to(dtype)
            b = torch.randn(n, n, generator=g).to(dtype)
            at, bt = a.to("tpu"), b.to("tpu")
            ar, br = a.to(ref), b.to(ref)
            flop = 2.0 * n ** 3
            tpu = timed(lambda: torch.mm(at, bt), torch.tpu.synchronize, args.warmup, args.reps)
            comp = timed(lambda: mm(at, bt), torch.tpu.synchronize, args.warmup, args.reps)
            r = timed(lambda: torch.mm(ar, br), ref_sync, args.warmup, args.reps)
            out_t = torch.mm(at, bt).cpu().double()
            out_r = torch.mm(ar, br).cpu().double()
            err = ((out_t - out_r).abs().max() / out_r.abs().max()).item()
            print(f"{dname:>9} {n:>6} {flop / tpu / 1e12:>10.1f} {flop / comp / 1e12:>13.1f}"
                  f" {flop / r / 1e12:>11.1f} {err:>23.2e}", flush=True)


if __name__ == "__main__":
    main()
