"""Collectives among the devices of one process (issue 36, item 3(a)).

One thread that holds tensors on several tpu devices runs a collective among them as ONE
program over those devices (csrc/bridge/native_dist.cpp ``_local_collective`` ->
``pj_coll_run``): no process group, no rendezvous, no host copy. It is what NCCL's
single-process collectives are on CUDA, and ``torch.nn.parallel.comm`` (the functions
``nn.DataParallel`` calls) runs on them for tpu tensors once :func:`install_parallel_comm` has
run (``import torch_pjrt`` does it)::

    from torch_pjrt.distributed import local
    xs = [torch.ones(4, device=f"tpu:{i}") for i in range(4)]
    local.all_reduce(xs)              # 4 tensors, each the sum, one on each device
    local.broadcast(xs[0], [0, 1, 2]) # xs[0] on tpu:0, copies on tpu:1 and tpu:2

``torch.nn.parallel.comm`` for tpu tensors: ``broadcast`` and ``broadcast_coalesced`` are
BROADCAST programs (coalesced: one flat buffer per dtype, as CUDA's), ``reduce_add`` a REDUCE
program onto the destination, ``scatter`` and ``gather`` device-to-device copies (one source or
one destination: nothing to combine). CPU and CUDA tensors take PyTorch's own functions.
"""
from __future__ import annotations

import torch

_REDUCE_OPS = {"sum": 0, "avg": 1, "product": 2, "min": 3, "max": 4, "band": 5, "bor": 6,
               "bxor": 7}


def _c():
    from ..device import _C

    return _C


def _op_number(op) -> int:
    if isinstance(op, str):
        if op.lower() not in _REDUCE_OPS:
            raise ValueError(f"unknown reduce op {op!r}; one of {', '.join(_REDUCE_OPS)}")
        return _REDUCE_OPS[op.lower()]
    return int(op)  # a torch.distributed.ReduceOp member or its number


def _index(device) -> int:
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"expected a tpu device, got {d}")
    return torch.tpu.current_device() if d.index is None else d.index


def all_reduce(tensors, op="sum") -> list[torch.Tensor]:
    """The reduction of ``tensors`` (one per device, one dtype and shape), on every device."""
    return list(_c()._local_collective("all_reduce", list(tensors), _op_number(op), 0))


def reduce(tensors, root: int = 0, op="sum") -> torch.Tensor:
    """The reduction of ``tensors`` on ``tensors[root]``'s device."""
    return _c()._local_collective("reduce", list(tensors), _op_number(op), root)[root]


def all_gather(tensors) -> list[torch.Tensor]:
    """``torch.cat(tensors)`` (0-d tensors stacked) on every tensor's device."""
    return list(_c()._local_collective("all_gather", list(tensors), 0, 0))


def broadcast(tensor: torch.Tensor, devices) -> list[torch.Tensor]:
    """``tensor`` on each of ``devices`` (indices or tpu devices): the tensor itself where it
    already is, a copy on every other device, from one BROADCAST program."""
    devices = [_index(d) for d in devices]
    src = tensor.device.index
    others = [d for d in devices if d != src]
    if not others:
        return [tensor for _ in devices]
    # the program runs on the source and the other devices; non-sources pass a stand-in of the
    # same type, whose contents the program ignores
    stand_ins = [torch.empty_like(tensor, device=f"tpu:{d}") for d in others]
    outs = _c()._local_collective("broadcast", [tensor] + stand_ins, 0, 0)
    by_device = dict(zip(others, outs[1:]))
    return [tensor if d == src else by_device[d] for d in devices]


def broadcast_coalesced(tensors, devices) -> list[list[torch.Tensor]]:
    """Each tensor of ``tensors`` (all on ``devices[0]``) on every device: per device the list
    of tensors, ``devices[0]``'s being ``tensors`` themselves. One BROADCAST program per dtype,
    over the tensors flattened into one buffer."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    devices = [_index(d) for d in devices]
    tensors = list(tensors)
    result = [[None] * len(tensors) for _ in devices]
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for idx in by_dtype.values():
        group = [tensors[i] for i in idx]
        flat = _flatten_dense_tensors([t.detach() for t in group])
        for k, copy in enumerate(broadcast(flat, devices)):
            parts = (group if devices[k] == flat.device.index
                     else _unflatten_dense_tensors(copy, group))
            for i, part in zip(idx, parts):
                result[k][i] = part
    return result


def reduce_add(inputs, destination=None) -> torch.Tensor:
    """The sum of ``inputs`` (one per device) on ``destination`` (default: the current
    device): one REDUCE program onto it (then a copy if no input is there)."""
    dest = torch.tpu.current_device() if destination is None else _index(destination)
    inputs = list(inputs)
    devices = [t.device.index for t in inputs]
    root = devices.index(dest) if dest in devices else 0
    total = reduce(inputs, root)
    return total if dest == devices[root] else total.to(f"tpu:{dest}")


def _scatter(tensor, devices, chunk_sizes=None, dim=0):
    devices = [_index(d) for d in devices]
    if chunk_sizes is None:
        chunks = tensor.chunk(len(devices), dim)
    else:
        if sum(chunk_sizes) != tensor.size(dim):
            raise ValueError(f"chunk_sizes {chunk_sizes} do not add up to the size "
                             f"{tensor.size(dim)} of dim {dim}")
        chunks = tensor.split(list(chunk_sizes), dim)
    return tuple(c.contiguous().to(f"tpu:{d}") for c, d in zip(chunks, devices))


def _gather(tensors, dim=0, destination=None):
    dest = torch.tpu.current_device() if destination is None else destination
    if dest == -1 or (isinstance(dest, str) and dest == "cpu"):
        dest = "cpu"
    elif not isinstance(dest, (str, torch.device)):
        dest = f"tpu:{dest}"
    return torch.cat([t.to(dest) for t in tensors], dim)


def _on_tpu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "tpu"


def install_parallel_comm() -> None:
    """Makes ``torch.nn.parallel.comm`` (what ``nn.DataParallel`` and users call) run tpu
    tensors through this module; every other tensor takes PyTorch's own function (idempotent)."""
    import torch.nn.parallel.comm as comm

    if getattr(comm, "_torch_pjrt_local", False):
        return
    orig = {name: getattr(comm, name)
            for name in ("broadcast", "broadcast_coalesced", "reduce_add", "scatter", "gather")}

    def comm_broadcast(tensor, devices=None, *, out=None):
        if not _on_tpu(tensor) or out is not None:
            return orig["broadcast"](tensor, devices, out=out)
        return tuple(broadcast(tensor, devices))

    def comm_broadcast_coalesced(tensors, devices, buffer_size=10485760):
        if not tensors or not all(_on_tpu(t) for t in tensors):
            return orig["broadcast_coalesced"](tensors, devices, buffer_size)
        return [tuple(ts) for ts in broadcast_coalesced(tensors, devices)]

    def comm_reduce_add(inputs, destination=None):
        if not inputs or not all(_on_tpu(t) for t in inputs):
            return orig["reduce_add"](inputs, destination)
        return reduce_add(inputs, destination)

    def comm_scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
        # device numbers name tpu devices for a tpu tensor, and for a CPU one where tpu is the
        # accelerator (nn.DataParallel's device_ids then are tpu's)
        to_tpu = _on_tpu(tensor) or (tensor.device.type == "cpu" and
                                     torch._utils._get_available_device_type() == "tpu")
        if not to_tpu or out is not None or devices is None:
            return orig["scatter"](tensor, devices, chunk_sizes, dim, streams, out=out)
        return _scatter(tensor, devices, chunk_sizes, dim)

    def comm_gather(tensors, dim=0, destination=None, *, out=None):
        if not tensors or not all(_on_tpu(t) for t in tensors) or out is not None:
            return orig["gather"](tensors, dim, destination, out=out)
        return _gather(tensors, dim, destination)

    for name, fn in (("broadcast", comm_broadcast),
                     ("broadcast_coalesced", comm_broadcast_coalesced),
                     ("reduce_add", comm_reduce_add), ("scatter", comm_scatter),
                     ("gather", comm_gather)):
        fn.__doc__ = orig[name].__doc__
        fn.__wrapped__ = orig[name]
        setattr(comm, name, fn)
    comm._torch_pjrt_local = True
