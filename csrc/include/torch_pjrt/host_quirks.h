/* CPU results that depend on the host CPU's instruction set, which lowerings reproduce so that
 * tpu's numbers equal CPU's on the host beside it (CPU is the numeric reference, and PyTorch's
 * CPU kernels are not the same function on every host). The bridge asks CPU once at start-up
 * (csrc/bridge/host_quirks.cpp) and sets them here before any program is built; each setting is
 * process-wide and fixed from then on, so a program's key needs no bit for it (an executable of
 * the CPU plugin is specific to its host anyway). */
#ifndef TORCH_PJRT_HOST_QUIRKS_H
#define TORCH_PJRT_HOST_QUIRKS_H
#include <stdbool.h>
#ifdef __cplusplus
extern "C" {
#endif

/* Whether CPU's erf-form gelu of +inf is NaN (not the formula's +inf) for float32 and for
 * bfloat16: its AVX-512 vectorized erf gives NaN there, its AVX2 one and its scalar float16 /
 * float64 paths +inf. Default: false (the formula, and CUDA). */
void pj_host_quirks_set_gelu_inf_is_nan(bool f32, bool bf16);
bool pj_host_quirks_gelu_inf_is_nan(bool bf16);

#ifdef __cplusplus
}
#endif
#endif
