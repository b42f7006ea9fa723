/* Lowering: torch._scaled_mm, the matrix product of two float8 (or float4) matrices with scales.
 *
 * The result is PyTorch's CPU formula: both factors decoded to float32 (exact), one dot_general
 * accumulating in float32, times scale_a then times scale_b (each broadcast: a single value for
 * tensor-wise scaling, an [m, 1] column and a [1, n] row for row-wise scaling), plus the bias in
 * float32, divided by scale_result only when the output is a float8 type (CPU ignores it
 * otherwise), and one final rounding to the output dtype (pj_set_result; float8 outputs round
 * as float8 casts do, csrc/hlo/float8.c). use_fast_accum changes nothing on CPU nor here.
 * Which scale shapes and dtypes are accepted is checked by the bridge before this runs
 * (csrc/bridge/lowp_ops.cpp: CPU's checks for CPU's forms, the Meta kernel's for the block
 * forms; the Meta kernel itself applies CUDA's rules to tpu tensors). The sum's order is
 * XLA's, so float32 results differ from CPU's in the last bits (as any two products do).
 *
 * Block-scaled forms (which CPU lacks; CUDA's definitions): MX, float8 or float4 operands with
 * one float8_e8m0fnu scale per 32 consecutive elements along K, and NVFP4, float4 operands with
 * one float8_e4m3fn scale per 16. Each operand is dequantized (its values times its block's
 * scale, in float32) and the product is the one above. Scales come in cuBLAS's blocked layout:
 * the [rows, K blocks] matrix padded to multiples of [128, 4], each 128 x 4 tile stored as
 * [32, 4, 4] with the tile's row r at (r % 32, r / 32). float4 operands are packed along K.
 * And float32 scales per block of 128 (DeepSeek's recipe): scale_a per 1 x 128 ([m, K/128])
 * or 128 x 128 ([m/128, K/128]) block of self, scale_b per 128 x 128 ([K/128, n/128]) or
 * 128 x 1 ([K/128, n]) block of mat2 (sizes rounded up), dequantized the same way. */
#include "table.h"
#include "emit.h"
#include "torch_pjrt/lowp.h"

/* A float32 scale argument broadcast to the product's shape (right-aligned, NumPy-style). */
static pj_val_t scale_as(pj_lower_t *L, const char *name, pj_type_t t) {
  pj_val_t s = pj_convert(H, pj_tensor(L, name), PJ_F32);
  return pj_broadcast_to(H, s, t.rank, t.dims);
}

/* A float8 or float4 operand as float32, K along dim k_axis (float4 unpacked along it). */
static pj_val_t operand(pj_lower_t *L, const char *name, int k_axis) {
  pj_val_t x = pj_tensor(L, name);
  if (x.t.dtype == PJ_F4E2M1FN_X2) return pj_lowp_unpack_f4(H, x, k_axis);
  return pj_convert(H, x, PJ_F32);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The blocked scale layout undone: a [rows, kblocks] float32 matrix of the scales. */
static pj_val_t unblock_scales(pj_lower_t *L, const char *name, int64_t rows, int64_t kblocks) {
  pj_val_t s = pj_convert(H, pj_tensor(L, name), PJ_F32);
  const int64_t rb = ceil_div(rows, 128), cb = ceil_div(kblocks, 4);
  if (pj_type_numel(&s.t) != rb * cb * 512)
    return pj_fail(L, PJ_ERR_RUNTIME, "_scaled_mm: %s has %lld elements, the blocked layout "
                   "of %lld x %lld scales has %lld", name, (long long)pj_type_numel(&s.t),
                   (long long)rows, (long long)kblocks, (long long)(rb * cb * 512));
  const int64_t tiles[5] = {rb, cb, 32, 4, 4}, perm[5] = {0, 3, 2, 1, 4};
  const int64_t full[2] = {rb * 128, cb * 4}, zero[2] = {0, 0}, lim[2] = {rows, kblocks};
  pj_val_t t = pj_transpose(H, pj_reshape(H, s, 5, tiles), perm); /* [rb, r/32, r%32, cb, c] */
  return pj_slice(H, pj_reshape(H, t, 2, full), zero, lim, NULL);
}

/* s ([d0, d1], float32) with each element repeated over an r0 x r1 block, cut to [n0, n1]. */
static pj_val_t upsample(pj_lower_t *L, pj_val_t s, int64_t r0, int64_t r1, int64_t n0,
                         int64_t n1) {
  const int64_t d0 = s.t.dims[0], d1 = s.t.dims[1];
  const int64_t e4[4] = {d0, r0, d1, r1}, e2[2] = {d0 * r0, d1 * r1}, bdims[2] = {0, 2};
  pj_val_t up = pj_broadcast_in_dim(H, s, pj_type(PJ_F32, 4, e4), bdims);
  const int64_t zero[2] = {0, 0}, lim[2] = {n0, n1};
  return pj_slice(H, pj_reshape(H, up, 2, e2), zero, lim, NULL);
}

static pj_status_t *lower_scaled_mm(pj_lower_t *L) {
  pj_val_t a = operand(L, "self", 1);
  pj_val_t b = operand(L, "mat2", 0);
  const int64_t m = a.t.dims[0], k = a.t.dims[1], n = b.t.dims[1];
  const int64_t tr[2] = {1, 0};
  const pj_dtype_t sdt = pj_arg_dtype(L, "scale_a");
  const pj_tensor_desc_t *da = pj_tensor_desc(L, "scale_a"), *db = pj_tensor_desc(L, "scale_b");
  /* float32 scales: one each (tensor-wise), [m, 1] and [1, n] (row-wise), else blocks of 128
   * (sizes checked by the bridge: [m or m/128, K/128] and [K/128, n/128 or n]) */
  const bool blocked = sdt == PJ_F8E8M0FNU || sdt == PJ_F8E4M3FN;
  const bool rowwise = !blocked && da->rank == 2 && db->rank == 2 && da->sizes[0] == m &&
                       da->sizes[1] == 1 && db->sizes[0] == 1 && db->sizes[1] == n;
  const bool blocks128 = !blocked && !rowwise && da->rank == 2 && db->rank == 2 &&
                         da->sizes[0] * da->sizes[1] * db->sizes[0] * db->sizes[1] != 1;
  if (blocked) {
    const int64_t block = sdt == PJ_F8E8M0FNU ? 32 : 16, kblocks = ceil_div(k, block);
    pj_val_t sa = unblock_scales(L, "scale_a", m, kblocks);
    pj_val_t sb = unblock_scales(L, "scale_b", n, kblocks);
    a = MUL(a, upsample(L, sa, 1, block, m, k));
    b = MUL(b, pj_transpose(H, upsample(L, sb, 1, block, n, k), tr));
  } else if (blocks128) {
    pj_val_t sa = pj_convert(H, pj_tensor(L, "scale_a"), PJ_F32);
    pj_val_t sb = pj_convert(H, pj_tensor(L, "scale_b"), PJ_F32);
    a = MUL(a, upsample(L, sa, da->sizes[0] == m ? 1 : 128, 128, m, k));
    b = MUL(b, upsample(L, sb, 128, db->sizes[1] == n ? 1 : 128, k, n));
  }
  const int64_t lc = 1, rc = 0;
  pj_val_t acc = pj_dot_general(H, a, b, NULL, NULL, 0, &lc, &rc, 1, PJ_F32);
  if (!blocked && !blocks128) {
    acc = MUL(acc, scale_as(L, "scale_a", acc.t));
    acc = MUL(acc, scale_as(L, "scale_b", acc.t));
  }
  if (pj_has(L, "bias")) acc = ADD(acc, scale_as(L, "bias", acc.t));
  if (pj_dtype_is_lowp(pj_out_type(L, 0).dtype) && pj_has(L, "scale_result"))
    acc = DIV(acc, scale_as(L, "scale_result", acc.t));
  pj_set_result(L, 0, acc);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_scaled_mm[] = {
    {"_scaled_mm", lower_scaled_mm, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
