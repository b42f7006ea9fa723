// Output metadata of an aten call from PyTorch's Meta kernels, cached. A Meta kernel call costs
// ~100+ us (many are Python registrations); the metadata is a pure function of the op and of
// its arguments' metadata and non-tensor values, which is what the key holds. Only successful
// results are cached, so bad input raises CPU's error every time.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>
#include <vector>

namespace torch_pjrt {

// The Meta kernel's returns for op(args): meta tensors (or undefined tensors, lists of meta
// tensors, None). Throws what the Meta kernel throws; returns std::nullopt when the op has no
// Meta kernel (NotImplementedError).
std::optional<std::vector<c10::IValue>> meta_returns(const c10::OperatorHandle& op,
                                                     const torch::jit::Stack& args);

// Whether the calling thread is inside a Meta kernel called by meta_returns. PyTorch's Python
// Meta kernels take a plain meta tensor for a CUDA one (torch._meta_registrations.device_hint)
// and raise CUDA's nondeterminism alerts ("median CUDA with indices output"); torch_pjrt's
// wrapper of that alert (_meta_alerts.py) drops the alerts raised from here.
bool in_meta_kernel();

}  // namespace torch_pjrt
