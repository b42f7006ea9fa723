// Rewrites the tensors of a boxed argument (a tensor, a tensor list, a list of optional
// tensors) and the tpu device of factory-op arguments: used to run an op's Meta kernel (tensors
// -> meta) or its CPU kernel (tensors -> host copies) on the arguments of a tpu call.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <functional>

namespace torch_pjrt {

c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f,
                        c10::Device tpu_device_becomes);

}  // namespace torch_pjrt
