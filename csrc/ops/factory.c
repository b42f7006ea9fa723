/* Factory lowerings: the out= kernels PyTorch's composite factories end in (arange.start_out,
 * linspace.out, logspace.out, eye.out / eye.m_out, tril_indices / triu_indices). Result sizes
 * come from the Meta kernels; values follow CPU's formulas and computation types so results
 * match it bit for bit in most cases (within an ulp where CPU's vectorized loop associates
 * differently). full / zeros / ones / *_like / scalar_tensor are composites over empty + fill_
 * (elementwise.c) and need nothing here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"
#include "emit.h"


static pj_val_t bcast(pj_lower_t *L, pj_val_t s, pj_type_t t) {
  return pj_broadcast_in_dim(H, s, pj_type_with_dtype(t, s.t.dtype), NULL);
}

/* A Scalar argument as a 0-d value of dt, converted the way c10::Scalar::to<T> does (floats
 * round, integers truncate toward zero, through the Scalar's own type). */
static pj_val_t scalar_as(pj_lower_t *L, const char *name, pj_dtype_t dt) {
  return pj_convert(H, pj_scalar(L, name), dt);
}

static bool supported(pj_lower_t *L, pj_dtype_t dt, const char *op) {
  if (dt != PJ_BOOL && !pj_dtype_info(dt)->is_complex) return true;
  pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"%s\" not implemented for '%s' on tpu", op,
          pj_dtype_info(dt)->name);
  return false;
}

/* arange: start + step * i in CPU's accumulate type (double for float and double, float for
 * half types, int64 for integers), then converted to the result dtype. */
static pj_status_t *lower_arange(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (!supported(L, t.dtype, "arange_cpu")) return NULL;
  pj_dtype_t acc = t.dtype == PJ_F32 || t.dtype == PJ_F64 ? PJ_F64
                   : pj_dtype_info(t.dtype)->is_float    ? PJ_F32
                                                         : PJ_I64;
  pj_type_t at = pj_type_with_dtype(t, acc);
  pj_val_t start = bcast(L, scalar_as(L, "start", acc), at);
  pj_val_t step = pj_has(L, "step") ? bcast(L, scalar_as(L, "step", acc), at)
                                    : pj_full(H, at, 1);
  pj_set_result(L, 0, ADD(start, MUL(step, pj_iota(H, at, 0))));
  return NULL;
}

/* The value linspace puts at index i, in CPU's step type st (double for integer results, the
 * result dtype otherwise), symmetric from both ends:
 *   i <  steps / 2:  start + step * i
 *   i >= steps / 2:  end - step * (steps - 1 - i),   step = (end - start) / (steps - 1)
 * start and end are first converted to the result dtype, as CPU does. */
static pj_val_t linspace_values(pj_lower_t *L, pj_type_t t, int64_t steps, pj_dtype_t st) {
  pj_type_t vt = pj_type_with_dtype(t, st);
  pj_val_t start = pj_convert(H, scalar_as(L, "start", t.dtype), st);
  pj_val_t end = pj_convert(H, scalar_as(L, "end", t.dtype), st);
  if (steps == 1) return bcast(L, start, vt);
  /* (steps - 1) converted to st like CPU's mixed-type division */
  pj_val_t step = DIV(SUB(end, start), pj_convert(H, pj_const_i(H, PJ_I64, steps - 1), st));
  pj_type_t it = pj_type_with_dtype(t, PJ_I64);
  pj_val_t idx = pj_iota(H, it, 0);
  pj_val_t rev = SUB(pj_full(H, it, (double)(steps - 1)), idx);
  pj_val_t stepb = bcast(L, step, vt);
  pj_val_t lo = ADD(bcast(L, start, vt), MUL(stepb, pj_convert(H, idx, st)));
  pj_val_t hi = SUB(bcast(L, end, vt), MUL(stepb, pj_convert(H, rev, st)));
  return SEL(CMP("LT", idx, pj_full(H, it, (double)(steps / 2))), lo, hi);
}

static pj_status_t *lower_linspace(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (!supported(L, t.dtype, "linspace_cpu")) return NULL;
  int64_t steps = t.dims[0];
  pj_dtype_t st = pj_dtype_info(t.dtype)->is_float ? t.dtype : PJ_F64;
  pj_set_result(L, 0, linspace_values(L, t, steps, st)); /* integers: truncating conversion */
  return NULL;
}

/* logspace: base ** (linspace exponent), the power in double as CPU's std::pow(double, x). */
static pj_status_t *lower_logspace(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (!supported(L, t.dtype, "logspace_cpu")) return NULL;
  int64_t steps = t.dims[0];
  pj_dtype_t st = pj_dtype_info(t.dtype)->is_float ? t.dtype : PJ_F64;
  pj_val_t e;
  if (steps == 1) /* CPU fills pow(base, start) with start as a double */
    e = bcast(L, scalar_as(L, "start", PJ_F64), pj_type_with_dtype(t, PJ_F64));
  else
    e = pj_convert(H, linspace_values(L, t, steps, st), PJ_F64);
  pj_val_t base = pj_full(H, e.t, pj_float(L, "base", 10.0));
  pj_set_result(L, 0, pj_binary(H, "stablehlo.power", base, e));
  return NULL;
}

static pj_status_t *lower_eye(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (t.rank != 2) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: eye result of rank %d", t.rank);
    return NULL;
  }
  pj_type_t it = pj_type_with_dtype(t, PJ_I64);
  pj_set_result(L, 0, CMP("EQ", pj_iota(H, it, 0), pj_iota(H, it, 1)));
  return NULL;
}

/* tril_indices / triu_indices: the (row, col) pairs of the triangle in row-major order, as a
 * [2, N] tensor. The row-major linear indices inside the triangle are found by sorting all
 * row * col indices with the ones outside pushed past the end; the first N are the triangle. */
static pj_status_t *lower_tri_indices(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  int64_t rows = pj_int(L, "row", 0), cols = pj_int(L, "col", 0), off = pj_int(L, "offset", 0);
  bool lower = !strcmp(L->c->op, "tril_indices");
  int64_t total = rows * cols, n = t.rank == 2 ? t.dims[1] : 0;
  if (total <= 0 || n <= 0) return NULL; /* an empty [2, 0] result: nothing to write */
  pj_type_t ft = pj_type(PJ_I64, 1, &total);
  pj_val_t lin = pj_iota(H, ft, 0);
  pj_val_t c = pj_full(H, ft, (double)cols);
  pj_val_t r = DIV(lin, c), k = pj_binary(H, "stablehlo.remainder", lin, c);
  pj_val_t diag = SUB(k, r); /* col - row */
  pj_val_t in = lower ? CMP("LE", diag, pj_full(H, ft, (double)off))
                      : CMP("GE", diag, pj_full(H, ft, (double)off));
  pj_val_t key = SEL(in, lin, ADD(lin, pj_full(H, ft, (double)total)));
  pj_type_t st = pj_type_scalar(PJ_I64);
  pj_type_t sts[2] = {st, st};
  pj_val_t args[2];
  pj_hlo_region_begin(H, sts, 2, args);
  pj_val_t lt = CMP("LT", args[0], args[1]);
  char *region = pj_hlo_region_end(H, &lt, 1);
  if (!region) return NULL;
  pj_val_t sorted;
  pj_hlo_op_multi(H, "stablehlo.sort", &key, 1, region, "dimension = 0 : i64", &ft, 1, &sorted);
  free(region);
  int64_t s0 = 0, s1 = n, one = 1;
  pj_val_t first = pj_slice(H, sorted, &s0, &s1, &one);
  pj_type_t nt = pj_type(PJ_I64, 1, &n);
  pj_val_t cn = pj_full(H, nt, (double)cols);
  int64_t d1[2] = {1, n};
  pj_val_t parts[2] = {pj_reshape(H, DIV(first, cn), 2, d1),
                       pj_reshape(H, pj_binary(H, "stablehlo.remainder", first, cn), 2, d1)};
  pj_set_result(L, 0, pj_concat(H, parts, 2, 0));
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_factory[] = {
    {"arange", lower_arange},
    {"range", lower_arange}, /* the same values, the end included by its Meta kernel's size */
    {"linspace", lower_linspace},
    {"logspace", lower_logspace},
    {"eye", lower_eye},
    {"tril_indices", lower_tri_indices},
    {"triu_indices", lower_tri_indices},
    {NULL, NULL},
};
