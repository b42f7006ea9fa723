/* _foreach_* ops: one program for a whole list. Each element is lowered by the single-tensor
 * op's own lowering (add, addcdiv, sqrt, ...) through a per-element view of the call: list
 * arguments become their i-th element, Scalar[] arguments their i-th scalar, everything else is
 * shared, and foreach argument names are renamed to the single op's (scalar -> other, ...).
 * Destination i of the foreach call (the i-th returned, mutated or out= tensor) is the single
 * op's destination 0. Only overloads whose per-element meaning is exactly the single op's are
 * registered to reach here (dispatch.cpp); others keep PyTorch's composite per-tensor loop. */
#include <stdlib.h>
#include <string.h>

#include "table.h"

typedef struct {
  const char *from, *to;
} rename_t;

typedef struct {
  const char *name;   /* foreach base name */
  const char *single; /* the per-element op */
  rename_t renames[3];
} foreach_row_t;

static const foreach_row_t kRows[] = {
    {"_foreach_add", "add", {{"scalar", "other"}, {"scalars", "other"}}},
    {"_foreach_sub", "sub", {{"scalar", "other"}, {"scalars", "other"}}},
    {"_foreach_mul", "mul", {{"scalar", "other"}, {"scalars", "other"}}},
    {"_foreach_div", "div", {{"scalar", "other"}, {"scalars", "other"}}},
    {"_foreach_maximum", "maximum", {{"scalar", "other"}, {"scalars", "other"}}},
    {"_foreach_minimum", "minimum", {{"scalar", "other"}, {"scalars", "other"}}},
    {"_foreach_clamp_min", "clamp_min", {{"scalar", "min"}, {"scalars", "min"}, {"other", "min"}}},
    {"_foreach_clamp_max", "clamp_max", {{"scalar", "max"}, {"scalars", "max"}, {"other", "max"}}},
    {"_foreach_addcmul", "addcmul", {{"scalars", "value"}}},
    {"_foreach_addcdiv", "addcdiv", {{"scalars", "value"}}},
    {"_foreach_lerp", "lerp", {{"tensors1", "end"}, {"weights", "weight"}}},
    {"_foreach_pow", "pow", {{NULL, NULL}}},
    {"_foreach_copy", "_pj_copy", {{NULL, NULL}}},
    {"_foreach_zero", "zero", {{NULL, NULL}}},
    {"_foreach_sqrt", "sqrt", {{NULL, NULL}}},
    {"_foreach_neg", "neg", {{NULL, NULL}}},
    {"_foreach_abs", "abs", {{NULL, NULL}}},
    {"_foreach_exp", "exp", {{NULL, NULL}}},
    {"_foreach_log", "log", {{NULL, NULL}}},
    {"_foreach_reciprocal", "reciprocal", {{NULL, NULL}}},
    {"_foreach_sign", "sign", {{NULL, NULL}}},
    {"_foreach_sigmoid", "sigmoid", {{NULL, NULL}}},
    {"_foreach_tanh", "tanh", {{NULL, NULL}}},
    {NULL, NULL, {{NULL, NULL}}},
};

static const foreach_row_t *find_row(const char *op) {
  for (const foreach_row_t *r = kRows; r->name; r++)
    if (!strcmp(r->name, op)) return r;
  return NULL;
}

static const char *renamed(const foreach_row_t *row, const char *name) {
  for (int k = 0; k < 3 && row->renames[k].from; k++)
    if (!strcmp(row->renames[k].from, name)) return row->renames[k].to;
  return name;
}

/* The list length: the longest Tensor[] / Scalar[] argument (all lists have it; PyTorch checks). */
static int list_length(const pj_call_t *c) {
  int n = 0;
  for (int a = 0; a < c->nargs; a++)
    if ((c->args[a].kind == PJ_ARG_TENSORS || c->args[a].kind == PJ_ARG_SCALARS) &&
        c->args[a].count > n)
      n = c->args[a].count;
  return n;
}

static pj_status_t *lower_foreach(pj_lower_t *L) {
  const pj_call_t *c = L->c;
  const foreach_row_t *row = find_row(c->op);
  pj_lower_fn single = pj_lowering_find(row->single);
  int n = list_length(c);
  if (!single || n != c->nout) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s over %d elements with %d destinations",
            c->op, n, c->nout);
    return NULL;
  }
  /* One per-element call, rewritten for each element; it shares the tensor and scalar tables
   * (same indices), so the materialized-argument cache is shared too. */
  pj_call_t *sub = malloc(sizeof *sub);
  if (!sub) return pj_status_new(PJ_ERR_OOM, "out of host memory");
  pj_status_t *st = NULL;
  for (int i = 0; i < n && !st && pj_hlo_ok(L->h); i++) {
    memcpy(sub, c, sizeof *sub);
    sub->op = row->single;
    for (int a = 0; a < sub->nargs; a++) {
      pj_arg_t *g = &sub->args[a];
      g->name = renamed(row, g->name);
      if (g->kind == PJ_ARG_TENSORS) {
        g->kind = c->tensors[g->first + i].rank < 0 ? PJ_ARG_NONE : PJ_ARG_TENSOR;
        g->first += i;
        g->count = 1;
      } else if (g->kind == PJ_ARG_SCALARS) {
        g->kind = PJ_ARG_SCALAR;
        g->first += i;
        g->count = 1;
      }
    }
    sub->nout = 1;
    sub->outs[0] = c->outs[i];
    pj_val_t result = {.id = -1, .sub = -1};
    bool has = false;
    pj_lower_t E = *L;
    E.c = sub;
    E.results = &result;
    E.has_result = &has;
    st = single(&E);
    if (!st && has) {
      L->results[i] = result;
      L->has_result[i] = true;
    }
  }
  free(sub);
  return st;
}

const pj_lowering_entry_t pj_lowerings_foreach[] = {
#define ROW(n) {"_foreach_" #n, lower_foreach, PJ_SHAPE_EXACT},
    ROW(add) ROW(sub) ROW(mul) ROW(div) ROW(maximum) ROW(minimum) ROW(clamp_min) ROW(clamp_max)
    ROW(addcmul) ROW(addcdiv) ROW(lerp) ROW(pow) ROW(copy) ROW(zero) ROW(sqrt) ROW(neg) ROW(abs)
    ROW(exp) ROW(log) ROW(reciprocal) ROW(sign) ROW(sigmoid) ROW(tanh)
#undef ROW
    {NULL, NULL, PJ_SHAPE_EXACT},
};
