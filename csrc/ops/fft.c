/* Lowerings: discrete Fourier transforms (_fft_c2c, _fft_r2c, _fft_c2r), the three primitives
 * every torch.fft function reaches: fft, ifft, fftn, the rfft, irfft, hfft and ihfft variants
 * and stft are composites over them plus conj and slicing.
 *
 * stablehlo.fft transforms the trailing 1-3 dims of its operand, so the requested dims are
 * transposed to the end (in the order given: the last listed dim is the halved one of the real
 * transforms), transformed, and transposed back. More than three dims are transformed in
 * groups: a multi-dimensional DFT is separable, so groups compose.
 *
 * Scaling: XLA's inverse transforms (IFFT, IRFFT) divide by the transformed size n, PyTorch's
 * primitives never do on their own; `normalization` then asks for 1 (0), 1/sqrt(n) (1) or
 * 1/n (2), whatever the direction. n is the product of the signal sizes (the real side's). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "table.h"
#include "emit.h"

#define MAX_GROUP 3 /* dims one stablehlo.fft can transform */

static pj_dtype_t part_of(pj_dtype_t dt) { return dt == PJ_C128 || dt == PJ_F64 ? PJ_F64 : PJ_F32; }
static pj_dtype_t complex_of(pj_dtype_t dt) { return part_of(dt) == PJ_F64 ? PJ_C128 : PJ_C64; }

/* Reads the dim list, normalized, into dims; returns its length (or -1 after an error). */
static int fft_dims(pj_lower_t *L, int rank, int *dims) {
  int64_t raw[PJ_MAX_RANK];
  int n = pj_ints(L, "dim", raw, PJ_MAX_RANK);
  if (n > PJ_MAX_RANK) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s over %d dims", L->c->op, n);
    return -1;
  }
  for (int i = 0; i < n; i++) dims[i] = pj_norm_dim(L, raw[i], rank);
  return pj_hlo_ok(H) ? (n < 0 ? 0 : n) : -1;
}

/* One stablehlo.fft of `type` over dims[0..nd) of x (nd <= 3), moved last in that order.
 * `last_len` is the signal length of the last dim for IRFFT (its input holds last_len/2 + 1
 * bins, sliced or zero-padded to that). */
static pj_val_t fft_over(pj_lower_t *L, pj_val_t x, const int *dims, int nd, const char *type,
                         int64_t last_len) {
  int rank = x.t.rank;
  int64_t perm[PJ_MAX_RANK], inv[PJ_MAX_RANK];
  bool moved[PJ_MAX_RANK] = {false};
  int k = 0;
  for (int i = 0; i < nd; i++) moved[dims[i]] = true;
  for (int i = 0; i < rank; i++)
    if (!moved[i]) perm[k++] = i;
  for (int i = 0; i < nd; i++) perm[k++] = dims[i];
  for (int i = 0; i < rank; i++) inv[perm[i]] = i;
  pj_val_t xt = pj_transpose(H, x, perm);
  bool irfft = !strcmp(type, "IRFFT"), rfft = !strcmp(type, "RFFT");
  if (irfft) { /* the input's last dim must be last_len / 2 + 1 bins */
    int64_t want = last_len / 2 + 1, have = xt.t.dims[rank - 1];
    if (have > want) {
      int64_t start[PJ_MAX_RANK] = {0}, limit[PJ_MAX_RANK];
      for (int i = 0; i < rank; i++) limit[i] = xt.t.dims[i];
      limit[rank - 1] = want;
      xt = pj_slice(H, xt, start, limit, NULL);
    } else if (have < want) {
      int64_t lo[PJ_MAX_RANK] = {0}, hi[PJ_MAX_RANK] = {0};
      hi[rank - 1] = want - have;
      xt = pj_pad(H, xt, pj_const(H, xt.t.dtype, 0), lo, hi, NULL);
    }
  }
  int64_t len[MAX_GROUP];
  for (int i = 0; i < nd; i++) len[i] = xt.t.dims[rank - nd + i];
  if (irfft) len[nd - 1] = last_len;
  pj_type_t ot = xt.t;
  if (rfft) {
    ot.dtype = complex_of(xt.t.dtype);
    ot.dims[rank - 1] = len[nd - 1] / 2 + 1;
  } else if (irfft) {
    ot.dtype = part_of(xt.t.dtype);
    ot.dims[rank - 1] = last_len;
  }
  char attrs[160];
  int w = snprintf(attrs, sizeof attrs, "fft_type = #stablehlo<fft_type %s>, fft_length = array<i64", type);
  for (int i = 0; i < nd; i++)
    w += snprintf(attrs + w, sizeof attrs - (size_t)w, "%s %lld", i ? "," : ":", (long long)len[i]);
  snprintf(attrs + w, sizeof attrs - (size_t)w, ">");
  pj_val_t y = pj_hlo_op(H, "stablehlo.fft", &xt, 1, attrs, ot);
  return pj_transpose(H, y, inv);
}

/* Complex-to-complex transform over any number of dims, in groups of up to three. */
static pj_val_t c2c(pj_lower_t *L, pj_val_t x, const int *dims, int nd, bool forward) {
  for (int i = 0; i < nd; i += MAX_GROUP) {
    int g = nd - i < MAX_GROUP ? nd - i : MAX_GROUP;
    x = fft_over(L, x, dims + i, g, forward ? "FFT" : "IFFT", 0);
  }
  return x;
}

/* Multiplies by PyTorch's normalization factor for signal size n, undoing XLA's 1/n for an
 * inverse transform first. */
static pj_val_t scale(pj_lower_t *L, pj_val_t y, double n, bool inverse) {
  int64_t mode = pj_int(L, "normalization", 0);
  double f = mode == 1 ? 1.0 / sqrt(n) : mode == 2 ? 1.0 / n : 1.0;
  if (inverse) f *= n;
  if (f == 1.0 || n == 0) return y;
  return MUL(y, pj_full(H, y.t, f));
}

static pj_status_t *lower_fft_c2c(pj_lower_t *L) {
  pj_dtype_t ct = complex_of(pj_out_type(L, 0).dtype);
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), ct);
  int dims[PJ_MAX_RANK];
  int nd = fft_dims(L, x.t.rank, dims);
  if (nd < 0) return NULL;
  bool forward = pj_bool(L, "forward", true);
  double n = 1;
  for (int i = 0; i < nd; i++) n *= (double)x.t.dims[dims[i]];
  pj_set_result(L, 0, scale(L, c2c(L, x, dims, nd, forward), n, !forward));
  return NULL;
}

static pj_status_t *lower_fft_r2c(pj_lower_t *L) {
  pj_dtype_t ct = complex_of(pj_out_type(L, 0).dtype);
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), part_of(ct));
  int dims[PJ_MAX_RANK];
  int nd = fft_dims(L, x.t.rank, dims);
  if (nd < 0) return NULL;
  double n = 1;
  for (int i = 0; i < nd; i++) n *= (double)x.t.dims[dims[i]];
  pj_val_t y;
  if (nd == 0) {
    y = pj_convert(H, x, ct);
  } else if (pj_bool(L, "onesided", true)) {
    /* the halved (last listed) dim first, as a real transform; the rest complex */
    y = c2c(L, fft_over(L, x, dims + nd - 1, 1, "RFFT", 0), dims, nd - 1, true);
  } else {
    y = c2c(L, pj_convert(H, x, ct), dims, nd, true);
  }
  pj_set_result(L, 0, scale(L, y, n, false));
  return NULL;
}

static pj_status_t *lower_fft_c2r(pj_lower_t *L) {
  pj_type_t out = pj_out_type(L, 0);
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), complex_of(out.dtype));
  int dims[PJ_MAX_RANK];
  int nd = fft_dims(L, x.t.rank, dims);
  if (nd < 0) return NULL;
  int64_t last = pj_int(L, "last_dim_size", 0);
  double n = 1;
  for (int i = 0; i < nd; i++) n *= (double)out.dims[dims[i]];
  if (nd == 0) {
    pj_set_result(L, 0, pj_convert(H, x, part_of(out.dtype)));
    return NULL;
  }
  /* the full dims first (complex inverse), then the halved one back to real */
  pj_val_t y = fft_over(L, c2c(L, x, dims, nd - 1, false), dims + nd - 1, 1, "IRFFT", last);
  pj_set_result(L, 0, scale(L, y, n, true));
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_fft[] = {
    {"_fft_c2c", lower_fft_c2c, PJ_SHAPE_EXACT},
    {"_fft_r2c", lower_fft_r2c, PJ_SHAPE_EXACT},
    {"_fft_c2r", lower_fft_c2r, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
