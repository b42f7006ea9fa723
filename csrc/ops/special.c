/* Lowerings: special family (torch.special and the elementwise special functions of aten).
 *
 * Every function computes in float64 (exact for the inputs of every narrower dtype) and the
 * result is converted to the output dtype, so one formulation per function serves all dtypes.
 * Methods are standard numerical analysis, coefficients computed here at lowering time:
 *  - modified Bessel I0/I1 (and scaled): power series for |x| <= 20, the Hankel asymptotic
 *    expansion sum_k (-1)^k a_k(nu) / x^k beyond, a_k(nu) = prod_j (4nu^2 - (2j-1)^2) / (k! 8^k);
 *  - K0/K1 (and scaled): the logarithmic series for x <= 2, the trapezoidal rule on
 *    e^x K_nu(x) = int_0^inf exp(-x (cosh t - 1)) cosh(nu t) dt for 2 < x <= 20 (exponentially
 *    convergent: the integrand is analytic in a strip), the asymptotic expansion beyond;
 *  - J0/J1/Y0/Y1: the trapezoidal rule over one period of Bessel's integral (exact up to
 *    J_{m+N}) for |x| <= 20, with Neumann's series sum_k (-1)^k J_2k / k folded into node weights
 *    for Y; the Hankel expansions P, Q beyond;
 *  - Airy Ai: the Maclaurin series of f and g for -7.6 <= x <= 2, K_{1/3} above, the
 *    oscillatory Hankel form below;
 *  - orthogonal polynomials: their three-term recurrences in a stablehlo.while loop up to max(n);
 *  - igamma/igammac: the series for P(a,x) when x < a+1, Lentz's continued fraction for Q else;
 *  - gcd/lcm: Euclid's algorithm in a while loop; frexp: exponent bits;
 *  - Hurwitz zeta (and polygamma n >= 1 through it): direct terms, then Euler-Maclaurin;
 *  - digamma/nextafter: chlo ops; erfcx: exp(x^2) erfc(x), Laplace's continued fraction
 *    for large x; ndtri via erf_inv; log_ndtr via erfc/erfcx.
 * Loop bodies use only their carried values and constants made inside the body. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../hlo/strbuf.h"
#include "table.h"
#include "emit.h"

#define EULER_GAMMA 0.57721566490153286061

/* ---- helpers ---- */

static pj_val_t operand(pj_lower_t *L, const char *name) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && a->kind == PJ_ARG_SCALAR) return pj_scalar(L, name);
  return pj_tensor(L, name);
}

/* Argument `name` as float64 at the output's shape. */
static pj_val_t f64_arg(pj_lower_t *L, const char *name) {
  pj_type_t t = pj_out_type(L, 0);
  return pj_broadcast_to(H, pj_convert(H, operand(L, name), PJ_F64), t.rank, t.dims);
}

static pj_val_t cst(pj_lower_t *L, pj_val_t like, double v) { return pj_full(H, like.t, v); }

/* sum_k c[k] t^k (Horner). */
static pj_val_t poly(pj_lower_t *L, pj_val_t t, const double *c, int n) {
  pj_val_t p = cst(L, t, c[n - 1]);
  for (int k = n - 2; k >= 0; k--) p = ADD(MUL(p, t), cst(L, t, c[k]));
  return p;
}

/* a_k(nu) of the Hankel expansions, k = 0..n-1, times sign^k. */
static void hankel_coefs(double nu, double sign, double *a, int n) {
  a[0] = 1;
  for (int k = 1; k < n; k++)
    a[k] = a[k - 1] * sign * (4 * nu * nu - (double)(2 * k - 1) * (2 * k - 1)) / (8.0 * k);
}

/* A 1-D float64 constant. */
static pj_val_t const_vec(pj_lower_t *L, const double *v, int64_t n) {
  pj_sb_t b = {0};
  pj_type_t t = pj_type(PJ_F64, 1, &n);
  char ts[64];
  pj_sb_puts(&b, "value = dense<[");
  for (int64_t i = 0; i < n; i++) pj_sb_printf(&b, i ? ", %.17e" : "%.17e", v[i]);
  pj_sb_printf(&b, "]> : %s", pj_type_str(&t, ts, sizeof ts));
  char *attrs = b.failed ? NULL : pj_sb_take(&b, NULL);
  pj_sb_free(&b);
  pj_val_t r = attrs ? pj_hlo_op(H, "stablehlo.constant", NULL, 0, attrs, t)
                     : pj_hlo_fail(H, PJ_ERR_OOM, "out of memory");
  free(attrs);
  return r;
}

/* sum_j w[j] f(x * s[j]) for f = "cosine", "sine" or "exponential" (of -x s[j] when negate),
 * as one broadcast over a trailing axis of m nodes and a reduction. */
static pj_val_t node_sum(pj_lower_t *L, pj_val_t x, const double *s, const double *w, int m,
                         const char *f, bool negate) {
  pj_type_t t = x.t;
  int r = t.rank;
  t.dims[r] = m;
  t.rank = r + 1;
  int64_t dims[PJ_MAX_RANK];
  for (int i = 0; i < r; i++) dims[i] = i;
  pj_val_t xb = pj_broadcast_in_dim(H, x, t, dims);
  int64_t last = r;
  pj_val_t sb = pj_broadcast_in_dim(H, const_vec(L, s, m), t, &last);
  pj_val_t wb = pj_broadcast_in_dim(H, const_vec(L, w, m), t, &last);
  pj_val_t arg = MUL(xb, sb);
  if (negate) arg = U("negate", arg);
  pj_val_t v = MUL(pj_unary(H, f, arg), wb);
  return pj_reduce(H, v, &last, 1, "add");
}

static pj_val_t is_nan(pj_lower_t *L, pj_val_t x) { return CMP("NE", x, x); }

static void set_out(pj_lower_t *L, pj_val_t v) { pj_set_result(L, 0, v); }

/* ---- modified Bessel functions ---- */

#define I_SERIES 40
#define ASYM 25
#define BIG 20.0 /* switch to asymptotic expansions above this |x| */

/* I_nu(a) e^{-a} for a = |x| >= 0, nu = 0 or 1 (sign of x applied by the caller). */
static pj_val_t bessel_i_scaled(pj_lower_t *L, pj_val_t a, int nu) {
  double c[I_SERIES], h[ASYM];
  double f = 1;
  for (int k = 0; k < I_SERIES; k++) {
    if (k) f *= (double)k * (k + nu);
    c[k] = 1.0 / f; /* 1 / (k! (k+nu)!) */
  }
  pj_val_t y = MUL(MUL(a, a), cst(L, a, 0.25));
  pj_val_t s = poly(L, y, c, I_SERIES);
  if (nu == 1) s = MUL(s, MUL(a, cst(L, a, 0.5)));
  s = MUL(s, U("exponential", U("negate", a)));
  hankel_coefs(nu, -1, h, ASYM);
  pj_val_t big = CMP("GT", a, cst(L, a, BIG));
  pj_val_t as = SEL(big, a, cst(L, a, BIG + 1)); /* keeps the unused branch finite */
  pj_val_t asym = DIV(poly(L, DIV(cst(L, as, 1), as), h, ASYM),
                      U("sqrt", MUL(as, cst(L, as, 2 * M_PI))));
  return SEL(big, asym, s);
}

/* e^{x} K_nu(x) for x > 0 (nu = 0, 1 or 1/3 outside the series range); NaN for x < 0. */
#define K_NODES 41
#define K_STEP 0.1
static pj_val_t bessel_k_scaled(pj_lower_t *L, pj_val_t x, double nu) {
  /* series for x <= 2 (integer nu only) */
  pj_val_t series = cst(L, x, 0);
  if (nu == 0 || nu == 1) {
    int n = 24;
    double c[24], d[24], hk = 0;
    double f = 1;
    for (int k = 0; k < n; k++) {
      if (k) f *= (double)k * (k + (int)nu);
      double hk1 = hk + 1.0 / (k + 1);
      c[k] = 1.0 / f;                           /* 1/(k!(k+nu)!) */
      d[k] = (nu == 0 ? hk : hk + hk1) / f;     /* H_k or H_k + H_{k+1} */
      hk = hk1;
    }
    pj_val_t xs = SEL(CMP("GT", x, cst(L, x, 2)), cst(L, x, 1), x);
    pj_val_t y = MUL(MUL(xs, xs), cst(L, xs, 0.25));
    pj_val_t lg = ADD(U("log", MUL(xs, cst(L, xs, 0.5))), cst(L, xs, EULER_GAMMA));
    if (nu == 0) {
      series = SUB(poly(L, y, d, n), MUL(lg, poly(L, y, c, n)));
    } else {
      pj_val_t half = MUL(xs, cst(L, xs, 0.5));
      pj_val_t i1 = MUL(half, poly(L, y, c, n));
      series = ADD(ADD(DIV(cst(L, xs, 1), xs), MUL(lg, i1)),
                   U("negate", MUL(MUL(xs, cst(L, xs, 0.25)), poly(L, y, d, n))));
    }
    series = MUL(series, U("exponential", xs));
  }
  /* trapezoidal rule */
  double s[K_NODES], w[K_NODES];
  for (int j = 0; j < K_NODES; j++) {
    double t = j * K_STEP;
    s[j] = cosh(t) - 1;
    w[j] = K_STEP * cosh(nu * t) * (j ? 1.0 : 0.5);
  }
  pj_val_t xt = SEL(CMP("GT", x, cst(L, x, 0)), x, cst(L, x, 1));
  pj_val_t trap = node_sum(L, xt, s, w, K_NODES, "stablehlo.exponential", true);
  /* asymptotic */
  double h[ASYM];
  hankel_coefs(nu, 1, h, ASYM);
  pj_val_t big = CMP("GT", x, cst(L, x, BIG));
  pj_val_t as = SEL(big, x, cst(L, x, BIG + 1));
  pj_val_t asym = MUL(poly(L, DIV(cst(L, as, 1), as), h, ASYM),
                      U("sqrt", DIV(cst(L, as, M_PI_2), as)));
  pj_val_t r = SEL(big, asym, trap);
  if (nu == 0 || nu == 1) r = SEL(CMP("LE", x, cst(L, x, 2)), series, r);
  r = SEL(CMP("EQ", x, cst(L, x, 0)), cst(L, x, INFINITY), r);
  r = SEL(CMP("LT", x, cst(L, x, 0)), cst(L, x, NAN), r);
  return SEL(is_nan(L, x), x, r);
}

/* ---- Bessel functions of the first and second kind ---- */

#define J_N 128                /* nodes over one period */
#define J_UNIQUE (J_N / 4 + 1) /* distinct |sin theta| */
#define NEUMANN_K 32

/* J0, J1, Y0, Y1 of x >= 0 for x <= BIG by the periodic trapezoidal rule. which: 0 J0, 1 J1,
 * 2 Y0, 3 Y1. */
static pj_val_t bessel_jy_small(pj_lower_t *L, pj_val_t x, int which) {
  double s[J_UNIQUE], w1[J_UNIQUE], ws[J_UNIQUE], wn[J_UNIQUE], wns[J_UNIQUE];
  for (int j = 0; j < J_UNIQUE; j++) {
    double th = 2 * M_PI * j / J_N;
    double mult = (j == 0 || j == J_UNIQUE - 1) ? 2 : 4;
    double neu = 0;
    for (int k = 1; k <= NEUMANN_K; k++) neu += (k % 2 ? -1.0 : 1.0) * cos(2 * k * th) / k;
    s[j] = sin(th);
    w1[j] = mult / J_N;
    ws[j] = mult / J_N * s[j];
    wn[j] = mult / J_N * neu;
    wns[j] = mult / J_N * neu * s[j];
  }
  pj_val_t j0 = node_sum(L, x, s, w1, J_UNIQUE, "stablehlo.cosine", false);
  if (which == 0) return j0;
  pj_val_t j1 = node_sum(L, x, s, ws, J_UNIQUE, "stablehlo.sine", false);
  if (which == 1) return j1;
  pj_val_t xp = SEL(CMP("GT", x, cst(L, x, 0)), x, cst(L, x, 1));
  pj_val_t lg = ADD(U("log", MUL(xp, cst(L, xp, 0.5))), cst(L, xp, EULER_GAMMA));
  if (which == 2) {
    pj_val_t n = node_sum(L, x, s, wn, J_UNIQUE, "stablehlo.cosine", false);
    return MUL(cst(L, x, M_2_PI), SUB(MUL(lg, j0), MUL(cst(L, n, 2), n)));
  }
  pj_val_t n = node_sum(L, x, s, wns, J_UNIQUE, "stablehlo.sine", false);
  pj_val_t d = ADD(SUB(DIV(j0, xp), MUL(lg, j1)), MUL(cst(L, n, 2), n));
  return MUL(cst(L, x, -M_2_PI), d);
}

/* Hankel expansions for x > BIG: J_nu = sqrt(2/(pi x)) (P cos chi - Q sin chi),
 * Y_nu = sqrt(2/(pi x)) (P sin chi + Q cos chi), chi = x - (nu/2 + 1/4) pi. */
static void hankel_pq(pj_lower_t *L, pj_val_t x, double nu, pj_val_t *p, pj_val_t *q) {
  double a[2 * ASYM], pc[ASYM], qc[ASYM];
  hankel_coefs(nu, 1, a, 2 * ASYM);
  for (int k = 0; k < ASYM; k++) {
    pc[k] = (k % 2 ? -1.0 : 1.0) * a[2 * k];
    qc[k] = (k % 2 ? -1.0 : 1.0) * a[2 * k + 1];
  }
  pj_val_t t = DIV(cst(L, x, 1), x);
  pj_val_t t2 = MUL(t, t);
  *p = poly(L, t2, pc, ASYM);
  *q = MUL(t, poly(L, t2, qc, ASYM));
}

static pj_val_t bessel_jy(pj_lower_t *L, pj_val_t x0, int which) {
  bool odd = which == 1;
  bool y = which >= 2;
  pj_val_t x = y ? x0 : U("abs", x0);
  pj_val_t big = CMP("GT", x, cst(L, x, BIG));
  pj_val_t xs = SEL(big, cst(L, x, 1), SEL(CMP("LT", x, cst(L, x, 0)), cst(L, x, 1), x));
  pj_val_t small = bessel_jy_small(L, xs, which);
  pj_val_t xb = SEL(big, x, cst(L, x, BIG + 1));
  pj_val_t p, q;
  int nu = which % 2;
  hankel_pq(L, xb, nu, &p, &q);
  /* chi = x - pi/4 (nu 0) or x - 3pi/4 (nu 1): cos/sin of x combined exactly */
  pj_val_t c = U("cosine", xb), s = U("sine", xb);
  pj_val_t cchi, schi;
  double r2 = M_SQRT1_2;
  if (nu == 0) {
    cchi = MUL(ADD(c, s), cst(L, c, r2));
    schi = MUL(SUB(s, c), cst(L, c, r2));
  } else {
    cchi = MUL(SUB(s, c), cst(L, c, r2));
    schi = MUL(U("negate", ADD(s, c)), cst(L, c, r2));
  }
  pj_val_t amp = U("sqrt", DIV(cst(L, xb, M_2_PI), xb));
  pj_val_t asym = y ? MUL(amp, ADD(MUL(p, schi), MUL(q, cchi)))
                    : MUL(amp, SUB(MUL(p, cchi), MUL(q, schi)));
  pj_val_t r = SEL(big, asym, small);
  pj_val_t inf = CMP("EQ", x, cst(L, x, INFINITY)); /* NaN there, as torch */
  r = SEL(inf, cst(L, r, NAN), r);
  if (y) {
    r = SEL(CMP("EQ", x, cst(L, x, 0)), cst(L, x, -INFINITY), r);
    r = SEL(CMP("LT", x, cst(L, x, 0)), cst(L, x, NAN), r);
  } else if (odd) {
    r = SEL(CMP("LT", x0, cst(L, x0, 0)), U("negate", r), r);
  }
  return SEL(is_nan(L, x0), x0, r);
}

/* ---- lowerings: Bessel family ---- */

static pj_status_t *lower_bessel_i(pj_lower_t *L) {
  const char *op = L->c->op;
  pj_val_t x = f64_arg(L, pj_has(L, "self") ? "self" : "x");
  bool one = strstr(op, "i1") != NULL;
  bool scaled = !strcmp(op, "special_i0e") || !strcmp(op, "special_i1e");
  pj_val_t a = U("abs", x);
  pj_val_t r = bessel_i_scaled(L, a, one ? 1 : 0);
  if (!scaled) r = MUL(r, U("exponential", a));
  if (!scaled && !one) /* torch's i0 of an infinity is NaN */
    r = SEL(CMP("EQ", a, cst(L, a, INFINITY)), cst(L, a, NAN), r);
  if (one) r = SEL(CMP("LT", x, cst(L, x, 0)), U("negate", r), r);
  r = SEL(CMP("EQ", x, cst(L, x, 0)), cst(L, x, one ? 0 : 1), r);
  set_out(L, SEL(is_nan(L, x), x, r));
  return NULL;
}

static pj_status_t *lower_bessel_k(pj_lower_t *L) {
  const char *op = L->c->op;
  pj_val_t x = f64_arg(L, pj_has(L, "self") ? "self" : "x");
  bool one = strstr(op, "k1") != NULL;
  bool scaled = strstr(op, "scaled") != NULL;
  pj_val_t r = bessel_k_scaled(L, x, one ? 1 : 0);
  if (!scaled) {
    pj_val_t e = MUL(r, U("exponential", U("negate", x)));
    r = SEL(CMP("GT", x, cst(L, x, 0)), e, r);
    r = SEL(CMP("EQ", x, cst(L, x, INFINITY)), cst(L, x, 0), r);
  }
  set_out(L, r);
  return NULL;
}

static pj_status_t *lower_bessel_jy(pj_lower_t *L) {
  const char *op = L->c->op;
  int which = !strcmp(op, "special_bessel_j0") ? 0 : !strcmp(op, "special_bessel_j1") ? 1
              : !strcmp(op, "special_bessel_y0") ? 2 : 3;
  set_out(L, bessel_jy(L, f64_arg(L, "self"), which));
  return NULL;
}

static pj_status_t *lower_spherical_j0(pj_lower_t *L) {
  pj_val_t x = f64_arg(L, "x");
  pj_val_t ax = U("abs", x);
  pj_val_t tiny = CMP("LT", ax, cst(L, x, 1e-4));
  pj_val_t xs = SEL(tiny, cst(L, x, 1), x);
  pj_val_t r = DIV(U("sine", xs), xs);
  pj_val_t x2 = MUL(x, x);
  pj_val_t ser = SUB(cst(L, x, 1), MUL(x2, SUB(cst(L, x, 1.0 / 6), MUL(x2, cst(L, x, 1.0 / 120)))));
  r = SEL(tiny, ser, r);
  r = SEL(CMP("EQ", ax, cst(L, x, INFINITY)), cst(L, x, 0), r);
  set_out(L, r);
  return NULL;
}

#define AIRY_SERIES 50
#define AIRY_BIG 7.6 /* below -7.6 (zeta > 14) the series would cancel more than the */
                      /* asymptotic expansion errs */
static pj_status_t *lower_airy_ai(pj_lower_t *L) {
  pj_val_t x = f64_arg(L, "x");
  /* Maclaurin series: Ai = Ai(0) f - |Ai'(0)| g */
  double fc[AIRY_SERIES], gc[AIRY_SERIES];
  fc[0] = gc[0] = 1;
  for (int k = 1; k < AIRY_SERIES; k++) {
    fc[k] = fc[k - 1] / ((3.0 * k) * (3.0 * k - 1));
    gc[k] = gc[k - 1] / ((3.0 * k + 1) * (3.0 * k));
  }
  pj_val_t in_series = AND(CMP("GE", x, cst(L, x, -AIRY_BIG)), CMP("LE", x, cst(L, x, 2)));
  pj_val_t xs = SEL(in_series, x, cst(L, x, 0));
  pj_val_t t = MUL(MUL(xs, xs), xs);
  pj_val_t ser = SUB(MUL(cst(L, t, 0.355028053887817239260), poly(L, t, fc, AIRY_SERIES)),
                     MUL(MUL(cst(L, t, 0.258819403792806798405), xs), poly(L, t, gc, AIRY_SERIES)));
  /* x > 2: Ai = sqrt(x/3)/pi K_{1/3}(zeta) */
  pj_val_t pos = CMP("GT", x, cst(L, x, 2));
  pj_val_t xp = SEL(pos, x, cst(L, x, 3));
  pj_val_t zeta = MUL(cst(L, xp, 2.0 / 3), MUL(xp, U("sqrt", xp)));
  pj_val_t k = bessel_k_scaled(L, zeta, 1.0 / 3);
  pj_val_t right = MUL(MUL(U("sqrt", DIV(xp, cst(L, xp, 3))), cst(L, xp, M_1_PI)),
                       MUL(k, U("exponential", U("negate", zeta))));
  right = SEL(CMP("EQ", x, cst(L, x, INFINITY)), cst(L, x, 0), right);
  /* x < -AIRY_BIG: Ai(-z) = z^{-1/4}/sqrt(pi) (P cos(zeta - pi/4) - Q sin(zeta - pi/4)) */
  pj_val_t neg = CMP("LT", x, cst(L, x, -AIRY_BIG));
  pj_val_t z = SEL(neg, U("negate", x), cst(L, x, AIRY_BIG + 1));
  pj_val_t zn = MUL(cst(L, z, 2.0 / 3), MUL(z, U("sqrt", z)));
  pj_val_t p, q;
  hankel_pq(L, zn, 1.0 / 3, &p, &q);
  pj_val_t c = U("cosine", zn), s = U("sine", zn);
  pj_val_t cchi = MUL(ADD(c, s), cst(L, c, M_SQRT1_2)), schi = MUL(SUB(s, c), cst(L, c, M_SQRT1_2));
  pj_val_t amp = DIV(cst(L, z, 1 / sqrt(M_PI)), U("sqrt", U("sqrt", z)));
  pj_val_t left = MUL(amp, SUB(MUL(p, cchi), MUL(q, schi)));
  left = SEL(CMP("EQ", z, cst(L, z, INFINITY)), cst(L, z, 0), left);
  pj_val_t r = SEL(pos, right, SEL(neg, left, ser));
  r = SEL(CMP("EQ", U("abs", x), cst(L, x, INFINITY)), cst(L, x, NAN), r); /* as torch */
  set_out(L, SEL(is_nan(L, x), x, r));
  return NULL;
}

/* ---- orthogonal polynomials ---- */

typedef enum { P_CHEB_T, P_CHEB_U, P_CHEB_V, P_CHEB_W, P_HERM_H, P_HERM_E, P_LAG, P_LEG } poly_kind_t;

static poly_kind_t poly_kind(const char *op) {
  if (strstr(op, "chebyshev_polynomial_t")) return P_CHEB_T;
  if (strstr(op, "chebyshev_polynomial_u")) return P_CHEB_U;
  if (strstr(op, "chebyshev_polynomial_v")) return P_CHEB_V;
  if (strstr(op, "chebyshev_polynomial_w")) return P_CHEB_W;
  if (strstr(op, "hermite_polynomial_he")) return P_HERM_E;
  if (strstr(op, "hermite_polynomial_h")) return P_HERM_H;
  if (strstr(op, "laguerre")) return P_LAG;
  return P_LEG;
}

/* p_{k+1} from p_k, p_{k-1} at step k (a 0-d-broadcast float64 value). */
static pj_val_t poly_step(pj_lower_t *L, poly_kind_t kind, pj_val_t x, pj_val_t k, pj_val_t pk,
                          pj_val_t pk1) {
  switch (kind) {
    case P_HERM_H: /* 2x H_k - 2k H_{k-1} */
      return SUB(MUL(MUL(cst(L, x, 2), x), pk), MUL(MUL(cst(L, k, 2), k), pk1));
    case P_HERM_E: /* x He_k - k He_{k-1} */
      return SUB(MUL(x, pk), MUL(k, pk1));
    case P_LAG: /* ((2k+1-x) L_k - k L_{k-1}) / (k+1) */
      return DIV(SUB(MUL(SUB(ADD(MUL(cst(L, k, 2), k), cst(L, k, 1)), x), pk), MUL(k, pk1)),
                 ADD(k, cst(L, k, 1)));
    case P_LEG: /* ((2k+1) x P_k - k P_{k-1}) / (k+1) */
      return DIV(SUB(MUL(MUL(ADD(MUL(cst(L, k, 2), k), cst(L, k, 1)), x), pk), MUL(k, pk1)),
                 ADD(k, cst(L, k, 1)));
    default: /* Chebyshev: 2x p_k - p_{k-1} */
      return SUB(MUL(MUL(cst(L, x, 2), x), pk), pk1);
  }
}

static pj_val_t poly_p1(pj_lower_t *L, poly_kind_t kind, pj_val_t x) {
  switch (kind) {
    case P_CHEB_U: case P_HERM_H: return MUL(cst(L, x, 2), x);
    case P_CHEB_V: return SUB(MUL(cst(L, x, 2), x), cst(L, x, 1));
    case P_CHEB_W: return ADD(MUL(cst(L, x, 2), x), cst(L, x, 1));
    case P_LAG: return SUB(cst(L, x, 1), x);
    default: return x;
  }
}

static pj_status_t *lower_orth_poly(pj_lower_t *L) {
  poly_kind_t kind = poly_kind(L->c->op);
  pj_val_t x = f64_arg(L, "x");
  if (strstr(L->c->op, "shifted")) x = SUB(MUL(cst(L, x, 2), x), cst(L, x, 1));
  /* n truncated to an integer (as torch does), kept as float64 */
  pj_val_t n = f64_arg(L, "n");
  n = SEL(CMP("LT", n, cst(L, n, 0)), U("ceil", n), U("floor", n));
  pj_val_t p0 = cst(L, x, 1), p1 = poly_p1(L, kind, x);
  pj_val_t res = SEL(CMP("EQ", n, cst(L, n, 0)), p0, p1);
  /* loop k = 1 .. max(n)-1 producing p_{k+1}; state: k (0-d f64), x, n, p_k, p_{k-1}, res */
  int64_t alld[PJ_MAX_RANK];
  for (int i = 0; i < x.t.rank; i++) alld[i] = i;
  /* n beyond 2^24 (or infinite) would not finish: those elements give NaN, as NaN n does */
  pj_val_t huge = U("not", CMP("LE", n, cst(L, n, 16777216.0))); /* NaN too */
  n = SEL(huge, cst(L, n, NAN), n);
  pj_val_t nmax = pj_reduce(H, SEL(huge, cst(L, n, 0), n), alld, x.t.rank, "max");
  pj_val_t st[6] = {pj_const(H, PJ_F64, 1), x, n, p1, p0, res};
  pj_type_t ts[7];
  pj_val_t ins[7], args[7];
  ins[0] = nmax;
  ts[0] = nmax.t;
  for (int i = 0; i < 6; i++) {
    ins[i + 1] = st[i];
    ts[i + 1] = st[i].t;
  }
  pj_hlo_region_begin(H, ts, 7, args);
  pj_val_t c = CMP("LT", args[1], args[0]);
  char *cr = pj_hlo_region_end(H, &c, 1);
  pj_hlo_region_begin(H, ts, 7, args);
  {
    pj_val_t k = args[1], xx = args[2], nn = args[3], pk = args[4], pk1 = args[5], r = args[6];
    pj_val_t kb = pj_broadcast_to(H, k, xx.t.rank, xx.t.dims);
    pj_val_t next = poly_step(L, kind, xx, kb, pk, pk1);
    pj_val_t k1 = ADD(kb, cst(L, kb, 1));
    r = SEL(CMP("EQ", nn, k1), next, r);
    pj_val_t outs[7] = {args[0], ADD(k, pj_const(H, PJ_F64, 1)), xx, nn, next, pk, r};
    char *br = pj_hlo_region_end(H, outs, 7);
    if (cr && br) {
      size_t len = strlen(cr) + strlen(br) + 4;
      char *both = malloc(len);
      pj_val_t res7[7];
      if (both) {
        snprintf(both, len, "%s, %s", cr, br);
        pj_hlo_op_multi(H, "stablehlo.while", ins, 7, both, NULL, ts, 7, res7);
        res = res7[6];
        free(both);
      } else {
        pj_fail(L, PJ_ERR_OOM, "out of memory building a loop");
      }
    }
    free(br);
  }
  free(cr);
  /* n < 0 gives 0; Chebyshev/Legendre at |x| = 1 are exact +-1 */
  res = SEL(CMP("LT", n, cst(L, n, 0)), cst(L, res, 0), res);
  res = SEL(is_nan(L, n), n, res);
  if (kind == P_CHEB_T || kind == P_LEG) {
    pj_val_t half = MUL(n, cst(L, n, 0.5));
    pj_val_t even = CMP("EQ", U("floor", half), half);
    pj_val_t one = SEL(OR(CMP("GT", x, cst(L, x, 0)), even), cst(L, x, 1), cst(L, x, -1));
    pj_val_t edge = AND(CMP("EQ", U("abs", x), cst(L, x, 1)), CMP("GE", n, cst(L, n, 0)));
    res = SEL(edge, one, res);
  }
  set_out(L, res);
  return NULL;
}

/* ---- gcd / lcm ---- */

/* |v| of an integer (unsigned ones are their own; stablehlo.abs rejects them) */
static pj_val_t int_abs(pj_lower_t *L, pj_val_t v) {
  return pj_dtype_info(v.t.dtype)->is_signed ? U("abs", v) : v;
}

static pj_val_t gcd_of(pj_lower_t *L, pj_val_t a, pj_val_t b) {
  a = int_abs(L, a);
  b = int_abs(L, b);
  int64_t alld[PJ_MAX_RANK];
  for (int i = 0; i < a.t.rank; i++) alld[i] = i;
  pj_type_t ts[2] = {a.t, b.t};
  pj_val_t ins[2] = {a, b}, args[2], outs[2];
  pj_hlo_region_begin(H, ts, 2, args);
  pj_val_t nz = CMP("NE", args[1], pj_full(H, args[1].t, 0));
  pj_val_t c = pj_reduce(H, nz, alld, a.t.rank, "or");
  char *cr = pj_hlo_region_end(H, &c, 1);
  pj_hlo_region_begin(H, ts, 2, args);
  {
    pj_val_t x = args[0], y = args[1];
    pj_val_t zero = pj_full(H, y.t, 0);
    pj_val_t nzb = CMP("NE", y, zero);
    pj_val_t ysafe = SEL(nzb, y, pj_full(H, y.t, 1));
    pj_val_t r = pj_binary(H, "stablehlo.remainder", x, ysafe);
    pj_val_t o[2] = {SEL(nzb, y, x), SEL(nzb, r, zero)};
    char *br = pj_hlo_region_end(H, o, 2);
    if (cr && br) {
      size_t len = strlen(cr) + strlen(br) + 4;
      char *both = malloc(len);
      if (both) {
        snprintf(both, len, "%s, %s", cr, br);
        if (pj_hlo_op_multi(H, "stablehlo.while", ins, 2, both, NULL, ts, 2, outs)) a = outs[0];
        free(both);
      } else {
        pj_fail(L, PJ_ERR_OOM, "out of memory building a loop");
      }
    }
    free(br);
  }
  free(cr);
  return int_abs(L, a); /* |INT_MIN| stays negative, as on CPU */
}

static pj_status_t *lower_gcd_lcm(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  pj_val_t a = pj_broadcast_to(H, pj_convert(H, operand(L, "self"), t.dtype), t.rank, t.dims);
  pj_val_t b = pj_broadcast_to(H, pj_convert(H, operand(L, "other"), t.dtype), t.rank, t.dims);
  pj_val_t g = gcd_of(L, a, b);
  if (!strcmp(L->c->op, "lcm")) {
    pj_val_t zero = pj_full(H, g.t, 0);
    pj_val_t gz = CMP("EQ", g, zero);
    pj_val_t gs = SEL(gz, pj_full(H, g.t, 1), g);
    g = SEL(gz, zero, int_abs(L, MUL(DIV(a, gs), b)));
  }
  set_out(L, g);
  return NULL;
}

/* ---- frexp ---- */

/* Integer-only, so subnormals work on plugins that flush them to zero in float arithmetic. */
static pj_status_t *lower_frexp(pj_lower_t *L) {
  pj_val_t x0 = pj_tensor(L, "self");
  pj_dtype_t dt = x0.t.dtype;
  bool d64 = dt == PJ_F64;
  pj_val_t x = d64 ? x0 : pj_convert(H, x0, PJ_F32); /* exact for half types */
  pj_dtype_t it = d64 ? PJ_I64 : PJ_I32;
  int64_t M = d64 ? 52 : 23, B = d64 ? 64 : 32, emask = d64 ? 0x7ff : 0xff;
  int64_t bias = d64 ? 1022 : 126; /* frexp's: mantissa in [0.5, 1) */
  int64_t mmask = ((int64_t)1 << M) - 1;
  pj_val_t bits = pj_hlo_op(H, "stablehlo.bitcast_convert", &x, 1, NULL, pj_type_with_dtype(x.t, it));
#define IC(v) pj_broadcast_to(H, pj_const_i(H, it, (v)), bits.t.rank, bits.t.dims)
  pj_val_t sign = AND(bits, IC(d64 ? INT64_MIN : (int64_t)INT32_MIN));
  pj_val_t shr[2] = {bits, IC(M)};
  pj_val_t ef = AND(pj_hlo_op(H, "stablehlo.shift_right_logical", shr, 2, NULL, bits.t), IC(emask));
  pj_val_t m = AND(bits, IC(mmask));
  pj_val_t zero = CMP("EQ", OR(ef, m), IC(0));
  pj_val_t special = OR(zero, CMP("EQ", ef, IC(emask)));
  pj_val_t sub = CMP("EQ", ef, IC(0));
  /* normal */
  pj_val_t expo = SUB(ef, IC(bias));
  pj_val_t mb = OR(OR(sign, m), IC(bias << M));
  /* subnormal: p = position of m's top bit */
  pj_val_t lz = pj_unary(H, "stablehlo.count_leading_zeros", m);
  pj_val_t p = SUB(IC(B - 1), lz);
  pj_val_t sexpo = SUB(p, IC(bias + M - 1));
  pj_val_t shl[2] = {m, SUB(IC(M), p)};
  pj_val_t sm = AND(pj_hlo_op(H, "stablehlo.shift_left", shl, 2, NULL, bits.t), IC(mmask));
  pj_val_t smb = OR(OR(sign, sm), IC(bias << M));
#undef IC
  expo = SEL(sub, sexpo, expo);
  mb = SEL(sub, smb, mb);
  pj_val_t mant = pj_hlo_op(H, "stablehlo.bitcast_convert", &mb, 1, NULL, x.t);
  mant = SEL(special, x, mant);
  expo = SEL(special, pj_full(H, expo.t, 0), expo);
  pj_set_result(L, 0, pj_convert(H, mant, dt));
  pj_set_result(L, 1, pj_convert(H, expo, PJ_I32));
  return NULL;
}

/* ---- Hurwitz zeta and polygamma ---- */

/* zeta(s, q) = sum_k (q+k)^-s: terms summed directly while q+k < 10 (a while loop, so negative
 * q works for integer s), then the Euler-Maclaurin tail at a = q+k >= 10 with Bernoulli
 * numbers B_2..B_24. Edge cases as torch: s == 1 inf, s < 1 NaN, q a non-positive integer
 * inf, q < 0 with non-integer s NaN. */
static pj_val_t zeta_of(pj_lower_t *L, pj_val_t s, pj_val_t q) {
  static const double bern[12] = {1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66,
                                  -691.0 / 2730, 7.0 / 6, -3617.0 / 510, 43867.0 / 798,
                                  -174611.0 / 330, 854513.0 / 138, -236364091.0 / 2730};
  pj_val_t finite = CMP("LT", U("abs", q), cst(L, q, INFINITY));
  pj_val_t a0 = SEL(finite, q, cst(L, q, 20));
  pj_val_t st[3] = {a0, s, cst(L, q, 0)};
  pj_type_t ts[3] = {a0.t, s.t, a0.t};
  pj_val_t args[3], outs[3];
  int64_t alld[PJ_MAX_RANK];
  for (int i = 0; i < q.t.rank; i++) alld[i] = i;
  pj_hlo_region_begin(H, ts, 3, args);
  pj_val_t c = pj_reduce(H, CMP("LT", args[0], pj_full(H, args[0].t, 10)), alld, q.t.rank, "or");
  char *cr = pj_hlo_region_end(H, &c, 1);
  pj_hlo_region_begin(H, ts, 3, args);
  {
    pj_val_t a = args[0], ss = args[1], sum = args[2];
    pj_val_t m = CMP("LT", a, pj_full(H, a.t, 10));
    pj_val_t term = pj_binary(H, "stablehlo.power", a, U("negate", ss));
    sum = ADD(sum, SEL(m, term, pj_full(H, a.t, 0)));
    a = SEL(m, ADD(a, pj_full(H, a.t, 1)), a);
    pj_val_t o[3] = {a, ss, sum};
    char *br = pj_hlo_region_end(H, o, 3);
    if (cr && br) {
      size_t len = strlen(cr) + strlen(br) + 4;
      char *both = malloc(len);
      if (both) {
        snprintf(both, len, "%s, %s", cr, br);
        pj_hlo_op_multi(H, "stablehlo.while", st, 3, both, NULL, ts, 3, outs);
        free(both);
      } else {
        pj_fail(L, PJ_ERR_OOM, "out of memory building a loop");
      }
    }
    free(br);
  }
  free(cr);
  if (!pj_hlo_ok(H)) return q;
  pj_val_t a = outs[0], sum = outs[2];
  pj_val_t one = cst(L, a, 1);
  pj_val_t ams = pj_binary(H, "stablehlo.power", a, U("negate", s)); /* a^-s */
  sum = ADD(sum, DIV(MUL(ams, a), SUB(s, one)));
  sum = ADD(sum, MUL(ams, cst(L, a, 0.5)));
  /* v_j = s (s+1) ... (s+2j-2) a^{-s-2j+1} */
  pj_val_t v = DIV(MUL(s, ams), a);
  pj_val_t a2 = MUL(a, a);
  double fact = 2; /* (2j)! */
  for (int j = 1; j <= 12; j++) {
    sum = ADD(sum, MUL(v, cst(L, v, bern[j - 1] / fact)));
    v = DIV(MUL(v, MUL(ADD(s, cst(L, s, 2 * j - 1)), ADD(s, cst(L, s, 2 * j)))), a2);
    fact *= (2.0 * j + 1) * (2.0 * j + 2);
  }
  pj_val_t r = sum;
  r = SEL(CMP("EQ", q, cst(L, q, INFINITY)), cst(L, q, 0), r);
  pj_val_t qint = CMP("EQ", q, U("floor", q));
  pj_val_t sint = CMP("EQ", s, U("floor", s));
  pj_val_t qneg = CMP("LE", q, cst(L, q, 0));
  r = SEL(AND(qneg, U("not", sint)), cst(L, r, NAN), r);
  r = SEL(AND(qneg, qint), cst(L, r, INFINITY), r);
  r = SEL(CMP("LT", s, one), cst(L, r, NAN), r);
  r = SEL(CMP("EQ", s, one), cst(L, r, INFINITY), r);
  return SEL(OR(is_nan(L, s), is_nan(L, q)), cst(L, r, NAN), r);
}

static pj_status_t *lower_polygamma(pj_lower_t *L) {
  pj_val_t x = f64_arg(L, "self");
  int64_t n = pj_int(L, "n", 0);
  pj_val_t r;
  if (n == 0) {
    r = pj_unary(H, "chlo.digamma", x);
    /* digamma(+-0) = -+inf, as torch */
    r = SEL(CMP("EQ", x, cst(L, x, 0)), U("negate", DIV(cst(L, x, 1), x)), r);
  } else if (n == 1 && pj_out_type(L, 0).dtype != PJ_F64) {
    /* trigamma of a float32 (or half) input: torch reflects x < 1/2 with sin(pi x) evaluated in
     * float32, whose rounding dominates near the poles; the same formula here keeps CPU's
     * values: pi^2 / sin^2(pi x) - trigamma(1 - x) */
    pj_val_t xf = pj_convert(H, x, PJ_F32);
    pj_val_t sn = U("sine", MUL(cst(L, xf, M_PI), xf));
    pj_val_t refl = pj_convert(H, DIV(cst(L, xf, M_PI * M_PI), MUL(sn, sn)), PJ_F64);
    pj_val_t omx = pj_convert(H, SUB(cst(L, xf, 1), xf), PJ_F64);
    pj_val_t lo = CMP("LT", x, cst(L, x, 0.5));
    pj_val_t arg = SEL(lo, omx, x);
    pj_val_t z = zeta_of(L, cst(L, x, 2), arg);
    r = SEL(lo, SUB(refl, z), z);
  } else {
    /* (-1)^(n+1) n! zeta(n+1, x) */
    double f = 1;
    for (int64_t k = 2; k <= n; k++) f *= (double)k;
    r = MUL(zeta_of(L, cst(L, x, (double)(n + 1)), x), cst(L, x, n % 2 ? f : -f));
  }
  set_out(L, r);
  return NULL;
}

static pj_status_t *lower_zeta(pj_lower_t *L) {
  set_out(L, zeta_of(L, f64_arg(L, "self"), f64_arg(L, "other")));
  return NULL;
}

static pj_status_t *lower_nextafter(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  pj_val_t ins[2];
  ins[0] = pj_broadcast_to(H, pj_convert(H, operand(L, "self"), t.dtype), t.rank, t.dims);
  ins[1] = pj_broadcast_to(H, pj_convert(H, operand(L, "other"), t.dtype), t.rank, t.dims);
  set_out(L, pj_hlo_op(H, "chlo.next_after", ins, 2, NULL, t));
  return NULL;
}

/* ---- error-function family ---- */

#define ERFCX_CF 60
static pj_val_t erfcx_of(pj_lower_t *L, pj_val_t x) {
  pj_val_t big = CMP("GT", x, cst(L, x, 2.5));
  pj_val_t xd = SEL(big, cst(L, x, 0), x);
  pj_val_t direct = MUL(U("exponential", MUL(xd, xd)), pj_unary(H, "chlo.erfc", xd));
  /* erfc(x) e^{x^2} sqrt(pi) = 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))) */
  pj_val_t xb = SEL(big, x, cst(L, x, 3));
  pj_val_t f = xb;
  for (int k = ERFCX_CF; k >= 1; k--) f = ADD(xb, DIV(cst(L, xb, k * 0.5), f));
  pj_val_t cf = DIV(cst(L, f, 1 / sqrt(M_PI)), f);
  cf = SEL(CMP("EQ", x, cst(L, x, INFINITY)), cst(L, x, 0), cf);
  return SEL(big, cf, direct);
}

static pj_status_t *lower_erfcx(pj_lower_t *L) {
  set_out(L, erfcx_of(L, f64_arg(L, "self")));
  return NULL;
}

static pj_status_t *lower_ndtri(pj_lower_t *L) {
  pj_val_t p = f64_arg(L, "self");
  pj_val_t r = MUL(cst(L, p, M_SQRT2),
                   pj_unary(H, "chlo.erf_inv", SUB(MUL(cst(L, p, 2), p), cst(L, p, 1))));
  r = SEL(CMP("EQ", p, cst(L, p, 0)), cst(L, p, -INFINITY), r);
  r = SEL(CMP("EQ", p, cst(L, p, 1)), cst(L, p, INFINITY), r);
  r = SEL(OR(CMP("LT", p, cst(L, p, 0)), CMP("GT", p, cst(L, p, 1))), cst(L, p, NAN), r);
  set_out(L, r);
  return NULL;
}

static pj_status_t *lower_log_ndtr(pj_lower_t *L) {
  pj_val_t x = f64_arg(L, "self");
  pj_val_t t = MUL(x, cst(L, x, M_SQRT1_2));
  pj_val_t lo = CMP("LT", x, cst(L, x, -1));
  /* x < -1: log(erfcx(-t)/2) - t^2; else log1p(-erfc(t)/2) */
  pj_val_t tl = SEL(lo, t, cst(L, t, -1));
  pj_val_t left = SUB(U("log", MUL(erfcx_of(L, U("negate", tl)), cst(L, t, 0.5))), MUL(tl, tl));
  pj_val_t right = U("log_plus_one", MUL(pj_unary(H, "chlo.erfc", t), cst(L, t, -0.5)));
  set_out(L, SEL(lo, left, right));
  return NULL;
}

/* ---- incomplete gamma ---- */

#define IGAMMA_ITERS 2000
/* Regularized P(a, x) (upper = false) or Q(a, x). */
static pj_val_t igamma_of(pj_lower_t *L, pj_val_t a, pj_val_t x, bool upper) {
  pj_val_t use_series = CMP("LT", x, ADD(a, cst(L, a, 1)));
  /* pick safe operands so both branches stay finite */
  pj_val_t ok = AND(CMP("GT", a, cst(L, a, 0)), CMP("GT", x, cst(L, x, 0)));
  ok = AND(ok, AND(CMP("LT", a, cst(L, a, INFINITY)), CMP("LT", x, cst(L, x, INFINITY))));
  pj_val_t as = SEL(ok, a, cst(L, a, 1)), xs = SEL(ok, x, cst(L, x, 1));
  pj_val_t logpre = SUB(SUB(MUL(as, U("log", xs)), xs), pj_unary(H, "chlo.lgamma", as));
  /* one while loop runs both recurrences for a fixed number of steps or until converged:
   * series: term *= x/(a+i); sum += term.  CF (Lentz): an = -i(i-a); b += 2; d = 1/(an d + b);
   * c = b + an/c; h *= d c. state: i, a, x, term, sum, b, c, d, h */
  pj_val_t one = cst(L, as, 1);
  pj_val_t b0 = ADD(SUB(xs, as), one);
  pj_val_t tiny = cst(L, as, 1e-300);
  pj_val_t b0s = SEL(CMP("EQ", b0, cst(L, b0, 0)), tiny, b0);
  pj_val_t st[9] = {pj_const(H, PJ_F64, 1), as, xs, DIV(one, as), DIV(one, as),
                    b0, cst(L, as, 1e300), DIV(one, b0s), DIV(one, b0s)};
  int64_t alld[PJ_MAX_RANK];
  for (int i = 0; i < a.t.rank; i++) alld[i] = i;
  pj_type_t ts[9];
  pj_val_t args[9], outs[9];
  for (int i = 0; i < 9; i++) ts[i] = st[i].t;
  pj_hlo_region_begin(H, ts, 9, args);
  pj_val_t c = CMP("LT", args[0], pj_const(H, PJ_F64, IGAMMA_ITERS));
  {
    /* converged when every element's own method has converged (a term or a CF factor below
     * epsilon; NaN counts as done) */
    pj_val_t us = CMP("LT", args[2], ADD(args[1], pj_full(H, args[1].t, 1)));
    pj_val_t rel = DIV(U("abs", args[3]), U("abs", args[4]));
    pj_val_t eps = pj_full(H, rel.t, 1e-17);
    pj_val_t s_done = OR(CMP("LT", rel, eps), CMP("NE", rel, rel));
    pj_val_t dev = U("abs", SUB(MUL(args[7], args[6]), pj_full(H, rel.t, 1)));
    pj_val_t cf_done = OR(CMP("LT", dev, eps), CMP("NE", dev, dev));
    pj_val_t all = pj_reduce(H, SEL(us, s_done, cf_done), alld, a.t.rank, "and");
    c = AND(c, U("not", all));
  }
  char *cr = pj_hlo_region_end(H, &c, 1);
  pj_hlo_region_begin(H, ts, 9, args);
  {
    pj_val_t i = args[0], aa = args[1], xx = args[2], term = args[3], sum = args[4];
    pj_val_t b = args[5], cc = args[6], d = args[7], h = args[8];
    pj_val_t ib = pj_broadcast_to(H, i, aa.t.rank, aa.t.dims);
    pj_val_t one_b = pj_full(H, aa.t, 1);
    pj_val_t tiny_b = pj_full(H, aa.t, 1e-300);
    term = MUL(term, DIV(xx, ADD(aa, ib)));
    sum = ADD(sum, term);
    pj_val_t an = U("negate", MUL(ib, SUB(ib, aa)));
    b = ADD(b, pj_full(H, aa.t, 2));
    d = ADD(MUL(an, d), b);
    d = SEL(CMP("LT", U("abs", d), tiny_b), tiny_b, d);
    cc = ADD(b, DIV(an, cc));
    cc = SEL(CMP("LT", U("abs", cc), tiny_b), tiny_b, cc);
    d = DIV(one_b, d);
    h = MUL(h, MUL(d, cc));
    pj_val_t o[9] = {ADD(i, pj_const(H, PJ_F64, 1)), aa, xx, term, sum, b, cc, d, h};
    char *br = pj_hlo_region_end(H, o, 9);
    if (cr && br) {
      size_t len = strlen(cr) + strlen(br) + 4;
      char *both = malloc(len);
      if (both) {
        snprintf(both, len, "%s, %s", cr, br);
        pj_hlo_op_multi(H, "stablehlo.while", st, 9, both, NULL, ts, 9, outs);
        free(both);
      } else {
        pj_fail(L, PJ_ERR_OOM, "out of memory building a loop");
      }
    }
    free(br);
  }
  free(cr);
  if (!pj_hlo_ok(H)) return a;
  pj_val_t pre = U("exponential", logpre);
  pj_val_t p_series = MUL(pre, outs[4]); /* the sum started at 1/a */
  pj_val_t q_cf = MUL(pre, outs[8]);
  pj_val_t r = upper ? SEL(use_series, SUB(one, p_series), q_cf)
                     : SEL(use_series, p_series, SUB(one, q_cf));
  /* edge cases as torch: nan for a < 0 or x < 0; a == 0; x == 0; infinities */
  double at_x0 = upper ? 1 : 0, at_xinf = upper ? 0 : 1;
  pj_val_t nanv = cst(L, a, NAN);
  r = SEL(CMP("EQ", x, cst(L, x, INFINITY)), cst(L, x, at_xinf), r);
  r = SEL(CMP("EQ", a, cst(L, a, INFINITY)),
          SEL(CMP("EQ", x, cst(L, x, INFINITY)), nanv, cst(L, x, at_x0)), r);
  r = SEL(CMP("EQ", x, cst(L, x, 0)), cst(L, x, at_x0), r);
  r = SEL(CMP("EQ", a, cst(L, a, 0)),
          SEL(CMP("GT", x, cst(L, x, 0)), cst(L, x, at_xinf), nanv), r);
  r = SEL(OR(CMP("LT", a, cst(L, a, 0)), CMP("LT", x, cst(L, x, 0))), nanv, r);
  r = SEL(OR(is_nan(L, a), is_nan(L, x)), nanv, r);
  return r;
}

static pj_status_t *lower_igamma(pj_lower_t *L) {
  pj_val_t a = f64_arg(L, "self"), x = f64_arg(L, "other");
  set_out(L, igamma_of(L, a, x, !strcmp(L->c->op, "igammac")));
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_special[] = {
    {"i0", lower_bessel_i, PJ_SHAPE_EXACT},
    {"special_i0e", lower_bessel_i, PJ_SHAPE_EXACT},
    {"special_i1", lower_bessel_i, PJ_SHAPE_EXACT},
    {"special_i1e", lower_bessel_i, PJ_SHAPE_EXACT},
    {"special_modified_bessel_i0", lower_bessel_i, PJ_SHAPE_EXACT},
    {"special_modified_bessel_i1", lower_bessel_i, PJ_SHAPE_EXACT},
    {"special_modified_bessel_k0", lower_bessel_k, PJ_SHAPE_EXACT},
    {"special_modified_bessel_k1", lower_bessel_k, PJ_SHAPE_EXACT},
    {"special_scaled_modified_bessel_k0", lower_bessel_k, PJ_SHAPE_EXACT},
    {"special_scaled_modified_bessel_k1", lower_bessel_k, PJ_SHAPE_EXACT},
    {"special_bessel_j0", lower_bessel_jy, PJ_SHAPE_EXACT},
    {"special_bessel_j1", lower_bessel_jy, PJ_SHAPE_EXACT},
    {"special_bessel_y0", lower_bessel_jy, PJ_SHAPE_EXACT},
    {"special_bessel_y1", lower_bessel_jy, PJ_SHAPE_EXACT},
    {"special_spherical_bessel_j0", lower_spherical_j0, PJ_SHAPE_EXACT},
    {"special_airy_ai", lower_airy_ai, PJ_SHAPE_EXACT},
    {"special_chebyshev_polynomial_t", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_chebyshev_polynomial_u", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_chebyshev_polynomial_v", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_chebyshev_polynomial_w", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_shifted_chebyshev_polynomial_t", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_shifted_chebyshev_polynomial_u", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_shifted_chebyshev_polynomial_v", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_shifted_chebyshev_polynomial_w", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_hermite_polynomial_h", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_hermite_polynomial_he", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_laguerre_polynomial_l", lower_orth_poly, PJ_SHAPE_EXACT},
    {"special_legendre_polynomial_p", lower_orth_poly, PJ_SHAPE_EXACT},
    {"gcd", lower_gcd_lcm, PJ_SHAPE_EXACT},
    {"lcm", lower_gcd_lcm, PJ_SHAPE_EXACT},
    {"frexp", lower_frexp, PJ_SHAPE_EXACT},
    {"polygamma", lower_polygamma, PJ_SHAPE_EXACT},
    {"special_zeta", lower_zeta, PJ_SHAPE_EXACT},
    {"nextafter", lower_nextafter, PJ_SHAPE_EXACT},
    {"special_erfcx", lower_erfcx, PJ_SHAPE_EXACT},
    {"special_ndtri", lower_ndtri, PJ_SHAPE_EXACT},
    {"special_log_ndtr", lower_log_ndtr, PJ_SHAPE_EXACT},
    {"igamma", lower_igamma, PJ_SHAPE_EXACT},
    {"igammac", lower_igamma, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
