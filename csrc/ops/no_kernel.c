/* Dtypes CPU has no kernel for. CPU makes these checks in its kernels (their dtype dispatch),
 * not in the Meta kernels tpu takes output metadata from, so tpu computed a result where CPU
 * raises (hypot of integers, gcd of floats) or failed to compile (round of bools, with a
 * RuntimeError about StableHLO). A row refuses an op for bool, integer and/or floating (complex
 * included) operands, judged by the dtype CPU computes in: the input's for unary ops, the
 * operands' result type for binary ones. The error is CPU's type (NotImplementedError,
 * RuntimeError for relu); the message names the op. */
#include <string.h>

#include "no_kernel.h"

typedef struct {
  const char *op;
  const char *overload; /* NULL: every overload */
  bool binary;          /* dtype: result_type(self, other or exponent), else self's */
  bool no_bool, no_int, no_float; /* refused for bool / integer / floating or complex dtypes */
  const char *message;  /* NULL: "\"<op>\" not implemented for '<dtype>'" (NotImplementedError) */
  const char *when;     /* an argument that must be given (not None) for the row to apply */
} no_kernel_row_t;

static const no_kernel_row_t kNoKernel[] = {
    {"abs", NULL, false, true, false, false, NULL, NULL},
    {"floor", NULL, false, true, false, false, NULL, NULL},
    {"ceil", NULL, false, true, false, false, NULL, NULL},
    {"round", NULL, false, true, false, false, NULL, NULL},
    {"round", "decimals", false, true, true, false, NULL, NULL},
    {"trunc", NULL, false, true, false, false, NULL, NULL},
    {"fix", NULL, false, true, false, false, NULL, NULL},
    {"relu", NULL, false, true, false, false, "Boolean inputs not supported for relu", NULL},
    {"div", NULL, true, true, false, false, NULL, "rounding_mode"}, /* floor and trunc division */
    {"remainder", NULL, true, true, false, false, NULL, NULL},
    {"fmod", NULL, true, true, false, false, NULL, NULL},
    {"pow", NULL, true, true, false, false, NULL, NULL},
    {"gcd", NULL, true, true, false, true, NULL, NULL},
    {"lcm", NULL, true, true, false, true, NULL, NULL},
    {"hypot", NULL, true, true, true, false, NULL, NULL},
    {"nextafter", NULL, true, true, true, false, NULL, NULL},
    {NULL, NULL, false, false, false, false, NULL, NULL},
};

bool pj_no_cpu_kernel(pj_lower_t *L) {
  const pj_call_t *c = L->c;
  for (const no_kernel_row_t *r = kNoKernel; r->op; r++) {
    if (strcmp(r->op, c->op) != 0) continue;
    if (r->overload && (!c->overload || strcmp(r->overload, c->overload) != 0)) continue;
    if (r->when && !pj_has(L, r->when)) continue;
    pj_dtype_t dt;
    if (r->binary) {
      const char *names[2] = {"self", pj_has(L, "other") ? "other" : "exponent"};
      if (!pj_has(L, names[0]) || !pj_has(L, names[1])) continue; /* pow.Scalar and the like */
      dt = pj_result_type(L, names, 2);
    } else {
      if (!pj_has(L, "self")) continue;
      dt = pj_arg_dtype(L, "self");
    }
    bool refused = dt == PJ_BOOL                ? r->no_bool
                   : pj_dtype_is_integral(dt) ? r->no_int
                                              : r->no_float;
    if (!refused) continue;
    if (r->message) pj_fail(L, PJ_ERR_RUNTIME, "%s", r->message);
    else pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"%s\" not implemented for '%s'", c->op,
                 pj_dtype_info(dt)->name);
    return true;
  }
  return false;
}
