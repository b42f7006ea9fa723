/* Collectives built from descriptions (collective.h) on the CPU plugin with 4 devices: every
 * kind on 2 and 4 replicas, every ReduceOp on float32, float64, bfloat16, int32, int64, uint8
 * and bool (the pairs Gloo refuses as statuses), sub-groups and both dimensions of a 2x2 mesh,
 * non-contiguous input views, list forms, uneven all_to_all, rooted collectives at roots 1 and
 * 2, permutes, barrier, error statuses, and one compile per description. Every expected value
 * is computed here on the host from the same inputs. Needs TORCH_PJRT_PLUGIN. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "torch_pjrt/collective.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/stream.h"
#include "torch_pjrt/transfer.h"

#define MAXR 4
#define MAXIN 4
#define MAXN 64

/* A host value: floats in f, integers and bools in i (int64 keeps 64-bit ints exact). */
typedef struct {
  double f;
  int64_t i;
} num_t;

static bool is_fp(pj_dtype_t dt) { return pj_dtype_is_float(dt); }

/* ---- dtype bytes ---- */

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
  u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void store(pj_dtype_t dt, void *buf, int64_t k, num_t v) {
  switch (dt) {
    case PJ_F32: ((float *)buf)[k] = (float)v.f; break;
    case PJ_F64: ((double *)buf)[k] = v.f; break;
    case PJ_BF16: ((uint16_t *)buf)[k] = to_bf16((float)v.f); break;
    case PJ_I32: ((int32_t *)buf)[k] = (int32_t)v.i; break;
    case PJ_I64: ((int64_t *)buf)[k] = v.i; break;
    case PJ_U8: ((uint8_t *)buf)[k] = (uint8_t)v.i; break;
    case PJ_BOOL: ((uint8_t *)buf)[k] = v.i != 0; break;
    default: abort();
  }
}

static num_t load(pj_dtype_t dt, const void *buf, int64_t k) {
  num_t v = {0, 0};
  switch (dt) {
    case PJ_F32: v.f = ((const float *)buf)[k]; break;
    case PJ_F64: v.f = ((const double *)buf)[k]; break;
    case PJ_BF16: v.f = from_bf16(((const uint16_t *)buf)[k]); break;
    case PJ_I32: v.i = ((const int32_t *)buf)[k]; break;
    case PJ_I64: v.i = ((const int64_t *)buf)[k]; break;
    case PJ_U8: v.i = ((const uint8_t *)buf)[k]; break;
    case PJ_BOOL: v.i = ((const uint8_t *)buf)[k] != 0; break;
    default: abort();
  }
  return v;
}

/* A value as the dtype holds it (what the device would store). */
static num_t round_to(pj_dtype_t dt, num_t v) {
  unsigned char b[8];
  store(dt, b, 0, v);
  return load(dt, b, 0);
}

/* ---- inputs ---- */

/* Element k of replica r's storage s: distinct, small (sums and products of four are exact in
 * float32), negative ones included; int64 ones above 2^53 (exact only as integers). */
static num_t input(pj_dtype_t dt, int r, int s, int64_t k) {
  num_t v = {0, 0};
  const int64_t base = (r * 37 + s * 11 + k * 13) % 29;
  if (is_fp(dt)) v.f = (double)(base - 12) * 0.5;
  else if (dt == PJ_BOOL) v.i = (r + s + k) % 3 != 0;
  else if (dt == PJ_U8) v.i = (base * 9) % 256; /* sums wrap around */
  else if (dt == PJ_I64) v.i = (base - 12) + ((int64_t)1 << 55) * (k % 3);
  else v.i = base - 12;
  return v;
}

/* ---- the host reference ---- */

static num_t combine(pj_reduce_op_t op, pj_dtype_t dt, num_t a, num_t b) {
  num_t v = {0, 0};
  if (is_fp(dt)) {
    switch (op) {
      case PJ_REDUCE_PRODUCT: v.f = a.f * b.f; break;
      case PJ_REDUCE_MIN: v.f = fmin(a.f, b.f); break;
      case PJ_REDUCE_MAX: v.f = fmax(a.f, b.f); break;
      default: v.f = a.f + b.f; break; /* SUM, AVG, PREMUL_SUM */
    }
    return v;
  }
  /* integers with two's complement wrap-around (unsigned arithmetic), bool as C++ does */
  const uint64_t x = (uint64_t)a.i, y = (uint64_t)b.i;
  switch (op) {
    case PJ_REDUCE_SUM: v.i = (int64_t)(x + y); break;
    case PJ_REDUCE_PRODUCT: v.i = (int64_t)(x * y); break;
    case PJ_REDUCE_MIN: v.i = a.i < b.i ? a.i : b.i; break;
    case PJ_REDUCE_MAX: v.i = a.i > b.i ? a.i : b.i; break;
    case PJ_REDUCE_BAND: v.i = a.i & b.i; break;
    case PJ_REDUCE_BOR: v.i = a.i | b.i; break;
    case PJ_REDUCE_BXOR: v.i = a.i ^ b.i; break;
    default: abort();
  }
  if (dt == PJ_BOOL) v.i = v.i != 0;
  return round_to(dt, v);
}

/* Whether c10d (Gloo, and PREMUL_SUM as NCCL has it) admits op on dt. */
static bool admitted(pj_reduce_op_t op, pj_dtype_t dt) {
  if (is_fp(dt)) return op != PJ_REDUCE_BAND && op != PJ_REDUCE_BOR && op != PJ_REDUCE_BXOR;
  return op != PJ_REDUCE_AVG && op != PJ_REDUCE_PREMUL_SUM;
}

typedef struct {
  pj_coll_desc_t d;
  pj_coll_view_t views[MAXIN];
  int64_t sizes[MAXIN][4], strides[MAXIN][4];
  int devices[MAXR];
  double factors[MAXR];
} job_t;

/* The view's elements of replica r's storage s, in row-major order; returns their count. */
static int64_t read_view(const job_t *j, int r, int s, num_t *out) {
  const pj_coll_view_t *v = &j->views[s];
  int64_t n = 1;
  for (int i = 0; i < v->rank; i++) n *= v->sizes[i];
  for (int64_t e = 0; e < n; e++) {
    int64_t rest = e, at = v->offset;
    for (int i = v->rank - 1; i >= 0; i--) {
      at += (rest % v->sizes[i]) * v->strides[i];
      rest /= v->sizes[i];
    }
    out[e] = input(j->d.dtype, r, s, at);
  }
  return n;
}

static int group_size(const job_t *j) { return j->d.group_size; }
static int member(const job_t *j, int r, int g) {
  /* replica number of rank g in r's group */
  const int G = group_size(j);
  for (int k = 0; k < j->d.nreplicas / G; k++)
    for (int i = 0; i < G; i++) {
      const int m = j->d.groups ? j->d.groups[k * G + i] : k * G + i;
      if (m == r) return j->d.groups ? j->d.groups[k * G + g] : k * G + g;
    }
  abort();
}
static int rank_in_group(const job_t *j, int r) {
  for (int g = 0; g < group_size(j); g++)
    if (member(j, r, g) == r) return g;
  abort();
}

/* The flat input of replica r (list inputs concatenated). */
static int64_t flat_input(const job_t *j, int r, num_t *out) {
  int64_t n = 0;
  for (int s = 0; s < j->d.ninputs; s++) n += read_view(j, r, s, out + n);
  return n;
}

/* The reduction over r's group of the flat inputs (premul applied, AVG divided). */
static int64_t reduced(const job_t *j, int r, num_t *out) {
  const pj_coll_desc_t *d = &j->d;
  num_t tmp[MAXN * MAXIN];
  int64_t n = 0;
  for (int g = 0; g < d->group_size; g++) {
    const int m = member(j, r, g);
    n = flat_input(j, m, tmp);
    for (int64_t e = 0; e < n; e++) {
      num_t x = tmp[e];
      if (d->op == PJ_REDUCE_PREMUL_SUM) x.f = round_to(d->dtype, (num_t){x.f * j->factors[m], 0}).f;
      out[e] = g == 0 ? x : combine(d->op, d->dtype, out[e], x);
      if (is_fp(d->dtype)) out[e] = round_to(d->dtype, out[e]);
    }
  }
  if (d->op == PJ_REDUCE_AVG)
    for (int64_t e = 0; e < n; e++) out[e].f = round_to(d->dtype, (num_t){out[e].f / d->group_size, 0}).f;
  return n;
}

/* Expected output k of replica r as a flat list; returns its length. */
static int64_t expected(const job_t *j, int r, int k, num_t *out) {
  const pj_coll_desc_t *d = &j->d;
  const int G = d->group_size, me = rank_in_group(j, r);
  num_t tmp[MAXN * MAXIN];
  int64_t n;
  switch (d->kind) {
    case PJ_COLL_ALL_REDUCE:
      return reduced(j, r, out);
    case PJ_COLL_REDUCE:
      return me == d->root ? reduced(j, r, out) : flat_input(j, r, out);
    case PJ_COLL_REDUCE_SCATTER:
      n = reduced(j, r, tmp) / G;
      memcpy(out, tmp + me * n, sizeof(num_t) * (size_t)n);
      return n;
    case PJ_COLL_ALL_GATHER:
    case PJ_COLL_GATHER:
      if (d->list_out) return flat_input(j, member(j, r, k), out);
      n = 0;
      for (int g = 0; g < G; g++) n += flat_input(j, member(j, r, g), out + n);
      return n;
    case PJ_COLL_BROADCAST:
      return flat_input(j, member(j, r, d->root), out);
    case PJ_COLL_SCATTER:
      n = flat_input(j, member(j, r, d->root), tmp) / G;
      memcpy(out, tmp + me * n, sizeof(num_t) * (size_t)n);
      return n;
    case PJ_COLL_ALL_TO_ALL: {
      const int64_t rows = j->views[0].sizes[0];
      const int64_t row = rows ? flat_input(j, r, tmp) / rows : 0;
      if (!d->in_splits) {
        n = 0;
        for (int g = 0; g < G; g++) {
          const int64_t c = flat_input(j, member(j, r, g), tmp) / G;
          memcpy(out + n, tmp + me * c, sizeof(num_t) * (size_t)c);
          n += c;
        }
        return n;
      }
      int64_t most = 0, got = 0;
      for (int q = 0; q < d->nreplicas; q++) {
        int64_t s = 0;
        for (int g = 0; g < G; g++) s += d->in_splits[member(j, q, g) * G + rank_in_group(j, q)];
        if (s > most) most = s;
      }
      for (int g = 0; g < G; g++) {
        const int src = member(j, r, g);
        int64_t off = 0;
        for (int t = 0; t < me; t++) off += d->in_splits[src * G + t];
        flat_input(j, src, tmp);
        const int64_t cnt = d->in_splits[src * G + me];
        memcpy(out + got * row, tmp + off * row, sizeof(num_t) * (size_t)(cnt * row));
        got += cnt;
      }
      for (int64_t e = got * row; e < most * row; e++) out[e] = (num_t){0, 0};
      return most * row;
    }
    case PJ_COLL_PERMUTE:
      for (int p = 0; p < d->npairs; p++)
        if (d->pairs[2 * p + 1] == r) return flat_input(j, d->pairs[2 * p], out);
      return flat_input(j, r, out);
    case PJ_COLL_BARRIER:
      out[0] = (num_t){0, 0};
      return 1;
    default:
      abort();
  }
}

static bool close_to(pj_dtype_t dt, num_t got, num_t want) {
  if (!is_fp(dt)) return got.i == want.i;
  if (isnan(want.f)) return isnan(got.f);
  const double tol = dt == PJ_BF16 ? 1.0 / 64 : dt == PJ_F32 ? 1e-6 : 1e-12;
  return fabs(got.f - want.f) <= tol * fmax(1.0, fabs(want.f));
}

/* ---- running ---- */

static int g_runs;

/* Runs j on the device and checks every output of every replica against the reference. */
static void run_job(job_t *j, const char *what) {
  pj_coll_desc_t *d = &j->d;
  d->inputs = j->views;
  for (int s = 0; s < d->ninputs; s++) {
    j->views[s].sizes = j->sizes[s];
    j->views[s].strides = j->strides[s];
  }
  const int R = d->nreplicas, nin = d->ninputs, nout = pj_coll_num_outputs(d);
  struct PJRT_Buffer *in[MAXR * MAXIN], *outs[MAXR * MAXR];
  const size_t item = pj_dtype_info(d->dtype)->itemsize;
  for (int r = 0; r < R; r++)
    for (int s = 0; s < nin; s++) {
      unsigned char host[MAXN * 8];
      const int64_t numel = j->views[s].numel;
      for (int64_t k = 0; k < numel; k++) store(d->dtype, host, k, input(d->dtype, r, s, k));
      OK(pj_transfer_to_device(j->devices[r], host, d->dtype, &numel, 1, &in[r * nin + s]));
    }
  pj_marker_t *done[MAXR];
  pj_status_t *st = pj_coll_run(d, j->devices, in, j->factors, outs, done);
  if (st) {
    fprintf(stderr, "%s: %s\n", what, pj_status_message(st));
    pj_status_free(st);
    ctest_failures++;
  } else {
    g_runs++;
    for (int r = 0; r < R; r++) {
      OK(pj_marker_wait(done[r]));
      pj_marker_free(done[r]);
      for (int k = 0; k < nout; k++) {
        pj_type_t t;
        OK(pj_coll_output_type(d, k, &t));
        const int64_t n = pj_type_numel(&t);
        unsigned char host[MAXN * MAXIN * 8];
        num_t want[MAXN * MAXIN];
        OK(pj_transfer_to_host(outs[r * nout + k], host, (size_t)n * (t.dtype == PJ_I32 ? 4 : item)));
        const int64_t wn = expected(j, r, k, want);
        EXPECT(wn == n);
        int bad = 0;
        for (int64_t e = 0; e < n && e < wn; e++) {
          const num_t got = load(t.dtype, host, e);
          if (!close_to(t.dtype, got, want[e]) && bad++ < 3)
            fprintf(stderr, "%s: replica %d output %d element %lld: got %g/%lld, want %g/%lld\n",
                    what, r, k, (long long)e, got.f, (long long)got.i, want[e].f,
                    (long long)want[e].i);
        }
        if (bad) ctest_failures++;
        pj_buffer_destroy(outs[r * nout + k]);
      }
    }
  }
  for (int i = 0; i < R * nin; i++) pj_buffer_destroy(in[i]);
}

/* A job of `kind` over R replicas in one group (or `groups` of G), every input a contiguous
 * 1-D view of n elements at offset 0 of its own storage. */
static job_t make(pj_coll_kind_t kind, pj_dtype_t dt, int R, int G, const int *groups, int ninputs,
                  int64_t n) {
  job_t j;
  memset(&j, 0, sizeof j);
  j.d.kind = kind;
  j.d.dtype = dt;
  j.d.nreplicas = R;
  j.d.group_size = G;
  j.d.groups = groups;
  j.d.ninputs = ninputs;
  for (int s = 0; s < ninputs; s++) {
    j.views[s].rank = 1;
    j.sizes[s][0] = n;
    j.strides[s][0] = 1;
    j.views[s].numel = n;
  }
  for (int r = 0; r < R; r++) {
    j.devices[r] = r;
    j.factors[r] = 0.5 * (r + 1);
  }
  return j;
}

static void expect_code(pj_status_t *st, pj_code_t code, const char *what, const char *words) {
  if (!st || pj_status_code(st) != code || (words && !strstr(pj_status_message(st), words)))
    fprintf(stderr, "%s: expected code %d (%s), got %s\n", what, (int)code, words ? words : "",
            st ? pj_status_message(st) : "success");
  EXPECT(st && pj_status_code(st) == code);
  EXPECT(!st || !words || strstr(pj_status_message(st), words));
  pj_status_free(st);
}

static const pj_dtype_t kDtypes[] = {PJ_F32, PJ_F64, PJ_BF16, PJ_I32, PJ_I64, PJ_U8, PJ_BOOL};
#define NDT (int)(sizeof kDtypes / sizeof *kDtypes)

/* Every ReduceOp on every dtype over 4 replicas (and float32 / int32 over 2): all_reduce where
 * admitted, Gloo's refusal otherwise. */
static void test_all_reduce_ops(void) {
  for (int t = 0; t < NDT; t++)
    for (int op = 0; op < PJ_REDUCE_NUM_OPS; op++) {
      const pj_dtype_t dt = kDtypes[t];
      char what[96];
      snprintf(what, sizeof what, "all_reduce %s %s", pj_reduce_op_name(op),
               pj_dtype_info(dt)->name);
      job_t j = make(PJ_COLL_ALL_REDUCE, dt, 4, 4, NULL, 1, 5);
      j.d.op = (pj_reduce_op_t)op;
      if (!admitted(op, dt)) {
        j.d.inputs = j.views;
        j.views[0].sizes = j.sizes[0];
        j.views[0].strides = j.strides[0];
        expect_code(pj_coll_check(&j.d), PJ_ERR_RUNTIME, what, "Cannot use ReduceOp.");
        continue;
      }
      run_job(&j, what);
      if (dt == PJ_F32 || dt == PJ_I32) {
        job_t k = make(PJ_COLL_ALL_REDUCE, dt, 2, 2, NULL, 1, 5);
        k.d.op = (pj_reduce_op_t)op;
        k.devices[0] = 3; /* replica numbers, not devices, name the group */
        k.devices[1] = 1;
        run_job(&k, what);
      }
    }
}

/* reduce_scatter (tensor and list forms) and reduce with a few ops and dtypes. */
static void test_reductions(void) {
  const pj_reduce_op_t ops[] = {PJ_REDUCE_SUM, PJ_REDUCE_MAX, PJ_REDUCE_AVG, PJ_REDUCE_PREMUL_SUM,
                                PJ_REDUCE_BXOR, PJ_REDUCE_PRODUCT};
  for (int t = 0; t < NDT; t++)
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
      const pj_dtype_t dt = kDtypes[t];
      if (!admitted(ops[o], dt)) continue;
      char what[96];
      for (int R = 2; R <= 4; R += 2) {
        snprintf(what, sizeof what, "reduce_scatter %s %s on %d", pj_reduce_op_name(ops[o]),
                 pj_dtype_info(dt)->name, R);
        job_t j = make(PJ_COLL_REDUCE_SCATTER, dt, R, R, NULL, 1, 3 * R);
        j.d.op = ops[o];
        run_job(&j, what);
        snprintf(what, sizeof what, "reduce_scatter list %s %s on %d", pj_reduce_op_name(ops[o]),
                 pj_dtype_info(dt)->name, R);
        j = make(PJ_COLL_REDUCE_SCATTER, dt, R, R, NULL, R, 3);
        j.d.op = ops[o];
        run_job(&j, what);
      }
      snprintf(what, sizeof what, "reduce %s %s to root 2", pj_reduce_op_name(ops[o]),
               pj_dtype_info(dt)->name);
      job_t j = make(PJ_COLL_REDUCE, dt, 4, 4, NULL, 1, 6);
      j.d.op = ops[o];
      j.d.root = 2;
      run_job(&j, what);
    }
  job_t j = make(PJ_COLL_REDUCE, PJ_F32, 2, 2, NULL, 1, 6);
  j.d.op = PJ_REDUCE_SUM;
  j.d.root = 1;
  run_job(&j, "reduce to root 1 of 2");
}

/* The data-moving kinds on every dtype, on 2 and 4 replicas. */
static void test_movement(void) {
  for (int t = 0; t < NDT; t++)
    for (int R = 2; R <= 4; R += 2) {
      const pj_dtype_t dt = kDtypes[t];
      char what[96];
      snprintf(what, sizeof what, "all_gather %s on %d", pj_dtype_info(dt)->name, R);
      job_t j = make(PJ_COLL_ALL_GATHER, dt, R, R, NULL, 1, 3);
      run_job(&j, what);
      j.d.list_out = true;
      run_job(&j, what);
      snprintf(what, sizeof what, "gather %s on %d", pj_dtype_info(dt)->name, R);
      j = make(PJ_COLL_GATHER, dt, R, R, NULL, 1, 3);
      j.d.root = R - 1;
      j.d.list_out = true;
      run_job(&j, what);
      snprintf(what, sizeof what, "broadcast %s on %d from 1", pj_dtype_info(dt)->name, R);
      j = make(PJ_COLL_BROADCAST, dt, R, R, NULL, 1, 5);
      j.d.root = 1;
      run_job(&j, what);
      snprintf(what, sizeof what, "scatter %s on %d from 1", pj_dtype_info(dt)->name, R);
      j = make(PJ_COLL_SCATTER, dt, R, R, NULL, 1, 2 * R);
      j.d.root = 1;
      run_job(&j, what);
      j = make(PJ_COLL_SCATTER, dt, R, R, NULL, R, 2);
      j.d.root = R - 1;
      run_job(&j, what);
      snprintf(what, sizeof what, "all_to_all %s on %d", pj_dtype_info(dt)->name, R);
      j = make(PJ_COLL_ALL_TO_ALL, dt, R, R, NULL, 1, 2 * R);
      run_job(&j, what);
      snprintf(what, sizeof what, "permute %s on %d", pj_dtype_info(dt)->name, R);
      j = make(PJ_COLL_PERMUTE, dt, R, R, NULL, 1, 4);
      const int ring[8] = {0, 1, 1, 2, 2, 3, 3, 0}, swap[4] = {0, 1, 1, 0};
      j.d.pairs = R == 4 ? ring : swap;
      j.d.npairs = R;
      run_job(&j, what);
    }
  /* One send: replica 2 to 0; replicas 1, 2 and 3 keep their tensors. */
  job_t j = make(PJ_COLL_PERMUTE, PJ_F32, 4, 4, NULL, 1, 4);
  const int one[2] = {2, 0};
  j.d.pairs = one;
  j.d.npairs = 1;
  run_job(&j, "send 2 -> 0");
  j = make(PJ_COLL_BARRIER, PJ_F32, 4, 4, NULL, 0, 0);
  run_job(&j, "barrier");
  j = make(PJ_COLL_BARRIER, PJ_F32, 2, 2, NULL, 0, 0);
  run_job(&j, "barrier of 2");
  /* 0-d: gathered into [G]. */
  j = make(PJ_COLL_ALL_GATHER, PJ_I64, 4, 4, NULL, 1, 1);
  j.views[0].rank = 0;
  run_job(&j, "all_gather of 0-d");
}

/* Sub-groups, and a 2x2 mesh's rows {0,1},{2,3} and columns {0,2},{1,3}. */
static void test_groups(void) {
  static const int rows[4] = {0, 1, 2, 3}, cols[4] = {0, 2, 1, 3};
  const int *meshes[2] = {rows, cols};
  for (int m = 0; m < 2; m++) {
    char what[64];
    snprintf(what, sizeof what, "mesh %s", m ? "columns" : "rows");
    job_t j = make(PJ_COLL_ALL_REDUCE, PJ_F32, 4, 2, meshes[m], 1, 4);
    j.d.op = PJ_REDUCE_SUM;
    j.devices[0] = 2, j.devices[1] = 0, j.devices[2] = 3, j.devices[3] = 1;
    run_job(&j, what);
    j.d.op = PJ_REDUCE_AVG;
    run_job(&j, what);
    j = make(PJ_COLL_ALL_GATHER, PJ_I32, 4, 2, meshes[m], 1, 3);
    run_job(&j, what);
    j = make(PJ_COLL_REDUCE_SCATTER, PJ_I64, 4, 2, meshes[m], 1, 4);
    j.d.op = PJ_REDUCE_MIN;
    run_job(&j, what);
    j = make(PJ_COLL_BROADCAST, PJ_F64, 4, 2, meshes[m], 1, 3);
    j.d.root = 1;
    run_job(&j, what);
    j = make(PJ_COLL_REDUCE, PJ_U8, 4, 2, meshes[m], 1, 3);
    j.d.op = PJ_REDUCE_SUM;
    j.d.root = 1;
    run_job(&j, what);
    j = make(PJ_COLL_ALL_TO_ALL, PJ_BF16, 4, 2, meshes[m], 1, 4);
    run_job(&j, what);
    j = make(PJ_COLL_SCATTER, PJ_BOOL, 4, 2, meshes[m], 1, 4);
    j.d.root = 0;
    run_job(&j, what);
  }
}

/* Inputs read through non-contiguous views. */
static void test_views(void) {
  /* every other element from offset 1: elements 1, 3, 5, 7 of 9 */
  job_t j = make(PJ_COLL_ALL_REDUCE, PJ_F32, 4, 4, NULL, 1, 4);
  j.d.op = PJ_REDUCE_MAX;
  j.strides[0][0] = 2;
  j.views[0].offset = 1;
  j.views[0].numel = 9;
  run_job(&j, "all_reduce of a strided view");
  /* a transposed 2-D view: 4 x 3 of a 3 x 4 storage */
  static const pj_coll_kind_t kinds[] = {PJ_COLL_ALL_REDUCE, PJ_COLL_ALL_GATHER,
                                         PJ_COLL_REDUCE_SCATTER, PJ_COLL_ALL_TO_ALL,
                                         PJ_COLL_BROADCAST, PJ_COLL_SCATTER, PJ_COLL_PERMUTE};
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    j = make(kinds[k], PJ_I32, 4, 4, NULL, 1, 0);
    j.d.op = PJ_REDUCE_SUM;
    j.d.root = 3;
    j.views[0].rank = 2;
    j.sizes[0][0] = 4, j.sizes[0][1] = 3;
    j.strides[0][0] = 1, j.strides[0][1] = 4;
    j.views[0].numel = 12;
    const int pairs[4] = {1, 3, 3, 1};
    j.d.pairs = pairs;
    j.d.npairs = kinds[k] == PJ_COLL_PERMUTE ? 2 : 0;
    char what[64];
    snprintf(what, sizeof what, "%s of a transposed view", pj_coll_kind_name(kinds[k]));
    run_job(&j, what);
  }
  /* an expanded (stride 0) view */
  j = make(PJ_COLL_ALL_GATHER, PJ_F64, 2, 2, NULL, 1, 5);
  j.strides[0][0] = 0;
  j.views[0].offset = 2;
  run_job(&j, "all_gather of an expanded view");
}

/* all_to_all with uneven splits: 4 x 4 matrices of rows, 2 elements a row. */
static void test_uneven(void) {
  /* in_splits[r][g]: rows replica r sends to rank g; the largest row sum is 6 */
  static const int64_t splits[16] = {1, 2, 0, 3,  /* 6 */
                                     0, 0, 1, 1,  /* 2 */
                                     2, 1, 1, 1,  /* 5 */
                                     3, 0, 2, 0}; /* 5 */
  job_t j = make(PJ_COLL_ALL_TO_ALL, PJ_F32, 4, 4, NULL, 1, 0);
  j.views[0].rank = 2;
  j.sizes[0][0] = 6, j.sizes[0][1] = 2;
  j.strides[0][0] = 2, j.strides[0][1] = 1;
  j.views[0].numel = 12;
  j.d.in_splits = splits;
  /* what each replica gets, checked: column r of the matrix */
  int64_t outs[16];
  for (int r = 0; r < 4; r++)
    for (int g = 0; g < 4; g++) outs[r * 4 + g] = splits[g * 4 + r];
  j.d.out_splits = outs;
  run_job(&j, "uneven all_to_all");
  j.d.inputs = j.views;
  EXPECT(pj_coll_out_rows(&j.d, 0) == 6 && pj_coll_out_rows(&j.d, 1) == 3);
  EXPECT(pj_coll_out_rows(&j.d, 2) == 4 && pj_coll_out_rows(&j.d, 3) == 5);
  /* on a 2 x 2 mesh's columns, int64, a transposed input (3 rows of 2: 2 x 3 storage) */
  static const int cols[4] = {0, 2, 1, 3};
  static const int64_t s2[8] = {1, 2, /* replica 0 (rank 0 of {0,2}) */
                                3, 0, /* replica 1 (rank 0 of {1,3}) */
                                0, 3, /* replica 2 */
                                2, 1};
  j = make(PJ_COLL_ALL_TO_ALL, PJ_I64, 4, 2, cols, 1, 0);
  j.views[0].rank = 2;
  j.sizes[0][0] = 3, j.sizes[0][1] = 2;
  j.strides[0][0] = 1, j.strides[0][1] = 3;
  j.views[0].numel = 6;
  j.d.in_splits = s2;
  run_job(&j, "uneven all_to_all on mesh columns");
  /* two replicas, one of which sends nothing */
  static const int64_t s3[4] = {2, 1, 0, 0};
  j = make(PJ_COLL_ALL_TO_ALL, PJ_BOOL, 2, 2, NULL, 1, 3);
  j.d.in_splits = s3;
  run_job(&j, "uneven all_to_all with an empty side");
}

/* Broadcast moves bits: NaN, infinities and -0.0 arrive as they were. */
static void test_broadcast_exact(void) {
  const float special[4] = {NAN, INFINITY, -0.0f, -INFINITY};
  float host[4] = {0};
  int64_t n = 4;
  struct PJRT_Buffer *in[4], *out[4];
  for (int r = 0; r < 4; r++) {
    for (int i = 0; i < 4; i++) host[i] = r == 1 ? special[i] : (float)(r * 10 + i);
    OK(pj_transfer_to_device(r, host, PJ_F32, &n, 1, &in[r]));
  }
  job_t j = make(PJ_COLL_BROADCAST, PJ_F32, 4, 4, NULL, 1, 4);
  j.d.root = 1;
  j.d.inputs = j.views;
  j.views[0].sizes = j.sizes[0];
  j.views[0].strides = j.strides[0];
  OK(pj_coll_run(&j.d, NULL, in, NULL, out, NULL));
  for (int r = 0; r < 4; r++) {
    float got[4];
    OK(pj_transfer_to_host(out[r], got, sizeof got));
    EXPECT(memcmp(got, special, sizeof got) == 0);
    pj_buffer_destroy(out[r]);
    pj_buffer_destroy(in[r]);
  }
}

/* complex64 takes SUM, AVG and PREMUL_SUM (c10d's supports_complex): pairs of floats. */
static void test_complex(void) {
  const pj_reduce_op_t ops[3] = {PJ_REDUCE_SUM, PJ_REDUCE_AVG, PJ_REDUCE_PREMUL_SUM};
  const double factors[2] = {2.0, -0.5};
  for (int o = 0; o < 3; o++) {
    float host[2][6];
    int64_t n = 3;
    struct PJRT_Buffer *in[2], *out[2];
    for (int r = 0; r < 2; r++) {
      for (int i = 0; i < 6; i++) host[r][i] = (float)(r * 10 + i) - 4.0f;
      OK(pj_transfer_to_device(r, host[r], PJ_C64, &n, 1, &in[r]));
    }
    job_t j = make(PJ_COLL_ALL_REDUCE, PJ_C64, 2, 2, NULL, 1, 3);
    j.d.op = ops[o];
    j.d.inputs = j.views;
    j.views[0].sizes = j.sizes[0];
    j.views[0].strides = j.strides[0];
    OK(pj_coll_run(&j.d, NULL, in, factors, out, NULL));
    for (int r = 0; r < 2; r++) {
      float got[6];
      OK(pj_transfer_to_host(out[r], got, sizeof got));
      for (int i = 0; i < 6; i++) {
        float want = o == 2 ? (float)(host[0][i] * factors[0] + host[1][i] * factors[1])
                            : host[0][i] + host[1][i];
        if (o == 1) want /= 2;
        EXPECT(got[i] == want);
      }
      pj_buffer_destroy(out[r]);
      pj_buffer_destroy(in[r]);
    }
  }
}

/* A description compiles once: running it again is a cache hit. */
static void test_cache(void) {
  job_t j = make(PJ_COLL_ALL_REDUCE, PJ_F32, 4, 4, NULL, 1, 7);
  j.d.op = PJ_REDUCE_MIN;
  run_job(&j, "first run");
  const size_t before = pj_cache_size();
  run_job(&j, "second run");
  EXPECT(pj_cache_size() == before);
  unsigned char *k1, *k2;
  size_t l1, l2;
  OK(pj_coll_key(&j.d, &k1, &l1));
  j.d.op = PJ_REDUCE_MAX;
  OK(pj_coll_key(&j.d, &k2, &l2));
  EXPECT(l1 != l2 || memcmp(k1, k2, l1) != 0);
  free(k1);
  free(k2);
  /* another placement of the same description: its own program */
  j.devices[0] = 1, j.devices[1] = 0;
  run_job(&j, "another placement");
  EXPECT(pj_cache_size() == before + 1);
}

static void test_errors(void) {
  pj_coll_desc_t d;
  job_t j = make(PJ_COLL_ALL_REDUCE, PJ_F32, 4, 4, NULL, 1, 4);
  j.d.inputs = j.views;
  j.views[0].sizes = j.sizes[0];
  j.views[0].strides = j.strides[0];
  d = j.d;
  d.op = PJ_REDUCE_BAND;
  expect_code(pj_coll_check(&d), PJ_ERR_RUNTIME, "BAND on float",
              "Cannot use ReduceOp.BAND with non-integral dtype");
  d.dtype = PJ_I64;
  d.op = PJ_REDUCE_AVG;
  expect_code(pj_coll_check(&d), PJ_ERR_RUNTIME, "AVG on int64", "ReduceOp.AVG");
  d.dtype = PJ_C64;
  d.op = PJ_REDUCE_MAX;
  expect_code(pj_coll_check(&d), PJ_ERR_RUNTIME, "MAX on complex", "complex");
  d = j.d;
  d.op = PJ_REDUCE_NUM_OPS;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "op 9", "invalid reduce op");
  /* A refused description runs nothing and hands nothing out. */
  d.op = PJ_REDUCE_BXOR;
  struct PJRT_Buffer *outs[4] = {NULL};
  expect_code(pj_coll_run(&d, NULL, NULL, NULL, outs, NULL), PJ_ERR_RUNTIME, "run BXOR float",
              "non-integral");
  EXPECT(outs[0] == NULL);
  d = j.d;
  d.kind = PJ_COLL_BROADCAST;
  d.root = 4;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "root 4 of 4", "invalid root rank");
  d.root = -1;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "root -1", "invalid root rank");
  d = j.d;
  static const int dup[4] = {0, 1, 1, 3}, big[4] = {0, 1, 2, 4};
  d.groups = dup;
  d.group_size = 2;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "replica twice", "two groups");
  d.groups = big;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "replica 4", "replica 4");
  d.groups = NULL;
  d.group_size = 3;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "groups of 3", "groups of 3");
  /* all_to_all split sums */
  d = j.d;
  d.kind = PJ_COLL_ALL_TO_ALL;
  static const int64_t bad[16] = {1, 1, 1, 1, 1, 1, 1, 2, 0, 0, 0, 0, 1, 1, 1, 1};
  d.in_splits = bad; /* replica 1 sends 5 rows of 4 */
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "split sum 5 of 4", "Split sizes");
  static const int64_t small[16] = {1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0};
  d.in_splits = small; /* no replica sends the view's 4 rows */
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "split sums below rows", "Split sizes");
  static const int64_t even[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  static const int64_t wrong_out[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1};
  d.in_splits = even;
  d.out_splits = wrong_out;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "out splits", "expects 2 rows");
  d.in_splits = NULL;
  d.out_splits = NULL;
  j.sizes[0][0] = 6;
  j.views[0].numel = 6;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "6 rows over 4", "divide equally");
  d.kind = PJ_COLL_REDUCE_SCATTER;
  d.op = PJ_REDUCE_SUM;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "reduce_scatter 6 over 4", "group size");
  j.sizes[0][0] = 4;
  j.views[0].numel = 4;
  /* views outside their storage */
  d = j.d;
  j.views[0].offset = 1;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "view past storage", "reaches element 4");
  j.views[0].offset = 0;
  j.strides[0][0] = -1;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "negative stride", "stride");
  j.strides[0][0] = 1;
  /* permutes */
  d.kind = PJ_COLL_PERMUTE;
  static const int twice[4] = {0, 1, 0, 2}, into[4] = {0, 1, 2, 1}, out_of[2] = {0, 4};
  d.pairs = twice;
  d.npairs = 2;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "sends twice", "replica 0 sends twice");
  d.pairs = into;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "receives twice", "replica 1 receives twice");
  d.pairs = out_of;
  d.npairs = 1;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "pair out of range", "outside");
  /* input counts */
  d = j.d;
  d.ninputs = 2;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "2 inputs", "inputs");
  d = j.d;
  d.kind = PJ_COLL_ALL_REDUCE;
  d.list_out = true;
  expect_code(pj_coll_check(&d), PJ_ERR_VALUE, "list out of all_reduce", "no list");
  /* PREMUL_SUM needs its factors */
  d = j.d;
  d.op = PJ_REDUCE_PREMUL_SUM;
  expect_code(pj_coll_run(&d, NULL, NULL, NULL, outs, NULL), PJ_ERR_VALUE, "no factors",
              "factors");
}

int main(void) {
  if (!getenv("TORCH_PJRT_PLUGIN")) {
    fprintf(stderr, "TORCH_PJRT_PLUGIN must name the CPU plugin .so (make ctest sets it)\n");
    return 1;
  }
  OK(pj_runtime_configure(getenv("TORCH_PJRT_PLUGIN"), 4));
  test_errors();
  test_all_reduce_ops();
  test_reductions();
  test_movement();
  test_groups();
  test_views();
  test_uneven();
  test_broadcast_exact();
  test_complex();
  test_cache();
  OK(pj_stream_synchronize(-1));
  pj_cache_clear();
  printf("%d collectives run\n", g_runs);
  CTEST_DONE();
}
