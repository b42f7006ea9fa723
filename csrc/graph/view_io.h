/* Reading a strided view out of a storage's 1-D buffer, and writing a value into one. */
#ifndef TORCH_PJRT_VIEW_IO_H
#define TORCH_PJRT_VIEW_IO_H
#include "torch_pjrt/call.h"
#include "torch_pjrt/hlo.h"

/* The view (d) of the 1-D storage value `full`, as a value of shape d->sizes. */
pj_val_t pj_view_read(pj_hlo_t *h, pj_val_t full, const pj_tensor_desc_t *d);
/* `full` (may be invalid: a fresh storage of `numel` elements, unwritten parts become zero)
 * with the view d overwritten by v (shape d->sizes, dtype = full's). Returns the new 1-D value. */
pj_val_t pj_view_write(pj_hlo_t *h, pj_val_t full, int64_t numel, pj_dtype_t dt,
                       const pj_tensor_desc_t *d, pj_val_t v);
/* The elements a view can reach from its offset: 1 + sum((size - 1) * stride); 0 if empty. */
int64_t pj_view_span(const pj_tensor_desc_t *d);
/* pj_view_read of a view whose offset is the runtime 0-d int64 value `off` (d->offset is not
 * used): the view's span is cut out of `full` with dynamic_slice and read at offset 0. */
pj_val_t pj_view_read_at(pj_hlo_t *h, pj_val_t full, const pj_tensor_desc_t *d, pj_val_t off);
/* pj_view_write at the runtime offset *off (NULL: d->offset, as pj_view_write): the span is cut
 * out, written at offset 0 and put back with dynamic_update_slice. */
pj_val_t pj_view_write_at(pj_hlo_t *h, pj_val_t full, int64_t numel, pj_dtype_t dt,
                          const pj_tensor_desc_t *d, const pj_val_t *off, pj_val_t v);
/* Reinterprets a 1-D storage value's bytes as another element type (view(dtype), untyped
 * storage copies): the element count scales by the size ratio. bool <-> 8-bit ints convert by
 * value (0/1), which is what their bits are. */
pj_val_t pj_view_bitcast(pj_hlo_t *h, pj_val_t full, pj_dtype_t dt);
#endif
