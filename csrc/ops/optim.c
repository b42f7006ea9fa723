/* Optimizer lowerings: the fused in-place steps torch.optim uses with fused=True
 * (_fused_adam_, _fused_adamw_, _fused_sgd_, float or Tensor lr), one program for all
 * parameters, and torch.amp.GradScaler's two ops (_amp_foreach_non_finite_check_and_unscale_,
 * _amp_update_scale_). (The _foreach_* ops are CompositeExplicitAutograd in PyTorch: their
 * per-tensor loops reach the elementwise lowerings and never this file.)
 *
 * Destinations are the mutated list arguments in schema order, element by element, skipping
 * empty tensors (the bridge writes nothing for them): for _fused_adamw_ that is self, grads,
 * exp_avgs, exp_avg_sqs, max_exp_avg_sqs. Every destination gets a value, unchanged ones too
 * (grads when there is no grad_scale).
 *
 * Arithmetic follows PyTorch's CPU kernels: per-tensor constants (bias corrections, step size)
 * in double from the step tensor, elementwise math in the op-math type (float for half types)
 * with the constants rounded to it, and found_inf == 1 leaving every tensor as it was. */
#include <math.h>
#include <string.h>

#include "table.h"
#include "emit.h"


static int64_t desc_numel(const pj_tensor_desc_t *d) {
  if (d->rank < 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < d->rank; i++) n *= d->sizes[i];
  return n;
}

/* Destination indices of the elements of the mutated lists `names` (schema order): dest[l][i]
 * for list l element i, -1 for empty elements. Returns false (error recorded) if the count
 * disagrees with the call's destinations. */
#define MAX_LISTS 5
static bool map_dests(pj_lower_t *L, const char *const *names, int nlists, int n,
                      int (*dest)[PJ_CALL_MAX_OUTS]) {
  int k = 0;
  for (int l = 0; l < nlists; l++) {
    const pj_arg_t *a = pj_arg(L, names[l]);
    int len = a && a->kind == PJ_ARG_TENSORS ? a->count : 0;
    for (int i = 0; i < n; i++) dest[l][i] = -1;
    /* every element is a destination of the call (empty ones too); empty ones get no value */
    for (int i = 0; i < len && i < n; i++, k++)
      if (desc_numel(&L->c->tensors[a->first + i]) > 0) dest[l][i] = k;
  }
  if (k != pj_nout(L)) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s has %d destinations, the lists give %d",
            L->c->op, pj_nout(L), k);
    return false;
  }
  return true;
}

/* The element of a 0-d or one-element optional tensor (grad_scale, found_inf, lr) as a 0-d
 * value of dt; invalid if absent. */
static pj_val_t scalar_tensor(pj_lower_t *L, const char *name, pj_dtype_t dt) {
  const pj_arg_t *a = pj_arg(L, name);
  if (!a || a->kind != PJ_ARG_TENSOR) return (pj_val_t){.id = -1, .sub = -1};
  pj_val_t v = pj_tensor(L, name);
  if (v.id >= 0 && pj_type_numel(&v.t) != 1) {
    pj_fail(L, PJ_ERR_RUNTIME, "%s must be a one-element tensor, got %lld elements", name,
            (long long)pj_type_numel(&v.t));
    return (pj_val_t){.id = -1, .sub = -1};
  }
  return pj_convert(H, pj_reshape(H, v, 0, NULL), dt);
}

/* lr as 0-d double: a one-element tensor (the .tensor_lr overloads), the runtime scalar the
 * bridge passes for a float lr (a scheduler's new value reuses the program), or a constant. */
static pj_val_t lr_value(pj_lower_t *L) {
  const pj_arg_t *a = pj_arg(L, "lr");
  if (a && a->kind == PJ_ARG_TENSOR) return scalar_tensor(L, "lr", PJ_F64);
  if (a && a->kind == PJ_ARG_SCALAR) return pj_convert(H, pj_scalar(L, "lr"), PJ_F64);
  return pj_const(H, PJ_F64, pj_float(L, "lr", 0.0));
}

static pj_val_t bc(pj_lower_t *L, pj_val_t s, pj_val_t like) {
  return pj_broadcast_in_dim(H, s, like.t, NULL);
}
static pj_val_t cst(pj_lower_t *L, pj_val_t like, double v) { return pj_full(H, like.t, v); }
/* found_inf == 1 keeps `old`; otherwise r (converted to old's dtype). */
static pj_val_t keep_if(pj_lower_t *L, pj_val_t found, pj_val_t old, pj_val_t r) {
  if (found.id < 0) return r;
  pj_val_t pred = pj_broadcast_in_dim(H, found, pj_type_with_dtype(old.t, PJ_BOOL), NULL);
  return SEL(pred, old, pj_convert(H, r, old.t.dtype));
}

/* x as a vector. The update is elementwise, and computed on the buffers' own flat shape it
 * leaves XLA:CPU no reshapes between the donated inputs and the results: with them it wrote
 * each result to a fresh buffer and copied it into the donated one (and copied the moments
 * first), three to four fresh buffers per tensor and step: 19 ms instead of 2.6 ms for one
 * 3M-element tensor, 89 instead of 12 ms for four (Adam; SGD with momentum alike). */
static pj_val_t flat(pj_lower_t *L, pj_val_t x) {
  const int64_t n = pj_type_numel(&x.t);
  return pj_reshape(H, x, 1, &n);
}

static pj_dtype_t opmath(pj_dtype_t dt) { return dt == PJ_F64 ? PJ_F64 : PJ_F32; }

static bool check_lists(pj_lower_t *L, const char *const *names, int nlists, int n) {
  for (int l = 0; l < nlists; l++) {
    int len = pj_list_len(L, names[l]);
    if (len != n) {
      pj_fail(L, PJ_ERR_RUNTIME, "Tensor lists must have the same number of tensors, got %d "
              "and %d", n, len);
      return false;
    }
  }
  return true;
}

/* ---- Adam / AdamW ---- */

static pj_status_t *lower_fused_adam(pj_lower_t *L) {
  bool adamw = !strcmp(L->c->op, "_fused_adamw");
  static const char *const mut[MAX_LISTS] = {"self", "grads", "exp_avgs", "exp_avg_sqs",
                                             "max_exp_avg_sqs"};
  int n = pj_list_len(L, "self");
  bool amsgrad = pj_bool(L, "amsgrad", false), maximize = pj_bool(L, "maximize", false);
  static const char *const same[] = {"grads", "exp_avgs", "exp_avg_sqs", "state_steps"};
  if (!check_lists(L, same, 4, n)) return NULL;
  if (amsgrad && !check_lists(L, &mut[4], 1, n)) return NULL;
  static int dest[MAX_LISTS][PJ_CALL_MAX_OUTS]; /* guarded: lowerings run under call.c's lock */
  if (!map_dests(L, mut, MAX_LISTS, n, dest)) return NULL;
  double beta1 = pj_float(L, "beta1", 0.9), beta2 = pj_float(L, "beta2", 0.999);
  double wd = pj_float(L, "weight_decay", 0.0), eps = pj_float(L, "eps", 1e-8);
  pj_val_t lr = lr_value(L);
  pj_val_t found = pj_has(L, "found_inf")
                       ? CMP("EQ", scalar_tensor(L, "found_inf", PJ_F32), pj_const(H, PJ_F32, 1))
                       : (pj_val_t){.id = -1, .sub = -1};
  bool has_scale = pj_has(L, "grad_scale");
  for (int i = 0; i < n && pj_hlo_ok(H); i++) {
    if (dest[0][i] < 0) continue; /* empty parameter: its state is empty too */
    pj_val_t p0 = flat(L, pj_tensor_at(L, "self", i)), g0 = flat(L, pj_tensor_at(L, "grads", i));
    pj_val_t m0 = flat(L, pj_tensor_at(L, "exp_avgs", i));
    pj_val_t v0 = flat(L, pj_tensor_at(L, "exp_avg_sqs", i));
    pj_dtype_t ot = opmath(p0.t.dtype);
    /* per-tensor constants in double, as CPU computes them from step = state_step.item() */
    pj_val_t step = pj_convert(H, pj_reshape(H, pj_tensor_at(L, "state_steps", i), 0, NULL),
                               PJ_F32);
    pj_val_t stepd = pj_convert(H, step, PJ_F64);
    pj_val_t one = pj_const(H, PJ_F64, 1.0);
    pj_val_t bc1 = SUB(one, pj_binary(H, "stablehlo.power", pj_const(H, PJ_F64, beta1), stepd));
    pj_val_t bc2 = SUB(one, pj_binary(H, "stablehlo.power", pj_const(H, PJ_F64, beta2), stepd));
    pj_val_t step_size = pj_convert(H, DIV(lr, bc1), ot);
    pj_val_t bc2_sqrt = pj_convert(H, U("sqrt", bc2), ot);

    pj_val_t p = pj_convert(H, p0, ot), g = pj_convert(H, g0, ot);
    pj_val_t m = pj_convert(H, m0, ot), v = pj_convert(H, v0, ot);
    pj_val_t g_store = g0;
    if (has_scale) {
      g = DIV(g, bc(L, scalar_tensor(L, "grad_scale", ot), g));
      g_store = g;
    }
    if (maximize) g = U("negate", g);
    if (wd != 0) {
      if (adamw) /* param * (1 - lr * weight_decay), the factor in double then op-math */
        p = MUL(p, bc(L, pj_convert(H, SUB(one, MUL(lr, pj_const(H, PJ_F64, wd))), ot), p));
      else
        g = ADD(g, MUL(p, cst(L, p, wd)));
    }
    /* exp_avg.lerp_(grad, 1 - beta1), two-sided like torch.lerp */
    double w = (double)(float)(1 - beta1);
    if (ot == PJ_F64) w = 1 - beta1;
    pj_val_t mm = fabs(w) < 0.5 ? ADD(m, MUL(cst(L, m, w), SUB(g, m)))
                                : SUB(g, MUL(SUB(g, m), cst(L, m, 1 - w)));
    pj_val_t vv = ADD(MUL(v, cst(L, v, beta2)), MUL(MUL(cst(L, g, 1 - beta2), g), g));
    pj_val_t mx = {.id = -1, .sub = -1};
    pj_val_t den_base = vv;
    if (amsgrad) {
      /* NaN-propagating, like torch.maximum in the for-loop and foreach Adam (fuzz F14) */
      mx = pj_max_min_nan(L, pj_convert(H, flat(L, pj_tensor_at(L, "max_exp_avg_sqs", i)), ot),
                          vv, true);
      den_base = mx;
    }
    pj_val_t denom = ADD(DIV(U("sqrt", den_base), bc(L, bc2_sqrt, vv)), cst(L, vv, eps));
    pj_val_t pn = SUB(p, DIV(MUL(bc(L, step_size, mm), mm), denom));

    pj_val_t news[MAX_LISTS] = {pn, g_store, mm, vv, mx};
    pj_val_t olds[MAX_LISTS] = {p0, g0, m0, v0, {.id = -1, .sub = -1}};
    if (dest[4][i] >= 0) olds[4] = flat(L, pj_tensor_at(L, "max_exp_avg_sqs", i));
    for (int l = 0; l < MAX_LISTS; l++) {
      if (dest[l][i] < 0) continue;
      /* without amsgrad a given max_exp_avg_sqs element is written back unchanged */
      pj_val_t r = news[l].id >= 0 ? news[l] : olds[l];
      pj_type_t t = pj_out_type(L, dest[l][i]);
      pj_set_result(L, dest[l][i], pj_reshape(H, keep_if(L, found, olds[l], r), t.rank, t.dims));
    }
  }
  return NULL;
}

/* ---- SGD ---- */

static pj_status_t *lower_fused_sgd(pj_lower_t *L) {
  static const char *const mut[3] = {"self", "grads", "momentum_buffer_list"};
  int n = pj_list_len(L, "self");
  if (!check_lists(L, &mut[1], 1, n)) return NULL;
  double wd = pj_float(L, "weight_decay", 0.0), momentum = pj_float(L, "momentum", 0.0);
  double dampening = pj_float(L, "dampening", 0.0);
  bool nesterov = pj_bool(L, "nesterov", false), maximize = pj_bool(L, "maximize", false);
  bool first = pj_bool(L, "is_first_step", false);
  int nbuf = pj_list_len(L, "momentum_buffer_list");
  if (momentum != 0 && nbuf != n) {
    pj_fail(L, PJ_ERR_RUNTIME, "momentum_buffer_list must have %d tensors when momentum != 0, "
            "got %d", n, nbuf);
    return NULL;
  }
  static int dest[MAX_LISTS][PJ_CALL_MAX_OUTS]; /* guarded: lowerings run under call.c's lock */
  if (!map_dests(L, mut, 3, n, dest)) return NULL;
  pj_val_t lr = lr_value(L);
  pj_val_t found = pj_has(L, "found_inf")
                       ? CMP("EQ", scalar_tensor(L, "found_inf", PJ_F32), pj_const(H, PJ_F32, 1))
                       : (pj_val_t){.id = -1, .sub = -1};
  bool has_scale = pj_has(L, "grad_scale");
  for (int i = 0; i < n && pj_hlo_ok(H); i++) {
    if (dest[0][i] < 0) continue;
    pj_val_t p0 = flat(L, pj_tensor_at(L, "self", i)), g0 = flat(L, pj_tensor_at(L, "grads", i));
    pj_dtype_t ot = opmath(p0.t.dtype);
    pj_val_t p = pj_convert(H, p0, ot), g = pj_convert(H, g0, ot);
    pj_val_t g_store = g0;
    if (has_scale) {
      g = DIV(g, bc(L, scalar_tensor(L, "grad_scale", ot), g));
      g_store = g;
    }
    if (maximize) g = U("negate", g);
    if (wd != 0) g = ADD(g, MUL(p, cst(L, p, wd)));
    pj_val_t b0 = {.id = -1, .sub = -1}, buf = {.id = -1, .sub = -1};
    if (i < nbuf) b0 = flat(L, pj_tensor_at(L, "momentum_buffer_list", i));
    if (momentum != 0) {
      buf = first ? g
                  : ADD(MUL(pj_convert(H, b0, ot), cst(L, g, momentum)),
                        MUL(g, cst(L, g, 1 - dampening)));
      g = nesterov ? ADD(g, MUL(buf, cst(L, buf, momentum))) : buf;
    }
    pj_val_t pn = SUB(p, MUL(g, bc(L, pj_convert(H, lr, ot), g)));
    pj_val_t news[3] = {pn, g_store, buf.id >= 0 ? buf : b0};
    pj_val_t olds[3] = {p0, g0, b0};
    for (int l = 0; l < 3; l++)
      if (dest[l][i] >= 0) {
        pj_type_t t = pj_out_type(L, dest[l][i]);
        pj_set_result(L, dest[l][i],
                      pj_reshape(H, keep_if(L, found, olds[l], news[l]), t.rank, t.dims));
      }
  }
  return NULL;
}

/* ---- GradScaler ---- */

/* A 1-element tensor argument of dtype dt, checked as CPU checks it (RuntimeError); `shown`
 * is the name CPU's message uses. */
static bool check_one(pj_lower_t *L, const char *name, const char *shown, pj_dtype_t dt,
                      const char *dtname) {
  const pj_tensor_desc_t *d = pj_tensor_desc(L, name);
  if (!d || desc_numel(d) != 1) {
    pj_fail(L, PJ_ERR_RUNTIME, "%s must be a 1-element tensor.", shown);
    return false;
  }
  if (d->dtype != dt) {
    pj_fail(L, PJ_ERR_RUNTIME, "%s must be %s tensor.", shown, dtname);
    return false;
  }
  return true;
}

/* _amp_foreach_non_finite_check_and_unscale_(self[], found_inf, inv_scale): each tensor times
 * inv_scale in the op-math type; found_inf becomes 1 if any element of any tensor is inf or
 * NaN, else keeps its value (zeroing it is the caller's job). Destinations: self's elements,
 * then found_inf. An empty list changes nothing and checks nothing, as on CPU. */
static pj_status_t *lower_amp_unscale(pj_lower_t *L) {
  int n = pj_list_len(L, "self");
  if (pj_nout(L) != n + 1) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s has %d destinations, expected %d", L->c->op,
            pj_nout(L), n + 1);
    return NULL;
  }
  pj_val_t found0 = pj_tensor(L, "found_inf");
  if (n == 0) {
    pj_set_result(L, 0, found0);
    return NULL;
  }
  if (!check_one(L, "inv_scale", "inv_scale", PJ_F32, "a float") ||
      !check_one(L, "found_inf", "found_inf", PJ_F32, "a float"))
    return NULL;
  const pj_arg_t *self = pj_arg(L, "self");
  pj_val_t inv = scalar_tensor(L, "inv_scale", PJ_F32);
  pj_val_t any = pj_const(H, PJ_BOOL, 0);
  for (int i = 0; i < n && pj_hlo_ok(H); i++) {
    const pj_tensor_desc_t *d = &L->c->tensors[self->first + i];
    if (!pj_dtype_is_float(d->dtype)) {
      pj_fail(L, PJ_ERR_UNIMPLEMENTED, "_amp_foreach_non_finite_check_and_unscale_ is not "
              "implemented for %s", pj_dtype_info(d->dtype)->name);
      return NULL;
    }
    if (desc_numel(d) == 0) continue; /* nothing to write, nothing to check */
    pj_val_t g0 = pj_tensor_at(L, "self", i);
    pj_dtype_t ot = opmath(g0.t.dtype);
    pj_val_t g = pj_convert(H, g0, ot);
    pj_val_t fin = pj_hlo_op(H, "stablehlo.is_finite", &g, 1, NULL,
                             pj_type_with_dtype(g.t, PJ_BOOL));
    int64_t dims[PJ_MAX_RANK];
    for (int k = 0; k < g.t.rank; k++) dims[k] = k;
    any = OR(any, U("not", pj_reduce(H, fin, dims, g.t.rank, "and")));
    pj_set_result(L, i, MUL(g, bc(L, pj_convert(H, inv, ot), g)));
  }
  pj_val_t found = pj_reshape(H, found0, 0, NULL);
  pj_set_result(L, n, SEL(any, pj_const(H, PJ_F32, 1), found));
  return NULL;
}

/* _amp_update_scale_(self=scale, growth_tracker, found_inf, growth_factor, backoff_factor,
 * growth_interval): found_inf != 0 backs the scale off and zeroes the tracker; otherwise the
 * tracker counts the step, and at growth_interval the scale grows (unless that overflows
 * float) and the tracker restarts. Factors multiply in double, as on CPU. Destinations: scale,
 * growth_tracker. */
static pj_status_t *lower_amp_update_scale(pj_lower_t *L) {
  if (!check_one(L, "growth_tracker", "growth_tracker", PJ_I32, "an int") ||
      !check_one(L, "self", "current_scale", PJ_F32, "a float") ||
      !check_one(L, "found_inf", "found_inf", PJ_F32, "a float"))
    return NULL;
  pj_val_t s = scalar_tensor(L, "self", PJ_F32);
  pj_val_t t = scalar_tensor(L, "growth_tracker", PJ_I64);
  pj_val_t found = CMP("NE", scalar_tensor(L, "found_inf", PJ_F32), pj_const(H, PJ_F32, 0));
  pj_val_t sd = pj_convert(H, s, PJ_F64);
  pj_val_t backoff = pj_const(H, PJ_F64, pj_float(L, "scale_backoff_factor", 0.5));
  pj_val_t growth = pj_const(H, PJ_F64, pj_float(L, "scale_growth_factor", 2.0));
  pj_val_t backed = pj_convert(H, MUL(sd, backoff), PJ_F32);
  pj_val_t grown = pj_convert(H, MUL(sd, growth), PJ_F32);
  grown = SEL(pj_hlo_op(H, "stablehlo.is_finite", &grown, 1, NULL,
                        pj_type_with_dtype(grown.t, PJ_BOOL)), grown, s);
  pj_val_t succ = ADD(t, pj_const_i(H, PJ_I64, 1));
  pj_val_t grow = CMP("EQ", succ, pj_const_i(H, PJ_I64, pj_int(L, "growth_interval", 0)));
  pj_val_t zero = pj_const_i(H, PJ_I64, 0);
  pj_set_result(L, 0, SEL(found, backed, SEL(grow, grown, s)));
  pj_set_result(L, 1, pj_convert(H, SEL(found, zero, SEL(grow, zero, succ)), PJ_I32));
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_optim[] = {
    {"_amp_foreach_non_finite_check_and_unscale", lower_amp_unscale, PJ_SHAPE_EXACT},
    {"_amp_update_scale", lower_amp_update_scale, PJ_SHAPE_EXACT},
    {"_fused_adam", lower_fused_adam, PJ_SHAPE_EXACT},
    {"_fused_adamw", lower_fused_adam, PJ_SHAPE_EXACT},
    {"_fused_sgd", lower_fused_sgd, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
