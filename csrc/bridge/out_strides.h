// The layout CPU gives an out= tensor it resizes.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>

#include <optional>
#include <vector>

namespace torch_pjrt {

// For an elementwise op (its lowering's shape class, call.h) whose out= tensor CPU resizes:
// the strides TensorIterator gives that tensor, which follow the inputs' memory layout (a
// permuted or sliced input gives a permuted, dense result, as the functional op's result),
// where a plain resize would make it contiguous. Computed by TensorIterator itself over meta
// copies of the call's tpu tensor inputs. nullopt: not an elementwise op, no tensor input, or
// the iterator's shape is not `sizes` (then the resize's contiguous strides stand).
std::optional<std::vector<int64_t>> resized_out_strides(const char* base,
                                                        const c10::FunctionSchema& schema,
                                                        const torch::jit::Stack& args,
                                                        at::IntArrayRef sizes);

}  // namespace torch_pjrt
