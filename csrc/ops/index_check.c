/* Emission of device-side index checks into a program (lower.h; the state layout and how the
 * host reads it: torch_pjrt/index_checks.h). */
#include <stdlib.h>

#include "emit.h"

static pj_val_t state_element(pj_hlo_t *h, pj_val_t state, int64_t i) {
  int64_t lo = i, hi = i + 1, st = 1;
  return pj_reshape(h, pj_slice(h, state, &lo, &hi, &st), 0, NULL);
}

static const pj_val_t kNone = {.id = -1, .sub = -1};

/* kind: a 0-d int64 value (a pj_check_kind_t, constant or computed by the program). */
static pj_val_t check(pj_lower_t *L, pj_val_t idx, int64_t size, int dim, bool negative_ok,
                      pj_val_t kind, bool has_ignore, int64_t ignore) {
  pj_check_emit_t *c = L->chk;
  if (!c || idx.id < 0 || !pj_hlo_ok(H)) return kNone;
  int64_t n = pj_type_numel(&idx.t);
  if (n == 0) return kNone;
  if (c->state.id < 0) {
    int64_t len = PJ_CHECK_STATE_LEN;
    c->state = pj_hlo_param_last(H, pj_type(PJ_I64, 1, &len));
    c->seq = ADD(state_element(H, c->state, 8), pj_const_i(H, PJ_I64, 1));
  }
  pj_val_t i = pj_reshape(H, pj_convert(H, idx, PJ_I64), 1, &n);
  pj_type_t vt = i.t;
  pj_val_t lo = pj_full(H, vt, negative_ok ? (double)-size : 0);
  pj_val_t bad = OR(CMP("LT", i, lo), CMP("GE", i, pj_full(H, vt, (double)size)));
  if (has_ignore) bad = AND(bad, CMP("NE", i, pj_broadcast_in_dim(H, pj_const_i(H, PJ_I64, ignore), vt, NULL)));
  /* the first bad position and its value in one variadic reduce: (position, value) pairs,
   * the smaller position wins; good elements carry position n */
  pj_val_t pos = SEL(bad, pj_iota(H, vt, 0), pj_full(H, vt, (double)n));
  pj_type_t s64 = pj_type_scalar(PJ_I64);
  pj_type_t sts[4] = {s64, s64, s64, s64};
  pj_val_t a[4];
  pj_hlo_region_begin(H, sts, 4, a);
  pj_val_t left = CMP("LE", a[0], a[2]);
  pj_val_t rv[2] = {SEL(left, a[0], a[2]), SEL(left, a[1], a[3])};
  char *region = pj_hlo_region_end(H, rv, 2);
  if (!region) return kNone;
  pj_val_t ins[4] = {pos, i, pj_const_i(H, PJ_I64, n), pj_const_i(H, PJ_I64, 0)}, res[2];
  pj_type_t outs[2] = {s64, s64};
  bool ok = pj_hlo_op_multi(H, "stablehlo.reduce", ins, 4, region, "dimensions = array<i64: 0>",
                            outs, 2, res);
  free(region);
  if (!ok) return kNone;
  pj_val_t first = res[0], value = res[1];
  pj_val_t any = CMP("LT", first, pj_const_i(H, PJ_I64, n));
  /* The record as one [9] vector: element k is vals[k], by a chain of selects on an iota rather
   * than a concatenate of nine [1] pieces. Same values; XLA's CPU compiler fuses the chain with
   * the select below into one kernel, where the concatenate made the program's compile about a
   * fifth slower (docs/performance.md, the index checks' share of an index program's compile). */
  const pj_val_t vals[PJ_CHECK_STATE_LEN] = {
      pj_const_i(H, PJ_I64, 1), c->seq, pj_const_i(H, PJ_I64, c->op_index), kind, value,
      pj_const_i(H, PJ_I64, dim), pj_const_i(H, PJ_I64, size), first,
      state_element(H, c->state, 8)};
  pj_type_t rt = c->state.t;
  pj_val_t pos_of = pj_iota(H, rt, 0);
  pj_val_t record = pj_broadcast_in_dim(H, vals[0], rt, NULL);
  for (int k = 1; k < PJ_CHECK_STATE_LEN; k++)
    record = SEL(CMP("EQ", pos_of, pj_full(H, rt, (double)k)),
                 pj_broadcast_in_dim(H, vals[k], rt, NULL), record);
  /* the first failure wins: a state that already failed is kept */
  pj_val_t fresh = CMP("EQ", state_element(H, c->state, 0), pj_const_i(H, PJ_I64, 0));
  pj_val_t take = pj_broadcast_in_dim(H, AND(any, fresh), pj_type_with_dtype(c->state.t, PJ_BOOL), NULL);
  c->state = SEL(take, record, c->state);
  return any;
}

pj_val_t pj_check_index(pj_lower_t *L, pj_val_t idx, int64_t size, int dim, bool negative_ok,
                        pj_check_kind_t kind) {
  if (!L->chk) return kNone;
  return check(L, idx, size, dim, negative_ok, pj_const_i(H, PJ_I64, kind), false, 0);
}

pj_val_t pj_check_index_kind(pj_lower_t *L, pj_val_t idx, int64_t size, int dim,
                             bool negative_ok, pj_val_t kind) {
  if (kind.id < 0 || kind.t.rank != 0 || kind.t.dtype != PJ_I64) {
    if (pj_hlo_ok(H)) pj_fail(L, PJ_ERR_RUNTIME, "internal: an index check's kind is not a 0-d int64");
    return kNone;
  }
  return check(L, idx, size, dim, negative_ok, kind, false, 0);
}

pj_val_t pj_check_index_except(pj_lower_t *L, pj_val_t idx, int64_t size, int dim,
                               bool negative_ok, pj_check_kind_t kind, int64_t ignore) {
  if (!L->chk) return kNone;
  return check(L, idx, size, dim, negative_ok, pj_const_i(H, PJ_I64, kind), true, ignore);
}

pj_val_t pj_check_drop_all(pj_lower_t *L, pj_val_t bad, pj_val_t idx, int64_t size) {
  if (bad.id < 0 || idx.id < 0) return idx;
  pj_val_t past = pj_convert(H, pj_const_i(H, PJ_I64, size), idx.t.dtype);
  return SEL(pj_broadcast_in_dim(H, bad, pj_type_with_dtype(idx.t, PJ_BOOL), NULL),
             pj_broadcast_in_dim(H, past, idx.t, NULL), idx);
}

pj_val_t pj_check_finish(pj_hlo_t *h, pj_check_emit_t *chk) {
  if (!chk || chk->state.id < 0) return (pj_val_t){.id = -1, .sub = -1};
  int64_t lo = 0, hi = 8, st = 1, one = 1;
  pj_val_t parts[2] = {pj_slice(h, chk->state, &lo, &hi, &st), pj_reshape(h, chk->seq, 1, &one)};
  return pj_concat(h, parts, 2, 0);
}
