"""A differential fuzzer of the tpu device: random programs run on CPU and on tpu, compared step
by step (values, dtypes, shapes, strides, aliasing, in-place effects, exception types), in each
eager mode; failures are minimized to standalone reproductions.

    python -m torch_pjrt.fuzz --programs 200 --seed 1 --mode all --out fuzz-out

Modules: ops (the op table and argument generators), program (generation, execution,
comparison, verdicts), minimize (delta debugging, snippets), runner (batches, --isolate),
known (tolerated mismatches with reasons). docs/reliability.md has the results.
"""
from .program import check, execute, generate  # noqa: F401
from .runner import run_mode, run_one  # noqa: F401
