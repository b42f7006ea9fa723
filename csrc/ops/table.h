/* Each lowering family (one .c file) exports a NULL-terminated table of entries; table.c lists
 * the families. Adding an op is adding a row to its family's table. */
#ifndef TORCH_PJRT_TABLE_H
#define TORCH_PJRT_TABLE_H
#include "lower.h"

typedef struct {
  const char *name; /* aten base name */
  pj_lower_fn fn;
  pj_shape_class_t shape; /* how its program depends on shapes (call.h); 0: exact */
} pj_lowering_entry_t;

#define PJ_FAMILIES(X) \
  X(elementwise)       \
  X(reduce)            \
  X(linalg)            \
  X(linalg_decomp)     \
  X(linalg_eig)        \
  X(shape)             \
  X(index)             \
  X(nn)                \
  X(conv)              \
  X(random)            \
  X(factory)           \
  X(optim)             \
  X(foreach)           \
  X(special)           \
  X(select)            \
  X(rnn)               \
  X(vision)            \
  X(paged_attention)   \
  X(kernel)            \
  X(fft)               \
  X(scaled_mm)       \
  X(collective)

#define PJ_DECLARE_FAMILY(f) extern const pj_lowering_entry_t pj_lowerings_##f[];
PJ_FAMILIES(PJ_DECLARE_FAMILY)
#undef PJ_DECLARE_FAMILY

#endif
