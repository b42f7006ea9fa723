"""Export the tiny GPT to StableHLO with torch.export, write the program's text and signature, run
it.

    python examples/export_stablehlo.py [OUT.mlir] [--weights arguments|constants|inline]
                                        [--batch 4]

torch.export.export(model, (idx,)) -> torch_pjrt.compile.export.export_stablehlo -> the text of
the one program (func.func @main) is written to OUT.mlir (default /tmp/tiny_gpt.stablehlo.mlir)
and its signature to OUT.json: per @main argument its kind, name / state-dict key, type and, for
the recorded ops' scalar arguments, the value the plan passes; per output its @main result and
view. The exported program then runs on two batches through the PJRT runtime, both as the
captured plan (module.run) and as the written text itself (module.run_text: the text compiled and
executed by the runtime), and the largest difference from the CPU model is printed. With
--weights inline the text is self-contained: the weights are stablehlo.constant literals in it and
its arguments are the token ids (and the capture constants). See torch_pjrt/compile/export.py for
what the text contains (flat storages as arguments, in the order the graph touches them, then the
recorded ops' scalars).
"""
import argparse
import collections
import dataclasses
import json
import os

import torch

from torch_pjrt._models import CharDataset, TinyGPT, init_weights, zen_corpus
from torch_pjrt.compile.export import export_stablehlo


def _jsonable(v):
    if isinstance(v, complex):
        return [v.real, v.imag]
    if isinstance(v, torch.dtype):
        return str(v).removeprefix("torch.")
    return v


def signature(module) -> dict:
    return {
        "weights": module.weights_mode,
        "inputs": [{k: _jsonable(v) for k, v in dataclasses.asdict(i).items()}
                   for i in module.inputs],
        "outputs": [{k: _jsonable(v) for k, v in dataclasses.asdict(o).items()}
                    for o in module.outputs],
        "inlined": [{k: _jsonable(v) for k, v in dataclasses.asdict(i).items()}
                    for i in module.inlined],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="/tmp/tiny_gpt.stablehlo.mlir")
    ap.add_argument("--weights", choices=("arguments", "constants", "inline"),
                    default="arguments")
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()

    data = CharDataset(zen_corpus(), block=32)
    model = init_weights(TinyGPT(data.vocab, tie_head=True), seed=3).eval()
    gen = torch.Generator().manual_seed(0)
    x, _ = data.batch(args.batch, gen)

    exported = torch.export.export(model, (x,))
    module = export_stablehlo(exported, weights=args.weights)
    with open(args.out, "w") as f:
        f.write(module.text)
    sig_path = os.path.splitext(args.out)[0] + ".json"
    with open(sig_path, "w") as f:
        json.dump(signature(module), f, indent=1)
    kinds = collections.Counter(i.kind for i in module.inputs)
    print(f"wrote {args.out}: {len(module.text)} characters, {module.stats['ops']} recorded ops; "
          f"signature in {sig_path}")
    print(f"@main arguments ({args.weights} mode): "
          + ", ".join(f"{n} {k}" for k, n in kinds.items()))
    if module.inlined:
        print(f"  {len(module.inlined)} weights inlined as stablehlo.constant values")
    for i in module.inputs:
        if i.kind == "user_input":
            print(f"  argument {i.index}: user input {i.name} {tuple(i.shape)} {i.dtype} "
                  f"as {i.mlir_type}")
    scalars = module.scalars
    print(f"  scalar arguments ({len(scalars)}): {scalars[:8]}{' ...' if len(scalars) > 8 else ''}")
    for o in module.outputs:
        print(f"  output {o.name}: {o.kind} {o.shape} {o.dtype} (result {o.result})")

    worst = {"plan": 0.0, "text": 0.0}
    with torch.no_grad():
        for batch in (x, data.batch(args.batch, gen)[0]):
            want = model(batch)
            for how, got in (("plan", module.run(batch).cpu()), ("text", module.run_text(batch))):
                worst[how] = max(worst[how], (got - want).abs().max().item())
    print(f"max |exported - eager| over 2 batches: plan (run) {worst['plan']:.3g}, "
          f"text (run_text) {worst['text']:.3g}")


if __name__ == "__main__":
    main()
