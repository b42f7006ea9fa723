/* The host-dependent CPU results lowerings reproduce (torch_pjrt/host_quirks.h). Written once by
 * the bridge at start-up, read by lowerings on any thread: atomics, no lock. */
#include "torch_pjrt/host_quirks.h"

#include <stdatomic.h>

static atomic_bool gelu_inf_nan_f32 = false, gelu_inf_nan_bf16 = false;

void pj_host_quirks_set_gelu_inf_is_nan(bool f32, bool bf16) {
  atomic_store(&gelu_inf_nan_f32, f32);
  atomic_store(&gelu_inf_nan_bf16, bf16);
}

bool pj_host_quirks_gelu_inf_is_nan(bool bf16) {
  return atomic_load(bf16 ? &gelu_inf_nan_bf16 : &gelu_inf_nan_f32);
}
