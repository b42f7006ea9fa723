/* Lowerings: linalg family (matrix products).
 *
 * Every product here is one stablehlo.dot_general (default precision) with batch and
 * contracting dimension lists from a table row; the add-variants (addmm, baddbmm, addbmm, addmv)
 * combine it with `self` as beta * self + alpha * product. matmul, linear, outer, einsum and
 * scaled_dot_product_attention are CompositeImplicitAutograd in PyTorch and reach us as these
 * ops (plus views), so they need no rows of their own.
 *
 * Compute dtype: the output dtype, except that float16/bfloat16 products accumulate in float32
 * (dot_general with an f32 result, as CPU's kernels accumulate in float) and the add-variant's
 * arithmetic stays in float32 until the single final rounding. Bool products are rejected as
 * on CPU; integer products wrap like CPU's. */
#include <stdio.h>
#include <string.h>

#include "table.h"
#include "emit.h"
#include "torch_pjrt/runtime.h"


/* Dimension numbers of one product op, for the operand ranks the schema guarantees (the Meta
 * kernel has already checked ranks and sizes, so shapes are valid here). */
typedef struct {
  const char *name;
  const char *a, *b; /* argument names of the two factors */
  int nb;            /* batch dims */
  int64_t lb[2], rb[2];
  int nc; /* contracting dims */
  int64_t lc[2], rc[2];
  bool add;    /* beta * self + alpha * product */
  bool conj_a; /* vdot: conjugate the first factor */
} product_row_t;

static const product_row_t kProducts[] = {
    {"mm", "self", "mat2", 0, {0}, {0}, 1, {1}, {0}, false, false},
    {"bmm", "self", "mat2", 1, {0}, {0}, 1, {2}, {1}, false, false},
    {"mv", "self", "vec", 0, {0}, {0}, 1, {1}, {0}, false, false},
    {"dot", "self", "tensor", 0, {0}, {0}, 1, {0}, {0}, false, false},
    {"vdot", "self", "other", 0, {0}, {0}, 1, {0}, {0}, false, true},
    {"addmm", "mat1", "mat2", 0, {0}, {0}, 1, {1}, {0}, true, false},
    {"_addmm_activation", "mat1", "mat2", 0, {0}, {0}, 1, {1}, {0}, true, false},
    {"baddbmm", "batch1", "batch2", 1, {0}, {0}, 1, {2}, {1}, true, false},
    /* addbmm sums the batch of products: contract over the batch dim as well */
    {"addbmm", "batch1", "batch2", 0, {0}, {0}, 2, {0, 2}, {0, 1}, true, false},
    {"addmv", "mat", "vec", 0, {0}, {0}, 1, {1}, {0}, true, false},
    {NULL, NULL, NULL, 0, {0}, {0}, 0, {0}, {0}, false, false},
};

static const product_row_t *find_row(const char *op) {
  for (const product_row_t *r = kProducts; r->name; r++)
    if (!strcmp(r->name, op)) return r;
  return NULL;
}

static bool is_low_float(pj_dtype_t dt) { return dt == PJ_F16 || dt == PJ_BF16; }

/* A Scalar argument (beta/alpha) as a value of dtype dt broadcast to t's shape. */
static pj_val_t scalar_like(pj_lower_t *L, const char *name, pj_type_t t) {
  pj_val_t s = pj_convert(H, pj_scalar(L, name), t.dtype);
  return pj_broadcast_to(H, s, t.rank, t.dims);
}

/* A float32 product of a few rows by a large matrix (mm / addmm: [m, k] x [k, n], m <= 8):
 * decode-time linear layers. XLA's CPU dot runs these well below memory bandwidth (8 rows cost
 * about twice one row: it packs the whole right-hand matrix per call), so where this process has
 * the native kernel registered (CPU plugin; csrc/runtime/ffi_kernels.c) the product is a custom
 * call to it, which reads b once. Returns an invalid value (id < 0) to leave it to dot_general:
 * other shapes, dtypes and plugins, and products too small to be worth leaving XLA's fusions. */
static pj_val_t few_row_product(pj_lower_t *L, const product_row_t *row, pj_val_t a, pj_val_t b,
                                pj_dtype_t ct) {
  const pj_val_t none = {.id = -1, .sub = -1};
  if (!pj_ffi_small_gemm_target(false) || row->nb != 0 || row->nc != 1 || a.t.rank != 2 ||
      b.t.rank != 2 || ct != PJ_F32 || a.t.dtype != PJ_F32 || b.t.dtype != PJ_F32 ||
      row->lc[0] != 1 || row->rc[0] != 0)
    return none;
  int64_t m = a.t.dims[0], k = a.t.dims[1], n = b.t.dims[1];
  /* b as the transposed view of a row-major [n, k] matrix (F.linear's weight.t()): the kernel
   * that reads it that way, so XLA passes the stored matrix (transpose(transpose(w)) folds)
   * rather than copying it into a row-major [k, n] for every product. XLA's own product with
   * such a b is slow even at one row ([1, 768] x 32000 rows: 14 ms, against 3.8 ms here at two
   * rows). One row by a row-major b is the kernel's matrix-vector form (small_gemm.c, gemv). */
  const pj_tensor_desc_t *bd = pj_tensor_desc(L, row->b);
  bool nt = bd && bd->rank == 2 && bd->strides[0] == 1 && bd->strides[1] == k && n > 1;
  if (m < 1 || m > 8 || k * n < (1 << 16)) return none;
  const char *target = pj_ffi_small_gemm_target(nt);
  if (nt) {
    int64_t perm[2] = {1, 0};
    b = pj_transpose(H, b, perm);
  }
  char attrs[400];
  snprintf(attrs, sizeof attrs,
           "call_target_name = \"%s\", api_version = 4 : i32, "
           "operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>], "
           "result_layouts = [dense<[1, 0]> : tensor<2xindex>]",
           target);
  int64_t od[2] = {m, n};
  pj_val_t ins[2] = {a, b};
  return pj_hlo_op(H, "stablehlo.custom_call", ins, 2, attrs, pj_type(PJ_F32, 2, od));
}

static pj_status_t *lower_product(pj_lower_t *L) {
  const product_row_t *row = find_row(L->c->op);
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t a = pj_tensor(L, row->a), b = pj_tensor(L, row->b);
  if (a.id < 0 || b.id < 0) return NULL;
  pj_dtype_t in_dt = a.t.dtype;
  if (in_dt != b.t.dtype) {
    /* Meta checks this for most ops; dot/vdot report it in the CPU kernel */
    pj_fail(L, PJ_ERR_RUNTIME,
            "%s: expected both vectors to have same dtype, but found %s and %s", L->c->op,
            pj_dtype_info(in_dt)->name, pj_dtype_info(b.t.dtype)->name);
    return NULL;
  }
  if (in_dt == PJ_BOOL) {
    /* CPU raises NotImplementedError from its dtype dispatch */
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"%s\" not implemented for 'Bool'", L->c->op);
    return NULL;
  }
  /* out_dtype overloads (mm.dtype etc.) only widen low floats to float32: ot covers them */
  pj_dtype_t ct = is_low_float(in_dt) || is_low_float(ot.dtype) ? PJ_F32 : ot.dtype;
  if (row->conj_a && pj_dtype_info(in_dt)->is_complex) {
    pj_type_t rt = pj_type_with_dtype(a.t, in_dt == PJ_C128 ? PJ_F64 : PJ_F32);
    pj_val_t re = pj_hlo_op(H, "stablehlo.real", &a, 1, NULL, rt);
    pj_val_t im = pj_hlo_op(H, "stablehlo.imag", &a, 1, NULL, rt);
    pj_val_t parts[2] = {re, pj_unary(H, "stablehlo.negate", im)};
    a = pj_hlo_op(H, "stablehlo.complex", parts, 2, NULL, a.t);
  }
  /* Low floats stay low on the operands (the MXU's native input type); the product comes out
   * in float32. Other dtypes compute in the output dtype. */
  if (!is_low_float(in_dt)) {
    a = pj_convert(H, a, ct);
    b = pj_convert(H, b, ct);
  }
  pj_val_t p = few_row_product(L, row, a, b, ct);
  if (p.id < 0)
    p = pj_dot_general(H, a, b, row->lb, row->rb, row->nb, row->lc, row->rc, row->nc, ct);
  pj_type_t pt = pj_type_with_dtype(ot, ct);
  if (!row->add) {
    /* A zero sum is +0 on CPU (its kernels add the products to a +0 accumulator); XLA's CPU
     * dot gives -0 when every product is -0 (zeros times negatives), which atan2, 1/x and
     * signbit then show (fuzz seed 2000015671). x + 0 would be folded away by XLA, so a
     * select; NaN stays NaN. The add-variants add beta * self, which already gives +0. */
    if (pj_dtype_is_float(ct)) {
      pj_val_t zero = pj_full(H, pt, 0);
      p = pj_select(H, pj_compare(H, "EQ", p, zero), zero, p);
    }
    pj_set_result(L, 0, p);
    return NULL;
  }
  p = pj_binary(H, "stablehlo.multiply", scalar_like(L, "alpha", pt), p);
  pj_val_t self = pj_broadcast_to(H, pj_convert(H, pj_tensor(L, "self"), ct), pt.rank, pt.dims);
  pj_val_t beta = scalar_like(L, "beta", pt);
  /* beta == 0 ignores self entirely (NaN/Inf in self do not propagate), as on CPU; beta is a
   * runtime value, so the choice is a select. */
  pj_val_t zero = pj_full(H, pt, 0);
  pj_val_t scaled = pj_select(H, pj_compare(H, "EQ", beta, zero), zero,
                              pj_binary(H, "stablehlo.multiply", beta, self));
  pj_val_t r = pj_binary(H, "stablehlo.add", scaled, p);
  if (!strcmp(row->name, "_addmm_activation")) {
    if (pj_bool(L, "use_gelu", false)) {
      /* CPU's kernel applies the exact (erf) GELU */
      pj_val_t e = pj_unary(H, "chlo.erf",
                            pj_binary(H, "stablehlo.multiply", r,
                                      pj_full(H, pt, 0.70710678118654752440)));
      pj_val_t cdf = pj_binary(H, "stablehlo.multiply", pj_full(H, pt, 0.5),
                               pj_binary(H, "stablehlo.add", pj_full(H, pt, 1), e));
      r = pj_binary(H, "stablehlo.multiply", r, cdf);
    } else {
      r = pj_binary(H, "stablehlo.maximum", r, zero);
    }
  }
  pj_set_result(L, 0, r);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_linalg[] = {
    {"mm", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {"bmm", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {"mv", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {"dot", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {"vdot", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {"addmm", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {"_addmm_activation", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {"baddbmm", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {"addbmm", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {"addmv", lower_product, PJ_SHAPE_EXACT_INPUTS},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
