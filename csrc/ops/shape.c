/* Lowerings: shape family (data-moving shape ops). Views (view, slice, select, permute, expand,
 * ...) are metadata-only and never reach the lowerings; stack, repeat, constant_pad_nd and the
 * view backwards (select_backward, slice_backward, ...) are composite in PyTorch and arrive as
 * cat / copy_ / fill_. What remains: cat, flip, roll, tril/triu, and the reflection /
 * replication pads with their backwards. */
#include <stdio.h>
#include <string.h>

#include "slices.h"
#include <stdlib.h>

#include "table.h"
#include "emit.h"


static pj_status_t *lower_cat(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  int n = pj_list_len(L, "tensors");
  int dim = pj_norm_dim(L, pj_int(L, "dim", 0), ot.rank);
  /* on the heap: a pj_val_t holds PJ_MAX_RANK dims */
  pj_val_t *parts = malloc(sizeof(pj_val_t) * PJ_CALL_MAX_TENSORS);
  if (!parts) return pj_status_new(PJ_ERR_OOM, "out of host memory lowering aten::cat");
  int k = 0;
  for (int i = 0; i < n && k < PJ_CALL_MAX_TENSORS; i++) {
    const pj_tensor_desc_t *d = &L->c->tensors[pj_arg(L, "tensors")->first + i];
    int64_t numel = 1;
    for (int j = 0; j < d->rank; j++) numel *= d->sizes[j];
    /* empty inputs (including legacy 1-D [0] tensors of any other rank) add nothing */
    if (numel == 0) continue;
    parts[k++] = pj_convert(H, pj_tensor_at(L, "tensors", i), ot.dtype);
  }
  if (k == 0) { /* then the result is empty too: nothing to write */
    free(parts);
    if (pj_type_numel(&ot) == 0) return NULL;
    return pj_status_new(PJ_ERR_RUNTIME, "internal: cat with a non-empty result but "
                         "no non-empty input");
  }
  pj_set_result(L, 0, pj_concat(H, parts, k, dim));
  free(parts);
  return NULL;
}

static pj_status_t *lower_flip(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  int64_t dims[PJ_MAX_RANK];
  int nd = pj_ints(L, "dims", dims, PJ_MAX_RANK);
  bool flip[PJ_MAX_RANK] = {false};
  for (int i = 0; i < nd; i++) flip[pj_norm_dim(L, dims[i], x.t.rank)] = true;
  int64_t list[PJ_MAX_RANK];
  int nl = 0;
  for (int d = 0; d < x.t.rank; d++)
    if (flip[d] && x.t.dims[d] > 1) list[nl++] = d;
  if (nl == 0 || x.t.rank == 0) {
    pj_set_result(L, 0, x);
    return NULL;
  }
  char attrs[256];
  size_t len = (size_t)snprintf(attrs, sizeof attrs, "dimensions = array<i64");
  for (int i = 0; i < nl; i++)
    len += (size_t)snprintf(attrs + len, sizeof attrs - len, i ? ", %lld" : ": %lld",
                            (long long)list[i]);
  snprintf(attrs + len, sizeof attrs - len, ">");
  pj_set_result(L, 0, pj_hlo_op(H, "stablehlo.reverse", &x, 1, attrs, x.t));
  return NULL;
}

/* x rolled by s along dim: out[i] = x[(i - s) mod n]. */
static pj_val_t roll_dim(pj_lower_t *L, pj_val_t x, int dim, int64_t s) {
  int64_t n = x.t.dims[dim];
  if (n == 0) return x;
  s %= n;
  if (s < 0) s += n;
  if (s == 0) return x;
  int64_t st[PJ_MAX_RANK] = {0}, lim[PJ_MAX_RANK];
  for (int d = 0; d < x.t.rank; d++) lim[d] = x.t.dims[d];
  st[dim] = n - s;
  pj_val_t tail = pj_slice(H, x, st, lim, NULL);
  st[dim] = 0;
  lim[dim] = n - s;
  pj_val_t head = pj_slice(H, x, st, lim, NULL);
  pj_val_t parts[2] = {tail, head};
  return pj_concat(H, parts, 2, dim);
}

static pj_status_t *lower_roll(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  int64_t shifts[PJ_MAX_RANK], dims[PJ_MAX_RANK];
  int ns = pj_ints(L, "shifts", shifts, PJ_MAX_RANK);
  int nd = pj_ints(L, "dims", dims, PJ_MAX_RANK);
  if (nd <= 0) { /* roll the flattened tensor */
    int64_t n = pj_type_numel(&x.t);
    pj_val_t f = roll_dim(L, pj_reshape(H, x, 1, &n), 0, ns > 0 ? shifts[0] : 0);
    pj_set_result(L, 0, pj_reshape(H, f, x.t.rank, x.t.dims));
    return NULL;
  }
  if (nd != ns)
    return pj_status_new(PJ_ERR_RUNTIME, "shifts and dimensions must align. shifts: %d, dims:%d",
                         ns, nd);
  for (int i = 0; i < nd && i < PJ_MAX_RANK; i++)
    x = roll_dim(L, x, pj_norm_dim(L, dims[i], x.t.rank), shifts[i]);
  pj_set_result(L, 0, x);
  return NULL;
}

/* tril keeps col - row <= diagonal; triu keeps col - row >= diagonal (last two dims). */
static pj_status_t *lower_tril_triu(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), ot.dtype);
  int r = x.t.rank;
  if (r < 2) return pj_status_new(PJ_ERR_RUNTIME, "%s: input tensor must have at least 2 "
                                  "dimensions", L->c->op);
  pj_type_t it = pj_type_with_dtype(x.t, PJ_I64);
  pj_val_t diff = pj_binary(H, "stablehlo.subtract", pj_iota(H, it, r - 1), pj_iota(H, it, r - 2));
  pj_val_t k = pj_broadcast_in_dim(H, pj_const_i(H, PJ_I64, pj_int(L, "diagonal", 0)), it, NULL);
  pj_val_t keep = pj_compare(H, !strcmp(L->c->op, "tril") ? "LE" : "GE", diff, k);
  pj_set_result(L, 0, pj_select(H, keep, x, pj_full(H, x.t, 0)));
  return NULL;
}

/* ---- reflection / replication pads: out[j] = x[map(j)] along each padded dim ---- */

/* The source index of each of the n + lo + hi output positions (lo/hi may be negative: crop). */
static pj_val_t pad_map(pj_lower_t *L, int64_t n, int64_t lo, int64_t hi, bool reflect) {
  int64_t m = n + lo + hi;
  pj_type_t t = pj_type(PJ_I64, 1, &m);
  pj_val_t i = pj_binary(H, "stablehlo.subtract", pj_iota(H, t, 0), pj_full(H, t, (double)lo));
  pj_val_t zero = pj_full(H, t, 0), last = pj_full(H, t, (double)(n - 1));
  if (!reflect)
    return pj_binary(H, "stablehlo.minimum", pj_binary(H, "stablehlo.maximum", i, zero), last);
  i = pj_unary(H, "stablehlo.abs", i);
  pj_val_t mirrored = pj_binary(H, "stablehlo.subtract", pj_full(H, t, (double)(2 * (n - 1))), i);
  return pj_select(H, pj_compare(H, "GT", i, last), mirrored, i);
}

static pj_status_t *lower_pad(pj_lower_t *L) {
  const char *op = L->c->op;
  bool reflect = !strncmp(op, "reflection", 10);
  bool backward = strstr(op, "_backward") != NULL;
  const char *nd = strstr(op, "pad") + 3;
  int nsp = nd[0] - '0'; /* 1, 2 or 3 padded (trailing) dims */
  int64_t pad[6];
  if (pj_ints(L, "padding", pad, 6) != 2 * nsp)
    return pj_status_new(PJ_ERR_RUNTIME, "%s: padding must have %d elements", op, 2 * nsp);
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t self = pj_tensor(L, "self");
  int r = self.t.rank;
  if (!backward) {
    pj_val_t x = self;
    for (int i = 0; i < nsp; i++) {
      int dim = r - 1 - i;
      x = pj_take_slices(L, x, dim, pad_map(L, x.t.dims[dim], pad[2 * i], pad[2 * i + 1], reflect));
    }
    pj_set_result(L, 0, x);
    return NULL;
  }
  /* backward: each output position's gradient adds into its source position */
  pj_val_t g = pj_convert(H, pj_tensor(L, "grad_output"), ot.dtype);
  for (int i = 0; i < nsp; i++) {
    int dim = r - 1 - i;
    int64_t n = self.t.dims[dim];
    pj_type_t zt = g.t;
    zt.dims[dim] = n;
    g = pj_put_slices(L, pj_full(H, zt, 0), dim, pad_map(L, n, pad[2 * i], pad[2 * i + 1], reflect),
                      g, "add");
  }
  pj_set_result(L, 0, g);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_shape[] = {
    {"cat", lower_cat, PJ_SHAPE_EXACT},
    {"flip", lower_flip, PJ_SHAPE_EXACT},
    {"roll", lower_roll, PJ_SHAPE_EXACT},
    {"tril", lower_tril_triu, PJ_SHAPE_EXACT},
    {"triu", lower_tril_triu, PJ_SHAPE_EXACT},
    {"reflection_pad1d", lower_pad, PJ_SHAPE_EXACT},
    {"reflection_pad2d", lower_pad, PJ_SHAPE_EXACT},
    {"reflection_pad3d", lower_pad, PJ_SHAPE_EXACT},
    {"replication_pad1d", lower_pad, PJ_SHAPE_EXACT},
    {"replication_pad2d", lower_pad, PJ_SHAPE_EXACT},
    {"replication_pad3d", lower_pad, PJ_SHAPE_EXACT},
    {"reflection_pad1d_backward", lower_pad, PJ_SHAPE_EXACT},
    {"reflection_pad2d_backward", lower_pad, PJ_SHAPE_EXACT},
    {"reflection_pad3d_backward", lower_pad, PJ_SHAPE_EXACT},
    {"replication_pad1d_backward", lower_pad, PJ_SHAPE_EXACT},
    {"replication_pad2d_backward", lower_pad, PJ_SHAPE_EXACT},
    {"replication_pad3d_backward", lower_pad, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
