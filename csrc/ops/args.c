/* Argument access and type promotion for lowerings (see lower.h). */
#include <string.h>

#include "lower.h"
#include "../graph/view_io.h"

static const pj_val_t kBad = {.id = -1, .sub = -1};

const pj_arg_t *pj_arg(pj_lower_t *L, const char *name) {
  for (int i = 0; i < L->c->nargs; i++)
    if (strcmp(L->c->args[i].name, name) == 0) return &L->c->args[i];
  return NULL;
}

bool pj_has(pj_lower_t *L, const char *name) {
  const pj_arg_t *a = pj_arg(L, name);
  return a && a->kind != PJ_ARG_NONE;
}

/* x (rank 1) with its elements from index n (a 0-d int64 value) on replaced by x[0]: a size
 * bucket's padding made invisible to reductions that ignore repeats (pj_tensor_desc_t). */
static pj_val_t repeat_first_past(pj_lower_t *L, pj_val_t x, pj_val_t n) {
  const int64_t start = 0, limit = 1;
  pj_type_t idx_t = pj_type(PJ_I64, 1, x.t.dims);
  pj_val_t idx = pj_iota(L->h, idx_t, 0);
  pj_val_t valid = pj_compare(L->h, "LT", idx, pj_broadcast_to(L->h, pj_convert(L->h, n, PJ_I64),
                                                                1, x.t.dims));
  pj_val_t first = pj_broadcast_to(L->h, pj_slice(L->h, x, &start, &limit, NULL), 1, x.t.dims);
  return pj_select(L->h, valid, x, first);
}

static pj_val_t materialize(pj_lower_t *L, int ti) {
  pj_val_t *cached = &L->tensor_vals[ti];
  if (cached->id != -2) return *cached;
  const pj_tensor_desc_t *d = &L->c->tensors[ti];
  if (d->rank < 0) return kBad;
  if (d->slot < 0) {
    /* a 0-d CPU tensor / wrapped number passed by value: convert to the tensor's dtype */
    *cached = pj_convert(L->h, L->scalar_vals[d->scalar], d->dtype);
  } else {
    pj_val_t full = pj_view_bitcast(L->h, L->slot_vals[d->slot], d->dtype);
    *cached = d->dyn_offset
                  ? pj_view_read_at(L->h, full, d, L->scalar_vals[d->offset_scalar])
                  : pj_view_read(L->h, full, d);
    if (d->pad_repeats) *cached = repeat_first_past(L, *cached, L->scalar_vals[d->numel_scalar]);
  }
  return *cached;
}

pj_val_t pj_tensor(pj_lower_t *L, const char *name) {
  const pj_arg_t *a = pj_arg(L, name);
  if (!a || a->kind != PJ_ARG_TENSOR)
    return pj_hlo_fail(L->h, PJ_ERR_RUNTIME, "internal: aten::%s has no tensor argument '%s'",
                       L->c->op, name);
  return materialize(L, a->first);
}

const pj_tensor_desc_t *pj_tensor_desc(pj_lower_t *L, const char *name) {
  const pj_arg_t *a = pj_arg(L, name);
  if (!a || (a->kind != PJ_ARG_TENSOR && a->kind != PJ_ARG_TENSORS)) return NULL;
  return &L->c->tensors[a->first];
}

bool pj_tensor_present_at(pj_lower_t *L, const char *name, int i) {
  const pj_arg_t *a = pj_arg(L, name);
  return a && a->kind == PJ_ARG_TENSORS && i >= 0 && i < a->count &&
         L->c->tensors[a->first + i].rank >= 0;
}

pj_val_t pj_tensor_at(pj_lower_t *L, const char *name, int i) {
  const pj_arg_t *a = pj_arg(L, name);
  if (!a || a->kind != PJ_ARG_TENSORS || i < 0 || i >= a->count)
    return pj_hlo_fail(L->h, PJ_ERR_RUNTIME, "internal: aten::%s has no list element %s[%d]",
                       L->c->op, name, i);
  return materialize(L, a->first + i);
}

int pj_list_len(pj_lower_t *L, const char *name) {
  const pj_arg_t *a = pj_arg(L, name);
  return a && (a->kind == PJ_ARG_TENSORS || a->kind == PJ_ARG_INTS || a->kind == PJ_ARG_FLOATS ||
                a->kind == PJ_ARG_SCALARS)
             ? a->count
             : 0;
}

pj_val_t pj_scalar(pj_lower_t *L, const char *name) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && a->kind == PJ_ARG_SCALAR) return L->scalar_vals[a->first];
  if (a && a->kind == PJ_ARG_TENSOR) return materialize(L, a->first);
  return pj_hlo_fail(L->h, PJ_ERR_RUNTIME, "internal: aten::%s has no scalar argument '%s'",
                     L->c->op, name);
}

pj_val_t pj_scalar_at(pj_lower_t *L, const char *name, int i) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && a->kind == PJ_ARG_SCALARS && i >= 0 && i < a->count)
    return L->scalar_vals[a->first + i];
  return pj_hlo_fail(L->h, PJ_ERR_RUNTIME, "internal: aten::%s has no element %s[%d]",
                     L->c->op, name, i);
}

pj_dtype_t pj_arg_dtype(pj_lower_t *L, const char *name) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && a->kind == PJ_ARG_SCALAR) return L->c->scalars[a->first].dtype;
  if (a && (a->kind == PJ_ARG_TENSOR || a->kind == PJ_ARG_TENSORS) && a->count > 0)
    return L->c->tensors[a->first].dtype;
  return PJ_F32;
}

int64_t pj_int(pj_lower_t *L, const char *name, int64_t dflt) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && (a->kind == PJ_ARG_INT || a->kind == PJ_ARG_BOOL)) return a->i;
  if (a && a->kind == PJ_ARG_SCALAR) {
    const pj_scalar_t *s = &L->c->scalars[a->first];
    return s->dtype == PJ_F64 ? (int64_t)s->f : s->i;
  }
  return dflt;
}

double pj_float(pj_lower_t *L, const char *name, double dflt) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && a->kind == PJ_ARG_FLOAT) return a->f;
  if (a && (a->kind == PJ_ARG_INT || a->kind == PJ_ARG_BOOL)) return (double)a->i;
  return dflt;
}

bool pj_bool(pj_lower_t *L, const char *name, bool dflt) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && (a->kind == PJ_ARG_BOOL || a->kind == PJ_ARG_INT)) return a->i != 0;
  return dflt;
}

int pj_ints(pj_lower_t *L, const char *name, int64_t *out, int max) {
  const pj_arg_t *a = pj_arg(L, name);
  if (!a || a->kind == PJ_ARG_NONE) return -1;
  if (a->kind == PJ_ARG_INT) { /* int[1] arguments may arrive as a single int */
    if (max > 0) out[0] = a->i;
    return 1;
  }
  if (a->kind != PJ_ARG_INTS) return -1;
  for (int i = 0; i < a->count && i < max; i++) out[i] = L->c->ints[a->first + i];
  return a->count;
}

int pj_floats(pj_lower_t *L, const char *name, double *out, int max) {
  const pj_arg_t *a = pj_arg(L, name);
  if (!a || a->kind != PJ_ARG_FLOATS) return -1;
  for (int i = 0; i < a->count && i < max; i++) out[i] = L->c->floats[a->first + i];
  return a->count;
}

const char *pj_str(pj_lower_t *L, const char *name, const char *dflt) {
  const pj_arg_t *a = pj_arg(L, name);
  return a && a->kind == PJ_ARG_STR && a->s ? a->s : dflt;
}

int pj_norm_dim(pj_lower_t *L, int64_t dim, int rank) {
  int r = rank > 0 ? rank : 1;
  if (dim < -r || dim >= r) {
    pj_hlo_fail(L->h, PJ_ERR_INDEX,
                "Dimension out of range (expected to be in range of [%d, %d], but got %lld)", -r,
                r - 1, (long long)dim);
    return 0;
  }
  return (int)(dim < 0 ? dim + r : dim);
}

/* ---- type promotion (PyTorch's lattice and categories) ---- */

static int category(pj_dtype_t t) {
  const pj_dtype_info_t *i = pj_dtype_info(t);
  return t == PJ_BOOL ? 0 : i->is_complex ? 3 : i->is_float ? 2 : 1;
}

pj_dtype_t pj_promote(pj_dtype_t a, pj_dtype_t b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) {
    pj_dtype_t hi = ca > cb ? a : b, lo = ca > cb ? b : a;
    if (category(hi) == 3 && (lo == PJ_F64)) return PJ_C128;
    return hi;
  }
  switch (ca) {
    case 1: { /* integers: uint8 with a signed type widens to hold both */
      if (a == PJ_U8 || b == PJ_U8) {
        pj_dtype_t o = a == PJ_U8 ? b : a;
        return o == PJ_I8 ? PJ_I16 : o;
      }
      return pj_dtype_info(a)->itemsize > pj_dtype_info(b)->itemsize ? a : b;
    }
    case 2: /* f16 with bf16 -> f32; otherwise the wider */
      if ((a == PJ_F16 && b == PJ_BF16) || (a == PJ_BF16 && b == PJ_F16)) return PJ_F32;
      return pj_dtype_info(a)->itemsize > pj_dtype_info(b)->itemsize ? a : b;
    case 3: return (a == PJ_C128 || b == PJ_C128) ? PJ_C128 : PJ_C64;
    default: return a;
  }
}

#define PJ_UNDEF ((pj_dtype_t)-1)

static pj_dtype_t promote_u(pj_dtype_t a, pj_dtype_t b) {
  if ((int)a < 0) return b;
  if ((int)b < 0) return a;
  return pj_promote(a, b);
}

static pj_dtype_t combine(pj_dtype_t higher, pj_dtype_t lower) {
  if ((int)higher >= 0 && category(higher) == 3) return higher;
  if ((int)lower >= 0 && category(lower) == 3) {
    if ((int)higher >= 0 && category(higher) == 2) return higher == PJ_F64 ? PJ_C128 : PJ_C64;
    return lower;
  }
  if ((int)higher >= 0 && category(higher) == 2) return higher;
  if (higher == PJ_BOOL || ((int)lower >= 0 && category(lower) == 2))
    return promote_u(higher, lower);
  if ((int)higher >= 0) return higher;
  return lower;
}

pj_dtype_t pj_result_type(pj_lower_t *L, const char *const *names, int n) {
  pj_dtype_t dim = PJ_UNDEF, zero = PJ_UNDEF, wrapped = PJ_UNDEF;
  for (int k = 0; k < n; k++) {
    const pj_arg_t *a = pj_arg(L, names[k]);
    if (!a || a->kind == PJ_ARG_NONE) continue;
    if (a->kind == PJ_ARG_SCALAR) {
      pj_dtype_t t = L->c->scalars[a->first].dtype;
      /* a Python float promotes as the default dtype (float32), a complex as complex64 */
      if (t == PJ_F64) t = PJ_F32;
      if (t == PJ_C128) t = PJ_C64;
      wrapped = promote_u(wrapped, t);
      continue;
    }
    for (int i = 0; i < a->count; i++) {
      const pj_tensor_desc_t *d = &L->c->tensors[a->first + i];
      if (d->rank < 0) continue;
      pj_dtype_t t = d->dtype;
      if (d->wrapped) {
        if (t == PJ_F64) t = PJ_F32;
        if (t == PJ_C128) t = PJ_C64;
        wrapped = promote_u(wrapped, t);
      } else if (d->rank == 0) {
        zero = promote_u(zero, t);
      } else {
        dim = promote_u(dim, t);
      }
    }
  }
  pj_dtype_t r = combine(dim, combine(zero, wrapped));
  return (int)r < 0 ? PJ_F32 : r;
}

/* ---- destinations ---- */

int pj_nout(pj_lower_t *L) { return L->c->nout; }

pj_type_t pj_out_type(pj_lower_t *L, int k) {
  const pj_tensor_desc_t *d = &L->c->outs[k];
  return pj_type(d->dtype, d->rank, d->sizes);
}

void pj_set_result(pj_lower_t *L, int k, pj_val_t v) {
  if (k < 0 || k >= L->c->nout) {
    pj_hlo_fail(L->h, PJ_ERR_RUNTIME, "internal: aten::%s result %d of %d", L->c->op, k,
                L->c->nout);
    return;
  }
  pj_type_t t = pj_out_type(L, k);
  if (v.id >= 0 && !pj_type_same_shape(&v.t, &t)) {
    if (pj_type_numel(&v.t) == pj_type_numel(&t) && v.t.rank != t.rank && pj_type_numel(&t) <= 1)
      v = pj_reshape(L->h, v, t.rank, t.dims);
    else
      v = pj_broadcast_to(L->h, v, t.rank, t.dims);
  }
  L->results[k] = pj_convert(L->h, v, t.dtype);
  L->has_result[k] = true;
}
