/* Elementwise lowerings. Plain unary and binary ops are rows of two tables (name, StableHLO op,
 * dtype rule); ops with extra arguments or formulas (activations and their backwards, clamp,
 * where, lerp, addcmul, ...) are small functions below. All of them compute at the output's
 * shape, broadcasting operands NumPy-style, in a compute dtype chosen by the row's rule. */
#include <math.h>
#include <string.h>

#include "table.h"
#include "emit.h"
#include "torch_pjrt/host_quirks.h"

/* ---- helpers shared by the rows ---- */

/* A tensor or Scalar argument as a value (Scalar args are 0-d). */
static pj_val_t operand(pj_lower_t *L, const char *name) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && a->kind == PJ_ARG_SCALAR) return pj_scalar(L, name);
  return pj_tensor(L, name);
}

/* operand converted to dt and broadcast to the output shape of destination 0. */
static pj_val_t at_out(pj_lower_t *L, pj_val_t v, pj_dtype_t dt) {
  pj_type_t t = pj_out_type(L, 0);
  return pj_broadcast_to(L->h, pj_convert(L->h, v, dt), t.rank, t.dims);
}

static pj_val_t arg_at_out(pj_lower_t *L, const char *name, pj_dtype_t dt) {
  return at_out(L, operand(L, name), dt);
}

static pj_val_t cst(pj_lower_t *L, pj_val_t like, double v) { return pj_full(L->h, like.t, v); }


/* torch.maximum / torch.minimum of two values of one type (lower.h). NaN in either operand
 * gives NaN, as on CPU; the CPU plugin's stablehlo.maximum/minimum return the first operand
 * when only the second is NaN (fuzz finding F14). */
pj_val_t pj_max_min_nan(pj_lower_t *L, pj_val_t a, pj_val_t b, bool max) {
  pj_val_t m = max ? MAX(a, b) : MIN(a, b);
  if (!pj_dtype_info(a.t.dtype)->is_float) return m;
  return SEL(CMP("NE", a, a), a, SEL(CMP("NE", b, b), b, m));
}

static pj_dtype_t float_of(pj_dtype_t dt) {
  return pj_dtype_info(dt)->is_float || pj_dtype_info(dt)->is_complex ? dt : PJ_F32;
}

/* ---- unary rows ---- */

typedef enum {
  U_OUT,       /* compute in the output dtype (ints promote to float where torch does) */
  U_BOOL_OUT,  /* predicate: compute in the input dtype, result bool */
} unary_rule_t;

typedef struct {
  const char *name;
  const char *hlo; /* NULL: formula in unary_formula() */
  unary_rule_t rule;
} unary_row_t;

static const unary_row_t kUnary[] = {
    {"abs", "stablehlo.abs", U_OUT},
    {"neg", "stablehlo.negate", U_OUT},
    {"exp", "stablehlo.exponential", U_OUT},
    {"expm1", "stablehlo.exponential_minus_one", U_OUT},
    {"log", "stablehlo.log", U_OUT},
    {"log1p", "stablehlo.log_plus_one", U_OUT},
    {"sqrt", "stablehlo.sqrt", U_OUT},
    {"rsqrt", "stablehlo.rsqrt", U_OUT},
    {"sin", "stablehlo.sine", U_OUT},
    {"cos", "stablehlo.cosine", U_OUT},
    {"tan", "stablehlo.tan", U_OUT},
    {"tanh", "stablehlo.tanh", U_OUT},
    {"sigmoid", "stablehlo.logistic", U_OUT},
    {"floor", "stablehlo.floor", U_OUT},
    {"ceil", "stablehlo.ceil", U_OUT},
    {"round", "stablehlo.round_nearest_even", U_OUT},
    {"sign", NULL, U_OUT},
    {"sgn", NULL, U_OUT},
    {"erf", "chlo.erf", U_OUT},
    {"erfc", "chlo.erfc", U_OUT},
    {"erfinv", "chlo.erf_inv", U_OUT},
    {"asin", "chlo.asin", U_OUT},
    {"acos", "chlo.acos", U_OUT},
    {"atan", NULL, U_OUT},
    {"sinh", "chlo.sinh", U_OUT},
    {"cosh", "chlo.cosh", U_OUT},
    {"asinh", "chlo.asinh", U_OUT},
    {"acosh", "chlo.acosh", U_OUT},
    {"atanh", "chlo.atanh", U_OUT},
    {"lgamma", "chlo.lgamma", U_OUT},
    {"digamma", "chlo.digamma", U_OUT},
    {"bitwise_not", "stablehlo.not", U_OUT},
    {"trunc", NULL, U_OUT},
    {"fix", NULL, U_OUT},
    {"reciprocal", NULL, U_OUT},
    {"exp2", NULL, U_OUT},
    {"log2", NULL, U_OUT},
    {"log10", NULL, U_OUT},
    {"relu", NULL, U_OUT},
    {"silu", NULL, U_OUT},
    {"hardswish", NULL, U_OUT},
    {"hardsigmoid", NULL, U_OUT},
    {"mish", NULL, U_OUT},
    {"logical_not", NULL, U_BOOL_OUT},
    {"isnan", NULL, U_BOOL_OUT},
    {"isinf", NULL, U_BOOL_OUT},
    {"isfinite", NULL, U_BOOL_OUT},
    {"isposinf", NULL, U_BOOL_OUT},
    {"isneginf", NULL, U_BOOL_OUT},
    {"signbit", NULL, U_BOOL_OUT},
    {NULL, NULL, U_OUT},
};

/* atan of a real float tensor, range-reduced to |z| <= tan(pi/8) and summed as its odd Taylor
 * series there. The XLA CPU plugin's own atan (chlo.atan, i.e. atan2(x, 1)) returns garbage for
 * tensors of 63+ elements, so it is not used. Half types compute in float32. */
static pj_val_t real_atan(pj_lower_t *L, pj_val_t x0) {
  pj_dtype_t dt = x0.t.dtype;
  pj_val_t x = dt == PJ_F64 ? x0 : pj_convert(H, x0, PJ_F32);
  int nterms = dt == PJ_F64 ? 22 : 10; /* tan(pi/8)^(2n+1)/(2n+1) below the type's epsilon */
  pj_val_t t = U("abs", x);
  pj_val_t inv = CMP("GT", t, cst(L, t, 1));
  pj_val_t u = SEL(inv, DIV(cst(L, t, 1), t), t);
  pj_val_t mid = CMP("GT", u, cst(L, u, 0.41421356237309503));
  pj_val_t z = SEL(mid, DIV(SUB(u, cst(L, u, 1)), ADD(u, cst(L, u, 1))), u);
  pj_val_t z2 = MUL(z, z);
  pj_val_t p = cst(L, z, ((nterms - 1) % 2 ? -1.0 : 1.0) / (2 * (nterms - 1) + 1));
  for (int k = nterms - 2; k >= 0; k--)
    p = ADD(MUL(p, z2), cst(L, z, (k % 2 ? -1.0 : 1.0) / (2 * k + 1)));
  pj_val_t r = MUL(p, z);
  r = SEL(mid, ADD(r, cst(L, r, M_PI_4)), r);
  r = SEL(inv, SUB(cst(L, r, M_PI_2), r), r);
  r = SEL(CMP("LT", x, cst(L, x, 0)), U("negate", r), r);
  return pj_convert(H, r, dt);
}

static pj_val_t unary_formula(pj_lower_t *L, const char *n, pj_val_t x) {
  pj_dtype_t dt = x.t.dtype;
  if (!strcmp(n, "atan"))
    return pj_dtype_info(dt)->is_complex ? pj_unary(H, "chlo.atan", x) : real_atan(L, x);
  bool fl = pj_dtype_info(dt)->is_float;
  if (!strcmp(n, "trunc") || !strcmp(n, "fix")) {
    if (!fl) return x;
    return SEL(CMP("LT", x, cst(L, x, 0)), U("ceil", x), U("floor", x));
  }
  if (!strcmp(n, "sign") || !strcmp(n, "sgn")) {
    if (dt == PJ_BOOL) return x; /* CPU: the bools themselves */
    if (!fl && !pj_dtype_info(dt)->is_complex && !pj_dtype_info(dt)->is_signed)
      return pj_convert(H, CMP("NE", x, cst(L, x, 0)), dt); /* unsigned: stablehlo.sign rejects them */
    if (!fl) return U("sign", x); /* integers; complex sgn is z/|z| (0 at 0) */
    /* CPU: 0 for NaN and for -0.0 (stablehlo.sign keeps both) */
    return SEL(CMP("GT", x, cst(L, x, 0)), cst(L, x, 1),
               SEL(CMP("LT", x, cst(L, x, 0)), cst(L, x, -1), cst(L, x, 0)));
  }
  if (!strcmp(n, "reciprocal")) return DIV(cst(L, x, 1), x);
  if (!strcmp(n, "exp2")) return pj_binary(H, "stablehlo.power", cst(L, x, 2), x);
  if (!strcmp(n, "log2")) return DIV(U("log", x), cst(L, x, M_LN2));
  if (!strcmp(n, "log10")) return DIV(U("log", x), cst(L, x, M_LN10));
  if (!strcmp(n, "relu")) return dt == PJ_BOOL ? x : MAX(x, cst(L, x, 0));
  if (!strcmp(n, "silu")) return MUL(x, U("logistic", x));
  if (!strcmp(n, "mish"))
    return MUL(x, U("tanh", U("log_plus_one", U("exponential", x))));
  if (!strcmp(n, "hardsigmoid"))
    return DIV(MIN(MAX(ADD(x, cst(L, x, 3)), cst(L, x, 0)), cst(L, x, 6)), cst(L, x, 6));
  if (!strcmp(n, "hardswish"))
    return MUL(x, DIV(MIN(MAX(ADD(x, cst(L, x, 3)), cst(L, x, 0)), cst(L, x, 6)), cst(L, x, 6)));
  /* predicates */
  if (!strcmp(n, "logical_not")) return U("not", pj_convert(H, x, PJ_BOOL));
  if (pj_dtype_info(dt)->is_complex &&
      (!strcmp(n, "isnan") || !strcmp(n, "isinf") || !strcmp(n, "isfinite"))) {
    /* CPU: a complex number is NaN (inf) when either part is, finite when both parts are.
     * Comparing the complex value with itself does not find a NaN part on the XLA CPU plugin,
     * so the predicates look at the parts. */
    pj_val_t re = U("real", x), im = U("imag", x);
    pj_val_t pr = unary_formula(L, n, re), pi = unary_formula(L, n, im);
    return !strcmp(n, "isfinite") ? AND(pr, pi) : OR(pr, pi);
  }
  if (!fl) {
    bool v = false;
    if (!strcmp(n, "isfinite")) v = true;
    if (!strcmp(n, "signbit") && pj_dtype_info(dt)->is_signed)
      return CMP("LT", x, cst(L, x, 0));
    return pj_full(H, pj_type_with_dtype(x.t, PJ_BOOL), v);
  }
  if (!strcmp(n, "isnan")) return CMP("NE", x, x);
  pj_val_t ax = U("abs", x);
  if (!strcmp(n, "isinf")) return CMP("EQ", ax, cst(L, x, INFINITY));
  if (!strcmp(n, "isfinite")) return CMP("LT", ax, cst(L, x, INFINITY));
  if (!strcmp(n, "isposinf")) return CMP("EQ", x, cst(L, x, INFINITY));
  if (!strcmp(n, "isneginf")) return CMP("EQ", x, cst(L, x, -INFINITY));
  if (!strcmp(n, "signbit")) {
    /* true for -0.0 too: compare the sign bit through an integer view */
    pj_dtype_t it = pj_dtype_info(dt)->itemsize == 8 ? PJ_I64
                    : pj_dtype_info(dt)->itemsize == 4 ? PJ_I32 : PJ_I16;
    pj_val_t bits = pj_hlo_op(H, "stablehlo.bitcast_convert", &x, 1, NULL,
                              pj_type_with_dtype(x.t, it));
    return CMP("LT", bits, pj_full(H, bits.t, 0));
  }
  return pj_hlo_fail(H, PJ_ERR_RUNTIME, "internal: no formula for %s", n);
}

static const unary_row_t *find_unary(const char *op) {
  for (const unary_row_t *r = kUnary; r->name; r++)
    if (!strcmp(r->name, op)) return r;
  return NULL;
}

/* Ops that are the identity on integers (and whose StableHLO ops reject integer operands). */
static bool identity_on_integers(const char *op) {
  return !strcmp(op, "floor") || !strcmp(op, "ceil") || !strcmp(op, "round") ||
         !strcmp(op, "trunc") || !strcmp(op, "fix");
}

static pj_status_t *lower_unary(pj_lower_t *L) {
  const unary_row_t *row = find_unary(L->c->op);
  pj_val_t x = pj_tensor(L, "self");
  pj_type_t ot = pj_out_type(L, 0);
  if ((pj_dtype_is_integral(x.t.dtype) && identity_on_integers(row->name)) ||
      (!strcmp(row->name, "abs") && pj_dtype_is_integral(x.t.dtype) &&
       !pj_dtype_info(x.t.dtype)->is_signed)) { /* stablehlo.abs rejects unsigned operands */
    pj_set_result(L, 0, x);
    return NULL;
  }
  /* abs of a complex tensor is real: compute it on the complex input, not on a real copy */
  if (!strcmp(row->name, "abs") && pj_dtype_info(x.t.dtype)->is_complex) {
    pj_set_result(L, 0, pj_unary(H, "stablehlo.abs", x));
    return NULL;
  }
  if (row->rule == U_OUT) {
    pj_dtype_t ct = ot.dtype;
    /* half types compute in float32 and round once at the end, as torch's CPU kernels do
     * (silu in bfloat16 rounded twice otherwise) */
    ct = pj_dtype_compute(ct);
    /* erf_inv in float32 loses digits near +-1, where its derivative (the backward's
     * exp(erfinv(x)^2)) magnifies them: compute it in float64 */
    if (ct == PJ_F32 && !strcmp(row->name, "erfinv")) ct = PJ_F64;
    /* bool inputs of arithmetic: torch computes abs/neg/sign on bool as bool-preserving */
    x = pj_convert(H, x, ct == PJ_BOOL ? x.t.dtype : ct);
  }
  int64_t decimals = !strcmp(row->name, "round") ? pj_int(L, "decimals", 0) : 0;
  if (decimals != 0 && pj_dtype_info(x.t.dtype)->is_float) {
    /* round(x, decimals): scale by 10^|decimals|, round half to even, scale back (half types
     * in float32, as torch computes them) */
    pj_dtype_t dt = x.t.dtype;
    pj_val_t xf = dt == PJ_F64 ? x : pj_convert(H, x, PJ_F32);
    pj_val_t p = cst(L, xf, pow(10.0, (double)(decimals < 0 ? -decimals : decimals)));
    pj_val_t r = decimals > 0 ? DIV(U("round_nearest_even", MUL(xf, p)), p)
                              : MUL(U("round_nearest_even", DIV(xf, p)), p);
    pj_set_result(L, 0, pj_convert(H, r, dt));
    return NULL;
  }
  pj_val_t r = row->hlo ? pj_unary(H, row->hlo, x) : unary_formula(L, row->name, x);
  pj_set_result(L, 0, r);
  return NULL;
}

/* ---- binary rows ---- */

typedef enum {
  B_ARITH,   /* compute in result_type(self, other) */
  B_FLOAT,   /* like ARITH, but integer results compute in float32 (true division, atan2) */
  B_CMP,     /* compare in result_type, result bool */
  B_LOGICAL, /* operands as bool */
  B_BITS,    /* like ARITH, for integer and bool operands only (CPU: NotImplementedError) */
  B_SHIFT,   /* like ARITH, for integer operands only */
} binary_rule_t;

typedef struct {
  const char *name;
  const char *hlo; /* NULL: formula in binary_formula() */
  binary_rule_t rule;
} binary_row_t;

static const binary_row_t kBinary[] = {
    {"add", NULL, B_ARITH},
    {"sub", NULL, B_ARITH},
    {"rsub", NULL, B_ARITH},
    {"mul", "stablehlo.multiply", B_ARITH},
    {"div", NULL, B_FLOAT},
    {"true_divide", NULL, B_FLOAT},
    {"floor_divide", NULL, B_ARITH},
    {"remainder", NULL, B_ARITH},
    {"fmod", "stablehlo.remainder", B_ARITH},
    {"pow", NULL, B_ARITH},
    {"float_power", NULL, B_ARITH},
    {"maximum", NULL, B_ARITH},
    {"minimum", NULL, B_ARITH},
    {"fmax", NULL, B_ARITH},
    {"fmin", NULL, B_ARITH},
    {"atan2", "stablehlo.atan2", B_FLOAT},
    {"hypot", NULL, B_FLOAT},
    {"copysign", NULL, B_FLOAT},
    {"xlogy", NULL, B_FLOAT},
    {"bitwise_and", "stablehlo.and", B_BITS},
    {"bitwise_or", "stablehlo.or", B_BITS},
    {"bitwise_xor", "stablehlo.xor", B_BITS},
    {"bitwise_left_shift", "stablehlo.shift_left", B_SHIFT},
    {"bitwise_right_shift", "stablehlo.shift_right_arithmetic", B_SHIFT},
    /* the Python operators << and >> (and <<=, >>=) are aten ops of their own, with the
       bitwise_*_shift kernels' semantics on CPU */
    {"__lshift__", "stablehlo.shift_left", B_SHIFT},
    {"__ilshift__", "stablehlo.shift_left", B_SHIFT},
    {"__rshift__", "stablehlo.shift_right_arithmetic", B_SHIFT},
    {"__irshift__", "stablehlo.shift_right_arithmetic", B_SHIFT},
    {"eq", NULL, B_CMP},
    {"ne", NULL, B_CMP},
    {"lt", NULL, B_CMP},
    {"le", NULL, B_CMP},
    {"gt", NULL, B_CMP},
    {"ge", NULL, B_CMP},
    {"logical_and", "stablehlo.and", B_LOGICAL},
    {"logical_or", "stablehlo.or", B_LOGICAL},
    {"logical_xor", "stablehlo.xor", B_LOGICAL},
    {NULL, NULL, B_ARITH},
};

/* Float floor division as CPU defines it, through fmod rather than floor(a / b): the quotient
 * of the exact multiple (a - fmod(a, b)) / b, one less when the remainder's sign differs from
 * b's, rounded to the nearest integer below; a zero quotient takes the sign of a / b and b = 0
 * gives a / b. So an infinite a gives NaN (fmod is NaN) and a finite a over an infinite b gives
 * 0 or -1, where floor(a / b) gave an infinity or -0 (fuzz finding F21). Every step is in
 * the input's dtype: for bfloat16 that is what matches CPU's results bit for bit. */
static pj_val_t floor_div_float(pj_lower_t *L, pj_val_t a, pj_val_t b) {
  pj_val_t zero = cst(L, a, 0), one = cst(L, a, 1);
  pj_val_t q = DIV(a, b);
  pj_val_t mod = pj_binary(H, "stablehlo.remainder", a, b);
  pj_val_t d = DIV(SUB(a, mod), b);
  pj_val_t signs_differ = pj_binary(H, "stablehlo.xor", CMP("LT", b, zero), CMP("LT", mod, zero));
  d = SEL(pj_binary(H, "stablehlo.and", CMP("NE", mod, zero), signs_differ), SUB(d, one), d);
  pj_val_t fl = U("floor", d);
  fl = SEL(CMP("GT", SUB(d, fl), cst(L, a, 0.5)), ADD(fl, one), fl);
  pj_val_t r = SEL(CMP("NE", d, zero), fl, MUL(q, zero)); /* 0 * q: a zero with q's sign */
  return SEL(CMP("EQ", b, zero), q, r);
}

static pj_val_t floor_div(pj_lower_t *L, pj_val_t a, pj_val_t b) {
  if (pj_dtype_info(a.t.dtype)->is_float) return floor_div_float(L, a, b);
  /* integer floor division: truncating quotient, minus one when signs differ and inexact */
  pj_val_t q = DIV(a, b);
  pj_val_t r = pj_binary(H, "stablehlo.remainder", a, b);
  pj_val_t zero = cst(L, a, 0);
  pj_val_t adjust = pj_binary(H, "stablehlo.and", CMP("NE", r, zero),
                              pj_binary(H, "stablehlo.xor", CMP("LT", r, zero),
                                        CMP("LT", b, zero)));
  return SEL(adjust, SUB(q, cst(L, q, 1)), q);
}

static pj_val_t binary_formula(pj_lower_t *L, const char *n, pj_val_t a, pj_val_t b) {
  if (!strcmp(n, "add") || !strcmp(n, "sub") || !strcmp(n, "rsub")) {
    if (pj_has(L, "alpha")) {
      pj_val_t alpha = pj_convert(H, pj_scalar(L, "alpha"), b.t.dtype);
      b = MUL(b, pj_broadcast_to(H, alpha, b.t.rank, b.t.dims));
    }
    if (!strcmp(n, "add")) return a.t.dtype == PJ_BOOL ? pj_binary(H, "stablehlo.or", a, b)
                                                       : ADD(a, b);
    if (!strcmp(n, "sub")) return SUB(a, b);
    return SUB(b, a); /* rsub(self, other, alpha) = other - alpha * self: swap below */
  }
  if (!strcmp(n, "div") || !strcmp(n, "true_divide")) {
    const char *mode = pj_str(L, "rounding_mode", NULL);
    if (mode && !strcmp(mode, "floor")) return floor_div(L, a, b);
    pj_val_t q = DIV(a, b);
    if (mode && !strcmp(mode, "trunc") && pj_dtype_info(q.t.dtype)->is_float)
      q = SEL(CMP("LT", q, cst(L, q, 0)), U("ceil", q), U("floor", q));
    return q;
  }
  if (!strcmp(n, "floor_divide")) return floor_div(L, a, b);
  if (!strcmp(n, "remainder")) {
    pj_val_t r = pj_binary(H, "stablehlo.remainder", a, b);
    pj_val_t zero = cst(L, a, 0);
    pj_val_t fix = pj_binary(H, "stablehlo.and", CMP("NE", r, zero),
                             pj_binary(H, "stablehlo.xor", CMP("LT", r, zero),
                                       CMP("LT", b, zero)));
    return SEL(fix, ADD(r, b), r);
  }
  if (!strcmp(n, "pow") || !strcmp(n, "float_power")) return pj_binary(H, "stablehlo.power", a, b);
  if (!strcmp(n, "maximum") || !strcmp(n, "minimum"))
    return pj_max_min_nan(L, a, b, !strcmp(n, "maximum"));
  if (!strcmp(n, "fmax") || !strcmp(n, "fmin")) {
    pj_val_t m = !strcmp(n, "fmax") ? MAX(a, b) : MIN(a, b);
    if (!pj_dtype_info(a.t.dtype)->is_float) return m;
    return SEL(CMP("NE", a, a), b, SEL(CMP("NE", b, b), a, m));
  }
  if (!strcmp(n, "hypot")) return U("sqrt", ADD(MUL(a, a), MUL(b, b)));
  if (!strcmp(n, "copysign")) {
    pj_val_t ab = U("abs", a);
    pj_dtype_t it = pj_dtype_info(b.t.dtype)->itemsize == 8 ? PJ_I64
                    : pj_dtype_info(b.t.dtype)->itemsize == 4 ? PJ_I32 : PJ_I16;
    pj_val_t bits = pj_hlo_op(H, "stablehlo.bitcast_convert", &b, 1, NULL,
                              pj_type_with_dtype(b.t, it));
    return SEL(CMP("LT", bits, pj_full(H, bits.t, 0)), U("negate", ab), ab);
  }
  if (!strcmp(n, "xlogy")) {
    pj_val_t r = MUL(a, U("log", b));
    r = SEL(CMP("EQ", a, cst(L, a, 0)), cst(L, a, 0), r);
    return SEL(CMP("NE", b, b), b, r);
  }
  static const char *const dirs[][2] = {{"eq", "EQ"}, {"ne", "NE"}, {"lt", "LT"},
                                        {"le", "LE"}, {"gt", "GT"}, {"ge", "GE"}};
  for (int i = 0; i < 6; i++)
    if (!strcmp(n, dirs[i][0])) return CMP(dirs[i][1], a, b);
  return pj_hlo_fail(H, PJ_ERR_RUNTIME, "internal: no formula for %s", n);
}

static pj_status_t *lower_binary(pj_lower_t *L) {
  const binary_row_t *row = NULL;
  for (const binary_row_t *r = kBinary; r->name; r++)
    if (!strcmp(r->name, L->c->op)) row = r;
  static const char *const names[] = {"self", "other"};
  /* pow.Scalar(Scalar self, Tensor exponent) names its tensor "exponent" */
  const char *an = pj_has(L, "self") ? "self" : "self";
  const char *bn = pj_has(L, "other") ? "other" : "exponent";
  const char *const pnames[] = {an, bn};
  pj_dtype_t ct = pj_result_type(L, pj_has(L, "other") ? names : pnames, 2);
  if (row->rule == B_FLOAT && !pj_dtype_info(ct)->is_float && !pj_dtype_info(ct)->is_complex) {
    const char *mode = pj_str(L, "rounding_mode", NULL);
    if (!mode) ct = PJ_F32;
  }
  if ((row->rule == B_BITS && !pj_dtype_is_integral(ct) && ct != PJ_BOOL) ||
      (row->rule == B_SHIFT && !pj_dtype_is_integral(ct))) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"%s\" not implemented for '%s'", row->name,
            pj_dtype_info(ct)->name);
    return NULL;
  }
  if (!strcmp(row->name, "sub") || !strcmp(row->name, "rsub")) {
    /* CPU's sub_check, which the Meta kernel of the Scalar overloads and of a bool tensor
       operand does not reach; a Python bool operand counts as a bool tensor, as on CPU */
    bool ab = pj_arg_dtype(L, an) == PJ_BOOL, bb = pj_arg_dtype(L, bn) == PJ_BOOL;
    if (ab && bb) {
      pj_fail(L, PJ_ERR_RUNTIME, "Subtraction, the `-` operator, with two bool tensors is not "
              "supported. Use the `^` or `logical_xor()` operator instead.");
      return NULL;
    }
    if (ab || bb) {
      pj_fail(L, PJ_ERR_RUNTIME, "Subtraction, the `-` operator, with a bool tensor is not "
              "supported. If you are trying to invert a mask, use the `~` or `logical_not()` "
              "operator instead.");
      return NULL;
    }
  }
  if (row->rule == B_LOGICAL) ct = PJ_BOOL;
  if (!strcmp(row->name, "float_power")) ct = pj_dtype_info(ct)->is_complex ? PJ_C128 : PJ_F64;
  pj_val_t a = arg_at_out(L, an, ct), b = arg_at_out(L, bn, ct);
  if (!strcmp(row->name, "rsub")) {
    pj_val_t t = a; /* rsub(self, other, alpha) = other - alpha * self */
    a = b;
    b = t;
    if (pj_has(L, "alpha")) {
      pj_val_t alpha = pj_convert(H, pj_scalar(L, "alpha"), ct);
      b = MUL(b, pj_broadcast_to(H, alpha, b.t.rank, b.t.dims));
    }
    pj_set_result(L, 0, SUB(a, b));
    return NULL;
  }
  const char *hlo = row->hlo;
  /* >> of an unsigned integer shifts zeros in (CPU's logical shift); the table's arithmetic
     shift would copy the top bit */
  if (hlo && !strcmp(hlo, "stablehlo.shift_right_arithmetic") && pj_dtype_is_integral(ct) &&
      !pj_dtype_info(ct)->is_signed)
    hlo = "stablehlo.shift_right_logical";
  pj_val_t r = hlo ? pj_binary(H, hlo, a, b) : binary_formula(L, row->name, a, b);
  if (!strcmp(row->name, "mul") && pj_dtype_info(ct)->is_float &&
      (pj_arg_dtype(L, an) == PJ_BOOL || pj_arg_dtype(L, bn) == PJ_BOOL)) {
    /* XLA rewrites x * convert(pred) as select(pred, x, 0), which loses 0 * NaN = NaN and
       0 * inf = NaN (fuzz finding F16): where the bool is false, the product is x * 0 */
    bool a_bool = pj_arg_dtype(L, an) == PJ_BOOL;
    pj_val_t x = a_bool ? b : a, p = pj_convert(H, a_bool ? a : b, PJ_BOOL);
    pj_val_t zx = MUL(x, pj_full(H, x.t, 0));
    r = SEL(p, x, zx);
  }
  if ((!strcmp(row->name, "div") || !strcmp(row->name, "true_divide") ||
       !strcmp(row->name, "floor_divide")) &&
      pj_dtype_info(ct)->is_float && pj_arg_dtype(L, an) == PJ_BOOL) {
    /* XLA rewrites convert(pred) / y as select(pred, 1 / y, 0), which loses 0 / 0 = NaN
       (fuzz seed 2000008036: bool_t / 0.0 was 0 where CPU gives NaN): where the bool is
       false, the quotient is computed from an explicit 0 */
    pj_val_t zero_over_b = binary_formula(L, row->name, pj_full(H, a.t, 0), b);
    r = SEL(pj_convert(H, a, PJ_BOOL), r, zero_over_b);
  }
  pj_set_result(L, 0, r);
  return NULL;
}

/* ---- ops with their own signatures ---- */

static pj_status_t *lower_where(pj_lower_t *L) {
  static const char *const names[] = {"self", "other"};
  pj_dtype_t ct = pj_result_type(L, names, 2);
  pj_val_t c = arg_at_out(L, "condition", PJ_BOOL);
  pj_set_result(L, 0, SEL(c, arg_at_out(L, "self", ct), arg_at_out(L, "other", ct)));
  return NULL;
}

static pj_status_t *lower_clamp(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t x = arg_at_out(L, "self", ct);
  const char *op = L->c->op;
  bool has_min = pj_has(L, "min") && strcmp(op, "clamp_max") != 0;
  bool has_max = pj_has(L, "max") && strcmp(op, "clamp_min") != 0;
  /* torch.clamp: min first, then max (so min > max gives max); NaN bounds propagate */
  if (has_min) {
    pj_val_t lo = arg_at_out(L, "min", ct);
    x = pj_dtype_info(ct)->is_float ? SEL(CMP("NE", lo, lo), lo, MAX(x, lo)) : MAX(x, lo);
  }
  if (has_max) {
    pj_val_t hi = arg_at_out(L, "max", ct);
    x = pj_dtype_info(ct)->is_float ? SEL(CMP("NE", hi, hi), hi, MIN(x, hi)) : MIN(x, hi);
  }
  if (pj_dtype_info(ct)->is_float) {
    pj_val_t x0 = arg_at_out(L, "self", ct);
    x = SEL(CMP("NE", x0, x0), x0, x);
  }
  pj_set_result(L, 0, x);
  return NULL;
}

static pj_status_t *lower_lerp(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t a = arg_at_out(L, "self", ct), b = arg_at_out(L, "end", ct);
  pj_val_t w = arg_at_out(L, "weight", ct);
  /* the same two-sided formula torch uses, for accuracy near weight = 1 */
  pj_val_t d = SUB(b, a);
  pj_val_t lo = ADD(a, MUL(w, d));
  pj_val_t hi = SUB(b, MUL(d, SUB(cst(L, w, 1), w)));
  pj_val_t aw = U("abs", w); /* real for a complex weight */
  pj_set_result(L, 0, SEL(CMP("LT", aw, cst(L, aw, 0.5)), lo, hi));
  return NULL;
}

/* ---- complex numbers ---- */

/* re + i im for real values re and im of one float dtype. */
static pj_val_t make_complex(pj_lower_t *L, pj_val_t re, pj_val_t im) {
  pj_val_t parts[2] = {re, im};
  pj_dtype_t ct = re.t.dtype == PJ_F64 ? PJ_C128 : PJ_C64;
  return pj_hlo_op(H, "stablehlo.complex", parts, 2, NULL, pj_type_with_dtype(re.t, ct));
}

/* The real dtype of complex dt's parts. */
static pj_dtype_t part_dtype(pj_dtype_t dt) { return dt == PJ_C128 ? PJ_F64 : PJ_F32; }

static pj_status_t *lower_conj_physical(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  if (pj_dtype_info(x.t.dtype)->is_complex)
    x = make_complex(L, U("real", x), U("negate", U("imag", x)));
  pj_set_result(L, 0, x);
  return NULL;
}

/* torch.complex(real, imag) and torch.polar(abs, angle): float parts, complex result. */
static pj_status_t *lower_complex_polar(pj_lower_t *L) {
  pj_dtype_t pt = part_dtype(pj_out_type(L, 0).dtype);
  bool polar = !strcmp(L->c->op, "polar");
  pj_val_t a = arg_at_out(L, polar ? "abs" : "real", pt);
  pj_val_t b = arg_at_out(L, polar ? "angle" : "imag", pt);
  if (polar) {
    pj_val_t re = MUL(a, U("cosine", b));
    b = MUL(a, U("sine", b));
    a = re;
  }
  pj_set_result(L, 0, make_complex(L, a, b));
  return NULL;
}

/* angle: atan2(imag, real) of a complex; for real x, pi where x < 0, else 0 (NaN stays NaN). */
static pj_status_t *lower_angle(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_dtype_t ot = pj_out_type(L, 0).dtype;
  if (pj_dtype_info(x.t.dtype)->is_complex) {
    pj_set_result(L, 0, pj_binary(H, "stablehlo.atan2", U("imag", x), U("real", x)));
    return NULL;
  }
  pj_val_t y = pj_convert(H, x, ot);
  pj_val_t r = SEL(CMP("LT", y, cst(L, y, 0)), cst(L, y, M_PI), cst(L, y, 0));
  pj_set_result(L, 0, SEL(CMP("NE", y, y), y, r));
  return NULL;
}

static pj_status_t *lower_addcmul_addcdiv(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t s = arg_at_out(L, "self", ct);
  pj_val_t t1 = arg_at_out(L, "tensor1", ct), t2 = arg_at_out(L, "tensor2", ct);
  pj_val_t v = arg_at_out(L, "value", ct);
  pj_val_t p = !strcmp(L->c->op, "addcmul") ? MUL(t1, t2) : DIV(t1, t2);
  pj_set_result(L, 0, ADD(s, MUL(v, p)));
  return NULL;
}

static pj_status_t *lower_fill(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  pj_val_t v = !strcmp(L->c->op, "zero") ? pj_const(H, t.dtype, 0) : operand(L, "value");
  pj_set_result(L, 0, pj_broadcast_to(H, pj_convert(H, v, t.dtype), t.rank, t.dims));
  return NULL;
}

static pj_status_t *lower_masked_fill(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t x = arg_at_out(L, "self", ct);
  pj_val_t m = arg_at_out(L, "mask", PJ_BOOL);
  pj_set_result(L, 0, SEL(m, arg_at_out(L, "value", ct), x));
  return NULL;
}

/* Copy with dtype conversion: the bridge's device-to-device copy_ into any view. */
static pj_status_t *lower_copy(pj_lower_t *L) {
  pj_set_result(L, 0, pj_tensor(L, "src"));
  return NULL;
}

static pj_status_t *lower_to_copy(pj_lower_t *L) {
  pj_set_result(L, 0, pj_tensor(L, "self"));
  return NULL;
}

/* nan_to_num of real float x (ct its dtype): NaN, +inf and -inf replaced. */
static pj_val_t nan_to_num_real(pj_lower_t *L, pj_val_t x) {
  pj_dtype_t ct = x.t.dtype;
  double big = ct == PJ_F64 ? 1.7976931348623157e308 : ct == PJ_F16 ? 65504.0
               : ct == PJ_BF16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
  pj_val_t nan = cst(L, x, pj_float(L, "nan", 0));
  pj_val_t pinf = cst(L, x, pj_has(L, "posinf") ? pj_float(L, "posinf", big) : big);
  pj_val_t ninf = cst(L, x, pj_has(L, "neginf") ? pj_float(L, "neginf", -big) : -big);
  x = SEL(CMP("NE", x, x), nan, x);
  x = SEL(CMP("EQ", x, cst(L, x, INFINITY)), pinf, x);
  return SEL(CMP("EQ", x, cst(L, x, -INFINITY)), ninf, x);
}

static pj_status_t *lower_nan_to_num(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t x = arg_at_out(L, "self", ct);
  if (pj_dtype_info(ct)->is_complex) {
    /* CPU replaces in the real and the imaginary part separately, with the part dtype's limits */
    x = make_complex(L, nan_to_num_real(L, U("real", x)), nan_to_num_real(L, U("imag", x)));
  } else if (pj_dtype_info(ct)->is_float) {
    x = nan_to_num_real(L, x);
  }
  pj_set_result(L, 0, x);
  return NULL;
}

/* ---- activations with parameters, and backward formulas ---- */

static pj_val_t gelu_cdf_parts(pj_lower_t *L, pj_val_t x, bool tanh_approx, pj_val_t *pdf) {
  if (tanh_approx) {
    double k = sqrt(2.0 / M_PI);
    pj_val_t x3 = MUL(MUL(x, x), x);
    pj_val_t inner = MUL(cst(L, x, k), ADD(x, MUL(cst(L, x, 0.044715), x3)));
    pj_val_t th = U("tanh", inner);
    pj_val_t cdf = MUL(cst(L, x, 0.5), ADD(cst(L, x, 1), th));
    if (pdf) {
      /* d/dx [0.5 x (1 + tanh(inner))] = 0.5 (1 + th) + 0.5 x (1 - th^2) inner' */
      pj_val_t dinner = MUL(cst(L, x, k), ADD(cst(L, x, 1), MUL(cst(L, x, 3 * 0.044715), MUL(x, x))));
      *pdf = MUL(MUL(cst(L, x, 0.5), x), MUL(SUB(cst(L, x, 1), MUL(th, th)), dinner));
    }
    return cdf;
  }
  pj_val_t cdf = MUL(cst(L, x, 0.5),
                     ADD(cst(L, x, 1), pj_unary(H, "chlo.erf", MUL(x, cst(L, x, M_SQRT1_2)))));
  if (pdf)
    *pdf = MUL(x, MUL(cst(L, x, 0.5 * M_2_SQRTPI * M_SQRT1_2),
                      U("exponential", MUL(cst(L, x, -0.5), MUL(x, x)))));
  return cdf;
}

static bool gelu_tanh(pj_lower_t *L) {
  const char *a = pj_str(L, "approximate", "none");
  return !strcmp(a, "tanh");
}

/* gelu computes in float32 for float16 and bfloat16, as CPU does: the erf form's 1 + erf(x/sqrt2)
   cancels for negative x, and in bfloat16 that lost about half the value (gelu(-3): -0.00586
   against CPU's -0.00406). */

static pj_status_t *lower_gelu(pj_lower_t *L) {
  const pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t x = arg_at_out(L, "self", pj_dtype_compute(ct));
  pj_val_t r = MUL(x, gelu_cdf_parts(L, x, gelu_tanh(L), NULL));
  /* CPU's AVX-512 erf form gives NaN at +inf for float32 and bfloat16 (its AVX2 one, its
     float16 and float64 paths, and the formula give inf): as CPU on this host (host_quirks.h;
     fuzz seed 2000010566 found it on an AVX-512 host) */
  if (!gelu_tanh(L) && (ct == PJ_F32 || ct == PJ_BF16) &&
      pj_host_quirks_gelu_inf_is_nan(ct == PJ_BF16))
    r = SEL(CMP("EQ", x, cst(L, x, INFINITY)), cst(L, x, NAN), r);
  pj_set_result(L, 0, pj_convert(H, r, ct));
  return NULL;
}

static pj_status_t *lower_gelu_backward(pj_lower_t *L) {
  const pj_dtype_t ct = pj_out_type(L, 0).dtype, wt = pj_dtype_compute(ct);
  pj_val_t g = arg_at_out(L, "grad_output", wt), x = arg_at_out(L, "self", wt);
  pj_val_t pdf;
  pj_val_t cdf = gelu_cdf_parts(L, x, gelu_tanh(L), &pdf);
  pj_set_result(L, 0, pj_convert(H, MUL(g, ADD(cdf, pdf)), ct));
  return NULL;
}

static pj_status_t *lower_threshold_backward(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t g = arg_at_out(L, "grad_output", ct), x = arg_at_out(L, "self", ct);
  pj_val_t th = arg_at_out(L, "threshold", ct);
  pj_set_result(L, 0, SEL(CMP("LE", x, th), cst(L, g, 0), g));
  return NULL;
}

static pj_status_t *lower_threshold(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t x = arg_at_out(L, "self", ct);
  pj_set_result(L, 0, SEL(CMP("LE", x, arg_at_out(L, "threshold", ct)), arg_at_out(L, "value", ct), x));
  return NULL;
}

static pj_status_t *lower_silu_backward(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t g = arg_at_out(L, "grad_output", ct), x = arg_at_out(L, "self", ct);
  pj_val_t s = U("logistic", x);
  pj_val_t d = MUL(s, ADD(cst(L, x, 1), MUL(x, SUB(cst(L, x, 1), s))));
  pj_set_result(L, 0, MUL(g, d));
  return NULL;
}

static pj_status_t *lower_sigmoid_backward(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t g = arg_at_out(L, "grad_output", ct), y = arg_at_out(L, "output", ct);
  pj_set_result(L, 0, MUL(g, MUL(y, SUB(cst(L, y, 1), y))));
  return NULL;
}

static pj_status_t *lower_tanh_backward(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t g = arg_at_out(L, "grad_output", ct), y = arg_at_out(L, "output", ct);
  pj_set_result(L, 0, MUL(g, SUB(cst(L, y, 1), MUL(y, y))));
  return NULL;
}

static pj_status_t *lower_softplus(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t x = arg_at_out(L, "self", ct);
  pj_val_t beta = arg_at_out(L, "beta", ct), th = arg_at_out(L, "threshold", ct);
  pj_val_t bx = MUL(x, beta);
  pj_val_t soft = DIV(U("log_plus_one", U("exponential", bx)), beta);
  bool bw = !strcmp(L->c->op, "softplus_backward");
  if (bw) {
    pj_val_t g = arg_at_out(L, "grad_output", ct);
    pj_val_t z = U("exponential", bx);
    pj_val_t d = DIV(z, ADD(z, cst(L, z, 1)));
    pj_set_result(L, 0, SEL(CMP("GT", bx, th), g, MUL(g, d)));
  } else {
    pj_set_result(L, 0, SEL(CMP("GT", bx, th), x, soft));
  }
  return NULL;
}

static pj_status_t *lower_elu(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t alpha = arg_at_out(L, "alpha", ct), scale = arg_at_out(L, "scale", ct);
  pj_val_t iscale = arg_at_out(L, "input_scale", ct);
  if (!strcmp(L->c->op, "elu")) {
    pj_val_t x = arg_at_out(L, "self", ct);
    pj_val_t neg = MUL(alpha, U("exponential_minus_one", MUL(x, iscale)));
    pj_set_result(L, 0, MUL(scale, SEL(CMP("GT", x, cst(L, x, 0)), x, neg)));
    return NULL;
  }
  pj_val_t g = arg_at_out(L, "grad_output", ct);
  pj_val_t v = arg_at_out(L, "self_or_result", ct);
  bool is_result = pj_bool(L, "is_result", false);
  pj_val_t dneg = is_result ? MUL(iscale, ADD(v, MUL(alpha, scale)))
                            : MUL(MUL(iscale, MUL(alpha, scale)),
                                  U("exponential", MUL(v, iscale)));
  pj_val_t pos = CMP("GT", v, cst(L, v, 0));
  pj_set_result(L, 0, MUL(g, SEL(pos, scale, dneg)));
  return NULL;
}

static pj_status_t *lower_leaky_relu(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t slope = arg_at_out(L, "negative_slope", ct);
  if (!strcmp(L->c->op, "leaky_relu")) {
    pj_val_t x = arg_at_out(L, "self", ct);
    pj_set_result(L, 0, SEL(CMP("GT", x, cst(L, x, 0)), x, MUL(x, slope)));
  } else {
    pj_val_t g = arg_at_out(L, "grad_output", ct), x = arg_at_out(L, "self", ct);
    pj_set_result(L, 0, SEL(CMP("GT", x, cst(L, x, 0)), g, MUL(g, slope)));
  }
  return NULL;
}

static pj_status_t *lower_hardtanh(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t lo = arg_at_out(L, "min_val", ct), hi = arg_at_out(L, "max_val", ct);
  pj_val_t x = arg_at_out(L, "self", ct);
  if (!strcmp(L->c->op, "hardtanh")) {
    pj_set_result(L, 0, MIN(MAX(x, lo), hi));
  } else {
    pj_val_t g = arg_at_out(L, "grad_output", ct);
    pj_val_t inside = pj_binary(H, "stablehlo.and", CMP("GT", x, lo), CMP("LT", x, hi));
    pj_set_result(L, 0, SEL(inside, g, cst(L, g, 0)));
  }
  return NULL;
}

static pj_status_t *lower_hard_backward(pj_lower_t *L) {
  pj_dtype_t ct = pj_out_type(L, 0).dtype;
  pj_val_t g = arg_at_out(L, "grad_output", ct), x = arg_at_out(L, "self", ct);
  pj_val_t r;
  if (!strcmp(L->c->op, "hardsigmoid_backward")) {
    pj_val_t inside = pj_binary(H, "stablehlo.and", CMP("GT", x, cst(L, x, -3)), CMP("LT", x, cst(L, x, 3)));
    r = SEL(inside, DIV(g, cst(L, g, 6)), cst(L, g, 0));
  } else { /* hardswish_backward */
    pj_val_t mid = MUL(g, ADD(DIV(x, cst(L, x, 3)), cst(L, x, 0.5)));
    r = SEL(CMP("LT", x, cst(L, x, -3)), cst(L, g, 0), SEL(CMP("LE", x, cst(L, x, 3)), mid, g));
  }
  pj_set_result(L, 0, r);
  return NULL;
}

static pj_status_t *lower_logit(pj_lower_t *L) {
  pj_dtype_t ot = pj_out_type(L, 0).dtype;
  /* an integer destination (logit_ or out= of an integer tensor) cannot hold the float result;
   * logit's Meta kernel lets it through, CPU raises */
  if (!pj_dtype_info(ot)->is_float && !pj_dtype_info(ot)->is_complex) {
    pj_fail(L, PJ_ERR_RUNTIME, "result type Float can't be cast to the desired output type %s",
            pj_dtype_info(ot)->name);
    return NULL;
  }
  pj_dtype_t ct = float_of(ot);
  pj_val_t x = arg_at_out(L, "self", ct);
  if (pj_has(L, "eps")) {
    double e = pj_float(L, "eps", 0);
    x = MIN(MAX(x, cst(L, x, e)), cst(L, x, 1 - e));
  }
  pj_set_result(L, 0, U("log", DIV(x, SUB(cst(L, x, 1), x))));
  return NULL;
}

/* d logit / dx = 1 / (x (1 - x)); without eps NaN outside [0, 1], with eps zero outside
 * [eps, 1 - eps] (the clamped region), as torch's kernel. */
static pj_status_t *lower_logit_backward(pj_lower_t *L) {
  pj_dtype_t ot = pj_out_type(L, 0).dtype;
  pj_dtype_t ct = ot == PJ_BF16 || ot == PJ_F16 ? PJ_F32 : float_of(ot);
  pj_val_t g = arg_at_out(L, "grad_output", ct), x = arg_at_out(L, "self", ct);
  pj_val_t r = DIV(g, MUL(x, SUB(cst(L, x, 1), x)));
  if (pj_has(L, "eps")) {
    double e = pj_float(L, "eps", 0);
    pj_val_t out = pj_binary(H, "stablehlo.or", CMP("LT", x, cst(L, x, e)),
                             CMP("GT", x, cst(L, x, 1 - e)));
    r = SEL(out, cst(L, r, 0), r);
  } else {
    pj_val_t out = pj_binary(H, "stablehlo.or", CMP("LT", x, cst(L, x, 0)),
                             CMP("GT", x, cst(L, x, 1)));
    r = SEL(out, cst(L, r, NAN), r);
  }
  pj_set_result(L, 0, r);
  return NULL;
}

#define UNARY_ROWS(X)                                                                         \
  X(abs) X(neg) X(exp) X(expm1) X(log) X(log1p) X(sqrt) X(rsqrt) X(sin) X(cos) X(tan) X(tanh) \
  X(sigmoid) X(floor) X(ceil) X(round) X(sign) X(sgn) X(erf) X(erfc) X(erfinv) X(asin)       \
  X(acos) X(atan) X(sinh) X(cosh) X(asinh) X(acosh) X(atanh) X(lgamma) X(digamma)            \
  X(bitwise_not) X(trunc) X(fix) X(reciprocal) X(exp2) X(log2) X(log10) X(relu) X(silu)      \
  X(hardswish) X(hardsigmoid) X(mish) X(logical_not) X(isnan) X(isinf) X(isfinite)           \
  X(isposinf) X(isneginf) X(signbit)
#define BINARY_ROWS(X)                                                                        \
  X(add) X(sub) X(rsub) X(mul) X(div) X(true_divide) X(floor_divide) X(remainder) X(fmod)     \
  X(pow) X(float_power) X(maximum) X(minimum) X(fmax) X(fmin) X(atan2) X(hypot) X(copysign)  \
  X(xlogy) X(bitwise_and) X(bitwise_or) X(bitwise_xor) X(bitwise_left_shift)                 \
  X(bitwise_right_shift) X(__lshift__) X(__ilshift__) X(__rshift__) X(__irshift__) X(eq) X(ne) X(lt) X(le) X(gt) X(ge) X(logical_and) X(logical_or)     \
  X(logical_xor)
#define UNARY_ENTRY(n) {#n, lower_unary, PJ_SHAPE_ELEMENTWISE},
#define BINARY_ENTRY(n) {#n, lower_binary, PJ_SHAPE_ELEMENTWISE},

const pj_lowering_entry_t pj_lowerings_elementwise[] = {
    UNARY_ROWS(UNARY_ENTRY) BINARY_ROWS(BINARY_ENTRY)
    {"where", lower_where, PJ_SHAPE_ELEMENTWISE},
    {"clamp", lower_clamp, PJ_SHAPE_ELEMENTWISE},
    {"clip", lower_clamp, PJ_SHAPE_ELEMENTWISE},
    {"clamp_min", lower_clamp, PJ_SHAPE_ELEMENTWISE},
    {"clamp_max", lower_clamp, PJ_SHAPE_ELEMENTWISE},
    {"lerp", lower_lerp, PJ_SHAPE_ELEMENTWISE},
    {"conj_physical", lower_conj_physical, PJ_SHAPE_ELEMENTWISE},
    {"complex", lower_complex_polar, PJ_SHAPE_ELEMENTWISE},
    {"polar", lower_complex_polar, PJ_SHAPE_ELEMENTWISE},
    {"angle", lower_angle, PJ_SHAPE_ELEMENTWISE},
    {"addcmul", lower_addcmul_addcdiv, PJ_SHAPE_ELEMENTWISE},
    {"addcdiv", lower_addcmul_addcdiv, PJ_SHAPE_ELEMENTWISE},
    {"fill", lower_fill, PJ_SHAPE_ELEMENTWISE},
    {"zero", lower_fill, PJ_SHAPE_ELEMENTWISE},
    {"masked_fill", lower_masked_fill, PJ_SHAPE_ELEMENTWISE},
    {"_pj_copy", lower_copy, PJ_SHAPE_ELEMENTWISE},
    {"_to_copy", lower_to_copy, PJ_SHAPE_ELEMENTWISE},
    {"nan_to_num", lower_nan_to_num, PJ_SHAPE_ELEMENTWISE},
    {"gelu", lower_gelu, PJ_SHAPE_ELEMENTWISE},
    {"gelu_backward", lower_gelu_backward, PJ_SHAPE_ELEMENTWISE},
    {"threshold", lower_threshold, PJ_SHAPE_ELEMENTWISE},
    {"threshold_backward", lower_threshold_backward, PJ_SHAPE_ELEMENTWISE},
    {"silu_backward", lower_silu_backward, PJ_SHAPE_ELEMENTWISE},
    {"sigmoid_backward", lower_sigmoid_backward, PJ_SHAPE_ELEMENTWISE},
    {"tanh_backward", lower_tanh_backward, PJ_SHAPE_ELEMENTWISE},
    {"softplus", lower_softplus, PJ_SHAPE_ELEMENTWISE},
    {"softplus_backward", lower_softplus, PJ_SHAPE_ELEMENTWISE},
    {"elu", lower_elu, PJ_SHAPE_ELEMENTWISE},
    {"elu_backward", lower_elu, PJ_SHAPE_ELEMENTWISE},
    {"leaky_relu", lower_leaky_relu, PJ_SHAPE_ELEMENTWISE},
    {"leaky_relu_backward", lower_leaky_relu, PJ_SHAPE_ELEMENTWISE},
    {"hardtanh", lower_hardtanh, PJ_SHAPE_ELEMENTWISE},
    {"hardtanh_backward", lower_hardtanh, PJ_SHAPE_ELEMENTWISE},
    {"hardsigmoid_backward", lower_hard_backward, PJ_SHAPE_ELEMENTWISE},
    {"hardswish_backward", lower_hard_backward, PJ_SHAPE_ELEMENTWISE},
    {"logit", lower_logit, PJ_SHAPE_ELEMENTWISE},
    {"logit_backward", lower_logit_backward, PJ_SHAPE_ELEMENTWISE},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
