/* Strided views over 1-D storage values.
 *
 * A view (sizes S, strides T, offset o) is read, when possible, as a slice of a reshape: order
 * the dims that matter (size > 1, stride != 0) by decreasing stride p0..pr-1; if each stride
 * divides the previous one and the sizes fit (S[pk] <= T[pk-1] / T[pk]), then the elements are
 * segment = full[o : o + S[p0]*T[p0]] reshaped to [S[p0], T[p0]/T[p1], ..., T[pr-1]] and sliced
 * to [S[p0], S[p1], ..., 1]. Transposes, narrow/select/split of any dim and strided slices all
 * fit; the rest (overlapping as_strided) falls back to a gather of computed indices. Stride-0
 * (expanded) and size-1 dims are restored with broadcast_in_dim. */
#include "view_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int r;                  /* number of dims that matter */
  int pos[PJ_MAX_RANK];   /* their positions in the view, ordered by decreasing stride */
  int64_t S[PJ_MAX_RANK], T[PJ_MAX_RANK];
  bool fits;              /* the slice-of-reshape form applies */
  bool dense;             /* ... and the elements are contiguous in memory order */
} layout_t;

static void analyze(const pj_tensor_desc_t *d, layout_t *L) {
  L->r = 0;
  for (int i = 0; i < d->rank; i++)
    if (d->sizes[i] > 1 && d->strides[i] != 0) L->pos[L->r++] = i;
  /* insertion sort by decreasing stride; stable so equal strides keep view order */
  for (int a = 1; a < L->r; a++)
    for (int b = a; b > 0 && d->strides[L->pos[b]] > d->strides[L->pos[b - 1]]; b--) {
      int t = L->pos[b];
      L->pos[b] = L->pos[b - 1];
      L->pos[b - 1] = t;
    }
  L->fits = true;
  L->dense = true;
  for (int k = 0; k < L->r; k++) {
    L->S[k] = d->sizes[L->pos[k]];
    L->T[k] = d->strides[L->pos[k]];
    if (L->T[k] < 0) L->fits = false;
  }
  for (int k = 1; L->fits && k < L->r; k++) {
    if (L->T[k] == 0 || L->T[k - 1] % L->T[k] != 0 || L->S[k] > L->T[k - 1] / L->T[k])
      L->fits = false;
    else if (L->S[k] != L->T[k - 1] / L->T[k])
      L->dense = false;
  }
  if (L->r > 0 && L->T[L->r - 1] != 1) L->dense = false;
  L->dense = L->dense && L->fits;
}

static int64_t numel_of(const pj_tensor_desc_t *d) {
  int64_t n = 1;
  for (int i = 0; i < d->rank; i++) n *= d->sizes[i];
  return n;
}

/* Linear storage indices of every element of the view (i64, shape = view sizes). */
static pj_val_t linear_indices(pj_hlo_t *h, const pj_tensor_desc_t *d) {
  pj_type_t t = pj_type(PJ_I64, d->rank, d->sizes);
  pj_val_t acc = pj_full(h, t, 0);
  acc = pj_binary(h, "stablehlo.add", acc, pj_full(h, t, (double)d->offset));
  for (int i = 0; i < d->rank; i++) {
    if (d->sizes[i] <= 1 || d->strides[i] == 0) continue;
    pj_val_t io = pj_iota(h, t, i);
    pj_val_t st = pj_broadcast_in_dim(h, pj_const_i(h, PJ_I64, d->strides[i]), t, NULL);
    acc = pj_binary(h, "stablehlo.add", acc, pj_binary(h, "stablehlo.multiply", io, st));
  }
  return acc;
}

/* 1-D segment full[start : start + len], zero-padded past the end. */
static pj_val_t segment(pj_hlo_t *h, pj_val_t full, int64_t start, int64_t len) {
  int64_t n = full.t.dims[0];
  if (start + len > n) {
    int64_t lo = 0, hi = start + len - n;
    full = pj_pad(h, full, pj_const(h, full.t.dtype, 0), &lo, &hi, NULL);
  }
  int64_t s = start, l = start + len;
  return pj_slice(h, full, &s, &l, NULL);
}

pj_val_t pj_view_read(pj_hlo_t *h, pj_val_t full, const pj_tensor_desc_t *d) {
  pj_type_t out = pj_type(full.t.dtype, d->rank, d->sizes);
  if (numel_of(d) == 0) return pj_full(h, out, 0);
  layout_t L;
  analyze(d, &L);
  pj_val_t core; /* the dims that matter, in view order */
  int64_t core_dims[PJ_MAX_RANK];
  int core_pos[PJ_MAX_RANK], nc = 0;
  for (int i = 0; i < d->rank; i++)
    if (d->sizes[i] > 1 && d->strides[i] != 0) {
      core_pos[nc] = i;
      core_dims[nc++] = d->sizes[i];
    }
  if (L.r == 0) {
    core = pj_reshape(h, segment(h, full, d->offset, 1), 0, NULL);
  } else if (L.fits) {
    int64_t shape[PJ_MAX_RANK + 1], start[PJ_MAX_RANK + 1] = {0}, limit[PJ_MAX_RANK + 1];
    int nd = 0;
    shape[nd] = L.S[0];
    limit[nd++] = L.S[0];
    for (int k = 1; k < L.r; k++) {
      shape[nd] = L.T[k - 1] / L.T[k];
      limit[nd++] = L.S[k];
    }
    bool inner = L.T[L.r - 1] > 1;
    if (inner) {
      shape[nd] = L.T[L.r - 1];
      limit[nd++] = 1;
    }
    if (nd > PJ_MAX_RANK) {
      L.fits = false;
    } else {
      pj_val_t seg = segment(h, full, d->offset, L.S[0] * L.T[0]);
      pj_val_t x = pj_slice(h, pj_reshape(h, seg, nd, shape), start, limit, NULL);
      x = pj_reshape(h, x, L.r, L.S); /* drops the inner unit dim */
      /* x is in stride order; permute to view order. perm[j] = index in stride order of the
       * j-th core dim in view order. */
      int64_t perm[PJ_MAX_RANK];
      for (int j = 0; j < nc; j++)
        for (int k = 0; k < L.r; k++)
          if (L.pos[k] == core_pos[j]) perm[j] = k;
      core = pj_transpose(h, x, perm);
    }
  }
  if (L.r > 0 && !L.fits) {
    pj_tensor_desc_t cd = *d;
    cd.rank = nc;
    for (int j = 0; j < nc; j++) {
      cd.sizes[j] = d->sizes[core_pos[j]];
      cd.strides[j] = d->strides[core_pos[j]];
    }
    core = pj_gather_1d(h, full, linear_indices(h, &cd));
  }
  (void)core_dims;
  int64_t bd[PJ_MAX_RANK];
  for (int j = 0; j < nc; j++) bd[j] = core_pos[j];
  return pj_broadcast_in_dim(h, core, out, bd);
}

pj_val_t pj_view_write(pj_hlo_t *h, pj_val_t full, int64_t numel, pj_dtype_t dt,
                       const pj_tensor_desc_t *d, pj_val_t v) {
  int64_t n = numel_of(d);
  if (full.id < 0) full = pj_full(h, pj_type(dt, 1, &numel), 0);
  if (n == 0) return full;
  layout_t L;
  analyze(d, &L);
  if (L.dense) {
    /* Memory order = decreasing stride: transpose the value into it, flatten. */
    int64_t perm[PJ_MAX_RANK];
    int np = 0;
    for (int k = 0; k < L.r; k++) perm[np++] = L.pos[k];
    /* size-1 dims carry no data: drop them first so perm covers all remaining dims */
    int64_t core_dims[PJ_MAX_RANK];
    int map[PJ_MAX_RANK], nc = 0;
    for (int i = 0; i < d->rank; i++)
      if (d->sizes[i] > 1) {
        map[i] = nc;
        core_dims[nc++] = d->sizes[i];
      }
    if (nc == L.r) {
      pj_val_t x = pj_reshape(h, v, nc, core_dims);
      for (int k = 0; k < np; k++) perm[k] = map[perm[k]];
      x = pj_transpose(h, x, perm);
      x = pj_reshape(h, x, 1, &n);
      if (d->offset == 0 && n == numel) return x;
      pj_val_t idx = pj_const_i(h, PJ_I64, d->offset);
      pj_val_t ins[3] = {full, x, idx};
      return pj_hlo_op(h, "stablehlo.dynamic_update_slice", ins, 3, NULL, full.t);
    }
  }
  return pj_scatter_1d(h, full, linear_indices(h, d), v, NULL);
}

/* Complex elements are (real, imag) pairs of their part type in memory; XLA's bitcast_convert
 * rejects complex types, so they are split into or assembled from interleaved parts. */
static pj_val_t complex_bitcast(pj_hlo_t *h, pj_val_t full, pj_dtype_t dt) {
  if (pj_dtype_info(full.t.dtype)->is_complex) {
    int64_t n = full.t.dims[0], col[2] = {n, 1}, m = 2 * n;
    pj_val_t re = pj_reshape(h, pj_unary(h, "stablehlo.real", full), 2, col);
    pj_val_t im = pj_reshape(h, pj_unary(h, "stablehlo.imag", full), 2, col);
    pj_val_t pair[2] = {re, im};
    return pj_view_bitcast(h, pj_reshape(h, pj_concat(h, pair, 2, 1), 1, &m), dt);
  }
  pj_dtype_t pt = dt == PJ_C128 ? PJ_F64 : PJ_F32;
  pj_val_t parts = pj_view_bitcast(h, full, pt);
  if (parts.id < 0) return parts;
  int64_t n = parts.t.dims[0];
  if (n % 2)
    return pj_hlo_fail(h, PJ_ERR_RUNTIME, "a storage of %lld %s elements is not a whole number of %s",
                       (long long)n, pj_dtype_info(pt)->name, pj_dtype_info(dt)->name);
  int64_t m = n / 2, d2[2] = {m, 2}, start[2] = {0, 0}, limit[2] = {m, 1};
  pj_val_t x = pj_reshape(h, parts, 2, d2);
  pj_val_t re = pj_reshape(h, pj_slice(h, x, start, limit, NULL), 1, &m);
  start[1] = 1;
  limit[1] = 2;
  pj_val_t im = pj_reshape(h, pj_slice(h, x, start, limit, NULL), 1, &m);
  pj_val_t ins[2] = {re, im};
  return pj_hlo_op(h, "stablehlo.complex", ins, 2, NULL, pj_type(dt, 1, &m));
}

pj_val_t pj_view_bitcast(pj_hlo_t *h, pj_val_t full, pj_dtype_t dt) {
  if (full.id < 0 || full.t.dtype == dt) return full;
  if (pj_dtype_info(full.t.dtype)->is_complex || pj_dtype_info(dt)->is_complex)
    return complex_bitcast(h, full, dt);
  size_t a = pj_dtype_info(full.t.dtype)->itemsize, b = pj_dtype_info(dt)->itemsize;
  if (full.t.dtype == PJ_BOOL || dt == PJ_BOOL) {
    if (a == b) return pj_convert(h, full, dt); /* bool <-> 8-bit: the bits are 0/1 */
    if (full.t.dtype == PJ_BOOL) full = pj_convert(h, full, PJ_U8);
    else full = pj_view_bitcast(h, full, PJ_U8);
    return dt == PJ_BOOL ? pj_convert(h, full, dt) : pj_view_bitcast(h, full, dt);
  }
  int64_t n = full.t.dims[0];
  if (a == b)
    return pj_hlo_op(h, "stablehlo.bitcast_convert", &full, 1, NULL, pj_type_with_dtype(full.t, dt));
  if (a > b) { /* e.g. float32[n] as uint8[4n]: bitcast to [n, 4], flatten */
    int64_t d2[2] = {n, (int64_t)(a / b)}, m = n * (int64_t)(a / b);
    pj_val_t x = pj_hlo_op(h, "stablehlo.bitcast_convert", &full, 1, NULL, pj_type(dt, 2, d2));
    return pj_reshape(h, x, 1, &m);
  }
  /* e.g. uint8[4n] as float32[n]: group the bytes, bitcast each group */
  int64_t k = (int64_t)(b / a);
  if (n % k)
    return pj_hlo_fail(h, PJ_ERR_RUNTIME, "a storage of %lld %s elements is not a whole number of %s",
                       (long long)n, pj_dtype_info(full.t.dtype)->name, pj_dtype_info(dt)->name);
  int64_t d2[2] = {n / k, k}, m = n / k;
  pj_val_t x = pj_reshape(h, full, 2, d2);
  return pj_hlo_op(h, "stablehlo.bitcast_convert", &x, 1, NULL, pj_type(dt, 1, &m));
}

/* ---- views at a runtime offset (pj_tensor_desc_t.dyn_offset) ---- */

int64_t pj_view_span(const pj_tensor_desc_t *d) {
  int64_t span = 1;
  for (int i = 0; i < d->rank; i++) {
    if (d->sizes[i] == 0) return 0;
    span += (d->sizes[i] - 1) * d->strides[i];
  }
  return span;
}

/* full[off : off + span] (a valid view lies inside its storage, so dynamic_slice's clamping of
 * the start never applies). */
static pj_val_t span_at(pj_hlo_t *h, pj_val_t full, pj_val_t off, int64_t span) {
  char attrs[64];
  snprintf(attrs, sizeof attrs, "slice_sizes = array<i64: %lld>", (long long)span);
  pj_val_t ins[2] = {full, pj_convert(h, off, PJ_I64)};
  return pj_hlo_op(h, "stablehlo.dynamic_slice", ins, 2, attrs,
                   pj_type(full.t.dtype, 1, &span));
}

pj_val_t pj_view_read_at(pj_hlo_t *h, pj_val_t full, const pj_tensor_desc_t *d, pj_val_t off) {
  const int64_t span = pj_view_span(d);
  pj_tensor_desc_t at = *d;
  at.offset = 0;
  at.dyn_offset = false;
  if (span == 0 || full.id < 0) return pj_view_read(h, full, &at);
  if (span > full.t.dims[0])
    return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: a view reaching %lld elements of a storage "
                       "of %lld", (long long)span, (long long)full.t.dims[0]);
  return pj_view_read(h, span_at(h, full, off, span), &at);
}

pj_val_t pj_view_write_at(pj_hlo_t *h, pj_val_t full, int64_t numel, pj_dtype_t dt,
                          const pj_tensor_desc_t *d, const pj_val_t *off, pj_val_t v) {
  const int64_t span = pj_view_span(d);
  if (!off || span == 0) return pj_view_write(h, full, numel, dt, d, v);
  if (span > numel)
    return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: a view reaching %lld elements of a storage "
                       "of %lld", (long long)span, (long long)numel);
  if (full.id < 0) full = pj_full(h, pj_type(dt, 1, &numel), 0); /* a fresh storage: zeros */
  pj_tensor_desc_t at = *d;
  at.offset = 0;
  at.dyn_offset = false;
  pj_val_t start = pj_convert(h, *off, PJ_I64);
  pj_val_t part = pj_view_write(h, span_at(h, full, start, span), span, dt, &at, v);
  pj_val_t ins[3] = {full, part, start};
  return pj_hlo_op(h, "stablehlo.dynamic_update_slice", ins, 3, NULL, full.t);
}
