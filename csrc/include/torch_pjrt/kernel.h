/* Custom kernels: StableHLO functions written or exported outside torch_pjrt (JAX, Pallas in
 * interpret mode, hand-written StableHLO; torch_pjrt/kernels/) that programs call.
 *
 * A kernel is registered once per process under an id derived from a fingerprint of its text
 * (the front end computes it), so the id in a call's key (the `kernel` string argument of
 * tpu::kernel_call) names exactly one text: two kernels never share a cached program, in
 * memory or on disk, and a restarted process that registers the same text gets the same id and
 * the programs it compiled before. The text is one or more func.func definitions whose symbols
 * all carry the id as a prefix (so kernels never clash inside one program); `callee` is the
 * entry function, called with the call's tensors in order and returning its results in order. */
#ifndef TORCH_PJRT_KERNEL_H
#define TORCH_PJRT_KERNEL_H
#include <stdbool.h>
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Registers (copies) a kernel. Registering an id again with the same callee and text is a no-op;
 * with different ones it is a ValueError (ids are fingerprints: that is a front-end bug). */
pj_status_t *pj_kernel_register(const char *id, const char *callee, const char *text);
/* Whether a kernel is registered under id. */
bool pj_kernel_known(const char *id);

#ifdef __cplusplus
}
#endif
#endif
