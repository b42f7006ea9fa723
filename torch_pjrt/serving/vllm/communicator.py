"""vLLM's device communicator for the `tpu` device.

vLLM's base communicator already runs every collective a tensor-parallel dense model needs
through torch.distributed on the group's device group (all_reduce, all_gather_into_tensor,
reduce_scatter_tensor, gather, send/recv), and the device group's tpu tensors go to
torch_pjrt's `tpu_dist` backend, which implements all of them. What this class changes is the
device: vLLM's GroupCoordinator names it `tpu:<local rank>`, a device that does not exist in a
rank's process when the plugin exposes one device (the CPU plugin's default: each process has
its own client and its own `tpu:0`). Tensors the communicator makes itself (recv buffers)
belong on the device the worker chose."""

from __future__ import annotations

from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)

from torch_pjrt.distributed import local_device


class TpuCommunicator(DeviceCommunicatorBase):
    def __init__(self, cpu_group, device=None, device_group=None, unique_name="",
                 use_all2all=False):
        if device is not None and device.type == "tpu":
            # The same rule as the worker's choice: tpu:<local rank> among several devices,
            # tpu:0 when there is one.
            device = local_device(device.index or 0)
        super().__init__(cpu_group, device, device_group, unique_name, use_all2all=use_all2all)
        if self.use_all2all:
            raise NotImplementedError("tpu: expert-parallel all-to-all is not implemented")
