/* Ops whose result shape depends on tensor values (nonzero, masked_select, and index.Tensor /
 * index.Tensor_out with a bool or uint8 mask among its indices). Their Meta kernels cannot give
 * the result shape (they raise), so the bridge takes this path instead of the Meta step:
 *
 *   1. build the pj_call_t with every argument as usual, but no outs yet;
 *   2. if pj_call_dynamic(call): pj_dynamic_count(call, &n) runs a small program counting the
 *      selected elements and reads the count back (a host sync); then
 *      pj_dynamic_out_type(call, n, &t) gives the result's dtype and sizes (and raises CPU's
 *      shape errors, e.g. a mask that does not match the indexed shape);
 *   3. add an int argument "__count" = n to the call (the lowering reads it; it is part of the
 *      cache key, so each distinct count compiles its own program), allocate the result with
 *      t's sizes and dtype (functional variant) or resize_output the out= tensor to t's sizes,
 *      add it as the single out, and run the call as any other.
 *
 * These functions never modify `c`. Thread-safe. */
#ifndef TORCH_PJRT_OPS_DYNAMIC_H
#define TORCH_PJRT_OPS_DYNAMIC_H
#include <stdbool.h>
#include <stdint.h>

#include "torch_pjrt/call.h"
#ifdef __cplusplus
extern "C" {
#endif

/* True if the call's result shape depends on values (decided from op name and argument dtypes). */
bool pj_call_dynamic(const pj_call_t *c);
/* Runs the counting program for a dynamic call and returns the count (blocks on the device). */
pj_status_t *pj_dynamic_count(const pj_call_t *c, int64_t *count);
/* The result type of a dynamic call given its count. */
pj_status_t *pj_dynamic_out_type(const pj_call_t *c, int64_t count, pj_type_t *out);

#ifdef __cplusplus
}
#endif
#endif
