/* Ops refused for dtypes CPU has no kernel for (no_kernel.c). */
#ifndef TORCH_PJRT_NO_KERNEL_H
#define TORCH_PJRT_NO_KERNEL_H
#include <stdbool.h>

#include "lower.h"

/* Whether CPU has no kernel for this call's dtypes; if so the error is recorded in the
 * builder (pj_fail) and the lowering must not run. */
bool pj_no_cpu_kernel(pj_lower_t *L);
#endif
