/* Lowerings: index family (gather/scatter, index_select/add/copy/fill, advanced indexing and
 * index_put, take/put, masked_select/masked_scatter, nonzero, sort, index_reduce; topk is in
 * select.c),
 * and the data-dependent-shape protocol of dynamic.h.
 *
 * Index semantics: index values are used as given; negative values are wrapped by the indexed
 * size where PyTorch accepts them (advanced indexing, take/put, index_fill). XLA clamps
 * gathered indices and drops out-of-range scatter updates, so every lowering checks the
 * indices its caller gave against the range CPU accepts (pj_check_index: CPU's error comes at
 * the next synchronization, index_checks.h); the shared helpers (pj_take_slices, ...) do not
 * check the indices other lowerings compute. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dynamic.h"
#include "slices.h"
#include "order.h"
#include "table.h"
#include "emit.h"
#include "torch_pjrt/transfer.h"


static const pj_val_t kBad = {.id = -1, .sub = -1};

/* ---- small value helpers ---- */

static pj_val_t as_i64(pj_lower_t *L, pj_val_t v) { return pj_convert(H, v, PJ_I64); }

static pj_val_t bin(pj_lower_t *L, const char *op, pj_val_t a, pj_val_t b) {
  return pj_binary(H, op, a, b);
}

static pj_val_t full_like(pj_lower_t *L, pj_val_t like, double v) {
  return pj_full(H, like.t, v);
}

/* Index values wrapped into [0, size) when negative (PyTorch's advanced-indexing rule). */
static pj_val_t wrap_negative(pj_lower_t *L, pj_val_t idx, int64_t size) {
  idx = as_i64(L, idx);
  pj_val_t zero = pj_full(H, idx.t, 0);
  pj_val_t sz = pj_broadcast_in_dim(H, pj_const_i(H, PJ_I64, size), idx.t, NULL);
  return pj_select(H, pj_compare(H, "LT", idx, zero), bin(L, "stablehlo.add", idx, sz), idx);
}

/* x reshaped to rank 1. */
static pj_val_t flat(pj_lower_t *L, pj_val_t x) {
  int64_t n = pj_type_numel(&x.t);
  return pj_reshape(H, x, 1, &n);
}

/* x reshaped with a trailing size-1 dim (an index vector of length 1). */
static pj_val_t with_unit_tail(pj_lower_t *L, pj_val_t x) {
  if (x.id < 0) return kBad;
  int64_t d[PJ_MAX_RANK + 1];
  if (x.t.rank + 1 > PJ_MAX_RANK)
    return pj_fail(L, PJ_ERR_UNIMPLEMENTED, "index tensors of rank %d are not supported",
                   x.t.rank);
  for (int i = 0; i < x.t.rank; i++) d[i] = x.t.dims[i];
  d[x.t.rank] = 1;
  return pj_reshape(H, x, x.t.rank + 1, d);
}

static void put_list(char *buf, size_t cap, const char *name, const int64_t *v, int n,
                     bool *first) {
  if (n == 0) return;
  size_t len = strlen(buf);
  len += (size_t)snprintf(buf + len, cap - len, "%s%s = [", *first ? "" : ", ", name);
  for (int i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, i ? ", %lld" : "%lld", (long long)v[i]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
  *first = false;
}

/* stablehlo.gather with general dimension numbers; the index vector is the last dim of idx. */
static pj_val_t gather_g(pj_lower_t *L, pj_val_t operand, pj_val_t idx, const int64_t *offset,
                         int noff, const int64_t *collapsed, int ncol, const int64_t *start_map,
                         int nmap, const int64_t *slice_sizes, pj_type_t out) {
  if (operand.id < 0 || idx.id < 0) return kBad;
  /* Nothing to read (an empty result), or slices wider than an empty operand dim (every index
   * into it is out of range, which the index check reports): StableHLO rejects such a gather,
   * and no element of the result depends on the operand. */
  bool readable = pj_type_numel(&out) > 0;
  for (int i = 0; i < operand.t.rank; i++) readable = readable && slice_sizes[i] <= operand.t.dims[i];
  if (!readable) return pj_full(H, pj_type_with_dtype(out, operand.t.dtype), 0);
  char attrs[1024] = "dimension_numbers = #stablehlo.gather<";
  bool first = true;
  put_list(attrs, sizeof attrs, "offset_dims", offset, noff, &first);
  put_list(attrs, sizeof attrs, "collapsed_slice_dims", collapsed, ncol, &first);
  put_list(attrs, sizeof attrs, "start_index_map", start_map, nmap, &first);
  size_t len = strlen(attrs);
  len += (size_t)snprintf(attrs + len, sizeof attrs - len, "%sindex_vector_dim = %d>, "
                          "slice_sizes = array<i64", first ? "" : ", ", idx.t.rank - 1);
  for (int i = 0; i < operand.t.rank; i++)
    len += (size_t)snprintf(attrs + len, sizeof attrs - len, i ? ", %lld" : ": %lld",
                            (long long)slice_sizes[i]);
  snprintf(attrs + len, sizeof attrs - len, ">, indices_are_sorted = false");
  pj_val_t ins[2] = {operand, idx};
  return pj_hlo_op(H, "stablehlo.gather", ins, 2, attrs, pj_type_with_dtype(out, operand.t.dtype));
}

/* Combiner region of a scatter: NULL replaces; "add", "mul", "max", "min" combine (bool: add is
 * or, mul is and). */
static char *combiner_region(pj_lower_t *L, pj_dtype_t dt, const char *combiner) {
  pj_type_t st = pj_type_scalar(dt);
  pj_type_t sts[2] = {st, st};
  pj_val_t a[2];
  pj_hlo_region_begin(H, sts, 2, a);
  pj_val_t r = a[1];
  if (combiner) {
    bool b = dt == PJ_BOOL;
    const char *op = !strcmp(combiner, "add")   ? (b ? "stablehlo.or" : "stablehlo.add")
                     : !strcmp(combiner, "mul") ? (b ? "stablehlo.and" : "stablehlo.multiply")
                     : !strcmp(combiner, "max") ? "stablehlo.maximum"
                                                : "stablehlo.minimum";
    r = bin(L, op, a[0], a[1]);
    if (pj_dtype_info(dt)->is_float && (!strcmp(combiner, "max") || !strcmp(combiner, "min"))) {
      /* NaN wins, as on CPU (XLA's scatter does not keep the NaN of stablehlo.maximum) */
      r = pj_select(H, pj_compare(H, "NE", a[1], a[1]), a[1], r);
      r = pj_select(H, pj_compare(H, "NE", a[0], a[0]), a[0], r);
    }
  }
  return pj_hlo_region_end(H, &r, 1);
}

/* stablehlo.scatter with general dimension numbers; the index vector is the last dim of idx. */
static pj_val_t scatter_g(pj_lower_t *L, pj_val_t operand, pj_val_t idx, pj_val_t updates,
                          const int64_t *window, int nwin, const int64_t *inserted, int nins,
                          const int64_t *s2o, int ns2o, const char *combiner) {
  if (operand.id < 0 || idx.id < 0 || updates.id < 0) return kBad;
  updates = pj_convert(H, updates, operand.t.dtype);
  char attrs[1024] = "scatter_dimension_numbers = #stablehlo.scatter<";
  bool first = true;
  put_list(attrs, sizeof attrs, "update_window_dims", window, nwin, &first);
  put_list(attrs, sizeof attrs, "inserted_window_dims", inserted, nins, &first);
  put_list(attrs, sizeof attrs, "scatter_dims_to_operand_dims", s2o, ns2o, &first);
  size_t len = strlen(attrs);
  snprintf(attrs + len, sizeof attrs - len,
           "%sindex_vector_dim = %d>, indices_are_sorted = false, unique_indices = false",
           first ? "" : ", ", idx.t.rank - 1);
  char *region = combiner_region(L, operand.t.dtype, combiner);
  pj_val_t ins[3] = {operand, idx, updates}, r = kBad;
  if (region) pj_hlo_op_multi(H, "stablehlo.scatter", ins, 3, region, attrs, &operand.t, 1, &r);
  free(region);
  return r;
}

/* ---- element-wise gather/scatter along one dim (torch.gather / scatter semantics) ---- */

/* Full coordinates [S..., rank] for an index of shape S (rank == operand rank): coordinate d is
 * the index value along `dim` and the position itself elsewhere. */
static pj_val_t point_coords(pj_lower_t *L, pj_val_t idx, int dim) {
  int r = idx.t.rank;
  pj_val_t parts[PJ_MAX_RANK];
  pj_type_t it = pj_type_with_dtype(idx.t, PJ_I64);
  for (int d = 0; d < r; d++)
    parts[d] = with_unit_tail(L, d == dim ? as_i64(L, idx) : pj_iota(H, it, d));
  return pj_concat(H, parts, r, r);
}

static pj_val_t gather_points(pj_lower_t *L, pj_val_t x, pj_val_t idx, int dim) {
  int r = x.t.rank;
  int64_t all[PJ_MAX_RANK], ones[PJ_MAX_RANK];
  for (int d = 0; d < r; d++) all[d] = d, ones[d] = 1;
  return gather_g(L, x, point_coords(L, idx, dim), NULL, 0, all, r, all, r, ones, idx.t);
}

static pj_val_t scatter_points(pj_lower_t *L, pj_val_t x, pj_val_t idx, int dim, pj_val_t upd,
                               const char *combiner) {
  int r = x.t.rank;
  int64_t all[PJ_MAX_RANK];
  for (int d = 0; d < r; d++) all[d] = d;
  return scatter_g(L, x, point_coords(L, idx, dim), upd, NULL, 0, all, r, all, r, combiner);
}

/* Rank-0 operands of gather/scatter behave as rank 1 of size 1. */
static pj_val_t at_least_1d(pj_lower_t *L, pj_val_t v) {
  if (v.id < 0 || v.t.rank > 0) return v;
  int64_t one = 1;
  return pj_reshape(H, v, 1, &one);
}

/* src sliced to the index's shape (scatter reads src only where index has elements). */
static pj_val_t slice_to(pj_lower_t *L, pj_val_t src, pj_type_t shape) {
  int64_t st[PJ_MAX_RANK] = {0}, lim[PJ_MAX_RANK];
  for (int d = 0; d < src.t.rank; d++) lim[d] = shape.dims[d];
  return pj_slice(H, src, st, lim, NULL);
}

static pj_status_t *lower_gather(pj_lower_t *L) {
  pj_val_t x = at_least_1d(L, pj_tensor(L, "self"));
  pj_val_t idx = at_least_1d(L, pj_tensor(L, "index"));
  int dim = pj_norm_dim(L, pj_int(L, "dim", 0), x.t.rank);
  if (dim >= 0) pj_check_index(L, idx, x.t.dims[dim], dim, false, PJ_CHECK_DIM_RUNTIME);
  pj_set_result(L, 0, gather_points(L, x, idx, dim));
  return NULL;
}

/* scatter (src/value, optional reduce="add"/"multiply"), scatter_add, scatter_reduce.two. */
static pj_status_t *lower_scatter(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t self = pj_tensor(L, "self");
  pj_val_t x = at_least_1d(L, pj_convert(H, self, ot.dtype));
  pj_val_t idx = at_least_1d(L, pj_tensor(L, "index"));
  int dim = pj_norm_dim(L, pj_int(L, "dim", 0), x.t.rank);
  if (pj_type_numel(&idx.t) == 0) {
    pj_set_result(L, 0, self);
    return NULL;
  }
  if (dim >= 0) /* all or nothing: one bad index drops every update */
    idx = pj_check_drop_all(L, pj_check_index(L, idx, x.t.dims[dim], dim, false,
                                              PJ_CHECK_DIM_RUNTIME), idx, x.t.dims[dim]);
  pj_val_t upd;
  if (pj_has(L, "src")) {
    upd = slice_to(L, at_least_1d(L, pj_convert(H, pj_tensor(L, "src"), ot.dtype)), idx.t);
  } else {
    pj_val_t v = pj_convert(H, pj_scalar(L, "value"), ot.dtype);
    upd = pj_broadcast_in_dim(H, v, pj_type_with_dtype(idx.t, ot.dtype), NULL);
  }
  const char *op = L->c->op;
  const char *reduce = pj_str(L, "reduce", NULL);
  const char *comb = NULL;
  bool include_self = pj_bool(L, "include_self", true);
  bool mean = false;
  if (!strcmp(op, "scatter_add")) comb = "add";
  if (reduce) {
    if (!strcmp(reduce, "add") || !strcmp(reduce, "sum")) comb = "add";
    else if (!strcmp(reduce, "multiply") || !strcmp(reduce, "prod")) comb = "mul";
    else if (!strcmp(reduce, "amax")) comb = "max";
    else if (!strcmp(reduce, "amin")) comb = "min";
    else if (!strcmp(reduce, "mean")) comb = "add", mean = true;
    else return pj_status_new(PJ_ERR_RUNTIME, "reduce argument must be either sum, prod, mean, "
                              "amax or amin, got %s", reduce);
  }
  pj_val_t base = x;
  pj_val_t touched = kBad;
  if (!include_self || mean) {
    pj_type_t bt = pj_type_with_dtype(x.t, PJ_BOOL);
    touched = scatter_points(L, pj_full(H, bt, 0), idx, dim,
                             pj_full(H, pj_type_with_dtype(idx.t, PJ_BOOL), 1), NULL);
  }
  if (!include_self) {
    double ident = !strcmp(comb, "add") ? 0 : !strcmp(comb, "mul") ? 1
                   : !strcmp(comb, "max") ? pj_dtype_lowest(x.t.dtype)
                                          : pj_dtype_highest(x.t.dtype);
    pj_val_t idv = x.t.dtype == PJ_I64 && !strcmp(comb, "max") ? pj_const_i(H, PJ_I64, INT64_MIN)
                   : x.t.dtype == PJ_I64 && !strcmp(comb, "min") ? pj_const_i(H, PJ_I64, INT64_MAX)
                                                                 : pj_const(H, x.t.dtype, ident);
    base = pj_select(H, touched, pj_broadcast_in_dim(H, idv, x.t, NULL), x);
  }
  pj_val_t r = scatter_points(L, base, idx, dim, upd, comb);
  if (mean) {
    /* count of contributions per position (+1 for self when included) */
    pj_val_t cnt = scatter_points(L, full_like(L, x, include_self ? 1 : 0), idx, dim,
                                  pj_full(H, upd.t, 1), "add");
    cnt = pj_select(H, touched, cnt, full_like(L, x, 1));
    pj_val_t q = bin(L, "stablehlo.divide", r, cnt);
    if (!pj_dtype_info(x.t.dtype)->is_float && !pj_dtype_info(x.t.dtype)->is_complex) {
      /* integer mean rounds toward negative infinity, as CPU's floor division */
      pj_val_t rem = bin(L, "stablehlo.remainder", r, cnt);
      pj_val_t zero = full_like(L, r, 0);
      pj_val_t adj = bin(L, "stablehlo.and", pj_compare(H, "NE", rem, zero),
                         pj_compare(H, "LT", r, zero));
      q = pj_select(H, adj, bin(L, "stablehlo.subtract", q, full_like(L, q, 1)), q);
    }
    r = q;
  }
  pj_set_result(L, 0, r);
  return NULL;
}

/* ---- whole-slice gather/scatter along one dim (index_select, index_add, ...) ---- */

/* x.index_select(dim, idx) generalized to an index of any rank k: the result is
 * x.shape[:dim] + idx.shape + x.shape[dim+1:]. */
pj_val_t pj_take_slices(pj_lower_t *L, pj_val_t x, int dim, pj_val_t idx) {
  if (x.id < 0 || idx.id < 0) return kBad;
  int r = x.t.rank, k = idx.t.rank;
  if (r - 1 + k > PJ_MAX_RANK)
    return pj_fail(L, PJ_ERR_UNIMPLEMENTED, "result of rank %d is not supported", r - 1 + k);
  pj_type_t out = {.dtype = x.t.dtype, .rank = r - 1 + k};
  int64_t offset[PJ_MAX_RANK], sizes[PJ_MAX_RANK], d64 = dim;
  int noff = 0;
  for (int i = 0; i < r; i++) sizes[i] = i == dim ? 1 : x.t.dims[i];
  for (int i = 0; i < dim; i++) out.dims[i] = x.t.dims[i], offset[noff++] = i;
  for (int i = 0; i < k; i++) out.dims[dim + i] = idx.t.dims[i];
  for (int i = dim + 1; i < r; i++) out.dims[i - 1 + k] = x.t.dims[i], offset[noff++] = i - 1 + k;
  return gather_g(L, x, with_unit_tail(L, as_i64(L, idx)), offset, noff, &d64, 1, &d64, 1, sizes,
                  out);
}

/* Scatters slices upd (x.shape with dim replaced by idx's length n) into x at idx[n]. */
pj_val_t pj_put_slices(pj_lower_t *L, pj_val_t x, int dim, pj_val_t idx, pj_val_t upd,
                       const char *combiner) {
  if (x.id < 0) return kBad;
  int r = x.t.rank;
  int64_t window[PJ_MAX_RANK], d64 = dim;
  int nw = 0;
  for (int i = 0; i < r; i++)
    if (i != dim) window[nw++] = i;
  return scatter_g(L, x, with_unit_tail(L, as_i64(L, flat(L, idx))), upd, window, nw, &d64, 1,
                   &d64, 1, combiner);
}

static pj_status_t *lower_index_select(pj_lower_t *L) {
  const pj_tensor_desc_t *id = pj_tensor_desc(L, "index");
  if (id && id->rank > 1) /* CPU's kernel (not its Meta) checks this */
    return pj_status_new(PJ_ERR_INDEX, "index_select(): Index is supposed to be a vector");
  if (id && id->dtype != PJ_I64 && id->dtype != PJ_I32)
    return pj_status_new(PJ_ERR_INDEX, "index_select(): Expected dtype int32 or int64 for index");
  pj_val_t x = at_least_1d(L, pj_tensor(L, "self"));
  pj_val_t idx = flat(L, pj_tensor(L, "index"));
  int dim = pj_norm_dim(L, pj_int(L, "dim", 0), x.t.rank);
  /* CPU's kernel has its own message along dim 1 of a tensor of rank > 1 (and for an empty
   * one of rank > 1) */
  const pj_tensor_desc_t *sd = pj_tensor_desc(L, "self");
  const bool data_bounds = sd && sd->rank > 1 && (dim == 1 || pj_type_numel(&x.t) == 0);
  if (dim >= 0)
    pj_check_index(L, idx, x.t.dims[dim], dim, false,
                   data_bounds ? PJ_CHECK_DATA_BOUNDS : PJ_CHECK_SELF);
  pj_set_result(L, 0, pj_take_slices(L, x, dim, idx));
  return NULL;
}

/* The exception CPU's index_add raises for an out-of-range index, as a 0-d int64 kind. Into a
 * tensor of rank 1 (or 0): "index out of range in self" (IndexError). Into one of higher rank,
 * CPU takes scatter_add's path, whose error names the dim and size (RuntimeError), when dim is
 * the first or the last one, the index is int64 and alpha equals 1 (a bool alpha never does,
 * a complex one when it is 1 + 0j); else its own loop's IndexError. alpha is a program
 * argument, so the comparison is the program's. */
static pj_val_t index_add_check_kind(pj_lower_t *L, const pj_tensor_desc_t *sd, int dim) {
  pj_val_t self_kind = pj_const_i(H, PJ_I64, PJ_CHECK_SELF);
  const pj_tensor_desc_t *id = pj_tensor_desc(L, "index");
  if (!sd || sd->rank <= 1 || !(dim == 0 || dim == sd->rank - 1) || !id || id->dtype != PJ_I64)
    return self_kind;
  pj_val_t runtime_kind = pj_const_i(H, PJ_I64, PJ_CHECK_DIM_RUNTIME);
  if (!pj_has(L, "alpha")) return runtime_kind; /* alpha's default is 1 */
  const pj_dtype_t at = pj_arg_dtype(L, "alpha");
  if (at == PJ_BOOL) return self_kind;
  pj_val_t a = pj_scalar(L, "alpha"), one;
  if (a.id < 0) return self_kind;
  if (at == PJ_C64 || at == PJ_C128) {
    pj_val_t re = pj_unary(H, "stablehlo.real", a), im = pj_unary(H, "stablehlo.imag", a);
    one = bin(L, "stablehlo.and", pj_compare(H, "EQ", re, pj_full(H, re.t, 1)),
              pj_compare(H, "EQ", im, pj_full(H, im.t, 0)));
  } else {
    pj_val_t d = pj_convert(H, a, PJ_F64);
    one = pj_compare(H, "EQ", d, pj_full(H, d.t, 1));
  }
  return pj_select(H, one, runtime_kind, self_kind);
}

/* index_add / index_copy / index_fill: slices of self at index along dim, from source/value. */
static pj_status_t *lower_index_update(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t x = at_least_1d(L, pj_convert(H, pj_tensor(L, "self"), ot.dtype));
  pj_val_t idx = flat(L, pj_tensor(L, "index"));
  int dim = pj_norm_dim(L, pj_int(L, "dim", 0), x.t.rank);
  const char *op = L->c->op;
  if (dim < 0) return NULL;
  const bool fill = !strcmp(op, "index_fill"), copy = !strcmp(op, "index_copy");
  const pj_tensor_desc_t *sd = pj_tensor_desc(L, "self");
  pj_val_t bad;
  if (fill || copy)
    bad = pj_check_index(L, idx, x.t.dims[dim], dim, fill,
                         fill ? PJ_CHECK_DIM : PJ_CHECK_INDEX_COPY);
  else if (sd && sd->rank > 1 && pj_type_numel(&x.t) == 0)
    bad = kBad; /* CPU's index_add of an empty tensor of rank > 1 returns before any check */
  else
    bad = pj_check_index_kind(L, idx, x.t.dims[dim], dim, false,
                              index_add_check_kind(L, sd, dim));
  idx = pj_check_drop_all(L, bad, idx, x.t.dims[dim]);
  pj_type_t ut = x.t;
  ut.dims[dim] = idx.t.dims[0];
  pj_val_t upd;
  const char *comb = NULL;
  if (fill) {
    pj_val_t v = pj_has(L, "value") ? pj_scalar(L, "value") : kBad;
    upd = pj_broadcast_in_dim(H, pj_convert(H, v, ot.dtype), ut, NULL);
    idx = wrap_negative(L, idx, x.t.dims[dim]);
  } else {
    upd = pj_reshape(H, pj_convert(H, pj_tensor(L, "source"), ot.dtype), ut.rank, ut.dims);
    if (!strcmp(op, "index_add")) {
      comb = "add";
      if (pj_has(L, "alpha")) {
        pj_val_t a = pj_convert(H, pj_scalar(L, "alpha"), ot.dtype);
        upd = ot.dtype == PJ_BOOL ? bin(L, "stablehlo.and", upd, pj_broadcast_in_dim(H, a, ut, NULL))
                                  : bin(L, "stablehlo.multiply", upd,
                                        pj_broadcast_in_dim(H, a, ut, NULL));
      }
    }
  }
  if (idx.t.dims[0] == 0) {
    pj_set_result(L, 0, x);
    return NULL;
  }
  pj_set_result(L, 0, pj_put_slices(L, x, dim, idx, upd, comb));
  return NULL;
}

/* index_reduce: slices of source combined into self at index along dim with prod / mean / amax /
 * amin; include_self=False starts the indexed slices from the reduction's identity. mean
 * divides by the number of contributions (floor division for integers, as CPU). */
static pj_status_t *lower_index_reduce(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t x = at_least_1d(L, pj_convert(H, pj_tensor(L, "self"), ot.dtype));
  pj_val_t idx = flat(L, pj_tensor(L, "index"));
  int dim = pj_norm_dim(L, pj_int(L, "dim", 0), x.t.rank);
  const char *reduce = pj_str(L, "reduce", "");
  bool include_self = pj_bool(L, "include_self", true);
  const char *comb = !strcmp(reduce, "prod")   ? "mul"
                     : !strcmp(reduce, "mean") ? "add"
                     : !strcmp(reduce, "amax") ? "max"
                     : !strcmp(reduce, "amin") ? "min"
                                               : NULL;
  if (!comb)
    return pj_status_new(PJ_ERR_RUNTIME, "index_reduce(): Expected reduce to be one of prod, "
                         "mean, amax or amin, got %s.", reduce);
  if (x.id < 0 || idx.id < 0 || idx.t.dims[0] == 0 || dim < 0) {
    pj_set_result(L, 0, x);
    return NULL;
  }
  idx = pj_check_drop_all(L, pj_check_index(L, idx, x.t.dims[dim], dim, false, PJ_CHECK_SELF),
                          idx, x.t.dims[dim]);
  pj_type_t ut = x.t;
  ut.dims[dim] = idx.t.dims[0];
  pj_val_t upd = pj_reshape(H, pj_convert(H, pj_tensor(L, "source"), ot.dtype), ut.rank, ut.dims);
  pj_type_t bt = pj_type_with_dtype(x.t, PJ_BOOL);
  pj_val_t touched = pj_put_slices(L, pj_full(H, bt, 0), dim, idx,
                                   pj_full(H, pj_type_with_dtype(ut, PJ_BOOL), 1), NULL);
  pj_val_t base = x;
  if (!include_self) {
    pj_dtype_t dt = x.t.dtype;
    bool mx = !strcmp(comb, "max"), mn = !strcmp(comb, "min");
    pj_val_t ident = dt == PJ_I64 && mx   ? pj_const_i(H, dt, INT64_MIN)
                     : dt == PJ_I64 && mn ? pj_const_i(H, dt, INT64_MAX)
                     : mx                 ? pj_const(H, dt, pj_dtype_lowest(dt))
                     : mn                 ? pj_const(H, dt, pj_dtype_highest(dt))
                                          : pj_const(H, dt, !strcmp(comb, "mul") ? 1 : 0);
    base = pj_select(H, touched, pj_broadcast_in_dim(H, ident, x.t, NULL), x);
  }
  pj_val_t r = pj_put_slices(L, base, dim, idx, upd, comb);
  if (!strcmp(reduce, "mean")) {
    pj_val_t cnt = pj_put_slices(L, full_like(L, x, include_self ? 1 : 0), dim, idx,
                                 pj_full(H, upd.t, 1), "add");
    cnt = pj_select(H, touched, cnt, full_like(L, x, 1));
    pj_val_t q = bin(L, "stablehlo.divide", r, cnt);
    if (!pj_dtype_info(x.t.dtype)->is_float && !pj_dtype_info(x.t.dtype)->is_complex) {
      pj_val_t rem = bin(L, "stablehlo.remainder", r, cnt);
      pj_val_t adj = bin(L, "stablehlo.and", pj_compare(H, "NE", rem, full_like(L, r, 0)),
                         pj_compare(H, "LT", r, full_like(L, r, 0)));
      q = pj_select(H, adj, bin(L, "stablehlo.subtract", q, full_like(L, q, 1)), q);
    }
    r = q;
  }
  pj_set_result(L, 0, r);
  return NULL;
}

static pj_status_t *lower_take(pj_lower_t *L) {
  pj_val_t x = flat(L, pj_tensor(L, "self"));
  pj_val_t idx = pj_tensor(L, "index");
  if (x.t.dims[0] == 0 && pj_type_numel(&idx.t) > 0) /* CPU's shape check, not a data one */
    return pj_status_new(PJ_ERR_INDEX, "take(): tried to take from an empty tensor");
  pj_check_index(L, idx, x.t.dims[0], 0, true, PJ_CHECK_TAKE);
  pj_set_result(L, 0, pj_gather_1d(H, x, wrap_negative(L, idx, x.t.dims[0])));
  return NULL;
}

static pj_status_t *lower_put(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t self = pj_convert(H, pj_tensor(L, "self"), ot.dtype);
  pj_val_t x = flat(L, self);
  pj_val_t idx = flat(L, pj_tensor(L, "index"));
  pj_val_t src = flat(L, pj_convert(H, pj_tensor(L, "source"), ot.dtype));
  if (idx.t.dims[0] == 0) {
    pj_set_result(L, 0, self);
    return NULL;
  }
  if (x.t.dims[0] == 0)
    return pj_status_new(PJ_ERR_INDEX, "put_(): Tried to put elements into an empty tensor");
  idx = pj_check_drop_all(L, pj_check_index(L, idx, x.t.dims[0], 0, true, PJ_CHECK_TAKE), idx,
                          x.t.dims[0]);
  idx = wrap_negative(L, idx, x.t.dims[0]);
  pj_val_t r = pj_scatter_1d(H, x, idx, src, pj_bool(L, "accumulate", false) ? "add" : NULL);
  pj_set_result(L, 0, pj_reshape(H, r, ot.rank, ot.dims));
  return NULL;
}

/* ---- sorting ---- */

/* Sorts operands[0] (keys) along dim, carrying the other operands; comparator `before(a, b)`:
 * ascending puts NaN last, descending puts NaN first (CPU's order). Always stable. */
bool pj_sort_along(pj_lower_t *L, pj_val_t *ops, int n, int dim, bool descending,
                       pj_val_t *res) {
  pj_type_t sts[8];
  for (int i = 0; i < n; i++) sts[2 * i] = sts[2 * i + 1] = pj_type_scalar(ops[i].t.dtype);
  pj_val_t a[8];
  pj_hlo_region_begin(H, sts, 2 * n, a);
  pj_val_t x = a[0], y = a[1], lt;
  if (pj_dtype_info(x.t.dtype)->is_float) {
    /* ascending: x < y, or y is NaN and x is not; descending: x > y, or x is NaN and y not */
    pj_val_t xn = pj_compare(H, "NE", x, x), yn = pj_compare(H, "NE", y, y);
    if (descending)
      lt = bin(L, "stablehlo.or", pj_compare(H, "GT", x, y),
               bin(L, "stablehlo.and", xn, pj_unary(H, "stablehlo.not", yn)));
    else
      lt = bin(L, "stablehlo.or", pj_compare(H, "LT", x, y),
               bin(L, "stablehlo.and", yn, pj_unary(H, "stablehlo.not", xn)));
  } else {
    lt = pj_compare(H, descending ? "GT" : "LT", x, y);
  }
  char *region = pj_hlo_region_end(H, &lt, 1);
  char attrs[64];
  snprintf(attrs, sizeof attrs, "dimension = %d : i64, is_stable = true", dim);
  pj_type_t outs[4];
  for (int i = 0; i < n; i++) outs[i] = ops[i].t;
  bool ok = region && pj_hlo_op_multi(H, "stablehlo.sort", ops, n, region, attrs, outs, n, res);
  free(region);
  return ok;
}

static pj_status_t *lower_sort(pj_lower_t *L) {
  pj_val_t x = at_least_1d(L, pj_tensor(L, "self"));
  int dim = pj_norm_dim(L, pj_int(L, "dim", -1), x.t.rank);
  bool desc = pj_bool(L, "descending", false);
  pj_val_t ops[2] = {x, pj_iota(H, pj_type_with_dtype(x.t, PJ_I64), dim)}, res[2];
  if (!pj_sort_along(L, ops, 2, dim, desc, res)) return NULL;
  /* destinations: values, indices (one may be missing when it has no elements) */
  for (int k = 0; k < pj_nout(L) && k < 2; k++) pj_set_result(L, k, res[pj_nout(L) == 2 ? k : 0]);
  return NULL;
}

/* Positions [m] (i64) of a flat bool mask [m] with the true ones first, in increasing order:
 * a stable sort of (mask ? 0 : 1, iota). */
pj_val_t pj_true_positions(pj_lower_t *L, pj_val_t mask) {
  pj_type_t it = pj_type_with_dtype(mask.t, PJ_I32);
  pj_val_t key = pj_select(H, mask, pj_full(H, it, 0), pj_full(H, it, 1));
  pj_val_t ops[2] = {key, pj_iota(H, pj_type_with_dtype(mask.t, PJ_I64), 0)}, res[2];
  if (!pj_sort_along(L, ops, 2, 0, false, res)) return kBad;
  return res[1];
}

/* Count of true elements of a bool value, as 0-d i64. */
pj_val_t pj_count_true(pj_lower_t *L, pj_val_t mask) {
  int64_t all[PJ_MAX_RANK];
  for (int i = 0; i < mask.t.rank; i++) all[i] = i;
  return pj_reduce(H, as_i64(L, mask), all, mask.t.rank, "add");
}

/* The first n positions of a mask, unravelled into coordinates of the mask's shape: one [n]
 * index vector per mask dim. */
static void mask_coords(pj_lower_t *L, pj_val_t mask, int64_t n, pj_val_t *coords) {
  pj_val_t pos = pj_true_positions(L, flat(L, mask));
  int64_t z = 0;
  pos = pj_slice(H, pos, &z, &n, NULL);
  pj_type_t t = pj_type(PJ_I64, 1, &n);
  int64_t stride = 1;
  for (int d = mask.t.rank - 1; d >= 0; d--) {
    pj_val_t c = bin(L, "stablehlo.divide", pos, pj_full(H, t, (double)stride));
    coords[d] = bin(L, "stablehlo.remainder", c, pj_full(H, t, (double)mask.t.dims[d]));
    stride *= mask.t.dims[d];
  }
}

static pj_status_t *lower_nonzero(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_type_t ot = pj_out_type(L, 0);
  int64_t n = ot.dims[0];
  pj_val_t mask = at_least_1d(L, pj_convert(H, x, PJ_BOOL));
  pj_val_t coords[PJ_MAX_RANK];
  int r = x.t.rank;
  if (r == 0) { /* [n, 0]: no columns to compute */
    pj_set_result(L, 0, pj_full(H, ot, 0));
    return NULL;
  }
  mask_coords(L, mask, n, coords);
  for (int d = 0; d < r; d++) coords[d] = with_unit_tail(L, coords[d]);
  pj_set_result(L, 0, pj_concat(H, coords, r, 1));
  return NULL;
}

/* self and mask broadcast to their common shape. */
static void broadcast_pair(pj_lower_t *L, pj_val_t *a, pj_val_t *b) {
  int r = a->t.rank > b->t.rank ? a->t.rank : b->t.rank;
  int64_t d[PJ_MAX_RANK];
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->t.rank), ib = i - (r - b->t.rank);
    int64_t da = ia >= 0 ? a->t.dims[ia] : 1, db = ib >= 0 ? b->t.dims[ib] : 1;
    d[i] = da == 1 ? db : da;
  }
  *a = pj_broadcast_to(H, *a, r, d);
  *b = pj_broadcast_to(H, *b, r, d);
}

static pj_status_t *lower_masked_select(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_val_t m = pj_convert(H, pj_tensor(L, "mask"), PJ_BOOL);
  broadcast_pair(L, &x, &m);
  int64_t n = pj_out_type(L, 0).dims[0], z = 0;
  pj_val_t pos = pj_slice(H, pj_true_positions(L, flat(L, m)), &z, &n, NULL);
  pj_set_result(L, 0, pj_gather_1d(H, flat(L, x), pos));
  return NULL;
}

/* Writes rows of `rows` ([P, vn, R], vn >= 1) into x ([P, M, R]) at the true positions of a
 * flat mask [M], in order (j-th true position <- row j), without knowing the count at compile
 * time: rows past the count go to a padding row M that is sliced off. */
static pj_val_t put_rows_at_mask(pj_lower_t *L, pj_val_t x, pj_val_t mask, pj_val_t rows,
                                 const char *combiner) {
  int64_t M = mask.t.dims[0], vn = rows.t.dims[1];
  pj_type_t mt = pj_type(PJ_I64, 1, &M);
  pj_val_t pos = pj_true_positions(L, mask);
  pj_val_t cnt = pj_broadcast_in_dim(H, pj_count_true(L, mask), mt, NULL);
  pj_val_t j = pj_iota(H, mt, 0);
  pj_val_t target = pj_select(H, pj_compare(H, "LT", j, cnt), pos, pj_full(H, mt, (double)M));
  pj_val_t src = bin(L, "stablehlo.minimum", j, pj_full(H, mt, (double)(vn - 1)));
  pj_val_t upd = pj_take_slices(L, rows, 1, src); /* [P, M, R] */
  int64_t lo[3] = {0, 0, 0}, hi[3] = {0, 1, 0};
  pj_val_t padded = pj_pad(H, x, pj_const(H, x.t.dtype, 0), lo, hi, NULL);
  pj_val_t r = pj_put_slices(L, padded, 1, target, upd, combiner);
  int64_t st[3] = {0, 0, 0}, lim[3] = {x.t.dims[0], M, x.t.dims[2]};
  return pj_slice(H, r, st, lim, NULL);
}

static pj_status_t *lower_masked_scatter(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), ot.dtype);
  pj_val_t m = pj_convert(H, pj_tensor(L, "mask"), PJ_BOOL);
  pj_val_t src = flat(L, pj_convert(H, pj_tensor(L, "source"), ot.dtype));
  x = pj_broadcast_to(H, x, ot.rank, ot.dims);
  m = pj_broadcast_to(H, m, ot.rank, ot.dims);
  int64_t M = pj_type_numel(&ot), sn = src.t.dims[0];
  /* CPU requires source to hold at least count(mask) elements: a device-side check (reported
   * at the next synchronization, as CUDA's kernel asserts), never a silently short write */
  if (M > 0) pj_check_index(L, pj_count_true(L, flat(L, m)), sn + 1, 0, false,
                            PJ_CHECK_MASKED_SCATTER);
  if (sn == 0 || M == 0) {
    pj_set_result(L, 0, x);
    return NULL;
  }
  int64_t d3[3] = {1, M, 1}, s3[3] = {1, sn, 1};
  pj_val_t r = put_rows_at_mask(L, pj_reshape(H, x, 3, d3), flat(L, m), pj_reshape(H, src, 3, s3),
                                NULL);
  pj_set_result(L, 0, pj_reshape(H, r, ot.rank, ot.dims));
  return NULL;
}

/* ---- advanced indexing ---- */

/* The plan of self[indices]: which dims are indexed, the broadcast shape of the index tensors,
 * where its dims go in the result, and at most one bool/uint8 mask (expanded into one index
 * vector of length `count` per mask dim). Built from a call (for dynamic.h, before the result
 * exists) as well as inside the lowerings. */
typedef struct {
  int rank;                      /* self's rank */
  int64_t self_dims[PJ_MAX_RANK];
  int nidx;                      /* indexed dims */
  int dims[PJ_MAX_RANK];         /* the indexed dims, increasing */
  int entry[PJ_MAX_RANK];        /* list element providing each indexed dim */
  int mask_entry;                /* list element of the mask, or -1 */
  int mask_dim0, mask_rank;      /* dims covered by the mask */
  int brank;                     /* broadcast index shape */
  int64_t bshape[PJ_MAX_RANK];
  int bpos;                      /* position of the broadcast dims in the result */
  pj_type_t out;                 /* result shape (dtype of self) */
} index_plan_t;

static const pj_arg_t *call_arg(const pj_call_t *c, const char *name) {
  for (int i = 0; i < c->nargs; i++)
    if (!strcmp(c->args[i].name, name)) return &c->args[i];
  return NULL;
}

static bool is_mask_dtype(pj_dtype_t dt) { return dt == PJ_BOOL || dt == PJ_U8; }

static void dims_str(char *buf, size_t cap, const int64_t *d, int n) {
  size_t len = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, i ? ", %lld" : "%lld", (long long)d[i]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
}

/* count: the mask's count (ignored without a mask). */
static pj_status_t *index_plan(const pj_call_t *c, int64_t count, index_plan_t *p) {
  memset(p, 0, sizeof *p);
  const pj_arg_t *self = call_arg(c, "self"), *ind = call_arg(c, "indices");
  if (!self || self->kind != PJ_ARG_TENSOR || !ind || ind->kind != PJ_ARG_TENSORS)
    return pj_status_new(PJ_ERR_RUNTIME, "internal: aten::%s without self/indices", c->op);
  const pj_tensor_desc_t *sd = &c->tensors[self->first];
  p->rank = sd->rank;
  memcpy(p->self_dims, sd->sizes, sizeof p->self_dims);
  p->mask_entry = -1;
  int dim = 0;
  int64_t shapes[PJ_MAX_RANK][PJ_MAX_RANK];
  int ranks[PJ_MAX_RANK];
  for (int i = 0; i < ind->count; i++) {
    const pj_tensor_desc_t *t = &c->tensors[ind->first + i];
    if (t->rank < 0) {
      dim++;
      continue;
    }
    if (is_mask_dtype(t->dtype)) {
      if (p->mask_entry >= 0)
        return pj_status_new(PJ_ERR_UNIMPLEMENTED,
                             "indexing with more than one bool mask is not supported on tpu");
      if (dim + t->rank > p->rank)
        return pj_status_new(PJ_ERR_INDEX, "too many indices for tensor of dimension %d (got %d)",
                             p->rank, dim + t->rank);
      for (int k = 0; k < t->rank; k++)
        if (t->sizes[k] != p->self_dims[dim + k]) {
          char a[160], b[160];
          dims_str(a, sizeof a, t->sizes, t->rank);
          dims_str(b, sizeof b, p->self_dims + dim, t->rank);
          return pj_status_new(PJ_ERR_INDEX,
                               "The shape of the mask %s at index %d does not match the shape "
                               "of the indexed tensor %s at index %d", a, k, b, dim + k);
        }
      p->mask_entry = i;
      p->mask_dim0 = dim;
      p->mask_rank = t->rank;
      for (int k = 0; k < t->rank; k++) {
        p->dims[p->nidx] = dim + k;
        p->entry[p->nidx] = i;
        ranks[p->nidx] = 1;
        shapes[p->nidx][0] = count;
        p->nidx++;
      }
      dim += t->rank;
      continue;
    }
    if (pj_dtype_info(t->dtype)->is_float || pj_dtype_info(t->dtype)->is_complex)
      return pj_status_new(PJ_ERR_INDEX,
                           "tensors used as indices must be long, int, byte or bool tensors");
    if (dim >= p->rank)
      return pj_status_new(PJ_ERR_INDEX, "too many indices for tensor of dimension %d (got %d)",
                           p->rank, dim + 1);
    p->dims[p->nidx] = dim;
    p->entry[p->nidx] = i;
    ranks[p->nidx] = t->rank;
    memcpy(shapes[p->nidx], t->sizes, sizeof shapes[0]);
    p->nidx++;
    dim++;
  }
  /* broadcast the index shapes */
  for (int k = 0; k < p->nidx; k++)
    if (ranks[k] > p->brank) p->brank = ranks[k];
  for (int i = 0; i < p->brank; i++) p->bshape[i] = 1;
  for (int k = 0; k < p->nidx; k++)
    for (int i = 0; i < ranks[k]; i++) {
      int j = p->brank - ranks[k] + i;
      int64_t s = shapes[k][i];
      if (p->bshape[j] == 1) p->bshape[j] = s;
      else if (s != 1 && s != p->bshape[j])
        return pj_status_new(PJ_ERR_INDEX, "shape mismatch: indexing tensors could not be "
                             "broadcast together");
    }
  /* adjacent indexed dims keep their place; otherwise the broadcast dims go first */
  bool adjacent = true;
  for (int k = 1; k < p->nidx; k++) adjacent = adjacent && p->dims[k] == p->dims[k - 1] + 1;
  p->bpos = adjacent && p->nidx > 0 ? p->dims[0] : 0;
  p->out.dtype = sd->dtype;
  p->out.rank = p->rank - p->nidx + p->brank;
  if (p->out.rank > PJ_MAX_RANK)
    return pj_status_new(PJ_ERR_UNIMPLEMENTED, "indexing result of rank %d", p->out.rank);
  int o = 0;
  for (int d = 0; d < p->rank; d++) {
    if (o == p->bpos)
      for (int i = 0; i < p->brank; i++) p->out.dims[o++] = p->bshape[i];
    bool indexed = false;
    for (int k = 0; k < p->nidx; k++) indexed = indexed || p->dims[k] == d;
    if (!indexed) p->out.dims[o++] = p->self_dims[d];
  }
  if (o == p->bpos)
    for (int i = 0; i < p->brank; i++) p->out.dims[o++] = p->bshape[i];
  return NULL;
}

/* The index tensors of a plan as one [B..., nidx] i64 value (negative indices wrapped). */
static pj_val_t plan_indices(pj_lower_t *L, const index_plan_t *p, int64_t count) {
  pj_val_t parts[PJ_MAX_RANK], mc[PJ_MAX_RANK];
  if (p->mask_entry >= 0) {
    pj_val_t m = pj_convert(H, pj_tensor_at(L, "indices", p->mask_entry), PJ_BOOL);
    if (m.t.rank == 0) { /* a 0-d mask adds a dim of size count (0 or 1): index 0 of it */
      int64_t n = count;
      mc[0] = pj_full(H, pj_type(PJ_I64, 1, &n), 0);
    } else {
      mask_coords(L, m, count, mc);
    }
  }
  int mk = 0;
  for (int k = 0; k < p->nidx; k++) {
    const bool given = p->entry[k] != p->mask_entry; /* mask coordinates are in range */
    pj_val_t v = given ? pj_tensor_at(L, "indices", p->entry[k]) : mc[mk++];
    /* CPU names the index tensor's position among the given ones as its "dimension" */
    const int64_t size = p->self_dims[p->dims[k]];
    if (given) /* index_put: one bad index drops every update */
      v = pj_check_drop_all(L, pj_check_index(L, v, size, k, true, PJ_CHECK_DIM), v, size);
    v = wrap_negative(L, v, size);
    parts[k] = with_unit_tail(L, pj_broadcast_to(H, v, p->brank, p->bshape));
  }
  return pj_concat(H, parts, p->nidx, p->brank);
}

/* Result positions of the non-indexed dims (offset / window dims), in self's dim order. */
static int plan_window(const index_plan_t *p, int64_t *window, int64_t *dims64, int64_t *sizes) {
  int nw = 0, o = 0;
  for (int d = 0; d < p->rank; d++) {
    if (o == p->bpos) o += p->brank;
    bool indexed = false;
    for (int k = 0; k < p->nidx; k++) indexed = indexed || p->dims[k] == d;
    sizes[d] = indexed ? 1 : p->self_dims[d];
    if (!indexed) window[nw++] = o++;
  }
  for (int k = 0; k < p->nidx; k++) dims64[k] = p->dims[k];
  return nw;
}

static pj_status_t *lower_index(pj_lower_t *L) {
  index_plan_t p;
  int64_t count = pj_int(L, "__count", 0);
  PJ_TRY(index_plan(L->c, count, &p));
  pj_val_t x = pj_tensor(L, "self");
  if (p.nidx == 0) {
    pj_set_result(L, 0, x);
    return NULL;
  }
  /* CPU checks an index where it reads an element: an empty result reads none, and its
   * indices go unchecked (fuzz gap G1). (An indexed dim of size 0 with a non-empty index is
   * refused at the call, before this: the bridge's advanced_index_checks.) */
  if (pj_type_numel(&p.out) == 0) {
    pj_set_result(L, 0, pj_full(H, p.out, 0));
    return NULL;
  }
  int64_t window[PJ_MAX_RANK], dims64[PJ_MAX_RANK], sizes[PJ_MAX_RANK];
  int nw = plan_window(&p, window, dims64, sizes);
  pj_val_t idx = plan_indices(L, &p, count);
  pj_set_result(L, 0, gather_g(L, x, idx, window, nw, dims64, p.nidx, dims64, p.nidx, sizes,
                               p.out));
  return NULL;
}

/* index_put with one mask covering dims [d, d+k) and no other index tensors, without knowing
 * the count: values either do not vary along the masked dim (a select) or are written row by
 * row at the mask's true positions. */
static pj_val_t index_put_mask(pj_lower_t *L, const index_plan_t *p, pj_val_t x, pj_val_t v,
                               bool acc) {
  pj_val_t m = pj_convert(H, pj_tensor_at(L, "indices", p->mask_entry), PJ_BOOL);
  int d0 = p->mask_dim0, k = p->mask_rank;
  int64_t P = 1, M = 1, R = 1;
  for (int d = 0; d < d0; d++) P *= p->self_dims[d];
  for (int d = d0; d < d0 + k; d++) M *= p->self_dims[d];
  for (int d = d0 + k; d < p->rank; d++) R *= p->self_dims[d];
  int64_t d3[3] = {P, M, R};
  pj_val_t x3 = pj_reshape(H, x, 3, d3);
  pj_val_t mflat = flat(L, m);
  /* values as [P, vn, R] where vn is the size values give the count dim (1 if broadcast) */
  int vr = v.t.rank, at = d0 - (p->out.rank - vr); /* values dim of the count dim */
  int64_t vn = at >= 0 && at < vr ? v.t.dims[at] : 1;
  pj_type_t full = p->out;
  full.dims[d0] = vn; /* rank of out: rank - k + 1 */
  pj_val_t vb = pj_broadcast_to(H, pj_convert(H, v, x.t.dtype), full.rank, full.dims);
  int64_t v3[3] = {P, vn, R};
  vb = pj_reshape(H, vb, 3, v3);
  /* No rows to write: values have none (the mask is all false, which the Meta kernel's shape
   * check has already required) or self is empty. The gather of row 0 would be out of bounds. */
  if (vn == 0 || P * M * R == 0) return x;
  if (vn == 1) {
    int64_t b3[3] = {P, M, R}, bd[3] = {0, 1, 2}, md[1] = {1};
    pj_type_t t3 = pj_type(x.t.dtype, 3, b3);
    pj_val_t vv = pj_broadcast_in_dim(H, vb, t3, bd);
    if (acc) vv = x.t.dtype == PJ_BOOL ? bin(L, "stablehlo.or", x3, vv)
                                       : bin(L, "stablehlo.add", x3, vv);
    pj_val_t mb = pj_broadcast_in_dim(H, mflat, pj_type_with_dtype(t3, PJ_BOOL), md);
    return pj_reshape(H, pj_select(H, mb, vv, x3), p->rank, p->self_dims);
  }
  pj_val_t r = put_rows_at_mask(L, x3, mflat, vb, acc ? "add" : NULL);
  return pj_reshape(H, r, p->rank, p->self_dims);
}

/* index_put / _index_put_impl_ / _unsafe_index_put. */
static pj_status_t *lower_index_put(pj_lower_t *L) {
  index_plan_t p;
  pj_type_t ot = pj_out_type(L, 0);
  PJ_TRY(index_plan(L->c, 1, &p));
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), ot.dtype);
  pj_val_t v = pj_tensor(L, "values");
  bool acc = pj_bool(L, "accumulate", false);
  if (p.nidx == 0) { /* self[...] = values */
    v = pj_broadcast_to(H, pj_convert(H, v, ot.dtype), ot.rank, ot.dims);
    pj_set_result(L, 0, acc ? bin(L, ot.dtype == PJ_BOOL ? "stablehlo.or" : "stablehlo.add", x, v)
                            : v);
    return NULL;
  }
  if (p.mask_entry >= 0) {
    if (p.nidx != p.mask_rank)
      return pj_status_new(PJ_ERR_UNIMPLEMENTED,
                           "index_put with a bool mask and other index tensors is not "
                           "supported on tpu");
    pj_set_result(L, 0, index_put_mask(L, &p, x, v, acc));
    return NULL;
  }
  /* CPU's kernel (not its Meta) checks that values broadcast to the indexing result, also
   * when nothing is written */
  bool fits = v.t.rank <= p.out.rank; /* right-aligned (x[i] = v strips v's leading 1s first) */
  for (int i = 1; fits && i <= v.t.rank; i++) {
    int64_t a = v.t.dims[v.t.rank - i], b = p.out.dims[p.out.rank - i];
    fits = a == b || a == 1;
  }
  if (!fits) {
    char a[160], b[160];
    dims_str(a, sizeof a, v.t.dims, v.t.rank);
    dims_str(b, sizeof b, p.out.dims, p.out.rank);
    return pj_status_new(PJ_ERR_RUNTIME, "shape mismatch: value tensor of shape %s cannot be "
                         "broadcast to indexing result of shape %s", a, b);
  }
  if (pj_type_numel(&p.out) == 0) {
    pj_set_result(L, 0, x);
    return NULL;
  }
  int64_t window[PJ_MAX_RANK], dims64[PJ_MAX_RANK], sizes[PJ_MAX_RANK];
  int nw = plan_window(&p, window, dims64, sizes);
  pj_val_t idx = plan_indices(L, &p, 0);
  v = pj_broadcast_to(H, pj_convert(H, v, ot.dtype), p.out.rank, p.out.dims);
  pj_set_result(L, 0, scatter_g(L, x, idx, v, window, nw, dims64, p.nidx, dims64, p.nidx,
                                acc ? "add" : NULL));
  return NULL;
}

/* ---- writes through a view into its whole storage ("_pj_view_put", view_index_put.cpp) ----
 *
 * self is the view's whole storage as a 1-D tensor; the view is (sizes, strides, offset) over
 * it: view element (i_0, ..., i_{r-1}) is storage element offset + sum_d i_d * strides[d]. The
 * written view elements form a value of shape R (the write's "result" shape), each given either
 * by an index tensor along one view dim or by its own position along another, so their storage
 * positions are offset + sum of (index * stride) terms + sum of (iota * stride) terms over R, a
 * value with exactly as many elements as are written. The write is then one 1-D scatter into
 * the storage, whose buffer the call donates: its cost follows the written elements, not the
 * storage. offset is a scalar argument (one program serves every view of one geometry: each
 * layer of a cache, each chunk).
 *
 * form "index_put": indices[k] along view dim dims[k] (advanced indexing: broadcast to B, B in
 *   place of the indexed dims when they are adjacent, else first; negative indices wrap);
 * form "slices": indices[0] (1-D) along dims[0], R the view's shape with that dim replaced by
 *   the index's length (index_copy_, index_add_, index_fill_; the layout of index_put with one
 *   index);
 * form "scatter": indices[0] of R's shape along dims[0], each other dim d at its own position
 *   (torch.scatter), values sliced to R.
 * Values: the "values" tensor (broadcast to R; sliced for scatter) or the "value" scalar, times
 * the optional "alpha" scalar; "accumulate" adds them instead of replacing. Negative indices
 * wrap where "negative_ok" (default: form index_put) and are out of range elsewhere.
 *
 * An index outside its own dimension must not land on another element of the storage: it is
 * sent past the storage's end, where the scatter drops it. With the index checks on, each given
 * index tensor is checked against its dimension (CPU's error of `kind` at the next
 * synchronization) and one bad index drops every update (CPU raises before writing). */
static pj_status_t *lower_view_put(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  int64_t sizes[PJ_MAX_RANK], strides[PJ_MAX_RANK], dims[PJ_MAX_RANK];
  const int rank = pj_ints(L, "sizes", sizes, PJ_MAX_RANK);
  const int n = pj_list_len(L, "indices");
  const char *form = pj_str(L, "form", "");
  const bool put = !strcmp(form, "index_put"), scatter = !strcmp(form, "scatter");
  const bool negative_ok = pj_bool(L, "negative_ok", put), acc = pj_bool(L, "accumulate", false);
  if (x.id < 0 || x.t.rank != 1 || rank < 1 || rank > PJ_MAX_RANK ||
      pj_ints(L, "strides", strides, PJ_MAX_RANK) != rank ||
      n < 1 || n > PJ_MAX_RANK || pj_ints(L, "dims", dims, PJ_MAX_RANK) != n || (!put && n != 1) ||
      (!put && !scatter && strcmp(form, "slices")))
    return pj_status_new(PJ_ERR_RUNTIME, "internal: bad _pj_view_put call");
  const int64_t storage = x.t.dims[0];
  const pj_check_kind_t kind = (pj_check_kind_t)pj_int(L, "kind", PJ_CHECK_DIM);
  pj_val_t idx[PJ_MAX_RANK];
  for (int k = 0; k < n; k++) {
    idx[k] = as_i64(L, pj_tensor_at(L, "indices", k));
    if (idx[k].id < 0 || dims[k] < 0 || dims[k] >= rank) return NULL;
  }

  /* R, where each index lands in it (bdims: R dim of each index dim, right-aligned to B), and
   * the R position of each non-indexed view dim (-1: indexed) */
  pj_type_t R = {.dtype = PJ_I64, .rank = 0};
  int64_t bdims[PJ_MAX_RANK][PJ_MAX_RANK];
  int pos[PJ_MAX_RANK];
  for (int d = 0; d < rank; d++) pos[d] = -1;
  if (scatter) {
    R = pj_type(PJ_I64, idx[0].t.rank, idx[0].t.dims);
    if (R.rank != rank) return pj_status_new(PJ_ERR_RUNTIME, "internal: bad _pj_view_put call");
    for (int d = 0; d < rank; d++) {
      bdims[0][d] = d;
      if (d != dims[0]) pos[d] = d;
    }
  } else {
    int brank = 0;
    int64_t bshape[PJ_MAX_RANK];
    for (int k = 0; k < n; k++) brank = idx[k].t.rank > brank ? idx[k].t.rank : brank;
    for (int i = 0; i < brank; i++) bshape[i] = 1;
    for (int k = 0; k < n; k++)
      for (int i = 0; i < idx[k].t.rank; i++) {
        int64_t s = idx[k].t.dims[i], *b = &bshape[brank - idx[k].t.rank + i];
        if (*b == 1) *b = s;
        else if (s != 1 && s != *b)
          return pj_status_new(PJ_ERR_INDEX, "shape mismatch: indexing tensors could not be "
                               "broadcast together");
      }
    bool adjacent = true;
    for (int k = 1; k < n; k++) adjacent = adjacent && dims[k] == dims[k - 1] + 1;
    const int bpos = adjacent ? (int)dims[0] : 0;
    if (rank - n + brank > PJ_MAX_RANK)
      return pj_status_new(PJ_ERR_UNIMPLEMENTED, "indexing result of rank %d", rank - n + brank);
    for (int d = 0; d <= rank; d++) {
      if (R.rank == bpos)
        for (int i = 0; i < brank; i++) R.dims[R.rank++] = bshape[i];
      if (d == rank) break;
      bool indexed = false;
      for (int k = 0; k < n; k++) indexed = indexed || dims[k] == d;
      if (!indexed) pos[d] = R.rank, R.dims[R.rank++] = sizes[d];
    }
    for (int k = 0; k < n; k++)
      for (int i = 0; i < idx[k].t.rank; i++) bdims[k][i] = bpos + brank - idx[k].t.rank + i;
  }
  const int64_t m = pj_type_numel(&R);

  const pj_type_t vt = pj_type_with_dtype(R, x.t.dtype);
  pj_val_t values;
  if (!pj_has(L, "values")) {
    values = pj_broadcast_in_dim(H, pj_convert(H, pj_scalar(L, "value"), x.t.dtype), vt, NULL);
  } else {
    values = pj_convert(H, pj_tensor(L, "values"), x.t.dtype);
    values = scatter && values.t.rank == R.rank ? slice_to(L, values, R)
                                                : pj_broadcast_to(H, values, R.rank, R.dims);
  }
  if (pj_has(L, "alpha"))
    values = MUL(values, pj_broadcast_in_dim(H, pj_convert(H, pj_scalar(L, "alpha"), x.t.dtype),
                                             vt, NULL));
  if (m == 0 || values.id < 0) {
    pj_set_result(L, 0, x);
    return NULL;
  }

  pj_val_t lin = pj_broadcast_in_dim(H, pj_scalar(L, "offset"), R, NULL), bad = kBad,
           valid = kBad;
  for (int k = 0; k < n; k++) {
    const int64_t size = sizes[dims[k]];
    /* CPU names the index tensor's position among the given ones (advanced indexing) or the
     * dim (the other forms) */
    pj_val_t b = pj_check_index(L, idx[k], size, put ? k : (int)dims[k], negative_ok, kind);
    if (b.id >= 0) bad = bad.id < 0 ? b : OR(bad, b);
    pj_val_t i = negative_ok ? wrap_negative(L, idx[k], size) : idx[k];
    if (!L->chk) { /* without checks each bad index is dropped alone */
      pj_val_t ok = AND(CMP("GE", idx[k], pj_full(H, idx[k].t, negative_ok ? (double)-size : 0)),
                        CMP("LT", idx[k], pj_full(H, idx[k].t, (double)size)));
      ok = pj_broadcast_in_dim(H, ok, pj_type_with_dtype(R, PJ_BOOL), bdims[k]);
      valid = valid.id < 0 ? ok : AND(valid, ok);
    }
    i = MUL(i, pj_full(H, i.t, (double)strides[dims[k]]));
    lin = ADD(lin, pj_broadcast_in_dim(H, i, R, bdims[k]));
  }
  for (int d = 0; d < rank; d++)
    if (pos[d] >= 0 && R.dims[pos[d]] > 1)
      lin = ADD(lin, MUL(pj_iota(H, R, pos[d]), pj_full(H, R, (double)strides[d])));
  if (valid.id >= 0) lin = SEL(valid, lin, pj_full(H, R, (double)storage));
  lin = pj_check_drop_all(L, bad, lin, storage);
  const int64_t zero = 0;
  pj_set_result(L, 0, scatter_g(L, x, with_unit_tail(L, flat(L, lin)), flat(L, values), NULL, 0,
                                &zero, 1, &zero, 1, acc ? "add" : NULL));
  return NULL;
}

/* ---- data-dependent shapes (dynamic.h) ---- */

static bool index_has_mask(const pj_call_t *c) {
  const pj_arg_t *ind = call_arg(c, "indices");
  if (!ind || ind->kind != PJ_ARG_TENSORS) return false;
  for (int i = 0; i < ind->count; i++) {
    const pj_tensor_desc_t *t = &c->tensors[ind->first + i];
    if (t->rank >= 0 && is_mask_dtype(t->dtype)) return true;
  }
  return false;
}

bool pj_call_dynamic(const pj_call_t *c) {
  if (pj_select_dynamic(c)) return true;
  if (!strcmp(c->op, "nonzero") || !strcmp(c->op, "masked_select")) return true;
  if (!strcmp(c->op, "index") || !strcmp(c->op, "_unsafe_index")) return index_has_mask(c);
  return false;
}

/* The counting programs: "_pj_count_<op>" with the op's arguments, one 0-d i64 result. */
static pj_status_t *lower_count(pj_lower_t *L) {
  const char *op = L->c->op + strlen("_pj_count_");
  pj_val_t m;
  if (!strcmp(op, "nonzero")) {
    m = pj_convert(H, pj_tensor(L, "self"), PJ_BOOL);
  } else if (!strcmp(op, "masked_select")) {
    pj_val_t x = pj_tensor(L, "self");
    m = pj_convert(H, pj_tensor(L, "mask"), PJ_BOOL);
    broadcast_pair(L, &x, &m);
  } else {
    index_plan_t p;
    PJ_TRY(index_plan(L->c, 0, &p));
    m = pj_convert(H, pj_tensor_at(L, "indices", p.mask_entry), PJ_BOOL);
  }
  pj_set_result(L, 0, pj_count_true(L, m));
  return NULL;
}

pj_status_t *pj_dynamic_count(const pj_call_t *c, int64_t *count) {
  *count = 0;
  if (pj_select_dynamic(c) == PJ_SHAPE_FROM_ARGS) return NULL;
  if (c->nslots >= PJ_CALL_MAX_SLOTS)
    return pj_status_new(PJ_ERR_RUNTIME, "too many distinct storages in one op");
  pj_call_t *cc = malloc(sizeof *cc);
  if (!cc) return pj_status_new(PJ_ERR_OOM, "out of host memory");
  *cc = *c;
  char name[64];
  snprintf(name, sizeof name, "_pj_count_%s", !strcmp(c->op, "_unsafe_index") ? "index" : c->op);
  cc->op = name;
  /* every tensor argument is read (the bridge sets slot flags only when it runs a call) */
  for (int i = 0; i < cc->ntensors; i++)
    if (cc->tensors[i].rank >= 0 && cc->tensors[i].slot >= 0) cc->slots[cc->tensors[i].slot].read = true;
  pj_storage_t *s = NULL;
  pj_status_t *st = pj_storage_new(c->device, sizeof(int64_t), &s);
  if (!st) {
    int slot = cc->nslots++;
    cc->slots[slot] = (pj_slot_t){.storage = s, .dtype = PJ_I64, .numel = 1, .read = false};
    cc->nout = 1;
    cc->outs[0] = (pj_tensor_desc_t){.dtype = PJ_I64, .rank = 0, .slot = slot};
    st = pj_call_run(cc);
  }
  if (!st && !s->buf) st = pj_status_new(PJ_ERR_RUNTIME, "internal: count was not written");
  if (!st) st = pj_transfer_to_host(s->buf, count, sizeof *count);
  pj_storage_release(s);
  free(cc);
  return st;
}

static pj_status_t *dynamic_out_type(const pj_call_t *c, int64_t count, pj_type_t *out);

pj_status_t *pj_dynamic_out_types(const pj_call_t *c, int64_t count, pj_type_t *outs, int max,
                                  int *n) {
  *n = 0;
  if (pj_select_dynamic(c)) return pj_select_out_types(c, count, outs, max, n);
  if (max < 1) return pj_status_new(PJ_ERR_RUNTIME, "internal: no room for results");
  *n = 1;
  return dynamic_out_type(c, count, outs);
}

static pj_status_t *dynamic_out_type(const pj_call_t *c, int64_t count, pj_type_t *out) {
  const pj_arg_t *self = call_arg(c, "self");
  if (!self || self->kind != PJ_ARG_TENSOR)
    return pj_status_new(PJ_ERR_RUNTIME, "internal: aten::%s without self", c->op);
  const pj_tensor_desc_t *sd = &c->tensors[self->first];
  if (!strcmp(c->op, "nonzero")) {
    int64_t d[2] = {count, sd->rank};
    *out = pj_type(PJ_I64, 2, d);
    return NULL;
  }
  if (!strcmp(c->op, "masked_select")) {
    const pj_arg_t *ma = call_arg(c, "mask");
    if (!ma || ma->kind != PJ_ARG_TENSOR)
      return pj_status_new(PJ_ERR_RUNTIME, "internal: masked_select without mask");
    const pj_tensor_desc_t *md = &c->tensors[ma->first];
    if (md->dtype != PJ_BOOL)
      return pj_status_new(PJ_ERR_RUNTIME, "masked_select: expected BoolTensor for mask");
    int r = sd->rank > md->rank ? sd->rank : md->rank;
    for (int i = 0; i < r; i++) {
      int ia = i - (r - sd->rank), ib = i - (r - md->rank);
      int64_t da = ia >= 0 ? sd->sizes[ia] : 1, db = ib >= 0 ? md->sizes[ib] : 1;
      if (da != db && da != 1 && db != 1)
        return pj_status_new(PJ_ERR_RUNTIME,
                             "The size of tensor a (%lld) must match the size of tensor b "
                             "(%lld) at non-singleton dimension %d",
                             (long long)da, (long long)db, i);
    }
    *out = pj_type(sd->dtype, 1, &count);
    return NULL;
  }
  index_plan_t p;
  PJ_TRY(index_plan(c, count, &p));
  *out = p.out;
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_index[] = {
    {"gather", lower_gather, PJ_SHAPE_EXACT},
    {"scatter", lower_scatter, PJ_SHAPE_EXACT},
    {"scatter_add", lower_scatter, PJ_SHAPE_EXACT},
    {"scatter_reduce", lower_scatter, PJ_SHAPE_EXACT},
    {"index_select", lower_index_select, PJ_SHAPE_EXACT},
    {"index_add", lower_index_update, PJ_SHAPE_EXACT},
    {"index_copy", lower_index_update, PJ_SHAPE_EXACT},
    {"index_fill", lower_index_update, PJ_SHAPE_EXACT},
    {"index_reduce", lower_index_reduce, PJ_SHAPE_EXACT},
    {"take", lower_take, PJ_SHAPE_EXACT},
    {"put", lower_put, PJ_SHAPE_EXACT},
    {"sort", lower_sort, PJ_SHAPE_EXACT},
    {"nonzero", lower_nonzero, PJ_SHAPE_EXACT},
    {"masked_select", lower_masked_select, PJ_SHAPE_EXACT},
    {"masked_scatter", lower_masked_scatter, PJ_SHAPE_EXACT},
    {"index", lower_index, PJ_SHAPE_EXACT},
    {"_unsafe_index", lower_index, PJ_SHAPE_EXACT},
    {"index_put", lower_index_put, PJ_SHAPE_EXACT},
    {"_index_put_impl", lower_index_put, PJ_SHAPE_EXACT},
    {"_unsafe_index_put", lower_index_put, PJ_SHAPE_EXACT},
    {"_pj_view_put", lower_view_put, PJ_SHAPE_EXACT},
    {"_pj_count_nonzero", lower_count, PJ_SHAPE_EXACT},
    {"_pj_count_masked_select", lower_count, PJ_SHAPE_EXACT},
    {"_pj_count_index", lower_count, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
