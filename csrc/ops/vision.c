/* Lowerings: the detection ops torchvision registers (torch_pjrt/vision_ops.py routes them).
 *
 * tpu::nms_keep(boxes [N, 4], iou_threshold) -> keep [N] bool: greedy non-maximum suppression
 * over boxes already ordered by descending score, as torchvision's CPU kernel runs it: box i,
 * if still kept, suppresses every later box j whose IoU with it exceeds the threshold. The IoU
 * is CPU's formula in the boxes' dtype, in CPU's order of operations:
 *   inter = max(0, min(x2i, x2j) - max(x1i, x1j)) * max(0, min(y2i, y2j) - max(y1i, y1j))
 *   iou = inter / ((area_i + area_j) - inter),  area = (x2 - x1) * (y2 - y1)
 * CPU compares the float IoU with the double threshold; here the comparison is against the
 * largest value of the boxes' dtype not above the threshold, which gives the same answer for
 * every value of that dtype (iou > t  <=>  iou > round_down(t)) without double arithmetic on
 * the device. The whole N x N "suppresses" matrix is built once; the sequential part is one
 * while loop of N steps, each reading row i (a dynamic slice) and clearing what it suppresses. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "table.h"
#include "emit.h"
#include "linalg_util.h"

/* The largest value of dtype dt that is <= t (float32: nextafterf toward -inf when rounding
 * went up; float64: t itself). */
static double round_down(pj_dtype_t dt, double t) {
  if (dt != PJ_F32) return t;
  float f = (float)t;
  if ((double)f > t) f = nextafterf(f, -INFINITY);
  return (double)f;
}

/* Column k of b [N, 4] as [N]. */
static pj_val_t coord(pj_lower_t *L, pj_val_t b, int64_t k) {
  int64_t n = b.t.dims[0];
  int64_t start[2] = {0, k}, limit[2] = {n, k + 1};
  return pj_reshape(H, pj_slice(H, b, start, limit, NULL), 1, &n);
}

static pj_val_t as_row(pj_lower_t *L, pj_val_t v, pj_type_t nn) { return bdims(L, v, nn, 1, -1); }
static pj_val_t as_col(pj_lower_t *L, pj_val_t v, pj_type_t nn) { return bdims(L, v, nn, 0, -1); }

/* state: over [N, N] pred (i suppresses j), keep [N] pred */
static void nms_step(pj_lower_t *L, pj_val_t i, pj_val_t *st, void *ctx) {
  (void)ctx;
  pj_val_t over = st[0], keep = st[1];
  int64_t n = keep.t.dims[0];
  pj_val_t zero = ci(L, 0);
  char attrs[64];
  snprintf(attrs, sizeof attrs, "slice_sizes = array<i64: 1, %lld>", (long long)n);
  pj_val_t rins[3] = {over, i, zero};
  pj_val_t row = pj_hlo_op(H, "stablehlo.dynamic_slice", rins, 3, attrs, ty(PJ_BOOL, 2, 1, n, 0));
  row = pj_reshape(H, row, 1, &n);
  pj_val_t kins[2] = {keep, i};
  pj_val_t ki = pj_hlo_op(H, "stablehlo.dynamic_slice", kins, 2, "slice_sizes = array<i64: 1>",
                          ty(PJ_BOOL, 1, 1, 0, 0));
  ki = pj_broadcast_in_dim(H, ki, keep.t, (int64_t[]){0});
  st[1] = AND(keep, U("not", AND(row, ki)));
}

static pj_status_t *lower_nms_keep(pj_lower_t *L) {
  pj_val_t b = pj_tensor(L, "boxes");
  if (b.t.rank != 2 || b.t.dims[1] != 4)
    return pj_status_new(PJ_ERR_VALUE, "nms_keep: boxes must be [N, 4]");
  pj_dtype_t dt = b.t.dtype;
  if (dt != PJ_F32 && dt != PJ_F64)
    return pj_status_new(PJ_ERR_TYPE, "nms_keep: boxes must be float32 or float64");
  int64_t n = b.t.dims[0];
  pj_type_t nn = ty(dt, 2, n, n, 0);
  pj_val_t x1 = coord(L, b, 0), y1 = coord(L, b, 1), x2 = coord(L, b, 2), y2 = coord(L, b, 3);
  pj_val_t area = MUL(SUB(x2, x1), SUB(y2, y1));
  pj_val_t zero = zeros(L, nn);
  pj_val_t w = MAX(zero, SUB(MIN(as_col(L, x2, nn), as_row(L, x2, nn)),
                             MAX(as_col(L, x1, nn), as_row(L, x1, nn))));
  pj_val_t h = MAX(zero, SUB(MIN(as_col(L, y2, nn), as_row(L, y2, nn)),
                             MAX(as_col(L, y1, nn), as_row(L, y1, nn))));
  pj_val_t inter = MUL(w, h);
  pj_val_t iou = DIV(inter, SUB(ADD(as_col(L, area, nn), as_row(L, area, nn)), inter));
  double t = round_down(dt, pj_float(L, "iou_threshold", 0.0));
  pj_val_t over = CMP("GT", iou, pj_full(H, nn, t));
  /* only later boxes are suppressed by an earlier one */
  over = AND(over, CMP("GT", iota(L, nn, 1), iota(L, nn, 0)));
  pj_val_t st[2] = {over, pj_full(H, ty(PJ_BOOL, 1, n, 0, 0), 1)};
  loop_while(L, n, st, 2, nms_step, NULL, NULL);
  pj_set_result(L, 0, st[1]);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_vision[] = {
    {"tpu::nms_keep", lower_nms_keep, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
