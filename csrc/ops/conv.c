/* Lowerings: conv family (convolution, pooling, upsampling; forward and backward).
 *
 * Spatial ops read their geometry (kernel, stride, padding, dilation, sizes) as compile-time
 * int lists and take output sizes from the destinations (PyTorch's Meta kernels computed and
 * validated them), so only the arithmetic lives here. Layout: inputs are [lead..., spatial...]
 * with nsp = 1..3 trailing spatial dims (the op name's digit, or rank - 2 for convolution).
 *
 * Compute dtype: float16/bfloat16 accumulate in float32 (as CPU's kernels do) and are rounded
 * once when the destination is set; other dtypes compute in their own type.
 *
 * Index tables that depend only on sizes (upsampling sources and weights, pooling divisors,
 * adaptive-pool windows) are computed here in C with CPU's formulas and emitted as constants,
 * so results match CPU's choices exactly (including its float32 index arithmetic). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../hlo/strbuf.h"
#include "table.h"
#include "emit.h"

#define MAXSP 3

static const pj_val_t kBad = {.id = -1, .sub = -1};


/* ---- attribute text helpers ---- */

static void sb_array(pj_sb_t *b, const char *name, const int64_t *v, int n) {
  pj_sb_printf(b, "%s = array<i64", name);
  for (int i = 0; i < n; i++) pj_sb_printf(b, i ? ", %lld" : ": %lld", (long long)v[i]);
  pj_sb_puts(b, ">");
}

static void sb_padding(pj_sb_t *b, const int64_t *lo, const int64_t *hi, int n) {
  pj_sb_puts(b, "padding = dense<[");
  for (int i = 0; i < n; i++)
    pj_sb_printf(b, "%s[%lld, %lld]", i ? ", " : "", (long long)lo[i], (long long)hi[i]);
  pj_sb_printf(b, "]> : tensor<%dx2xi64>", n);
}

/* Emits op with attributes accumulated in b (freed); optional region text. */
static bool emit(pj_lower_t *L, const char *op, const pj_val_t *ins, int n, const char *region,
                 pj_sb_t *b, const pj_type_t *outs, int nout, pj_val_t *res) {
  char *attrs = pj_sb_take(b, NULL);
  if (!attrs) {
    pj_fail(L, PJ_ERR_OOM, "out of memory building %s", op);
    for (int i = 0; i < nout; i++) res[i] = kBad;
    return false;
  }
  bool ok = pj_hlo_op_multi(H, op, ins, n, region, attrs, outs, nout, res);
  free(attrs);
  return ok;
}

/* A 1-D constant of n values of dtype dt (ints exact up to 2^53 via the double array). */
static pj_val_t const_vec(pj_lower_t *L, pj_dtype_t dt, const double *v, int64_t n) {
  pj_sb_t b = {0};
  pj_type_t t = pj_type(dt, 1, &n);
  char ts[64];
  bool is_f = pj_dtype_info(dt)->is_float;
  pj_sb_puts(&b, "value = dense<[");
  for (int64_t i = 0; i < n; i++) {
    if (is_f)
      pj_sb_printf(&b, i ? ", %.17e" : "%.17e", v[i]);
    else
      pj_sb_printf(&b, i ? ", %lld" : "%lld", (long long)v[i]);
  }
  pj_sb_printf(&b, "]> : %s", pj_type_str(&t, ts, sizeof ts));
  pj_val_t r;
  emit(L, "stablehlo.constant", NULL, 0, NULL, &b, &t, 1, &r);
  return r;
}

/* A 1-D table broadcast along dim `axis` of shape t (dtype of t). */
static pj_val_t table_along(pj_lower_t *L, const double *v, pj_type_t t, int axis) {
  pj_val_t c = const_vec(L, t.dtype, v, t.dims[axis]);
  int64_t d = axis;
  return pj_broadcast_in_dim(H, c, t, &d);
}

static double *dalloc(pj_lower_t *L, int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (!p) pj_fail(L, PJ_ERR_OOM, "out of host memory building a constant table");
  return p;
}

/* Reads an int[nsp] geometry argument; a single value applies to every spatial dim, an empty
 * or missing list gives dflt (NULL: all `fill`). Returns false (error recorded) on a bad
 * length. */
static bool geom(pj_lower_t *L, const char *name, int nsp, int64_t *out, const int64_t *dflt,
                 int64_t fill) {
  int64_t v[8];
  int n = pj_ints(L, name, v, 8);
  if (n <= 0) {
    for (int i = 0; i < nsp; i++) out[i] = dflt ? dflt[i] : fill;
    return true;
  }
  if (n != 1 && n != nsp) {
    pj_fail(L, PJ_ERR_VALUE, "%s: expected %d values for %s, got %d", L->c->op, nsp, name, n);
    return false;
  }
  for (int i = 0; i < nsp; i++) out[i] = v[n == 1 ? 0 : i];
  return true;
}

/* The digit in an op name ("max_pool3d_with_indices" -> 3); 0 if none. */
static int name_nsp(const char *op) {
  for (const char *p = op; *p; p++)
    if (*p >= '1' && *p <= '3' && p[1] == 'd') return *p - '0';
  return 0;
}

/* ---- convolution core ---- */

/* Layout of a convolution: per operand, the roles of dims 0 and 1 ("bf", "fb", "oi", "io");
 * the spatial dims follow in order. */
typedef struct {
  int nsp;
  const char *lhs, *rhs, *out;
  int64_t stride[MAXSP], lo[MAXSP], hi[MAXSP], lhs_dil[MAXSP], rhs_dil[MAXSP];
  int64_t fgc, bgc;
} conv_spec_t;

static int role_pos(const char *two, char role) { return two[0] == role ? 0 : 1; }

static void sb_layout(pj_sb_t *b, const char *two, int nsp) {
  pj_sb_printf(b, "[%c, %c", two[0], two[1]);
  for (int i = 0; i < nsp; i++) pj_sb_printf(b, ", %d", i);
  pj_sb_puts(b, "]");
}

/* stablehlo.convolution with result dtype ct. Negative padding (a crop) is applied to the
 * lhs with an explicit pad first (which also carries the lhs dilation then), since windows
 * take only non-negative padding. */
static pj_val_t conv_emit(pj_lower_t *L, pj_val_t lhs, pj_val_t rhs, conv_spec_t s,
                          pj_dtype_t ct) {
  if (lhs.id < 0 || rhs.id < 0) return kBad;
  int nsp = s.nsp;
  bool neg = false;
  for (int i = 0; i < nsp; i++) neg = neg || s.lo[i] < 0 || s.hi[i] < 0;
  if (neg) {
    int64_t lo[PJ_MAX_RANK] = {0}, hi[PJ_MAX_RANK] = {0}, in[PJ_MAX_RANK] = {0};
    for (int i = 0; i < nsp; i++) {
      lo[2 + i] = s.lo[i] < 0 ? s.lo[i] : 0;
      hi[2 + i] = s.hi[i] < 0 ? s.hi[i] : 0;
      in[2 + i] = s.lhs_dil[i] - 1;
      s.lo[i] -= lo[2 + i];
      s.hi[i] -= hi[2 + i];
      s.lhs_dil[i] = 1;
    }
    lhs = pj_pad(H, lhs, pj_const(H, lhs.t.dtype, 0), lo, hi, in);
    if (lhs.id < 0) return kBad;
  }
  pj_type_t ot = {.dtype = ct, .rank = nsp + 2};
  int lb = role_pos(s.lhs, 'b'), ro = role_pos(s.rhs, 'o');
  ot.dims[role_pos(s.out, 'b')] = lhs.t.dims[lb] / s.bgc;
  ot.dims[role_pos(s.out, 'f')] = rhs.t.dims[ro];
  for (int i = 0; i < nsp; i++) {
    int64_t in = lhs.t.dims[2 + i], k = rhs.t.dims[2 + i];
    int64_t padded = (in > 0 ? (in - 1) * s.lhs_dil[i] + 1 : 0) + s.lo[i] + s.hi[i];
    int64_t win = (k - 1) * s.rhs_dil[i] + 1;
    ot.dims[2 + i] = padded < win ? 0 : (padded - win) / s.stride[i] + 1;
  }
  pj_sb_t b = {0};
  pj_sb_puts(&b, "dimension_numbers = #stablehlo.conv<");
  sb_layout(&b, s.lhs, nsp);
  pj_sb_puts(&b, "x");
  sb_layout(&b, s.rhs, nsp);
  pj_sb_puts(&b, "->");
  sb_layout(&b, s.out, nsp);
  pj_sb_puts(&b, ">, ");
  sb_array(&b, "window_strides", s.stride, nsp);
  pj_sb_puts(&b, ", ");
  sb_padding(&b, s.lo, s.hi, nsp);
  pj_sb_puts(&b, ", ");
  sb_array(&b, "lhs_dilation", s.lhs_dil, nsp);
  pj_sb_puts(&b, ", ");
  sb_array(&b, "rhs_dilation", s.rhs_dil, nsp);
  pj_sb_printf(&b, ", feature_group_count = %lld : i64, batch_group_count = %lld : i64",
               (long long)s.fgc, (long long)s.bgc);
  pj_sb_puts(&b, pj_hlo_precision_config(lhs.t.dtype));
  pj_val_t ins[2] = {lhs, rhs}, r;
  emit(L, "stablehlo.convolution", ins, 2, NULL, &b, &ot, 1, &r);
  return r;
}

/* Operands of a convolution in compute dtype ct: low floats stay low (the product comes out
 * in f32 from the convolution itself); others convert. */
static pj_val_t conv_operand(pj_lower_t *L, pj_val_t x, pj_dtype_t ct) {
  return x.t.dtype == PJ_F16 || x.t.dtype == PJ_BF16 ? x : pj_convert(H, x, ct);
}

typedef struct {
  int nsp;
  int64_t stride[MAXSP], pad[MAXSP], dil[MAXSP], outpad[MAXSP];
  int64_t groups;
} conv_geom_t;

static conv_spec_t spec_init(int nsp, const char *lhs, const char *rhs, const char *out) {
  conv_spec_t s = {.nsp = nsp, .lhs = lhs, .rhs = rhs, .out = out, .fgc = 1, .bgc = 1};
  for (int i = 0; i < MAXSP; i++) s.stride[i] = s.lhs_dil[i] = s.rhs_dil[i] = 1;
  return s;
}

/* y = conv(x, w): x [N, C, sp], w [O, C/g, k] -> [N, O, osp]. */
static pj_val_t conv_fwd(pj_lower_t *L, pj_val_t x, pj_val_t w, const conv_geom_t *g,
                         pj_dtype_t ct) {
  conv_spec_t s = spec_init(g->nsp, "bf", "oi", "bf");
  for (int i = 0; i < g->nsp; i++) {
    s.stride[i] = g->stride[i];
    s.lo[i] = s.hi[i] = g->pad[i];
    s.rhs_dil[i] = g->dil[i];
  }
  s.fgc = g->groups;
  return conv_emit(L, conv_operand(L, x, ct), conv_operand(L, w, ct), s, ct);
}

/* Transposed convolution (the input-gradient of conv_fwd): x [N, Cin, sp], w [Cin, O/g, k]
 * -> [N, O, osp] with osp = (sp-1)*s - 2p + d(k-1) + 1 + outpad. As a forward convolution:
 * lhs dilated by the stride, padded by d(k-1) - p (+ outpad at the end), with the kernel's
 * spatial dims reversed and its feature dims swapped within each group. */
static pj_val_t conv_tr(pj_lower_t *L, pj_val_t x, pj_val_t w, const conv_geom_t *g,
                        pj_dtype_t ct) {
  if (x.id < 0 || w.id < 0) return kBad;
  int nsp = g->nsp;
  int64_t G = g->groups, cin = w.t.dims[0], og = w.t.dims[1], cg = cin / G;
  int64_t d5[PJ_MAX_RANK], perm[PJ_MAX_RANK], d3[PJ_MAX_RANK], rev[MAXSP];
  d5[0] = G;
  d5[1] = cg;
  d5[2] = og;
  perm[0] = 0;
  perm[1] = 2;
  perm[2] = 1;
  d3[0] = G * og;
  d3[1] = cg;
  for (int i = 0; i < nsp; i++) {
    d5[3 + i] = w.t.dims[2 + i];
    perm[3 + i] = 3 + i;
    d3[2 + i] = w.t.dims[2 + i];
    rev[i] = 2 + i;
  }
  pj_val_t wt = pj_reshape(H, conv_operand(L, w, ct), 3 + nsp, d5);
  wt = pj_transpose(H, wt, perm);
  wt = pj_reshape(H, wt, 2 + nsp, d3);
  pj_sb_t b = {0};
  sb_array(&b, "dimensions", rev, nsp);
  pj_val_t wr;
  emit(L, "stablehlo.reverse", &wt, 1, NULL, &b, &wt.t, 1, &wr);
  conv_spec_t s = spec_init(nsp, "bf", "oi", "bf");
  for (int i = 0; i < nsp; i++) {
    int64_t span = g->dil[i] * (w.t.dims[2 + i] - 1);
    s.lo[i] = span - g->pad[i];
    s.hi[i] = span - g->pad[i] + g->outpad[i];
    s.lhs_dil[i] = g->stride[i];
    s.rhs_dil[i] = g->dil[i];
  }
  s.fgc = G;
  return conv_emit(L, conv_operand(L, x, ct), wr, s, ct);
}

/* Weight gradient of conv_fwd: x [N, C, sp], go [N, O, osp] -> [O, C/g, k]. The batch is
 * contracted, so it is the convolution's feature dim; the window walks x with the dilation
 * as stride and go's spatial dims (dilated by the stride) as the kernel.
 *
 * Groups are a feature_group_count, not a batch_group_count: x's features become
 * (group, batch) pairs, [G*N, C/g, sp] with the group major, and go read as an "io" kernel
 * [N, O, osp] already pairs its output features group by group, so the result's batch is
 * C/g and its features O. XLA's CPU compiler rewrites a batch_group_count convolution into a
 * dense one over all C channels with a mask (time and memory ~ C^2 for a depthwise conv);
 * feature groups it runs as they are, so this costs what the forward does (linear in C).
 * With G == 1 the relayout is the identity and is skipped. */
static pj_val_t conv_wgrad(pj_lower_t *L, pj_val_t x, pj_val_t go, const int64_t *k,
                           const conv_geom_t *g, pj_dtype_t ct) {
  if (x.id < 0 || go.id < 0) return kBad;
  int nsp = g->nsp;
  int64_t G = g->groups, N = x.t.dims[0], cg = x.t.dims[1] / G;
  pj_val_t lhs = conv_operand(L, x, ct);
  if (G > 1) {
    int64_t d4[PJ_MAX_RANK], perm[PJ_MAX_RANK], d3[PJ_MAX_RANK];
    d4[0] = N;
    d4[1] = G;
    d4[2] = cg;
    perm[0] = 1;
    perm[1] = 0;
    perm[2] = 2;
    d3[0] = G * N;
    d3[1] = cg;
    for (int i = 0; i < nsp; i++) {
      d4[3 + i] = x.t.dims[2 + i];
      perm[3 + i] = 3 + i;
      d3[2 + i] = x.t.dims[2 + i];
    }
    lhs = pj_reshape(H, lhs, 3 + nsp, d4);
    lhs = pj_transpose(H, lhs, perm);
    lhs = pj_reshape(H, lhs, 2 + nsp, d3);
  }
  conv_spec_t s = spec_init(nsp, "fb", "io", "fb");
  for (int i = 0; i < nsp; i++) {
    int64_t in = x.t.dims[2 + i], on = go.t.dims[2 + i];
    s.stride[i] = g->dil[i];
    s.rhs_dil[i] = g->stride[i];
    s.lo[i] = g->pad[i];
    s.hi[i] = g->dil[i] * (k[i] - 1) + g->stride[i] * (on - 1) + 1 - in - g->pad[i];
  }
  s.fgc = G;
  return conv_emit(L, lhs, conv_operand(L, go, ct), s, ct);
}

static bool conv_geometry(pj_lower_t *L, int nsp, conv_geom_t *g) {
  g->nsp = nsp;
  g->groups = pj_int(L, "groups", 1);
  if (g->groups < 1) {
    pj_fail(L, PJ_ERR_VALUE, "non-positive groups is not supported");
    return false;
  }
  return geom(L, "stride", nsp, g->stride, NULL, 1) && geom(L, "padding", nsp, g->pad, NULL, 0) &&
         geom(L, "dilation", nsp, g->dil, NULL, 1) &&
         geom(L, "output_padding", nsp, g->outpad, NULL, 0);
}

/* The dtypes CPU's kernels accept, per op (others raise NotImplementedError there too). */
enum {
  DT_FLOAT = 1,  /* floating point and complex */
  DT_I64 = 2,
  DT_U8 = 4,
  DT_INT = 8, /* every integer type (not bool) */
};

static bool dtype_ok(pj_lower_t *L, pj_dtype_t dt, int allowed) {
  const pj_dtype_info_t *i = pj_dtype_info(dt);
  bool ok = ((allowed & DT_FLOAT) && (i->is_float || i->is_complex)) ||
            ((allowed & DT_I64) && dt == PJ_I64) || ((allowed & DT_U8) && dt == PJ_U8) ||
            ((allowed & DT_INT) && pj_dtype_is_integral(dt));
  if (!ok)
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"%s\" not implemented for '%s'", L->c->op, i->name);
  return ok;
}

static bool conv_dtype_ok(pj_lower_t *L, pj_dtype_t dt) {
  return dtype_ok(L, dt, DT_FLOAT | DT_INT);
}

static void set_checked(pj_lower_t *L, int k, pj_val_t v) {
  pj_type_t t = pj_out_type(L, k);
  if (v.id >= 0 && !pj_type_same_shape(&v.t, &t)) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: %s result %d has the wrong shape", L->c->op, k);
    return;
  }
  pj_set_result(L, k, v);
}

static pj_status_t *lower_convolution(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "input"), w = pj_tensor(L, "weight");
  if (x.id < 0 || w.id < 0) return NULL;
  int nsp = x.t.rank - 2;
  if (nsp < 1 || nsp > MAXSP || w.t.rank != x.t.rank) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "convolution of rank-%d input", x.t.rank);
    return NULL;
  }
  if (!conv_dtype_ok(L, x.t.dtype)) return NULL;
  conv_geom_t g;
  if (!conv_geometry(L, nsp, &g)) return NULL;
  pj_dtype_t ct = pj_dtype_compute(pj_out_type(L, 0).dtype);
  pj_val_t y = pj_bool(L, "transposed", false) ? conv_tr(L, x, w, &g, ct)
                                               : conv_fwd(L, x, w, &g, ct);
  if (pj_has(L, "bias") && y.id >= 0) {
    int64_t one = 1;
    pj_val_t b = pj_convert(H, pj_tensor(L, "bias"), ct);
    y = pj_binary(H, "stablehlo.add", y, pj_broadcast_in_dim(H, b, y.t, &one));
  }
  set_checked(L, 0, y);
  return NULL;
}

/* Gradients per output_mask. Destinations: one per true mask entry (undefined returns have
 * none), or all three for the out= overload (a masked-off out tensor keeps its value). */
static pj_status_t *lower_convolution_backward(pj_lower_t *L) {
  pj_val_t go = pj_tensor(L, "grad_output"), x = pj_tensor(L, "input");
  pj_val_t w = pj_tensor(L, "weight");
  if (go.id < 0 || x.id < 0 || w.id < 0) return NULL;
  int nsp = x.t.rank - 2;
  if (nsp < 1 || nsp > MAXSP) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "convolution_backward of rank-%d input", x.t.rank);
    return NULL;
  }
  if (!conv_dtype_ok(L, x.t.dtype)) return NULL;
  conv_geom_t g;
  if (!conv_geometry(L, nsp, &g)) return NULL;
  int64_t mask[3] = {1, 1, 1};
  pj_ints(L, "output_mask", mask, 3);
  bool transposed = pj_bool(L, "transposed", false);
  int nout = pj_nout(L);
  static const char *const outs[3] = {"out0", "out1", "out2"};
  int k = 0;
  for (int i = 0; i < 3; i++) {
    if (!mask[i]) {
      if (nout == 3 && pj_has(L, outs[i])) pj_set_result(L, k++, pj_tensor(L, outs[i]));
      continue;
    }
    if (k >= nout) break; /* an empty gradient has no destination */
    pj_dtype_t ct = pj_dtype_compute(pj_out_type(L, k).dtype);
    pj_val_t r;
    if (i == 0) {
      if (transposed) {
        r = conv_fwd(L, go, w, &g, ct);
      } else {
        /* output padding that restores the input's size */
        conv_geom_t gi = g;
        for (int j = 0; j < nsp; j++)
          gi.outpad[j] = x.t.dims[2 + j] - ((go.t.dims[2 + j] - 1) * g.stride[j] -
                                            2 * g.pad[j] + g.dil[j] * (w.t.dims[2 + j] - 1) + 1);
        r = conv_tr(L, go, w, &gi, ct);
      }
    } else if (i == 1) {
      /* a transposed convolution's weight gradient is the forward one with the roles of
       * input and output gradient exchanged */
      r = transposed ? conv_wgrad(L, go, x, &w.t.dims[2], &g, ct)
                     : conv_wgrad(L, x, go, &w.t.dims[2], &g, ct);
    } else {
      int64_t dims[PJ_MAX_RANK];
      int n = 0;
      for (int j = 0; j < go.t.rank; j++)
        if (j != 1) dims[n++] = j;
      r = pj_reduce(H, pj_convert(H, go, ct), dims, n, "add");
    }
    set_checked(L, k++, r);
  }
  return NULL;
}

/* ---- windows (pooling) ---- */

/* reduce_window over full-rank window arrays; n operands with n init values; `region` is the
 * combiner's text. Results have types outs[0..n). */
static bool reduce_window(pj_lower_t *L, const pj_val_t *xs, const pj_val_t *inits, int n,
                          const char *region, const int64_t *win, const int64_t *str,
                          const int64_t *dil, const int64_t *lo, const int64_t *hi,
                          pj_val_t *res) {
  pj_val_t ins[4];
  pj_type_t outs[2];
  int r = xs[0].t.rank;
  for (int i = 0; i < n; i++) {
    ins[i] = xs[i];
    ins[n + i] = inits[i];
    outs[i] = xs[i].t;
    for (int d = 0; d < r; d++) {
      int64_t padded = xs[i].t.dims[d] + lo[d] + hi[d];
      int64_t w = (win[d] - 1) * (dil ? dil[d] : 1) + 1;
      outs[i].dims[d] = padded < w ? 0 : (padded - w) / str[d] + 1;
    }
  }
  pj_sb_t b = {0};
  sb_array(&b, "window_dimensions", win, r);
  pj_sb_puts(&b, ", ");
  sb_array(&b, "window_strides", str, r);
  if (dil) {
    pj_sb_puts(&b, ", ");
    sb_array(&b, "window_dilations", dil, r);
  }
  pj_sb_puts(&b, ", ");
  sb_padding(&b, lo, hi, r);
  return emit(L, "stablehlo.reduce_window", ins, 2 * n, region, &b, outs, n, res);
}

static pj_val_t window_sum(pj_lower_t *L, pj_val_t x, const int64_t *win, const int64_t *str,
                           const int64_t *lo, const int64_t *hi) {
  if (x.id < 0) return kBad;
  pj_type_t st = pj_type_scalar(x.t.dtype);
  pj_type_t sts[2] = {st, st};
  pj_val_t a[2];
  pj_hlo_region_begin(H, sts, 2, a);
  pj_val_t s = pj_binary(H, "stablehlo.add", a[0], a[1]);
  char *region = pj_hlo_region_end(H, &s, 1);
  pj_val_t init = pj_const(H, x.t.dtype, 0), r = kBad;
  if (region) reduce_window(L, &x, &init, 1, region, win, str, NULL, lo, hi, &r);
  free(region);
  return r;
}

/* Slices the trailing nsp dims of x to [start, start + size). */
static pj_val_t slice_spatial(pj_lower_t *L, pj_val_t x, int nsp, const int64_t *start,
                              const int64_t *size) {
  if (x.id < 0) return kBad;
  int lead = x.t.rank - nsp;
  int64_t s[PJ_MAX_RANK], e[PJ_MAX_RANK];
  for (int i = 0; i < x.t.rank; i++) {
    s[i] = 0;
    e[i] = x.t.dims[i];
  }
  for (int j = 0; j < nsp; j++) {
    s[lead + j] = start[j];
    e[lead + j] = start[j] + size[j];
  }
  return pj_slice(H, x, s, e, NULL);
}

typedef struct {
  int nsp, lead;
  int64_t k[MAXSP], s[MAXSP], p[MAXSP], d[MAXSP];
  int64_t in[MAXSP], out[MAXSP];
} pool_geom_t;

/* Pool geometry from the schema (stride defaults to the kernel) and the input/output sizes. */
static bool pool_geometry(pj_lower_t *L, int nsp, pj_type_t in, pj_type_t out, pool_geom_t *g) {
  g->nsp = nsp;
  g->lead = in.rank - nsp;
  if (nsp < 1 || g->lead < 0 || out.rank != in.rank) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s of a rank-%d input", L->c->op, in.rank);
    return false;
  }
  if (!geom(L, "kernel_size", nsp, g->k, NULL, 1) || !geom(L, "stride", nsp, g->s, g->k, 1) ||
      !geom(L, "padding", nsp, g->p, NULL, 0) || !geom(L, "dilation", nsp, g->d, NULL, 1))
    return false;
  for (int j = 0; j < nsp; j++) {
    g->in[j] = in.dims[g->lead + j];
    g->out[j] = out.dims[g->lead + j];
    if (g->s[j] < 1 || g->k[j] < 1 || g->d[j] < 1) {
      pj_fail(L, PJ_ERR_VALUE, "%s: kernel, stride and dilation must be positive", L->c->op);
      return false;
    }
  }
  return true;
}

/* Full-rank window arrays of a pool over x's trailing dims: window k, stride s, dilation d,
 * padding p before and enough after to produce at least `out` windows (ceil_mode windows may
 * overhang); callers slice to `out`. */
static void pool_window(const pool_geom_t *g, int rank, int64_t *win, int64_t *str,
                        int64_t *dil, int64_t *lo, int64_t *hi) {
  for (int i = 0; i < rank; i++) {
    win[i] = str[i] = dil[i] = 1;
    lo[i] = hi[i] = 0;
  }
  for (int j = 0; j < g->nsp; j++) {
    int i = g->lead + j;
    win[i] = g->k[j];
    str[i] = g->s[j];
    dil[i] = g->d[j];
    lo[i] = g->p[j];
    int64_t need = (g->out[j] - 1) * g->s[j] + g->d[j] * (g->k[j] - 1) + 1 - g->in[j] - g->p[j];
    hi[i] = need > g->p[j] ? need : g->p[j];
  }
}

/* Flat index of every element of a [lead..., spatial...] type within its plane. */
static pj_val_t plane_index(pj_lower_t *L, pj_type_t xt, int lead, int nsp) {
  pj_type_t it = pj_type_with_dtype(xt, PJ_I64);
  pj_val_t idx = pj_full(H, it, 0);
  int64_t mult = 1;
  for (int j = nsp - 1; j >= 0; j--) {
    pj_val_t io = pj_iota(H, it, lead + j);
    idx = pj_binary(H, "stablehlo.add", idx,
                    pj_binary(H, "stablehlo.multiply", io, pj_full(H, it, (double)mult)));
    mult *= xt.dims[lead + j];
  }
  return idx;
}

/* reduce_window of (x, idx) to (max, index of the max). Ties go to the first element in scan
 * order, a NaN wins (the last NaN), as in CPU's loops. */
static void max_index_window(pj_lower_t *L, pj_val_t x, pj_val_t idx, const int64_t *win,
                             const int64_t *str, const int64_t *dil, const int64_t *lo,
                             const int64_t *hi, pj_val_t *res) {
  pj_dtype_t dt = x.t.dtype;
  res[0] = res[1] = kBad;
  pj_type_t sv = pj_type_scalar(dt), si = pj_type_scalar(PJ_I64);
  pj_type_t sts[4] = {sv, si, sv, si};
  pj_val_t a[4];
  pj_hlo_region_begin(H, sts, 4, a);
  pj_val_t an = pj_compare(H, "NE", a[0], a[0]), bn = pj_compare(H, "NE", a[2], a[2]);
  pj_val_t not_bn = pj_unary(H, "stablehlo.not", bn);
  pj_val_t gt = pj_compare(H, "GT", a[0], a[2]), eq = pj_compare(H, "EQ", a[0], a[2]);
  pj_val_t ilt = pj_compare(H, "LT", a[1], a[3]), igt = pj_compare(H, "GT", a[1], a[3]);
  /* a NaN: keep it unless the other is a later NaN; otherwise larger, or equal and earlier */
  pj_val_t if_nan = pj_binary(H, "stablehlo.or", not_bn, igt);
  pj_val_t if_num = pj_binary(H, "stablehlo.and", not_bn,
                              pj_binary(H, "stablehlo.or", gt,
                                        pj_binary(H, "stablehlo.and", eq, ilt)));
  pj_val_t pick_a = pj_select(H, an, if_nan, if_num);
  pj_val_t rv[2] = {pj_select(H, pick_a, a[0], a[2]), pj_select(H, pick_a, a[1], a[3])};
  char *region = pj_hlo_region_end(H, rv, 2);
  pj_val_t inits[2] = {dt == PJ_I64 ? pj_const_i(H, dt, INT64_MIN)
                                    : pj_const(H, dt, pj_dtype_lowest(dt)),
                       pj_const_i(H, PJ_I64, INT64_MAX)};
  pj_val_t xs[2] = {x, idx};
  if (region) reduce_window(L, xs, inits, 2, region, win, str, dil, lo, hi, res);
  free(region);
}

/* max_pool{1,2,3}d_with_indices: (max, flat index of the max within its plane). */
static pj_status_t *lower_max_pool(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  if (x.id < 0) return NULL;
  if (!dtype_ok(L, x.t.dtype, DT_FLOAT | DT_INT)) return NULL;
  pool_geom_t g;
  if (!pool_geometry(L, name_nsp(L->c->op), x.t, pj_out_type(L, 0), &g)) return NULL;
  int r = x.t.rank;
  pj_val_t idx = plane_index(L, x.t, g.lead, g.nsp);
  int64_t win[PJ_MAX_RANK], str[PJ_MAX_RANK], dil[PJ_MAX_RANK], lo[PJ_MAX_RANK], hi[PJ_MAX_RANK];
  pool_window(&g, r, win, str, dil, lo, hi);
  pj_val_t res[2];
  max_index_window(L, x, idx, win, str, dil, lo, hi, res);
  int64_t zero[MAXSP] = {0};
  set_checked(L, 0, slice_spatial(L, res[0], g.nsp, zero, g.out));
  if (pj_nout(L) > 1) set_checked(L, 1, slice_spatial(L, res[1], g.nsp, zero, g.out));
  return NULL;
}

/* Scatter-adds grad_output into each plane at the saved flat indices. */
static pj_status_t *lower_max_pool_backward(pj_lower_t *L) {
  pj_val_t go = pj_tensor(L, "grad_output"), ix = pj_tensor(L, "indices");
  pj_type_t ot = pj_out_type(L, 0);
  int nsp = name_nsp(L->c->op);
  if (go.id < 0 || ix.id < 0) return NULL;
  int lead = ot.rank - nsp;
  if (lead < 0 || go.t.rank != ot.rank || !pj_type_same_shape(&go.t, &ix.t)) {
    pj_fail(L, PJ_ERR_RUNTIME, "%s: grad_output and indices must match", L->c->op);
    return NULL;
  }
  int64_t planes = 1, osz = 1, isz = 1;
  for (int i = 0; i < lead; i++) planes *= ot.dims[i];
  for (int j = 0; j < nsp; j++) {
    osz *= go.t.dims[lead + j];
    isz *= ot.dims[lead + j];
  }
  pj_dtype_t ct = pj_dtype_compute(ot.dtype);
  int64_t d2[2] = {planes, osz}, n1 = planes * osz, all = planes * isz;
  pj_type_t t2 = pj_type(PJ_I64, 2, d2);
  pj_val_t gidx = pj_binary(
      H, "stablehlo.add", pj_reshape(H, pj_convert(H, ix, PJ_I64), 2, d2),
      pj_binary(H, "stablehlo.multiply", pj_iota(H, t2, 0), pj_full(H, t2, (double)isz)));
  pj_val_t upd = pj_reshape(H, pj_convert(H, go, ct), 1, &n1);
  pj_val_t z = pj_full(H, pj_type(ct, 1, &all), 0);
  pj_val_t r = pj_scatter_1d(H, z, pj_reshape(H, gidx, 1, &n1), upd, "add");
  pj_set_result(L, 0, pj_reshape(H, r, ot.rank, ot.dims));
  return NULL;
}

/* avg_pool divisor along one dim for each output position (CPU's formula): the window
 * clipped to the padded input (count_include_pad) or to the input. */
static void avg_counts(const pool_geom_t *g, int j, bool include_pad, double *cnt) {
  for (int64_t o = 0; o < g->out[j]; o++) {
    int64_t start = o * g->s[j] - g->p[j];
    int64_t end = start + g->k[j];
    if (end > g->in[j] + g->p[j]) end = g->in[j] + g->p[j];
    int64_t pool = end - start;
    if (start < 0) start = 0;
    if (end > g->in[j]) end = g->in[j];
    cnt[o] = (double)(include_pad ? pool : end - start);
  }
}

/* The divisor tensor of an avg_pool over output type t (dtype ct). */
static pj_val_t avg_divisor(pj_lower_t *L, const pool_geom_t *g, pj_type_t t) {
  if (pj_has(L, "divisor_override")) {
    int64_t dv = pj_int(L, "divisor_override", 1);
    if (dv == 0) {
      pj_fail(L, PJ_ERR_RUNTIME, "divisor must be not zero");
      return kBad;
    }
    return pj_full(H, t, (double)dv);
  }
  bool incl = pj_bool(L, "count_include_pad", true);
  pj_val_t div = kBad;
  for (int j = 0; j < g->nsp; j++) {
    double *cnt = dalloc(L, g->out[j]);
    if (!cnt) return kBad;
    avg_counts(g, j, incl, cnt);
    pj_val_t c = table_along(L, cnt, t, g->lead + j);
    free(cnt);
    div = j == 0 ? c : pj_binary(H, "stablehlo.multiply", div, c);
  }
  return div;
}

static pj_status_t *lower_avg_pool(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_type_t ot = pj_out_type(L, 0);
  if (x.id < 0 || !dtype_ok(L, x.t.dtype, DT_FLOAT | DT_I64)) return NULL;
  pool_geom_t g;
  if (!pool_geometry(L, name_nsp(L->c->op), x.t, ot, &g)) return NULL;
  pj_dtype_t ct = pj_dtype_compute(ot.dtype);
  int64_t win[PJ_MAX_RANK], str[PJ_MAX_RANK], dil[PJ_MAX_RANK], lo[PJ_MAX_RANK], hi[PJ_MAX_RANK];
  pool_window(&g, x.t.rank, win, str, dil, lo, hi);
  int64_t zero[MAXSP] = {0};
  pj_val_t s = slice_spatial(L, window_sum(L, pj_convert(H, x, ct), win, str, lo, hi), g.nsp,
                             zero, g.out);
  pj_val_t div = avg_divisor(L, &g, pj_type_with_dtype(ot, ct));
  set_checked(L, 0, pj_binary(H, "stablehlo.divide", s, div));
  return NULL;
}

/* Each input element receives grad/divisor of every window covering it: the divided grads,
 * dilated by the stride, summed over a stride-1 window of the kernel's size. */
static pj_status_t *lower_avg_pool_backward(pj_lower_t *L) {
  pj_val_t go = pj_tensor(L, "grad_output"), x = pj_tensor(L, "self");
  pj_type_t ot = pj_out_type(L, 0);
  if (go.id < 0 || x.id < 0) return NULL;
  pool_geom_t g;
  if (!pool_geometry(L, name_nsp(L->c->op), ot, go.t, &g)) return NULL;
  pj_dtype_t ct = pj_dtype_compute(ot.dtype);
  pj_val_t q = pj_convert(H, go, ct);
  q = pj_binary(H, "stablehlo.divide", q, avg_divisor(L, &g, q.t));
  int r = ot.rank;
  int64_t lo[PJ_MAX_RANK] = {0}, hi[PJ_MAX_RANK] = {0}, in[PJ_MAX_RANK] = {0};
  int64_t win[PJ_MAX_RANK], one[PJ_MAX_RANK], zero[PJ_MAX_RANK] = {0};
  for (int i = 0; i < r; i++) win[i] = one[i] = 1;
  for (int j = 0; j < g.nsp; j++) {
    int i = g.lead + j;
    int64_t reach = (g.out[j] - 1) * g.s[j] + g.k[j];
    int64_t extra = g.p[j] + g.in[j] - reach;
    lo[i] = g.k[j] - 1;
    hi[i] = g.k[j] - 1 + (extra > 0 ? extra : 0);
    in[i] = g.s[j] - 1;
    win[i] = g.k[j];
  }
  q = pj_pad(H, q, pj_const(H, ct, 0), lo, hi, in);
  pj_val_t s = window_sum(L, q, win, one, zero, zero);
  set_checked(L, 0, slice_spatial(L, s, g.nsp, g.p, g.in));
  return NULL;
}

/* ---- adaptive average pooling ---- */

/* dot_general at HIGHEST precision (pooling weights must not round through bf16 passes). */
static pj_val_t dot_exact(pj_lower_t *L, pj_val_t a, pj_val_t b, int64_t lc) {
  if (a.id < 0 || b.id < 0) return kBad;
  pj_type_t t = {.dtype = a.t.dtype, .rank = 0};
  for (int i = 0; i < a.t.rank; i++)
    if (i != lc) t.dims[t.rank++] = a.t.dims[i];
  t.dims[t.rank++] = b.t.dims[1];
  pj_sb_t s = {0};
  pj_sb_printf(&s,
               "dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [%lld], "
               "rhs_contracting_dimensions = [0]>, precision_config = "
               "[#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]",
               (long long)lc);
  pj_val_t ins[2] = {a, b}, r;
  emit(L, "stablehlo.dot_general", ins, 2, NULL, &s, &t, 1, &r);
  return r;
}

/* Window [start, end) of output o of an adaptive pool from `in` to `out` (CPU's formula). */
static void adaptive_window(int64_t o, int64_t in, int64_t out, int64_t *start, int64_t *end) {
  *start = (o * in) / out;
  *end = ((o + 1) * in + out - 1) / out;
}

/* Membership matrix of dim j, [in, out] (forward) or [out, in] (backward), 0/1 values. */
static pj_val_t adaptive_matrix(pj_lower_t *L, int64_t in, int64_t out, bool backward,
                                pj_dtype_t ct) {
  double *m = dalloc(L, in * out);
  if (!m) return kBad;
  for (int64_t o = 0; o < out; o++) {
    int64_t s, e;
    adaptive_window(o, in, out, &s, &e);
    for (int64_t i = s; i < e; i++) m[backward ? o * in + i : i * out + o] = 1;
  }
  int64_t n = in * out, d[2] = {backward ? out : in, backward ? in : out};
  pj_val_t v = pj_reshape(H, const_vec(L, ct, m, n), 2, d);
  free(m);
  return v;
}

/* Product of per-dim window sizes over the trailing nsp dims of t. */
static pj_val_t adaptive_counts(pj_lower_t *L, int nsp, const int64_t *in, pj_type_t t) {
  int lead = t.rank - nsp;
  pj_val_t div = kBad;
  for (int j = 0; j < nsp; j++) {
    int64_t out = t.dims[lead + j];
    double *c = dalloc(L, out);
    if (!c) return kBad;
    for (int64_t o = 0; o < out; o++) {
      int64_t s, e;
      adaptive_window(o, in[j], out, &s, &e);
      c[o] = (double)(e - s);
    }
    pj_val_t cv = table_along(L, c, t, lead + j);
    free(c);
    div = j == 0 ? cv : pj_binary(H, "stablehlo.multiply", div, cv);
  }
  return div;
}

static pj_status_t *lower_adaptive_avg_pool(pj_lower_t *L) {
  bool backward = strstr(L->c->op, "backward") != NULL;
  int nsp = name_nsp(L->c->op);
  pj_val_t x = pj_tensor(L, backward ? "grad_output" : "self");
  pj_type_t ot = pj_out_type(L, 0);
  if (x.id < 0 || !dtype_ok(L, x.t.dtype, DT_FLOAT)) return NULL;
  int lead = ot.rank - nsp;
  if (nsp < 1 || lead < 0 || x.t.rank != ot.rank) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s of a rank-%d input", L->c->op, ot.rank);
    return NULL;
  }
  pj_dtype_t ct = pj_dtype_compute(ot.dtype);
  /* in: the pooled (large) sizes; out: the pooled-to sizes */
  int64_t in[MAXSP], out[MAXSP];
  bool uniform = true;
  for (int j = 0; j < nsp; j++) {
    in[j] = (backward ? ot : x.t).dims[lead + j];
    out[j] = (backward ? x.t : ot).dims[lead + j];
    uniform = uniform && out[j] > 0 && in[j] % out[j] == 0;
  }
  pj_val_t v = pj_convert(H, x, ct);
  if (!backward) {
    if (uniform) {
      /* equal windows: a strided window sum */
      int64_t win[PJ_MAX_RANK], zero[PJ_MAX_RANK] = {0};
      double kk = 1;
      for (int i = 0; i < ot.rank; i++) win[i] = 1;
      for (int j = 0; j < nsp; j++) {
        win[lead + j] = in[j] / out[j];
        kk *= (double)win[lead + j];
      }
      v = window_sum(L, v, win, win, zero, zero);
      v = pj_binary(H, "stablehlo.divide", v, pj_full(H, v.t, kk));
    } else {
      /* contracting dim `lead` each time moves the pooled dim last: order is restored */
      for (int j = 0; j < nsp; j++)
        v = dot_exact(L, v, adaptive_matrix(L, in[j], out[j], false, ct), lead);
      v = pj_binary(H, "stablehlo.divide", v, adaptive_counts(L, nsp, in, v.t));
    }
    set_checked(L, 0, v);
    return NULL;
  }
  if (uniform) {
    /* each input element gets its window's grad / window size: broadcast and merge dims */
    int64_t big[PJ_MAX_RANK], map[PJ_MAX_RANK];
    double kk = 1;
    int nb = 0;
    for (int i = 0; i < lead; i++) {
      map[i] = nb;
      big[nb++] = ot.dims[i];
    }
    for (int j = 0; j < nsp; j++) {
      map[lead + j] = nb;
      big[nb++] = out[j];
      big[nb++] = in[j] / out[j];
      kk *= (double)(in[j] / out[j]);
    }
    if (nb > PJ_MAX_RANK) {
      pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s: rank too large", L->c->op);
      return NULL;
    }
    v = pj_binary(H, "stablehlo.divide", v, pj_full(H, v.t, kk));
    v = pj_broadcast_in_dim(H, v, pj_type(ct, nb, big), map);
    set_checked(L, 0, pj_reshape(H, v, ot.rank, ot.dims));
    return NULL;
  }
  v = pj_binary(H, "stablehlo.divide", v, adaptive_counts(L, nsp, in, v.t));
  for (int j = 0; j < nsp; j++)
    v = dot_exact(L, v, adaptive_matrix(L, in[j], out[j], true, ct), lead);
  set_checked(L, 0, v);
  return NULL;
}

/* ---- upsampling ---- */

typedef enum { UP_NEAREST, UP_NEAREST_EXACT, UP_LINEAR } up_mode_t;

/* Per output position along one dim: source indices i0/i1 and weights w0/w1 (linear), or i0
 * (nearest), with CPU's float (double for float64) arithmetic. */
static void up_table(up_mode_t mode, bool align, bool has_scale, double scale_arg, int64_t in,
                     int64_t out, bool dbl, double *i0, double *i1, double *w0, double *w1) {
  for (int64_t o = 0; o < out; o++) {
    if (mode != UP_LINEAR) {
      int64_t src;
      float sc = has_scale && scale_arg > 0 ? (float)(1.0 / scale_arg) : (float)in / (float)out;
      if (mode == UP_NEAREST && out == in)
        src = o;
      else if (mode == UP_NEAREST && out == 2 * in)
        src = o >> 1;
      else if (mode == UP_NEAREST)
        src = (int64_t)floorf((float)o * sc);
      else
        src = (int64_t)floorf((float)(((double)o + 0.5) * (double)sc));
      i0[o] = (double)(src < in - 1 ? src : in - 1);
      continue;
    }
    if (out == in) {
      i0[o] = i1[o] = (double)o;
      w0[o] = 1;
      w1[o] = 0;
      continue;
    }
    int64_t idx;
    if (dbl) {
      double sc = align ? (out > 1 ? (double)(in - 1) / (double)(out - 1) : 0)
                        : (has_scale && scale_arg > 0 ? 1.0 / scale_arg : (double)in / (double)out);
      double src = align ? sc * (double)o : sc * ((double)o + 0.5) - 0.5;
      if (!align && src < 0) src = 0;
      idx = (int64_t)floor(src);
      if (idx > in - 1) idx = in - 1;
      double l = src - (double)idx;
      l = l < 0 ? 0 : l > 1 ? 1 : l;
      w1[o] = l;
      w0[o] = 1.0 - l;
    } else {
      float sc = align ? (out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f)
                       : (has_scale && scale_arg > 0 ? (float)(1.0 / scale_arg)
                                                     : (float)in / (float)out);
      float src = align ? sc * (float)o : sc * ((float)o + 0.5f) - 0.5f;
      if (!align && src < 0) src = 0;
      idx = (int64_t)floorf(src);
      if (idx > in - 1) idx = in - 1;
      float l = src - (float)idx;
      l = l < 0 ? 0 : l > 1 ? 1 : l;
      w1[o] = l;
      w0[o] = 1.0f - l;
    }
    i0[o] = (double)idx;
    i1[o] = (double)(idx < in - 1 ? idx + 1 : idx);
  }
}

static pj_val_t index_column(pj_lower_t *L, const double *idx, int64_t n) {
  int64_t d[2] = {n, 1};
  return pj_reshape(H, const_vec(L, PJ_I64, idx, n), 2, d);
}

/* x with dim `axis` replaced by x[..., idx[o], ...] for o < n. */
static pj_val_t gather_axis(pj_lower_t *L, pj_val_t x, int axis, const double *idx, int64_t n) {
  if (x.id < 0) return kBad;
  pj_val_t iv = index_column(L, idx, n);
  pj_type_t t = x.t;
  t.dims[axis] = n;
  int64_t offs[PJ_MAX_RANK], sizes[PJ_MAX_RANK];
  int no = 0;
  for (int i = 0; i < x.t.rank; i++) {
    if (i != axis) offs[no++] = i;
    sizes[i] = i == axis ? 1 : x.t.dims[i];
  }
  pj_sb_t b = {0};
  pj_sb_puts(&b, "dimension_numbers = #stablehlo.gather<offset_dims = [");
  for (int i = 0; i < no; i++) pj_sb_printf(&b, i ? ", %lld" : "%lld", (long long)offs[i]);
  pj_sb_printf(&b, "], collapsed_slice_dims = [%d], start_index_map = [%d], index_vector_dim = 1>, ",
               axis, axis);
  sb_array(&b, "slice_sizes", sizes, x.t.rank);
  pj_sb_puts(&b, ", indices_are_sorted = false");
  pj_val_t ins[2] = {x, iv}, r;
  emit(L, "stablehlo.gather", ins, 2, NULL, &b, &t, 1, &r);
  return r;
}

/* The transpose of gather_axis: zeros with dim `axis` of size `size`, u[..., o, ...] added at
 * idx[o]. */
static pj_val_t scatter_add_axis(pj_lower_t *L, pj_val_t u, int axis, const double *idx,
                                 int64_t size) {
  if (u.id < 0) return kBad;
  int64_t n = u.t.dims[axis];
  pj_val_t iv = index_column(L, idx, n);
  pj_type_t t = u.t;
  t.dims[axis] = size;
  pj_val_t z = pj_full(H, t, 0);
  pj_type_t st = pj_type_scalar(t.dtype);
  pj_type_t sts[2] = {st, st};
  pj_val_t a[2];
  pj_hlo_region_begin(H, sts, 2, a);
  pj_val_t s = pj_binary(H, "stablehlo.add", a[0], a[1]);
  char *region = pj_hlo_region_end(H, &s, 1);
  pj_sb_t b = {0};
  pj_sb_puts(&b, "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [");
  int no = 0;
  for (int i = 0; i < u.t.rank; i++)
    if (i != axis) pj_sb_printf(&b, no++ ? ", %d" : "%d", i);
  pj_sb_printf(&b,
               "], inserted_window_dims = [%d], scatter_dims_to_operand_dims = [%d], "
               "index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false",
               axis, axis);
  pj_val_t ins[3] = {z, iv, u}, r = kBad;
  if (region) emit(L, "stablehlo.scatter", ins, 3, region, &b, &t, 1, &r);
  else pj_sb_free(&b);
  free(region);
  return r;
}

static pj_val_t resample_u8(pj_lower_t *L, pj_val_t x, pj_type_t ot, bool cubic, bool aa);

static pj_status_t *lower_upsample(pj_lower_t *L) {
  const char *op = L->c->op;
  bool backward = strstr(op, "backward") != NULL;
  up_mode_t mode = strstr(op, "nearest_exact") ? UP_NEAREST_EXACT
                   : strstr(op, "nearest")     ? UP_NEAREST
                                               : UP_LINEAR;
  int nsp = name_nsp(op);
  pj_val_t x = pj_tensor(L, backward ? "grad_output" : "self");
  pj_type_t ot = pj_out_type(L, 0);
  /* uint8: nearest is a copy; bilinear (2-d only, as on CPU) is CPU's fixed-point kernel
   * (resample_u8); CPU refuses uint8 linear 1-d / trilinear and every backward */
  bool u8_linear = mode == UP_LINEAR && nsp == 2 && !backward;
  if (x.id < 0 || !dtype_ok(L, x.t.dtype, (mode != UP_LINEAR && !backward) || u8_linear
                                              ? DT_FLOAT | DT_U8
                                              : DT_FLOAT))
    return NULL;
  int lead = ot.rank - nsp;
  if (nsp < 1 || lead < 0 || x.t.rank != ot.rank) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s of a rank-%d input", op, ot.rank);
    return NULL;
  }
  if (u8_linear && x.t.dtype == PJ_U8) {
    set_checked(L, 0, resample_u8(L, x, ot, false, false));
    return NULL;
  }
  static const char *const names1[] = {"scales"};
  static const char *const names2[] = {"scales_h", "scales_w"};
  static const char *const names3[] = {"scales_d", "scales_h", "scales_w"};
  const char *const *scale_names = nsp == 1 ? names1 : nsp == 2 ? names2 : names3;
  bool align = pj_bool(L, "align_corners", false);
  pj_dtype_t ct = mode == UP_LINEAR || backward ? pj_dtype_compute(ot.dtype) : ot.dtype;
  bool dbl = ct == PJ_F64;
  pj_val_t v = pj_convert(H, x, ct);
  /* forward: innermost dim first, so the last weights applied are the outermost dim's, the
   * same association as CPU's nested interpolation */
  for (int jj = 0; jj < nsp; jj++) {
    int j = backward ? jj : nsp - 1 - jj;
    int axis = lead + j;
    int64_t in = (backward ? ot : x.t).dims[axis], out = (backward ? x.t : ot).dims[axis];
    double *tab = dalloc(L, 4 * out);
    if (!tab) return NULL;
    double *i0 = tab, *i1 = tab + out, *w0 = tab + 2 * out, *w1 = tab + 3 * out;
    up_table(mode, align, pj_has(L, scale_names[j]), pj_float(L, scale_names[j], 0), in, out,
             dbl, i0, i1, w0, w1);
    if (mode != UP_LINEAR) {
      v = backward ? scatter_add_axis(L, v, axis, i0, in) : gather_axis(L, v, axis, i0, out);
    } else if (!backward) {
      pj_type_t t = v.t;
      t.dims[axis] = out;
      pj_val_t a = pj_binary(H, "stablehlo.multiply", gather_axis(L, v, axis, i0, out),
                             table_along(L, w0, t, axis));
      pj_val_t b = pj_binary(H, "stablehlo.multiply", gather_axis(L, v, axis, i1, out),
                             table_along(L, w1, t, axis));
      v = pj_binary(H, "stablehlo.add", a, b);
    } else {
      pj_val_t a = scatter_add_axis(
          L, pj_binary(H, "stablehlo.multiply", v, table_along(L, w0, v.t, axis)), axis, i0, in);
      pj_val_t b = scatter_add_axis(
          L, pj_binary(H, "stablehlo.multiply", v, table_along(L, w1, v.t, axis)), axis, i1, in);
      v = pj_binary(H, "stablehlo.add", a, b);
    }
    free(tab);
  }
  set_checked(L, 0, v);
  return NULL;
}

/* ---- separable interpolation by weight matrices: bicubic, antialiased bilinear / bicubic ---- */

/* CPU's scale between sizes (area_pixel_compute_scale): align_corners maps the corner pixels
 * onto each other; otherwise a given scale factor wins over the size ratio. */
static double interp_scale(int64_t in, int64_t out, bool align, bool has_scale, double sc,
                           bool dbl) {
  if (align) {
    if (out <= 1) return 0;
    return dbl ? (double)(in - 1) / (double)(out - 1) : (double)((float)(in - 1) / (float)(out - 1));
  }
  if (has_scale && sc > 0) return dbl ? 1.0 / sc : (double)(float)(1.0 / sc);
  return dbl ? (double)in / (double)out : (double)((float)in / (float)out);
}

static double cubic_near(double x, double a) { return ((a + 2) * x - (a + 3)) * x * x + 1; }
static double cubic_far(double x, double a) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; }

/* Antialias filters (the Keys cubic with a = -0.5 for bicubic, the triangle for bilinear). */
static double aa_filter(double x, bool cubic) {
  if (x < 0) x = -x;
  if (!cubic) return x < 1 ? 1 - x : 0;
  if (x < 1) return cubic_near(x, -0.5);
  if (x < 2) return cubic_far(x, -0.5);
  return 0;
}

/* Fills m[in * out] (row = input index, column = output index) with CPU's weights. */
static void interp_weights(bool aa, bool cubic, bool align, bool has_scale, double sc, int64_t in,
                           int64_t out, bool dbl, double *m) {
  double scale = interp_scale(in, out, align, has_scale, sc, dbl);
  for (int64_t o = 0; o < out; o++) {
    if (!aa) { /* bicubic: 4 taps around the source position, indices clamped */
      double real = align ? scale * (double)o : scale * ((double)o + 0.5) - 0.5;
      if (!dbl) real = align ? (double)((float)scale * (float)o)
                             : (double)((float)scale * ((float)o + 0.5f) - 0.5f);
      double fl = floor(real), t = real - fl;
      if (!dbl) t = (double)((float)real - (float)fl);
      int64_t i0 = (int64_t)fl;
      double w[4] = {cubic_far(t + 1, -0.75), cubic_near(t, -0.75), cubic_near(1 - t, -0.75),
                     cubic_far(2 - t, -0.75)};
      for (int k = 0; k < 4; k++) {
        int64_t i = i0 - 1 + k;
        i = i < 0 ? 0 : i > in - 1 ? in - 1 : i;
        m[i * out + o] += dbl ? w[k] : (double)(float)w[k];
      }
      continue;
    }
    /* antialiased: the filter stretched by the scale when downsampling, normalized to sum 1 */
    double support = (cubic ? 2.0 : 1.0) * (scale >= 1.0 ? scale : 1.0);
    double center = scale * ((double)o + 0.5);
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    int64_t lo = (int64_t)(center - support + 0.5);
    if (lo < 0) lo = 0;
    int64_t hi = (int64_t)(center + support + 0.5);
    if (hi > in) hi = in;
    double total = 0;
    for (int64_t i = lo; i < hi; i++) total += aa_filter(((double)i - center + 0.5) * invscale, cubic);
    for (int64_t i = lo; i < hi; i++) {
      double w = aa_filter(((double)i - center + 0.5) * invscale, cubic);
      m[i * out + o] = total != 0 ? w / total : w;
    }
  }
}

/* ---- uint8 bilinear / bicubic: CPU's fixed-point separable resampling ----
 *
 * CPU resamples uint8 images (bilinear and bicubic, with or without antialias, forward only)
 * in integers: per resized dim, each output is the sum over its taps of x[first + k] * q_k,
 * where q_k is the double weight scaled by 2^prec and rounded (half away from zero) to an
 * int16; the int32 sum plus 2^(prec-1), shifted right arithmetically by prec and clamped to
 * [0, 255], is stored as uint8. The last dim is resampled first, then the one before it, from
 * the stored uint8 intermediate; a dim whose size does not change is not resampled. Weights,
 * precision and tap ranges below repeat CPU's double arithmetic step for step (casts to
 * integers truncate, as C++'s do), so the integer result equals CPU's bit for bit. int32
 * cannot overflow: |q_k| < 2^15 and the q_k of one output sum to about 2^prec <= 2^22 (the
 * weights are normalized near 1), times at most 255. */

/* CPU's uint8 filters: the triangle, or the Keys cubic with a = -0.5 (antialias) or -0.75
 * (plain bicubic, the constant of its float kernel). */
static double u8_filter(double x, bool cubic, double a) {
  if (x < 0) x = -x;
  if (!cubic) return x < 1 ? 1 - x : 0;
  if (x < 1) return cubic_near(x, a);
  if (x < 2) return cubic_far(x, a);
  return 0;
}

/* Weights of one resized dim: w[o * kmax + k] for the cnt[o] taps of output o, which read
 * input indices first[o] + k; slots past cnt[o] stay 0. kmax bounds the taps: 2 or 4, or
 * 2 * ceil(support) + 1 with antialias. Returns the largest weight CPU's precision rule
 * sees. */
static double u8_dim_weights(bool cubic, bool aa, bool align, double scale, int64_t in,
                             int64_t out, int64_t kmax, int64_t *first, int64_t *cnt,
                             double *w) {
  double wmax = 0;
  int64_t ntap = cubic ? 4 : 2;
  for (int64_t o = 0; o < out; o++) {
    double *wo = w + o * kmax;
    if (aa) {
      /* the filter stretched by the scale when shrinking, on the inputs under its support
       * (clipped to the input), normalized to sum 1 */
      double support = ((double)ntap * 0.5) * (scale >= 1.0 ? scale : 1.0);
      double center = scale * ((double)o + 0.5);
      double inv = scale >= 1.0 ? 1.0 / scale : 1.0;
      int64_t lo = (int64_t)(center - support + 0.5), hi = (int64_t)(center + support + 0.5);
      if (lo < 0) lo = 0;
      if (hi > in) hi = in;
      int64_t n = hi - lo;
      n = n < 0 ? 0 : n > kmax ? kmax : n;
      double total = 0;
      for (int64_t k = 0; k < n; k++) {
        wo[k] = u8_filter(((double)(k + lo) - center + 0.5) * inv, cubic, -0.5);
        total += wo[k];
      }
      if (total != 0)
        for (int64_t k = 0; k < n; k++) {
          wo[k] /= total;
          if (wo[k] > wmax) wmax = wo[k];
        }
      first[o] = lo;
      cnt[o] = n;
      continue;
    }
    /* plain: the float kernel's source position and fraction, ntap taps around it; a tap
     * outside the input adds its weight to the edge sample it would be clamped to (the float
     * kernel's index clamping, with fewer distinct taps) */
    double src = align ? scale * (double)o : scale * ((double)o + 0.5) - 0.5;
    if (!align && !cubic && src < 0) src = 0;
    int64_t i0 = (int64_t)floor(src);
    if (i0 > in - 1) i0 = in - 1;
    double t = src - (double)i0;
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    int64_t half = ntap / 2, lo = i0 - half + 1;
    int64_t f = lo < 0 ? 0 : lo, e = lo + ntap < in ? lo + ntap : in;
    int64_t n = e - f;
    n = n < 0 ? 0 : n > ntap ? ntap : n;
    for (int64_t k = 0; k < ntap; k++) wo[k] = 0;
    for (int64_t k = 0; k < ntap; k++) {
      int64_t pos = lo + k;
      pos = pos < 0 ? 0 : pos > in - 1 ? in - 1 : pos;
      double *slot = wo + (pos - f); /* pos - f < n: f <= pos < e */
      *slot += u8_filter((double)(k + 1 - half) - t, cubic, -0.75);
      /* CPU takes the maximum over the partial sums of a folded slot too */
      if (*slot > wmax) wmax = *slot;
    }
    first[o] = f;
    cnt[o] = n;
  }
  return wmax;
}

/* CPU's precision: the first prec (at most 22) at which one bit more would round wmax * 2^prec
 * to 2^15 or beyond, so the largest scaled weight lies in [2^14, 2^15): int16, as fine as
 * that allows. */
static int u8_precision(double wmax) {
  int p = 0;
  while (p < 22 && (int64_t)(0.5 + wmax * (double)(1 << (p + 1))) < (1 << 15)) p++;
  return p;
}

/* x (int32 holding uint8 values) resampled along `axis` to `out` samples, clamped to
 * [0, 255]: the taps are one gather of out * K indices (K the most taps of any output; a
 * tap past an output's own count reads a valid index with weight 0), split into [out, K],
 * weighted and summed over K. Integer sums are exact in any order. */
static pj_val_t u8_resample_dim(pj_lower_t *L, pj_val_t x, int axis, bool cubic, bool aa,
                                bool align, bool has_scale, double sc, int64_t out) {
  if (x.id < 0) return kBad;
  int64_t in = x.t.dims[axis];
  double scale = interp_scale(in, out, align, has_scale, sc, true);
  int64_t ntap = cubic ? 4 : 2;
  int64_t kmax = aa ? 2 * (int64_t)ceil(((double)ntap * 0.5) * (scale >= 1.0 ? scale : 1.0)) + 1
                    : ntap;
  double *w = dalloc(L, out * kmax);
  if (!w) return kBad;
  int64_t *first = calloc((size_t)out, sizeof(int64_t)), *cnt = calloc((size_t)out, sizeof(int64_t));
  double *idx = NULL, *q = NULL;
  pj_val_t r = kBad;
  if (!first || !cnt) {
    pj_fail(L, PJ_ERR_OOM, "out of host memory building a constant table");
    goto done;
  }
  double wmax = u8_dim_weights(cubic, aa, align, scale, in, out, kmax, first, cnt, w);
  int prec = u8_precision(wmax);
  int64_t K = 1;
  for (int64_t o = 0; o < out; o++)
    if (cnt[o] > K) K = cnt[o];
  idx = dalloc(L, out * K);
  q = dalloc(L, out * K);
  if (!idx || !q) goto done;
  for (int64_t o = 0; o < out; o++)
    for (int64_t k = 0; k < K; k++) {
      int64_t i = first[o] + k;
      idx[o * K + k] = (double)(i < in - 1 ? i : in - 1);
      if (k >= cnt[o]) continue; /* weight 0 */
      double v = w[o * kmax + k] * (double)(1 << prec);
      q[o * K + k] = (double)(v < 0 ? (int64_t)(v - 0.5) : (int64_t)(v + 0.5));
    }
  int rk = x.t.rank;
  int64_t d[PJ_MAX_RANK], wd[2] = {out, K}, bd[2] = {axis, axis + 1}, kd = axis + 1;
  for (int i = 0; i < rk; i++) d[i < axis ? i : i + 1] = x.t.dims[i];
  d[axis] = out;
  d[axis + 1] = K;
  pj_val_t g = pj_reshape(H, gather_axis(L, x, axis, idx, out * K), rk + 1, d);
  pj_val_t wv = pj_reshape(H, const_vec(L, PJ_I32, q, out * K), 2, wd);
  pj_val_t s = pj_binary(H, "stablehlo.multiply", g, pj_broadcast_in_dim(H, wv, g.t, bd));
  s = pj_reduce(H, s, &kd, 1, "add");
  s = pj_binary(H, "stablehlo.add", s, pj_full(H, s.t, prec > 0 ? (double)(1 << (prec - 1)) : 0));
  s = pj_binary(H, "stablehlo.shift_right_arithmetic", s, pj_full(H, s.t, prec));
  s = pj_binary(H, "stablehlo.maximum", s, pj_full(H, s.t, 0));
  r = pj_binary(H, "stablehlo.minimum", s, pj_full(H, s.t, 255));
done:
  free(w);
  free(first);
  free(cnt);
  free(idx);
  free(q);
  return r;
}

/* Forward uint8 bilinear / bicubic (antialiased or not) of x to ot's shape; the last two dims
 * are the spatial ones. */
static pj_val_t resample_u8(pj_lower_t *L, pj_val_t x, pj_type_t ot, bool cubic, bool aa) {
  static const char *const names[2] = {"scales_h", "scales_w"};
  bool align = pj_bool(L, "align_corners", false);
  int lead = ot.rank - 2;
  for (int i = 0; i < ot.rank; i++)
    if (ot.dims[i] == 0) return pj_full(H, ot, 0); /* nothing to compute */
  pj_val_t v = x;
  for (int j = 1; j >= 0; j--) { /* width, then height */
    int axis = lead + j;
    if (x.t.dims[axis] == ot.dims[axis]) continue;
    v = u8_resample_dim(L, pj_convert(H, v, PJ_I32), axis, cubic, aa, align, pj_has(L, names[j]),
                        pj_float(L, names[j], 0), ot.dims[axis]);
  }
  return pj_convert(H, v, PJ_U8);
}

static pj_status_t *lower_interp_matrix(pj_lower_t *L) {
  const char *op = L->c->op;
  bool backward = strstr(op, "backward") != NULL, aa = strstr(op, "_aa") != NULL;
  bool cubic = strstr(op, "bicubic") != NULL;
  pj_val_t x = pj_tensor(L, backward ? "grad_output" : "self");
  pj_type_t ot = pj_out_type(L, 0);
  /* uint8 forward is CPU's fixed-point kernel; CPU refuses uint8 backwards */
  if (x.id < 0 || !dtype_ok(L, x.t.dtype, backward ? DT_FLOAT : DT_FLOAT | DT_U8)) return NULL;
  int nsp = 2, lead = ot.rank - nsp;
  if (lead < 0 || x.t.rank != ot.rank) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s of a rank-%d input", op, ot.rank);
    return NULL;
  }
  if (x.t.dtype == PJ_U8) {
    set_checked(L, 0, resample_u8(L, x, ot, cubic, aa));
    return NULL;
  }
  static const char *const names[2] = {"scales_h", "scales_w"};
  bool align = pj_bool(L, "align_corners", false);
  pj_dtype_t ct = pj_dtype_compute(ot.dtype);
  pj_val_t v = pj_convert(H, x, ct);
  /* contracting dim `lead` each time moves the interpolated dim last: order is restored */
  for (int j = 0; j < nsp; j++) {
    int64_t in = (backward ? ot : x.t).dims[lead + j], out = (backward ? x.t : ot).dims[lead + j];
    double *m = dalloc(L, in * out);
    if (!m) return NULL;
    interp_weights(aa, cubic, align, pj_has(L, names[j]), pj_float(L, names[j], 0), in, out,
                   ct == PJ_F64, m);
    int64_t n = in * out, d[2] = {in, out};
    pj_val_t mv = pj_reshape(H, const_vec(L, ct, m, n), 2, d);
    free(m);
    if (backward) {
      int64_t perm[2] = {1, 0};
      mv = pj_transpose(H, mv, perm);
    }
    v = dot_exact(L, v, mv, lead);
  }
  set_checked(L, 0, v);
  return NULL;
}

/* ---- grid sampling ---- */

/* grid_sampler_{2,3}d and backwards. input [N, C, S...], grid [N, O..., nsp] with grid[..., 0]
 * addressing the last spatial dim. Per spatial dim, a sampling mode gives taps: an index, a
 * weight and the weight's derivative by the (unnormalized) coordinate; the output is the sum
 * over tap combinations of the product of weights times the input there (0 out of bounds).
 * Rows of the input are gathered / scattered as [N * S, C]. CPU's coordinate rules:
 * unnormalize, then padding (border clips, reflection folds, then clips), each with the
 * gradient factor CPU uses. */
enum { GS_BILINEAR = 0, GS_NEAREST = 1, GS_BICUBIC = 2 };
enum { GS_ZEROS = 0, GS_BORDER = 1, GS_REFLECTION = 2 };

typedef struct {
  int ntap;
  pj_val_t idx[4], w[4], dw[4]; /* [N, O...]: int64 index, weight, d weight / d coord */
  pj_val_t mult;                /* d coord / d grid value */
} gs_dim_t;

static pj_val_t gs_clip(pj_lower_t *L, pj_val_t c, double size, pj_val_t *gm) {
  pj_val_t zero = pj_full(H, c.t, 0), hi = pj_full(H, c.t, size - 1);
  if (gm) {
    pj_val_t inside = pj_binary(H, "stablehlo.and", pj_compare(H, "GT", c, zero),
                                pj_compare(H, "LT", c, hi));
    *gm = pj_binary(H, "stablehlo.multiply", *gm, pj_select(H, inside, pj_full(H, c.t, 1), zero));
  }
  return pj_binary(H, "stablehlo.minimum", hi, pj_binary(H, "stablehlo.maximum", c, zero));
}

static pj_val_t gs_reflect(pj_lower_t *L, pj_val_t c, double twice_lo, double twice_hi,
                           pj_val_t *gm) {
  pj_type_t t = c.t;
  if (twice_lo == twice_hi) {
    if (gm) *gm = pj_full(H, t, 0);
    return pj_full(H, t, 0);
  }
  double mn = twice_lo / 2, span = (twice_hi - twice_lo) / 2;
  pj_val_t in = pj_binary(H, "stablehlo.subtract", c, pj_full(H, t, mn));
  pj_val_t neg = pj_compare(H, "LT", in, pj_full(H, t, 0));
  in = pj_unary(H, "stablehlo.abs", in);
  pj_val_t sp = pj_full(H, t, span);
  pj_val_t extra = pj_binary(H, "stablehlo.remainder", in, sp);
  pj_val_t flips = pj_unary(H, "stablehlo.floor", pj_binary(H, "stablehlo.divide", in, sp));
  pj_val_t odd = pj_compare(H, "NE", pj_binary(H, "stablehlo.remainder", flips, pj_full(H, t, 2)),
                            pj_full(H, t, 0));
  if (gm) {
    pj_val_t one = pj_full(H, t, 1), m1 = pj_full(H, t, -1);
    pj_val_t s1 = pj_select(H, neg, m1, one), s2 = pj_select(H, odd, m1, one);
    *gm = pj_binary(H, "stablehlo.multiply", *gm, pj_binary(H, "stablehlo.multiply", s1, s2));
  }
  pj_val_t r = pj_select(H, odd, pj_binary(H, "stablehlo.subtract", sp, extra), extra);
  return pj_binary(H, "stablehlo.add", r, pj_full(H, t, mn));
}

static pj_val_t gs_pad(pj_lower_t *L, pj_val_t c, double size, int padding, bool align,
                       pj_val_t *gm) {
  if (padding == GS_BORDER) return gs_clip(L, c, size, gm);
  if (padding == GS_REFLECTION) {
    c = align ? gs_reflect(L, c, 0, 2 * (size - 1), gm) : gs_reflect(L, c, -1, 2 * size - 1, gm);
    return gs_clip(L, c, size, gm);
  }
  return c;
}

/* cubic convolution (a = -0.75) weights of taps -1..2 around t in [0, 1), and derivatives */
static void gs_cubic(pj_lower_t *L, pj_val_t t, pj_val_t *w, pj_val_t *dw) {
  const double A = -0.75;
  pj_val_t x[4] = {pj_binary(H, "stablehlo.add", t, pj_full(H, t.t, 1)), t,
                   pj_binary(H, "stablehlo.subtract", pj_full(H, t.t, 1), t),
                   pj_binary(H, "stablehlo.subtract", pj_full(H, t.t, 2), t)};
  for (int k = 0; k < 4; k++) {
    bool far = k == 0 || k == 3;
    /* near: (A+2)x^3 - (A+3)x^2 + 1; far: A x^3 - 5A x^2 + 8A x - 4A (Horner) */
    double c3 = far ? A : A + 2, c2 = far ? -5 * A : -(A + 3), c1 = far ? 8 * A : 0,
           c0 = far ? -4 * A : 1;
    pj_val_t v = pj_full(H, t.t, c3), d = pj_full(H, t.t, 3 * c3);
    v = pj_binary(H, "stablehlo.add", pj_binary(H, "stablehlo.multiply", v, x[k]),
                  pj_full(H, t.t, c2));
    v = pj_binary(H, "stablehlo.add", pj_binary(H, "stablehlo.multiply", v, x[k]),
                  pj_full(H, t.t, c1));
    w[k] = pj_binary(H, "stablehlo.add", pj_binary(H, "stablehlo.multiply", v, x[k]),
                     pj_full(H, t.t, c0));
    d = pj_binary(H, "stablehlo.add", pj_binary(H, "stablehlo.multiply", d, x[k]),
                  pj_full(H, t.t, 2 * c2));
    d = pj_binary(H, "stablehlo.add", pj_binary(H, "stablehlo.multiply", d, x[k]),
                  pj_full(H, t.t, c1));
    dw[k] = k >= 2 ? pj_unary(H, "stablehlo.negate", d) : d; /* dx/dt = -1 for taps 1-t, 2-t */
  }
}

static void gs_dim(pj_lower_t *L, pj_val_t g, double size, int mode, int padding, bool align,
                   gs_dim_t *d) {
  pj_type_t t = g.t;
  pj_val_t one = pj_full(H, t, 1);
  /* unnormalize */
  pj_val_t c = align ? pj_binary(H, "stablehlo.multiply",
                                 pj_binary(H, "stablehlo.divide", pj_binary(H, "stablehlo.add", g, one),
                                           pj_full(H, t, 2)),
                                 pj_full(H, t, size - 1))
                     : pj_binary(H, "stablehlo.divide",
                                 pj_binary(H, "stablehlo.subtract",
                                           pj_binary(H, "stablehlo.multiply",
                                                     pj_binary(H, "stablehlo.add", g, one),
                                                     pj_full(H, t, size)),
                                           one),
                                 pj_full(H, t, 2));
  d->mult = pj_full(H, t, align ? (size - 1) / 2 : size / 2);
  if (mode == GS_BICUBIC) {
    pj_val_t fl = pj_unary(H, "stablehlo.floor", c);
    gs_cubic(L, pj_binary(H, "stablehlo.subtract", c, fl), d->w, d->dw);
    d->ntap = 4;
    for (int k = 0; k < 4; k++) {
      pj_val_t ck = pj_binary(H, "stablehlo.add", fl, pj_full(H, t, k - 1));
      d->idx[k] = pj_convert(H, gs_pad(L, ck, size, padding, align, NULL), PJ_I64);
    }
    return;
  }
  c = gs_pad(L, c, size, padding, align, &d->mult);
  if (mode == GS_NEAREST) {
    d->ntap = 1;
    d->idx[0] = pj_convert(H, pj_unary(H, "stablehlo.round_nearest_even", c), PJ_I64);
    d->w[0] = one;
    d->dw[0] = pj_full(H, t, 0);
    return;
  }
  pj_val_t fl = pj_unary(H, "stablehlo.floor", c), fr = pj_binary(H, "stablehlo.subtract", c, fl);
  d->ntap = 2;
  d->idx[0] = pj_convert(H, fl, PJ_I64);
  d->idx[1] = pj_binary(H, "stablehlo.add", d->idx[0], pj_full(H, pj_type_with_dtype(t, PJ_I64), 1));
  d->w[0] = pj_binary(H, "stablehlo.subtract", one, fr);
  d->w[1] = fr;
  d->dw[0] = pj_full(H, t, -1);
  d->dw[1] = one;
}

/* rows [K, C] of a [R, C] operand at row indices [K] (int64) */
static pj_val_t gather_rows(pj_lower_t *L, pj_val_t x, pj_val_t rows) {
  int64_t k = rows.t.dims[0], kd[2] = {k, 1}, c = x.t.dims[1];
  pj_val_t iv = pj_reshape(H, rows, 2, kd);
  pj_sb_t b = {0};
  pj_sb_printf(&b, "dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims "
               "= [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = "
               "array<i64: 1, %lld>, indices_are_sorted = false", (long long)c);
  int64_t od[2] = {k, c};
  pj_type_t ot = pj_type(x.t.dtype, 2, od);
  pj_val_t ins[2] = {x, iv}, r;
  emit(L, "stablehlo.gather", ins, 2, NULL, &b, &ot, 1, &r);
  return r;
}

static pj_val_t scatter_rows(pj_lower_t *L, pj_val_t acc, pj_val_t rows, pj_val_t upd) {
  int64_t k = rows.t.dims[0], kd[2] = {k, 1};
  pj_val_t iv = pj_reshape(H, rows, 2, kd);
  pj_type_t st = pj_type_scalar(acc.t.dtype);
  pj_type_t sts[2] = {st, st};
  pj_val_t a[2];
  pj_hlo_region_begin(H, sts, 2, a);
  pj_val_t sum = pj_binary(H, "stablehlo.add", a[0], a[1]);
  char *region = pj_hlo_region_end(H, &sum, 1);
  pj_sb_t b = {0};
  pj_sb_puts(&b, "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], "
             "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = "
             "1>, indices_are_sorted = false, unique_indices = false");
  pj_val_t ins[3] = {acc, iv, upd}, r = kBad;
  if (region) emit(L, "stablehlo.scatter", ins, 3, region, &b, &acc.t, 1, &r);
  else pj_sb_free(&b);
  free(region);
  return r;
}

static pj_status_t *lower_grid_sampler(pj_lower_t *L) {
  bool bw = strstr(L->c->op, "backward") != NULL;
  int nsp = name_nsp(L->c->op);
  pj_val_t x = pj_tensor(L, "input"), grid = pj_tensor(L, "grid");
  if (x.id < 0 || grid.id < 0 || !dtype_ok(L, x.t.dtype, DT_FLOAT)) return NULL;
  int mode = (int)pj_int(L, "interpolation_mode", 0), padding = (int)pj_int(L, "padding_mode", 0);
  bool align = pj_bool(L, "align_corners", false);
  if (x.t.rank != nsp + 2 || grid.t.rank != nsp + 2 || (mode == GS_BICUBIC && nsp != 2)) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s: unsupported input", L->c->op);
    return NULL;
  }
  /* CPU samples half types in their own arithmetic (coordinates and weights round per op) */
  pj_dtype_t ct = bw ? pj_dtype_compute(x.t.dtype) : x.t.dtype;
  int64_t n = x.t.dims[0], c = x.t.dims[1], ssz = 1, onum = 1;
  for (int j = 0; j < nsp; j++) ssz *= x.t.dims[2 + j];
  pj_type_t gt = {.dtype = ct, .rank = nsp + 1}; /* [N, O...] */
  gt.dims[0] = n;
  for (int j = 0; j < nsp; j++) onum *= gt.dims[1 + j] = grid.t.dims[1 + j];
  int64_t k = n * onum;
  gs_dim_t dims[MAXSP];
  pj_val_t gc = pj_convert(H, grid, ct);
  for (int j = 0; j < nsp; j++) {
    int comp = nsp - 1 - j;
    int64_t s0[PJ_MAX_RANK] = {0}, s1[PJ_MAX_RANK];
    for (int i = 0; i < grid.t.rank; i++) s1[i] = grid.t.dims[i];
    s0[nsp + 1] = comp;
    s1[nsp + 1] = comp + 1;
    pj_val_t g = pj_reshape(H, pj_slice(H, gc, s0, s1, NULL), gt.rank, gt.dims);
    gs_dim(L, g, (double)x.t.dims[2 + j], mode, padding, align, &dims[j]);
  }
  /* rows of the input: [N * S, C] */
  int64_t perm[PJ_MAX_RANK], rc[2] = {n * ssz, c};
  perm[0] = 0;
  for (int j = 0; j < nsp; j++) perm[1 + j] = 2 + j;
  perm[nsp + 1] = 1;
  pj_val_t rows = pj_reshape(H, pj_transpose(H, pj_convert(H, x, ct), perm), 2, rc);
  pj_type_t it = pj_type_with_dtype(gt, PJ_I64);
  pj_val_t base = pj_binary(H, "stablehlo.multiply", pj_iota(H, it, 0), pj_full(H, it, (double)ssz));
  /* grad_output as [K, C] */
  pj_val_t go = kBad;
  if (bw) {
    pj_val_t g0 = pj_convert(H, pj_tensor(L, "grad_output"), ct); /* [N, C, O...] */
    go = pj_reshape(H, pj_transpose(H, g0, perm), 2, (int64_t[]){k, c});
  }
  int64_t kc[2] = {k, c}, one_d = 1, zero_d = 0;
  pj_type_t kct = pj_type(ct, 2, kc);
  pj_val_t out = pj_full(H, kct, 0), gin = bw ? pj_full(H, rows.t, 0) : kBad;
  pj_val_t ggrid[MAXSP];
  for (int j = 0; j < nsp; j++) ggrid[j] = pj_full(H, pj_type(ct, 1, &k), 0);
  int total = 1;
  for (int j = 0; j < nsp; j++) total *= dims[j].ntap;
  for (int combo = 0; combo < total; combo++) {
    int tap[MAXSP], r = combo;
    for (int j = nsp - 1; j >= 0; j--) {
      tap[j] = r % dims[j].ntap;
      r /= dims[j].ntap;
    }
    pj_val_t w = pj_full(H, gt, 1), flat = base;
    pj_val_t valid = pj_full(H, pj_type_with_dtype(gt, PJ_BOOL), 1);
    int64_t stride = 1;
    for (int j = nsp - 1; j >= 0; j--) {
      pj_val_t ix = dims[j].idx[tap[j]];
      int64_t sz = x.t.dims[2 + j];
      valid = pj_binary(H, "stablehlo.and", valid,
                        pj_binary(H, "stablehlo.and", pj_compare(H, "GE", ix, pj_full(H, it, 0)),
                                  pj_compare(H, "LT", ix, pj_full(H, it, (double)sz))));
      ix = pj_binary(H, "stablehlo.minimum", pj_full(H, it, (double)(sz - 1)),
                     pj_binary(H, "stablehlo.maximum", ix, pj_full(H, it, 0)));
      flat = pj_binary(H, "stablehlo.add", flat,
                       pj_binary(H, "stablehlo.multiply", ix, pj_full(H, it, (double)stride)));
      stride *= sz;
      w = pj_binary(H, "stablehlo.multiply", w, dims[j].w[tap[j]]);
    }
    pj_val_t vmask = pj_select(H, valid, pj_full(H, gt, 1), pj_full(H, gt, 0));
    pj_val_t wk = pj_reshape(H, pj_binary(H, "stablehlo.multiply", w, vmask), 1, &k);
    pj_val_t fk = pj_reshape(H, flat, 1, &k);
    pj_val_t wb = pj_broadcast_in_dim(H, wk, kct, &zero_d);
    if (!bw) {
      out = pj_binary(H, "stablehlo.add", out,
                      pj_binary(H, "stablehlo.multiply", gather_rows(L, rows, fk), wb));
      continue;
    }
    gin = scatter_rows(L, gin, fk, pj_binary(H, "stablehlo.multiply", go, wb));
    if (mode == GS_NEAREST) continue;
    /* sum over channels of grad_output * input there (0 out of bounds) */
    pj_val_t gv = pj_reduce(H, pj_binary(H, "stablehlo.multiply", go, gather_rows(L, rows, fk)),
                            &one_d, 1, "add");
    gv = pj_binary(H, "stablehlo.multiply", gv, pj_reshape(H, vmask, 1, &k));
    for (int j = 0; j < nsp; j++) {
      pj_val_t pw = dims[j].dw[tap[j]];
      for (int i = 0; i < nsp; i++)
        if (i != j) pw = pj_binary(H, "stablehlo.multiply", pw, dims[i].w[tap[i]]);
      ggrid[j] = pj_binary(H, "stablehlo.add", ggrid[j],
                           pj_binary(H, "stablehlo.multiply", gv, pj_reshape(H, pw, 1, &k)));
    }
  }
  if (!bw) {
    /* [K, C] -> [N, O..., C] -> [N, C, O...] */
    int64_t od[PJ_MAX_RANK], back[PJ_MAX_RANK];
    for (int i = 0; i < gt.rank; i++) od[i] = gt.dims[i];
    od[gt.rank] = c;
    back[0] = 0;
    back[1] = nsp + 1;
    for (int j = 0; j < nsp; j++) back[2 + j] = 1 + j;
    set_checked(L, 0, pj_transpose(H, pj_reshape(H, out, nsp + 2, od), back));
    return NULL;
  }
  int64_t mask[2] = {1, 1};
  pj_ints(L, "output_mask", mask, 2);
  int kout = 0;
  if (mask[0]) {
    int64_t sd[PJ_MAX_RANK], back[PJ_MAX_RANK];
    sd[0] = n;
    for (int j = 0; j < nsp; j++) sd[1 + j] = x.t.dims[2 + j];
    sd[nsp + 1] = c;
    back[0] = 0;
    back[1] = nsp + 1;
    for (int j = 0; j < nsp; j++) back[2 + j] = 1 + j;
    set_checked(L, kout++, pj_transpose(H, pj_reshape(H, gin, nsp + 2, sd), back));
  }
  /* grad_grid: the Meta kernels return it whatever output_mask[1] says (CPU computes it too) */
  if (kout < pj_nout(L)) {
    pj_val_t parts[MAXSP];
    for (int comp = 0; comp < nsp; comp++) {
      int j = nsp - 1 - comp;
      pj_val_t gj = pj_binary(H, "stablehlo.multiply", ggrid[j],
                              pj_reshape(H, dims[j].mult, 1, &k));
      int64_t gd[PJ_MAX_RANK];
      for (int i = 0; i < gt.rank; i++) gd[i] = gt.dims[i];
      gd[gt.rank] = 1;
      parts[comp] = pj_reshape(H, gj, gt.rank + 1, gd);
    }
    set_checked(L, kout++, pj_concat(H, parts, nsp, nsp + 1));
  }
  return NULL;
}

/* ---- adaptive max pooling ---- */

/* adaptive_max_pool{2,3}d: (max, flat index within the plane) over CPU's adaptive windows.
 * Each pooled dim is gathered to [out * K] positions (K the longest window; shorter windows
 * repeat their last element, which changes neither the max nor the index chosen), then a
 * K-strided window reduces them. */
static pj_status_t *lower_adaptive_max_pool(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_type_t ot = pj_out_type(L, 0);
  int nsp = name_nsp(L->c->op);
  if (x.id < 0 || !dtype_ok(L, x.t.dtype, DT_FLOAT)) return NULL;
  int lead = ot.rank - nsp;
  if (nsp < 1 || lead < 0 || x.t.rank != ot.rank) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s of a rank-%d input", L->c->op, ot.rank);
    return NULL;
  }
  pj_val_t idx = plane_index(L, x.t, lead, nsp);
  int64_t win[PJ_MAX_RANK], str[PJ_MAX_RANK], dil[PJ_MAX_RANK], lo[PJ_MAX_RANK] = {0},
      hi[PJ_MAX_RANK] = {0};
  for (int i = 0; i < ot.rank; i++) win[i] = str[i] = dil[i] = 1;
  for (int j = 0; j < nsp; j++) {
    int axis = lead + j;
    int64_t in = x.t.dims[axis], out = ot.dims[axis], k = 1;
    for (int64_t o = 0; o < out; o++) {
      int64_t s0, e0;
      adaptive_window(o, in, out, &s0, &e0);
      if (e0 - s0 > k) k = e0 - s0;
    }
    double *tab = dalloc(L, out * k);
    if (!tab) return NULL;
    for (int64_t o = 0; o < out; o++) {
      int64_t s0, e0;
      adaptive_window(o, in, out, &s0, &e0);
      for (int64_t q = 0; q < k; q++) tab[o * k + q] = (double)(s0 + q < e0 ? s0 + q : e0 - 1);
    }
    x = gather_axis(L, x, axis, tab, out * k);
    idx = gather_axis(L, idx, axis, tab, out * k);
    free(tab);
    win[axis] = str[axis] = k;
  }
  pj_val_t res[2];
  max_index_window(L, x, idx, win, str, dil, lo, hi, res);
  set_checked(L, 0, res[0]);
  if (pj_nout(L) > 1) set_checked(L, 1, res[1]);
  return NULL;
}

/* ---- fractional max pooling ---- */

/* fractional_max_pool{2,3}d: windows of the kernel's size at starts drawn per plane from
 * random_samples ([N', C, nsp] with N' >= N, u in [0, 1), in CPU's per-dim order; ATen's
 * shape check has run before lowering). Only the first N rows are read, N being 1 for an
 * unbatched input, as CPU does: module_db passes [2, 4, 3] samples to a [4, T, H, W] input.
 * With
 * alpha = (in - k) / (out - 1), start[i] = trunc((i + u) alpha) - trunc(u alpha), the last
 * start being in - k. The starts are computed on the device; each window is gathered to
 * [planes, out..., k...] and reduced to (max, flat index within the plane). */
static pj_status_t *lower_fractional_max_pool(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_type_t ot = pj_out_type(L, 0);
  int nsp = name_nsp(L->c->op);
  if (x.id < 0 || !dtype_ok(L, x.t.dtype, DT_FLOAT)) return NULL;
  int lead = ot.rank - nsp;
  int64_t k[MAXSP];
  if (nsp < 2 || lead < 0 || x.t.rank != ot.rank || 1 + 2 * nsp > PJ_MAX_RANK ||
      !geom(L, "kernel_size", nsp, k, NULL, 1)) {
    if (pj_hlo_ok(H)) pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s of a rank-%d input", L->c->op, ot.rank);
    return NULL;
  }
  pj_dtype_t ct = pj_dtype_compute(x.t.dtype);
  int64_t planes = 1, psize = 1;
  for (int i = 0; i < lead; i++) planes *= x.t.dims[i];
  for (int j = 0; j < nsp; j++) psize *= x.t.dims[lead + j];
  pj_val_t rs = pj_tensor(L, "random_samples");
  int64_t nb = lead == 2 ? x.t.dims[0] : 1;
  if (rs.id < 0 || rs.t.rank != 3 || rs.t.dims[0] < nb || nb * rs.t.dims[1] != planes ||
      rs.t.dims[2] != nsp) {
    if (pj_hlo_ok(H))
      pj_fail(L, PJ_ERR_RUNTIME, "%s: random_samples of an unexpected shape", L->c->op);
    return NULL;
  }
  int64_t r0[3] = {0, 0, 0}, r1[3] = {nb, rs.t.dims[1], nsp}, pn[2] = {planes, nsp};
  pj_val_t u = pj_reshape(H, pj_convert(H, pj_slice(H, rs, r0, r1, NULL), ct), 2, pn);
  pj_type_t T = {.dtype = PJ_I64, .rank = 1 + 2 * nsp};
  T.dims[0] = planes;
  for (int j = 0; j < nsp; j++) {
    T.dims[1 + j] = ot.dims[lead + j];
    T.dims[1 + nsp + j] = k[j];
  }
  pj_val_t idx = pj_full(H, T, 0);
  int64_t stride = 1;
  for (int j = nsp - 1; j >= 0; j--) {
    int64_t in = x.t.dims[lead + j], out = ot.dims[lead + j];
    int64_t sj = nsp == 2 ? 1 - j : j; /* CPU's sample order: (w, h) in 2-D, (t, h, w) in 3-D */
    int64_t po[2] = {planes, out}, s0[2] = {0, sj}, s1[2] = {planes, sj + 1};
    pj_type_t tf = pj_type(ct, 2, po), ti = pj_type(PJ_I64, 2, po);
    pj_val_t uj = pj_reshape(H, pj_slice(H, u, s0, s1, NULL), 1, &planes);
    int64_t d0 = 0;
    pj_val_t ub = pj_broadcast_in_dim(H, uj, tf, &d0);
    double alpha = out > 1 ? (double)(in - k[j]) / (double)(out - 1) : 0;
    if (ct != PJ_F64) alpha = (double)(float)alpha;
    pj_val_t al = pj_full(H, tf, alpha);
    pj_val_t a = pj_convert(H, MUL(ADD(pj_convert(H, pj_iota(H, ti, 1), ct), ub), al), PJ_I64);
    pj_val_t b = pj_convert(H, MUL(ub, al), PJ_I64);
    pj_val_t start = SEL(CMP("EQ", pj_iota(H, ti, 1), pj_full(H, ti, (double)(out - 1))),
                         pj_full(H, ti, (double)(in - k[j])), SUB(a, b));
    int64_t map[2] = {0, 1 + j};
    pj_val_t pos = ADD(pj_broadcast_in_dim(H, start, T, map), pj_iota(H, T, 1 + nsp + j));
    idx = ADD(idx, MUL(pos, pj_full(H, T, (double)stride)));
    stride *= in;
  }
  int64_t flat_n = planes * psize;
  pj_val_t gidx = ADD(idx, MUL(pj_iota(H, T, 0), pj_full(H, T, (double)psize)));
  pj_val_t vals = pj_gather_1d(H, pj_reshape(H, x, 1, &flat_n), gidx);
  int64_t win[PJ_MAX_RANK], one[PJ_MAX_RANK], zero[PJ_MAX_RANK] = {0};
  for (int i = 0; i < T.rank; i++) {
    win[i] = i > nsp ? T.dims[i] : 1;
    one[i] = 1;
  }
  pj_val_t res[2];
  max_index_window(L, vals, idx, win, win, one, zero, zero, res);
  set_checked(L, 0, pj_reshape(H, res[0], ot.rank, ot.dims));
  if (pj_nout(L) > 1) set_checked(L, 1, pj_reshape(H, res[1], ot.rank, ot.dims));
  return NULL;
}

#define UPSAMPLE_ROWS(X)                                                                      \
  X(upsample_nearest1d) X(upsample_nearest2d) X(upsample_nearest3d)                           \
  X(_upsample_nearest_exact1d) X(_upsample_nearest_exact2d) X(_upsample_nearest_exact3d)      \
  X(upsample_linear1d) X(upsample_bilinear2d) X(upsample_trilinear3d)
#define UP_ENTRY(n) \
  {#n, lower_upsample, PJ_SHAPE_EXACT}, {#n "_backward", lower_upsample, PJ_SHAPE_EXACT},

const pj_lowering_entry_t pj_lowerings_conv[] = {
    {"convolution", lower_convolution, PJ_SHAPE_EXACT_INPUTS},
    {"convolution_backward", lower_convolution_backward, PJ_SHAPE_EXACT_INPUTS},
    {"max_pool2d_with_indices", lower_max_pool, PJ_SHAPE_EXACT},
    {"max_pool3d_with_indices", lower_max_pool, PJ_SHAPE_EXACT},
    {"max_pool2d_with_indices_backward", lower_max_pool_backward, PJ_SHAPE_EXACT},
    {"max_pool3d_with_indices_backward", lower_max_pool_backward, PJ_SHAPE_EXACT},
    {"avg_pool2d", lower_avg_pool, PJ_SHAPE_EXACT},
    {"avg_pool3d", lower_avg_pool, PJ_SHAPE_EXACT},
    {"avg_pool2d_backward", lower_avg_pool_backward, PJ_SHAPE_EXACT},
    {"avg_pool3d_backward", lower_avg_pool_backward, PJ_SHAPE_EXACT},
    {"adaptive_max_pool2d", lower_adaptive_max_pool, PJ_SHAPE_EXACT},
    {"adaptive_max_pool3d", lower_adaptive_max_pool, PJ_SHAPE_EXACT},
    {"adaptive_max_pool2d_backward", lower_max_pool_backward, PJ_SHAPE_EXACT},
    {"adaptive_max_pool3d_backward", lower_max_pool_backward, PJ_SHAPE_EXACT},
    {"fractional_max_pool2d", lower_fractional_max_pool, PJ_SHAPE_EXACT},
    {"fractional_max_pool3d", lower_fractional_max_pool, PJ_SHAPE_EXACT},
    {"fractional_max_pool2d_backward", lower_max_pool_backward, PJ_SHAPE_EXACT},
    {"fractional_max_pool3d_backward", lower_max_pool_backward, PJ_SHAPE_EXACT},
    {"upsample_bicubic2d", lower_interp_matrix, PJ_SHAPE_EXACT},
    {"upsample_bicubic2d_backward", lower_interp_matrix, PJ_SHAPE_EXACT},
    {"_upsample_bilinear2d_aa", lower_interp_matrix, PJ_SHAPE_EXACT},
    {"_upsample_bilinear2d_aa_backward", lower_interp_matrix, PJ_SHAPE_EXACT},
    {"_upsample_bicubic2d_aa", lower_interp_matrix, PJ_SHAPE_EXACT},
    {"_upsample_bicubic2d_aa_backward", lower_interp_matrix, PJ_SHAPE_EXACT},
    {"grid_sampler_2d", lower_grid_sampler, PJ_SHAPE_EXACT},
    {"grid_sampler_2d_backward", lower_grid_sampler, PJ_SHAPE_EXACT},
    {"grid_sampler_3d", lower_grid_sampler, PJ_SHAPE_EXACT},
    {"grid_sampler_3d_backward", lower_grid_sampler, PJ_SHAPE_EXACT},
    {"_adaptive_avg_pool2d", lower_adaptive_avg_pool, PJ_SHAPE_EXACT},
    {"_adaptive_avg_pool3d", lower_adaptive_avg_pool, PJ_SHAPE_EXACT},
    {"_adaptive_avg_pool2d_backward", lower_adaptive_avg_pool, PJ_SHAPE_EXACT},
    {"_adaptive_avg_pool3d_backward", lower_adaptive_avg_pool, PJ_SHAPE_EXACT},
    UPSAMPLE_ROWS(UP_ENTRY)
    {NULL, NULL, PJ_SHAPE_EXACT},
};
