/* Sorting helpers shared by the index and select families (defined in index.c), and the select
 * family's part of the data-dependent-shape protocol of dynamic.h (defined in select.c). */
#ifndef TORCH_PJRT_OPS_ORDER_H
#define TORCH_PJRT_OPS_ORDER_H
#include "lower.h"

/* Stable sort of ops[0] (the keys) along dim, carrying ops[1..n) (n <= 4) into res[0..n).
 * Ascending puts NaN last, descending puts NaN first (CPU's order). Returns false on error. */
bool pj_sort_along(pj_lower_t *L, pj_val_t *ops, int n, int dim, bool descending, pj_val_t *res);
/* Positions [m] (i64) of a flat bool mask [m], the true ones first in increasing order. */
pj_val_t pj_true_positions(pj_lower_t *L, pj_val_t mask);
/* Count of true elements of a bool value, as 0-d i64. */
pj_val_t pj_count_true(pj_lower_t *L, pj_val_t mask);

/* Whether a call takes the dynamic.h path for the select family: not at all (0), with a
 * counting program (PJ_SHAPE_FROM_COUNT), or with shapes from its arguments alone. */
enum { PJ_SHAPE_FROM_COUNT = 1, PJ_SHAPE_FROM_ARGS = 2 };
int pj_select_dynamic(const pj_call_t *c);
pj_status_t *pj_select_out_types(const pj_call_t *c, int64_t count, pj_type_t *outs, int max,
                                 int *n);
#endif
