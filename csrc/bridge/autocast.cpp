// Autocast for the tpu device: kernels for DispatchKey::AutocastPrivateUse1, so that
// torch.autocast("tpu") casts op inputs the way torch.autocast("cuda") does (eager mode; under
// torch.compile the same kernels run while AOTAutograd traces, so graphs get the casts).
//
// The op lists and cast policies are CUDA's: ATen's autocast_mode.h exports them as AT_FORALL_*
// tables meant for reuse by backends, and CUDA registers exactly these tables (plus cudnn-only
// convolutions) with binary_cross_entropy refused. Expanding the same tables here keeps the tpu
// policy equal to CUDA's for whichever torch version the extension is built against.
// Every other op falls through to the next dispatch key unchanged.
#include <ATen/autocast_mode.h>
#include <torch/headeronly/version.h>  // TORCH_VERSION_MINOR
#include <torch/library.h>

namespace {

// the names AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE's signatures use unqualified
using at::IntArrayRef;
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13
using at::DimnameList;  // torch 2.11's tables name it too (2.13's headers have no at:: alias)
#endif
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// Same refusal (and exception type) as CUDA autocast: BCE on probabilities is unsafe in half.
at::Tensor binary_cross_entropy_refused(const at::Tensor&, const at::Tensor&,
                                        const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast (tpu autocast refuses them, as CUDA's does). Fold the preceding sigmoid "
              "into the loss: use torch.nn.functional.binary_cross_entropy_with_logits or "
              "torch.nn.BCEWithLogitsLoss, which autocast runs in float32.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

// policy            ops
// lower_precision_fp  conv*, matmul/mm/bmm/addmm/baddbmm/addbmm/linear, rnn cells, sdpa, ...
// fp32                pointwise transcendental ops, norms, losses, upsampling, ...
// fp32_set_opt_dtype  softmax, log_softmax, sum, prod, cumsum, cumprod, vector/matrix norms
// fp32_append_dtype   norm.Scalar, norm.ScalarOpt_dim
// promote             addcdiv, addcmul, atan2, bilinear, cross, dot, vdot, index_put, ...
#define TPU_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TPU_LOWER_PRECISION_FP)
  AT_FORALL_FP32(TPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPU_PROMOTE)
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_refused));
}

}  // namespace
