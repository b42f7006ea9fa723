"""Model-coverage harness: models from Hugging Face Transformers, timm, torchvision and Diffusers,
built small from configs (nothing downloads), run on CPU and on tpu and compared (eval forward,
one SGD training step with every gradient, greedy generate / a pipeline run).

    python -m torch_pjrt.models [--zoo hf|timm|torchvision|diffusers] [-k SUBSTR] [-j N]
                                [--limit N] [--resume] [--timeout S] [--out FILE]
    python -m torch_pjrt.models report      # docs/models.md from docs/models/results-*.jsonl

compare.py: one model against CPU (tolerances, statuses); runner.py: worker subprocesses, JSONL;
hf.py, timm_zoo.py, torchvision_zoo.py, diffusers_zoo.py: the zoos; report.py: the markdown.
"""
