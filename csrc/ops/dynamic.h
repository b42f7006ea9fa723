/* Ops whose result shape depends on tensor values (nonzero, masked_select, index.Tensor /
 * index.Tensor_out with a bool or uint8 mask among its indices, and the select family's unique,
 * unique_consecutive, bincount, repeat_interleave without output_size: see select.c). Their
 * Meta kernels cannot give the result shape (they raise), so the bridge takes this path
 * instead of the Meta step:
 *
 *   1. build the pj_call_t with every argument as usual, but no outs yet;
 *   2. if pj_call_dynamic(call): pj_dynamic_count(call, &n) runs a small program counting the
 *      selected elements and reads the count back (a host sync); then
 *      pj_dynamic_out_types(call, n, ...) gives the results' dtypes and sizes (and raises CPU's
 *      shape errors, e.g. a mask that does not match the indexed shape);
 *   3. add an int argument "__count" = n to the call (the lowering reads it; it is part of the
 *      cache key, so each distinct count compiles its own program), allocate each result with
 *      its sizes and dtype (functional variant) or resize_output the out= tensors, add them as
 *      the outs, and run the call as any other.
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
/* The result types of a dynamic call given its count: *n results (at most max), in the order of
 * the op's returns (a Tensor[] return: its elements). Ops without a Meta kernel whose result
 * shapes follow from their arguments alone (histogram, _logcumsumexp) take this path too; their
 * count is 0 and no counting program runs. */
#define PJ_DYNAMIC_MAX_OUTS 8
pj_status_t *pj_dynamic_out_types(const pj_call_t *c, int64_t count, pj_type_t *outs, int max,
                                  int *n);

#ifdef __cplusplus
}
#endif
#endif
