// torch.set_float32_matmul_precision for tpu programs. PyTorch keeps the setting in its global
// context and says nothing when it changes, so every op the dispatcher lowers first brings the
// program builder's precision (torch_pjrt/hlo.h: pj_hlo_set_f32_product_precision) in step
// with it: one read of an enum when nothing changed. Ops DeferAndFuse recorded before a change
// are built when they are flushed, so a change flushes them first: each op's products take the
// precision in force when the op was called.
#include "bridge.h"

#include <ATen/Context.h>

extern "C" {
#include "torch_pjrt/hlo.h"
}

namespace torch_pjrt {

void sync_product_precision() {
  pj_precision_t want;
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST: want = PJ_PRECISION_HIGHEST; break;
    case at::Float32MatmulPrecision::HIGH: want = PJ_PRECISION_HIGH; break;
    default: want = PJ_PRECISION_DEFAULT; break;
  }
  if (want == pj_hlo_f32_product_precision()) return;
  check(pj_defer_flush());
  pj_hlo_set_f32_product_precision(want);
}

}  // namespace torch_pjrt
