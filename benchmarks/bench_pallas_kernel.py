"""The Pallas matmul kernel of examples/pallas_kernel.py against the same computation in plain
torch ops on the tpu device (measured, not asserted).

    python benchmarks/bench_pallas_kernel.py [--sizes 128 256 512] [--repeat 20]

Per size N: the median wall time of one forward (Y = X W, N x N) and one forward + backward
(dX, dW), each call synchronized, in strict mode, for the Pallas op and for torch.matmul on
tpu; the ratio is Pallas / torch (above 1: the kernel is slower). On the CPU plugin the kernel
runs in Pallas's interpret mode (a while loop over the grid of blocks with dynamic slices), so
it measures what the inlined interpret-mode lowering costs, not a TPU kernel.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from pallas_kernel import matmul  # noqa: E402


def timed(fn, repeat):
    fn()
    torch.tpu.synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        torch.tpu.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    print(f"plugin platform: {torch.tpu.get_device_name()}")
    print("| N | pass | Pallas op (ms) | torch ops (ms) | ratio |")
    print("|---|---|---|---|---|")
    for n in args.sizes:
        x = torch.randn(n, n, device="tpu", requires_grad=True)
        w = torch.randn(n, n, device="tpu", requires_grad=True)
        rows = {}
        for label, mm in (("pallas", matmul), ("torch", torch.matmul)):
            def fwd():
                with torch.no_grad():
                    mm(x, w)

            def fwd_bwd():
                x.grad = w.grad = None
                mm(x, w).sum().backward()
            rows[label] = (timed(fwd, args.repeat), timed(fwd_bwd, args.repeat))
        for i, name in enumerate(("forward", "forward+backward")):
            a, b = rows["pallas"][i], rows["torch"][i]
            print(f"| {n} | {name} | {a * 1e3:.3f} | {b * 1e3:.3f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
