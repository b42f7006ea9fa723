"""``torch.compile(model, backend="tpu")``: whole graphs as one StableHLO program.

The backend is registered through the ``torch_dynamo_backends`` entry point, so
``torch.compile(..., backend="tpu")`` works after a bare ``import torch``. Pipeline: Dynamo's FX
graph -> AOTAutograd (forward and backward graphs, functionalized, PyTorch's min-cut
partitioner) -> each graph runs once under a capture of the recorder that the defer_and_fuse
mode uses (csrc/graph/defer.c), so every node goes through the same lowerings and the whole
graph becomes one program (csrc/graph/capture.c); later calls with inputs of the same shapes
are one program execution each (backend.py and graph_runner.py say what is captured and what
falls back). ``export_stablehlo`` (export.py) turns a ``torch.export`` program into one StableHLO
module the same way.
"""
from .backend import OPTIONS, tpu_backend
from .export import StableHLOModule, export_stablehlo

__all__ = ["OPTIONS", "StableHLOModule", "export_stablehlo", "tpu_backend"]
