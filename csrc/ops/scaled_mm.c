/* Lowering: torch._scaled_mm, the matrix product of two float8 matrices with scales.
 *
 * The result is PyTorch's CPU formula: both factors decoded to float32 (exact), one dot_general
 * accumulating in float32, times scale_a then times scale_b (each broadcast: a single value for
 * tensor-wise scaling, an [m, 1] column and a [1, n] row for row-wise scaling), plus the bias in
 * float32, divided by scale_result only when the output is a float8 type (CPU ignores it
 * otherwise), and one final rounding to the output dtype (pj_set_result; float8 outputs round
 * as float8 casts do, csrc/hlo/float8.c). use_fast_accum changes nothing on CPU nor here.
 * Which scale shapes and dtypes are accepted is CPU's check (csrc/bridge/lowp_ops.cpp): the
 * Meta kernel checks them only for CUDA/XPU/CPU tensors. The sum's order is XLA's, so float32
 * results differ from CPU's in the last bits (as any two matrix products do). */
#include "table.h"
#include "emit.h"

/* A float32 scale argument broadcast to the product's shape (right-aligned, NumPy-style). */
static pj_val_t scale_as(pj_lower_t *L, const char *name, pj_type_t t) {
  pj_val_t s = pj_convert(H, pj_tensor(L, name), PJ_F32);
  return pj_broadcast_to(H, s, t.rank, t.dims);
}

static pj_status_t *lower_scaled_mm(pj_lower_t *L) {
  pj_val_t a = pj_convert(H, pj_tensor(L, "self"), PJ_F32);
  pj_val_t b = pj_convert(H, pj_tensor(L, "mat2"), PJ_F32);
  const int64_t lc = 1, rc = 0;
  pj_val_t acc = pj_dot_general(H, a, b, NULL, NULL, 0, &lc, &rc, 1, PJ_F32);
  acc = MUL(acc, scale_as(L, "scale_a", acc.t));
  acc = MUL(acc, scale_as(L, "scale_b", acc.t));
  if (pj_has(L, "bias")) acc = ADD(acc, scale_as(L, "bias", acc.t));
  if (pj_dtype_is_lowp(pj_out_type(L, 0).dtype) && pj_has(L, "scale_result"))
    acc = DIV(acc, scale_as(L, "scale_result", acc.t));
  pj_set_result(L, 0, acc);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_scaled_mm[] = {
    {"_scaled_mm", lower_scaled_mm},
    {NULL, NULL},
};
