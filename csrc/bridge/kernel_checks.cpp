// Argument checks that CPU's kernels make and PyTorch's Meta kernels (which give tpu its output
// metadata) do not: run before an op is run or recorded, so every eager mode raises CPU's error
// at the call. Without them Strict raised another message from the lowering, and
// defer_and_fuse raised it at the next flush, on an unrelated line (fuzz finding F9).
#include "bridge.h"

#include <torch/headeronly/version.h>  // TORCH_VERSION_MINOR

#include <string>

namespace torch_pjrt {
namespace {

const at::Tensor* tensor_arg(const torch::jit::Stack& args, size_t i) {
  return i < args.size() && args[i].isTensor() && args[i].toTensor().defined()
             ? &args[i].toTensor()
             : nullptr;
}

// CPU's bmm / baddbmm kernels: "expected scalar type A but found B".
void same_scalar_type(const at::Tensor* a, const at::Tensor* b) {
  if (a && b)
    TORCH_CHECK(a->scalar_type() == b->scalar_type(), "expected scalar type ", a->scalar_type(),
                " but found ", b->scalar_type());
}

}  // namespace

void cpu_kernel_checks(const std::string& base, const torch::jit::Stack& args) {
  if (base == "mm") {
    const at::Tensor *a = tensor_arg(args, 0), *b = tensor_arg(args, 1);
    if (a && b)
      TORCH_CHECK(a->dtype() == b->dtype(), "expected m1 and m2 to have the same dtype, but got: ",
                  a->dtype(), " != ", b->dtype());
  } else if (base == "bmm") {
    same_scalar_type(tensor_arg(args, 0), tensor_arg(args, 1));
  } else if (base == "baddbmm" || base == "addbmm") {
    same_scalar_type(tensor_arg(args, 1), tensor_arg(args, 2));
    same_scalar_type(tensor_arg(args, 1), tensor_arg(args, 0));
  } else if (base == "convolution") {
    // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    const at::Tensor *w = tensor_arg(args, 1), *bias = tensor_arg(args, 2);
    if (w && bias && args.size() > 8 && args[6].isBool() && args[8].isInt()) {
      const bool transposed = args[6].toBool();
      const int64_t out = transposed ? w->size(1) * args[8].toInt() : w->size(0);
      TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out, "Given ",
                  transposed ? "transposed=1, " : "", "weight of size ", w->sizes(),
                  ", expected bias to be 1-dimensional with ", out,
                  " elements, but got bias of size ", bias->sizes(), " instead");
    }
  }
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 14
  // Before torch 2.14, CPU's group-norm kernel refuses inputs that are not dense in their
  // suggested layout (aten::group_norm makes its input dense first): same error here, although
  // the lowering could compute them. From 2.14 on CPU's kernel takes any layout and
  // aten::group_norm passes its input as it is, so the lowering reads the strided view.
  if (base == "native_group_norm") {
    if (const at::Tensor* x = tensor_arg(args, 0))
      TORCH_CHECK(x->is_contiguous(x->suggest_memory_format()),
                  "Expected X.is_contiguous(memory_format) to be true, but got false.");
  }
#endif
}

}  // namespace torch_pjrt
