// The layout CPU gives an out= tensor it resizes (out_strides.h).
#include "out_strides.h"

#include <ATen/TensorIterator.h>
#include <ATen/ops/empty_strided.h>

#include "torch_pjrt/call.h"

namespace torch_pjrt {

std::optional<std::vector<int64_t>> resized_out_strides(const char* base,
                                                        const c10::FunctionSchema& schema,
                                                        const torch::jit::Stack& args,
                                                        at::IntArrayRef sizes) {
  if (pj_lowering_shape_class(base) != PJ_SHAPE_ELEMENTWISE) return std::nullopt;
  at::TensorIteratorConfig config;
  config.add_owned_output(at::Tensor());
  config.check_all_same_dtype(false);
  // Only the layout is wanted: one dtype for every operand, on the meta device.
  config.declare_static_dtype_and_device(at::kFloat, c10::Device(c10::kMeta));
  int inputs = 0;
  for (size_t a = 0; a < args.size() && a < schema.arguments().size(); a++) {
    const c10::Argument& arg = schema.arguments()[a];
    if ((arg.alias_info() && arg.alias_info()->isWrite()) || !args[a].isTensor()) continue;
    const at::Tensor& t = args[a].toTensor();
    // CPU 0-d tensors (wrapped numbers) take part as scalars: they shape nothing
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) continue;
    config.add_owned_const_input(at::empty_strided(
        t.sizes(), t.strides(), t.options().dtype(at::kFloat).device(c10::kMeta)));
    inputs++;
  }
  if (inputs == 0) return std::nullopt;
  at::TensorIterator iter = config.build();
  const at::Tensor& out = iter.output(0);
  if (!out.sizes().equals(sizes)) return std::nullopt;
  return out.strides().vec();
}

}  // namespace torch_pjrt
