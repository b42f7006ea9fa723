/* Whole-slice gather/scatter along one dim, shared by the index and shape families (defined in
 * index.c). Index values are used as given (no wrapping, no bounds check). */
#ifndef TORCH_PJRT_OPS_SLICES_H
#define TORCH_PJRT_OPS_SLICES_H
#include "lower.h"

/* x.index_select(dim, idx) for an index of any rank k: the result has shape
 * x.shape[:dim] + idx.shape + x.shape[dim+1:]. */
pj_val_t pj_take_slices(pj_lower_t *L, pj_val_t x, int dim, pj_val_t idx);
/* x with the slices upd (x's shape with dim replaced by idx's element count) written at the
 * positions idx (flattened) along dim; combiner NULL replaces, "add"/"mul"/"max"/"min" combine. */
pj_val_t pj_put_slices(pj_lower_t *L, pj_val_t x, int dim, pj_val_t idx, pj_val_t upd,
                       const char *combiner);
#endif
