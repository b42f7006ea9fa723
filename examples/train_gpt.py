"""Main job: train a tiny GPT (character level, on the Zen of Python) on the tpu device.

    python examples/train_gpt.py [--steps 300] [--device tpu]

Prints the loss every 25 steps and the training speed. Nothing here is tpu-specific beyond the
device string: `import torch` loads torch_pjrt through its autoload entry point.
"""
import argparse
import time

import torch

from torch_pjrt._models import CharDataset, TinyGPT, init_weights, zen_corpus


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device", default="tpu")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()

    torch.manual_seed(0)
    data = CharDataset(zen_corpus(), block=32)
    model = init_weights(TinyGPT(data.vocab, block=32), seed=0).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    print(f"device={args.device} ({torch.tpu.get_device_name() if args.device.startswith('tpu') else 'cpu'}), "
          f"params={sum(p.numel() for p in model.parameters())}, vocab={data.vocab}")
    t0 = time.perf_counter()
    t_warm = None
    for step in range(1, args.steps + 1):
        x, y = data.batch(args.batch, gen)
        loss = model(x.to(args.device), y.to(args.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step == 5:
            loss.item()  # wait for the device, so the rate below excludes compilation
            t_warm = time.perf_counter()
        if step % 25 == 0 or step == 1:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    loss.item()
    t1 = time.perf_counter()
    rate = (args.steps - 5) / (t1 - t_warm) if t_warm and args.steps > 5 else float("nan")
    print(f"trained {args.steps} steps in {t1 - t0:.1f} s; {rate:.1f} steps/s after warm-up")
    metrics = torch.tpu.metrics() if args.device.startswith("tpu") else {}
    if metrics:
        print("compiles={compiles} executions={executions} cpu_fallbacks={cpu_fallbacks}".format(**metrics))


if __name__ == "__main__":
    main()
