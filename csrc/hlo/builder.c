/* StableHLO text builder core: types, parameters, generic op printing, regions, finishing. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"
#include "torch_pjrt/hlo.h"

#define PJ_MAX_REGION_DEPTH 8

struct pj_hlo {
  pj_val_t *params;                        /* function parameters, printed at finish */
  int params_cap;
  pj_sb_t body;                            /* ops of func.func @main */
  pj_sb_t regions[PJ_MAX_REGION_DEPTH];    /* bodies of regions being built */
  int depth;
  int next_id;
  int nparams;
  pj_sb_t funcs;                           /* module-level functions after @main (kernels) */
  char **func_keys;                        /* keys of the functions added to funcs, once each */
  int nfunc_keys;
  pj_val_t last;                           /* the trailing parameter, if has_last */
  bool has_last;
  pj_code_t err_code;
  char err[1024];
};

pj_type_t pj_type(pj_dtype_t dt, int rank, const int64_t *dims) {
  /* a rank beyond PJ_MAX_RANK is kept (every emitter refuses it with a status) but only
   * PJ_MAX_RANK dims are stored; the readers below stop there too */
  pj_type_t t = {.dtype = dt, .rank = rank};
  for (int i = 0; i < rank && i < PJ_MAX_RANK; i++) t.dims[i] = dims[i];
  return t;
}
/* The number of dims stored in t (its rank, clamped to the array). */
static int stored_rank(const pj_type_t *t) { return t->rank < PJ_MAX_RANK ? t->rank : PJ_MAX_RANK; }
pj_type_t pj_type_scalar(pj_dtype_t dt) { return pj_type(dt, 0, NULL); }
pj_type_t pj_type_with_dtype(pj_type_t t, pj_dtype_t dt) {
  t.dtype = dt;
  return t;
}
int64_t pj_type_numel(const pj_type_t *t) {
  int64_t n = 1;
  for (int i = 0; i < stored_rank(t); i++) n *= t->dims[i];
  return n;
}
bool pj_type_same_shape(const pj_type_t *a, const pj_type_t *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < stored_rank(a); i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}
char *pj_type_str(const pj_type_t *t, char *buf, size_t cap) {
  size_t o = (size_t)snprintf(buf, cap, "tensor<");
  for (int i = 0; i < stored_rank(t) && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%lldx", (long long)t->dims[i]);
  if (o < cap) snprintf(buf + o, cap - o, "%s>", pj_dtype_info(t->dtype)->mlir);
  return buf;
}

pj_hlo_t *pj_hlo_new(void) { return calloc(1, sizeof(pj_hlo_t)); }

void pj_hlo_free(pj_hlo_t *h) {
  if (!h) return;
  free(h->params);
  pj_sb_free(&h->body);
  pj_sb_free(&h->funcs);
  for (int i = 0; i < h->nfunc_keys; i++) free(h->func_keys[i]);
  free(h->func_keys);
  for (int i = 0; i < PJ_MAX_REGION_DEPTH; i++) pj_sb_free(&h->regions[i]);
  free(h);
}

static const pj_val_t kInvalid = {.id = -1, .sub = -1};

pj_val_t pj_hlo_fail(pj_hlo_t *h, pj_code_t code, const char *fmt, ...) {
  if (h->err[0]) return kInvalid;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->err, sizeof h->err, fmt, ap);
  va_end(ap);
  if (!h->err[0]) snprintf(h->err, sizeof h->err, "lowering failed");
  h->err_code = code;
  return kInvalid;
}

bool pj_hlo_ok(const pj_hlo_t *h) { return h->err[0] == 0; }

static pj_sb_t *out(pj_hlo_t *h) { return h->depth ? &h->regions[h->depth - 1] : &h->body; }

static void print_val(pj_sb_t *b, pj_val_t v) {
  if (v.sub >= 0)
    pj_sb_printf(b, "%%v%d#%d", v.id, v.sub);
  else
    pj_sb_printf(b, "%%v%d", v.id);
}

pj_val_t pj_hlo_param(pj_hlo_t *h, pj_type_t t) {
  if (h->nparams == h->params_cap) {
    int cap = h->params_cap ? h->params_cap * 2 : 16;
    pj_val_t *p = realloc(h->params, (size_t)cap * sizeof *p);
    if (!p) return pj_hlo_fail(h, PJ_ERR_OOM, "out of memory adding a parameter");
    h->params = p;
    h->params_cap = cap;
  }
  pj_val_t v = {.id = h->next_id++, .sub = -1, .t = t};
  h->params[h->nparams++] = v;
  return v;
}

pj_val_t pj_hlo_param_last(pj_hlo_t *h, pj_type_t t) {
  if (h->has_last) return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: a second trailing parameter");
  h->last = (pj_val_t){.id = h->next_id++, .sub = -1, .t = t};
  h->has_last = true;
  return h->last;
}

static bool check_ins(pj_hlo_t *h, const char *op, const pj_val_t *ins, int n) {
  if (!pj_hlo_ok(h)) return false;
  for (int i = 0; i < n; i++)
    if (ins[i].id < 0) {
      pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: invalid operand %d of %s", i, op);
      return false;
    }
  return true;
}

static void print_types(pj_sb_t *b, const pj_type_t *ts_, int n, bool paren) {
  char ts[PJ_TYPE_STR_CAP];
  if (paren) pj_sb_puts(b, "(");
  for (int i = 0; i < n; i++) {
    pj_sb_puts(b, i ? ", " : "");
    pj_sb_puts(b, pj_type_str(&ts_[i], ts, sizeof ts));
  }
  if (paren) pj_sb_puts(b, ")");
}

/* The types of n values (any n: ops such as concatenate take as many operands as the user
 * gave, a program returns every live storage). */
static void print_val_types(pj_sb_t *b, const pj_val_t *vals, int n, bool paren) {
  char ts[PJ_TYPE_STR_CAP];
  if (paren) pj_sb_puts(b, "(");
  for (int i = 0; i < n; i++) {
    pj_sb_puts(b, i ? ", " : "");
    pj_sb_puts(b, pj_type_str(&vals[i].t, ts, sizeof ts));
  }
  if (paren) pj_sb_puts(b, ")");
}

bool pj_hlo_op_multi(pj_hlo_t *h, const char *op, const pj_val_t *ins, int n, const char *region,
                     const char *attrs, const pj_type_t *outs, int nout, pj_val_t *results) {
  for (int i = 0; i < nout; i++) results[i] = kInvalid;
  if (!check_ins(h, op, ins, n)) return false;
  for (int i = 0; i < nout; i++)
    if (outs[i].rank > PJ_MAX_RANK) {
      pj_hlo_fail(h, PJ_ERR_UNIMPLEMENTED, "tensors of rank > %d are not supported", PJ_MAX_RANK);
      return false;
    }
  pj_sb_t *b = out(h);
  int id = h->next_id++;
  if (nout == 1)
    pj_sb_printf(b, "  %%v%d = ", id);
  else if (nout > 1)
    pj_sb_printf(b, "  %%v%d:%d = ", id, nout);
  else
    pj_sb_puts(b, "  ");
  pj_sb_printf(b, "\"%s\"(", op);
  for (int i = 0; i < n; i++) {
    pj_sb_puts(b, i ? ", " : "");
    print_val(b, ins[i]);
  }
  pj_sb_puts(b, ")");
  if (region) pj_sb_printf(b, " (%s)", region);
  if (attrs && attrs[0]) pj_sb_printf(b, " {%s}", attrs);
  pj_sb_puts(b, " : ");
  print_val_types(b, ins, n, true);
  pj_sb_puts(b, " -> ");
  print_types(b, outs, nout, nout != 1);
  pj_sb_puts(b, "\n");
  for (int i = 0; i < nout; i++) {
    results[i].id = id;
    results[i].sub = nout == 1 ? -1 : i;
    results[i].t = outs[i];
  }
  return true;
}

pj_val_t pj_hlo_op(pj_hlo_t *h, const char *op, const pj_val_t *ins, int n, const char *attrs,
                   pj_type_t t) {
  pj_val_t r;
  pj_hlo_op_multi(h, op, ins, n, NULL, attrs, &t, 1, &r);
  return r;
}

void pj_hlo_region_begin(pj_hlo_t *h, const pj_type_t *arg_types, int nargs, pj_val_t *args) {
  if (h->depth >= PJ_MAX_REGION_DEPTH) {
    pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: regions nested too deep");
    for (int i = 0; i < nargs; i++) args[i] = kInvalid;
    return;
  }
  pj_sb_t *b = &h->regions[h->depth++];
  pj_sb_puts(b, "{\n  ^bb0(");
  for (int i = 0; i < nargs; i++) {
    char ts[PJ_TYPE_STR_CAP];
    args[i].id = h->next_id++;
    args[i].sub = -1;
    args[i].t = arg_types[i];
    pj_sb_puts(b, i ? ", " : "");
    print_val(b, args[i]);
    pj_sb_printf(b, ": %s", pj_type_str(&arg_types[i], ts, sizeof ts));
  }
  pj_sb_puts(b, "):\n");
}

char *pj_hlo_region_end(pj_hlo_t *h, const pj_val_t *rets, int nrets) {
  if (h->depth == 0) {
    pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: region_end without region_begin");
    return NULL;
  }
  pj_sb_t *b = &h->regions[h->depth - 1];
  check_ins(h, "stablehlo.return", rets, nrets);
  pj_sb_puts(b, "  \"stablehlo.return\"(");
  for (int i = 0; i < nrets; i++) {
    pj_sb_puts(b, i ? ", " : "");
    print_val(b, rets[i]);
  }
  pj_sb_puts(b, ") : ");
  print_val_types(b, rets, nrets, true);
  pj_sb_puts(b, " -> ()\n}");
  h->depth--;
  char *text = pj_sb_take(b, NULL);
  if (!text) pj_hlo_fail(h, PJ_ERR_OOM, "out of memory building a region");
  return text;
}

bool pj_hlo_add_funcs(pj_hlo_t *h, const char *key, const char *text) {
  if (!pj_hlo_ok(h)) return false;
  for (int i = 0; i < h->nfunc_keys; i++)
    if (strcmp(h->func_keys[i], key) == 0) return true;
  char **keys = realloc(h->func_keys, (size_t)(h->nfunc_keys + 1) * sizeof *keys);
  char *k = keys ? strdup(key) : NULL;
  if (keys) h->func_keys = keys;
  if (!k) {
    pj_hlo_fail(h, PJ_ERR_OOM, "out of memory adding module functions");
    return false;
  }
  h->func_keys[h->nfunc_keys++] = k;
  pj_sb_puts(&h->funcs, text);
  pj_sb_puts(&h->funcs, "\n");
  return true;
}

bool pj_hlo_call(pj_hlo_t *h, const char *callee, const pj_val_t *ins, int n,
                 const pj_type_t *outs, int nout, pj_val_t *results) {
  char attrs[256];
  if ((size_t)snprintf(attrs, sizeof attrs, "callee = @%s", callee) >= sizeof attrs) {
    pj_hlo_fail(h, PJ_ERR_VALUE, "function name too long: %s", callee);
    return false;
  }
  return pj_hlo_op_multi(h, "func.call", ins, n, NULL, attrs, outs, nout, results);
}

pj_status_t *pj_hlo_finish(pj_hlo_t *h, const pj_val_t *results, int n, const int *alias,
                           char **text, size_t *len) {
  check_ins(h, "return", results, n);
  if (h->depth) pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: unterminated region");
  if (!pj_hlo_ok(h)) return pj_status_new(h->err_code, "%s", h->err);
  pj_sb_t m = {0};
  pj_sb_puts(&m, "func.func @main(");
  for (int p = 0; p < h->nparams + h->has_last; p++) {
    char tbuf[PJ_TYPE_STR_CAP];
    const bool last = p == h->nparams;
    const pj_val_t v = last ? h->last : h->params[p];
    pj_sb_puts(&m, p ? ", " : "");
    print_val(&m, v);
    pj_sb_printf(&m, ": %s", pj_type_str(&v.t, tbuf, sizeof tbuf));
    /* Donation: result r reuses parameter p's buffer (the caller must also pass p as
     * donatable at execution; otherwise XLA copies). */
    for (int r = 0; alias && r < n; r++)
      if (alias[r] == (last ? PJ_HLO_ALIAS_LAST : p))
        pj_sb_printf(&m, " {tf.aliasing_output = %d : i32}", r);
  }
  pj_sb_puts(&m, ") -> ");
  print_val_types(&m, results, n, true);
  pj_sb_puts(&m, " {\n");
  pj_sb_puts(&m, h->body.s ? h->body.s : "");
  pj_sb_puts(&m, "  \"func.return\"(");
  for (int i = 0; i < n; i++) {
    pj_sb_puts(&m, i ? ", " : "");
    print_val(&m, results[i]);
  }
  pj_sb_puts(&m, ") : ");
  print_val_types(&m, results, n, true);
  pj_sb_puts(&m, " -> ()\n}\n");
  pj_sb_puts(&m, h->funcs.s ? h->funcs.s : "");
  *text = pj_sb_take(&m, len);
  if (!*text || h->body.failed || h->funcs.failed)
    return pj_status_new(PJ_ERR_OOM, "out of memory building program text");
  return NULL;
}
