/* Lowerings: linalg_eig family (eigenvalues and eigenvectors of general square matrices).
 *
 * StableHLO has no eigen-solver for nonsymmetric matrices, so this is the textbook complex QR
 * algorithm written as stablehlo.while loops over whole batched matrices ([B, n, n], leading
 * dims flattened), computed in the complex dtype of the result (complex64 for float32 and
 * complex64 inputs, complex128 for float64 and complex128):
 *  1. Hessenberg reduction A = Q Hm Q^H by n-2 Householder reflectors P = I - 2 u u^H / u^H u
 *     (Hermitian and unitary), applied from both sides, Q accumulated.
 *  2. Single-shift QR iteration on the complex Hessenberg matrix until it is upper triangular
 *     (the complex Schur form T = Q^H A Q). Every outer iteration first sets negligible
 *     subdiagonal entries to zero (|h(j+1,j)| <= eps (|h(j,j)| + |h(j+1,j+1)|), in |re|+|im|),
 *     which deflates: each matrix keeps its own active window [lo, hi), hi the end of the last
 *     unreduced block and lo its start. Then one implicit QR step per active matrix: the
 *     Wilkinson shift (the eigenvalue of the window's trailing 2x2 block nearer its last
 *     diagonal entry, or an exceptional shift after every 10 steps without deflation, which
 *     breaks the cycles of e.g. permutation matrices), and a bulge chase of Givens rotations
 *     k = lo .. hi-2 applied as similarities to whole rows and columns (the full Schur form,
 *     not only the window, because the eigenvectors need all of T) and accumulated into Q.
 *     The iterations are bounded (30 max(10, n) outer steps), so no input can hang the loop; a
 *     NaN subdiagonal counts as deflated, so NaN inputs end at once with NaN results.
 *  3. Eigenvalues: the diagonal of T, in the order the iteration leaves them (LAPACK's order
 *     differs; the set is the same).
 *  4. Eigenvectors: for every k the upper triangular system (T - t_kk I) x = 0 with x_k = 1,
 *     x_j = 0 for j > k, solved for all k at once by back substitution one row at a time; a
 *     denominator t_ii - t_kk smaller than smin = max(eps |t_kk|, smlnum) is replaced by smin,
 *     as LAPACK's trevc does for repeated eigenvalues. Columns are rescaled to max 1 after each
 *     row (the system is homogeneous in each column, so the scale is free and cannot overflow).
 *     V = Q X; each column is normalized to unit 2-norm and multiplied by the phase that makes
 *     its component of largest modulus (the first one, on ties) real and positive, LAPACK's
 *     convention "unit norm, largest component real" (for real eigenvalues of real inputs the
 *     vector is then real up to rounding).
 * The input is first scaled to largest modulus 1 (eigenvalues scaled back at the end), so
 * matrices near the under- or overflow threshold lose nothing in the squares of the reflector
 * norms and shifts.
 * Not done (LAPACK's geev does them): balancing of the input, and the check that
 * the input has no Inf/NaN (CPU raises; that needs a device-to-host sync the lowering cannot
 * make). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"
#include "emit.h"
#include "linalg_util.h"

/* Smallest safe magnitude for divisions: LAPACK's smlnum = unfl * (n / ulp). */
static double smlnum_of(pj_dtype_t dt, int64_t n) {
  bool dbl = dt == PJ_C128 || dt == PJ_F64;
  double unfl = dbl ? DBL_MIN : FLT_MIN;
  return unfl * ((double)(n > 1 ? n : 1) / eps_of(dt));
}

/* Real r (of the complex dtype's real type) as a complex value with zero imaginary part. */
static pj_val_t as_cplx(pj_lower_t *L, pj_val_t r, pj_dtype_t dt) {
  return mkcomplex(L, r, zeros(L, r.t), dt);
}

/* ---- 1. Hessenberg reduction ----
 * state: Hm [B,n,n], Q [B,n,n]; step k zeros column k below row k+1. */
static void hess_step(pj_lower_t *L, pj_val_t k, pj_val_t *st, void *ctx) {
  (void)ctx;
  pj_val_t Hm = st[0], Q = st[1];
  pj_dtype_t dt = Hm.t.dtype, rt = real_of(dt);
  int64_t B = Hm.t.dims[0], n = Hm.t.dims[1];
  pj_type_t vn = ty(dt, 2, B, n, 0), vb = ty(dt, 1, B, 0, 0), rb = ty(rt, 1, B, 0, 0);
  pj_val_t rows = iota(L, vn, 1);
  pj_val_t k1 = ADD(k, ci(L, 1));
  pj_val_t col = col_at(L, Hm, k);
  pj_val_t x = SEL(CMP("GT", rows, bs(L, k, rows.t)), col, zeros(L, vn)); /* rows k+1.. */
  pj_val_t alpha = elt_at(L, col, k1);
  pj_val_t ax = U("abs", x);
  pj_val_t xnorm = U("sqrt", sum1(L, MUL(ax, ax), 1)); /* [B] real */
  pj_val_t aa = U("abs", alpha);
  pj_val_t az = CMP("EQ", aa, zeros(L, rb));
  /* u = x + phase(alpha) |x| e_{k+1}: the sign that avoids cancellation in u's first entry */
  pj_val_t phase = SEL(az, pj_full(H, vb, 1), DIV(alpha, as_cplx(L, SEL(az, pj_full(H, rb, 1), aa), dt)));
  pj_val_t lead = MUL(phase, as_cplx(L, xnorm, dt)); /* P x = -lead e_{k+1} */
  pj_val_t atk1 = CMP("EQ", rows, bs(L, k1, rows.t));
  pj_val_t u = ADD(x, SEL(atk1, bdims(L, lead, vn, 0, -1), zeros(L, vn)));
  pj_val_t au = U("abs", u);
  pj_val_t un2 = sum1(L, MUL(au, au), 1);
  pj_val_t uz = CMP("EQ", un2, zeros(L, rb));
  /* f = 2 / u^H u, 0 when x is already zero (P = I) */
  pj_val_t f = as_cplx(L, SEL(uz, zeros(L, rb), DIV(pj_full(H, rb, 2), SEL(uz, pj_full(H, rb, 1), un2))), dt);
  pj_val_t fu = MUL(u, bdims(L, f, vn, 0, -1)), cu = conj_(L, u);
  int64_t b0 = 0, one = 1, two = 2;
  /* Hm <- P Hm: Hm -= (f u) (u^H Hm) */
  pj_val_t w = pj_dot_general(H, cu, Hm, &b0, &b0, 1, &one, &one, 1, dt); /* [B,n] */
  Hm = SUB(Hm, MUL(bdims(L, fu, Hm.t, 0, 1), bdims(L, w, Hm.t, 0, 2)));
  /* Hm <- Hm P: Hm -= (Hm u) (f u)^H; P is Hermitian, so (f u)^H = f conj(u) with f real */
  pj_val_t z = pj_dot_general(H, Hm, u, &b0, &b0, 1, &two, &one, 1, dt);
  pj_val_t fcu = conj_(L, fu);
  Hm = SUB(Hm, MUL(bdims(L, z, Hm.t, 0, 1), bdims(L, fcu, Hm.t, 0, 2)));
  pj_val_t zq = pj_dot_general(H, Q, u, &b0, &b0, 1, &two, &one, 1, dt);
  Q = SUB(Q, MUL(bdims(L, zq, Q.t, 0, 1), bdims(L, fcu, Q.t, 0, 2)));
  /* column k below the subdiagonal is zero by construction: make it exactly zero */
  pj_val_t r3 = iota(L, Hm.t, 1), c3 = iota(L, Hm.t, 2);
  pj_val_t below = AND(CMP("EQ", c3, bs(L, k, c3.t)), CMP("GT", r3, bs(L, k1, r3.t)));
  st[0] = SEL(below, zeros(L, Hm.t), Hm);
  st[1] = Q;
}

/* ---- 2. shifted QR iteration ---- */

/* Eigenvalue of [[a, b], [c, d]] ([B] complex each) nearer d: d - bc / (h + s), with
 * h = (a - d)/2, s = +-sqrt(h^2 + bc) signed so that |h + s| is the larger of |h +- s| (no
 * cancellation). Computed on the block scaled by its size (no overflow in h^2). */
static pj_val_t wilkinson(pj_lower_t *L, pj_val_t a, pj_val_t b, pj_val_t c, pj_val_t d) {
  pj_dtype_t dt = a.t.dtype;
  pj_type_t rb = pj_type_with_dtype(a.t, real_of(dt));
  pj_val_t s = ADD(ADD(pivmag(L, a), pivmag(L, b)), ADD(pivmag(L, c), pivmag(L, d)));
  pj_val_t s0 = CMP("EQ", s, zeros(L, rb));
  pj_val_t sc = as_cplx(L, SEL(s0, pj_full(H, rb, 1), s), dt);
  a = DIV(a, sc), b = DIV(b, sc), c = DIV(c, sc), d = DIV(d, sc);
  pj_val_t h = MUL(SUB(a, d), pj_full(H, a.t, 0.5));
  pj_val_t bc = MUL(b, c);
  pj_val_t disc = U("sqrt", ADD(MUL(h, h), bc));
  pj_val_t dot = ADD(MUL(U("real", h), U("real", disc)), MUL(U("imag", h), U("imag", disc)));
  pj_val_t den = SEL(CMP("GE", dot, zeros(L, rb)), ADD(h, disc), SUB(h, disc));
  pj_val_t dz = CMP("EQ", pivmag(L, den), zeros(L, rb));
  pj_val_t corr = SEL(dz, zeros(L, a.t), DIV(bc, SEL(dz, pj_full(H, a.t, 1), den)));
  return MUL(SUB(d, corr), sc);
}

/* Rotation G = [[c, s], [-conj(s), c]] (c real >= 0, c^2 + |s|^2 = 1) with G [x; y] = [r; 0],
 * for [B] complex x, y; the identity when both are zero. */
static void givens(pj_lower_t *L, pj_val_t x, pj_val_t y, pj_val_t *c, pj_val_t *s) {
  pj_dtype_t dt = x.t.dtype;
  pj_type_t rb = pj_type_with_dtype(x.t, real_of(dt));
  pj_val_t ax = U("abs", x), ay = U("abs", y);
  pj_val_t r = U("abs", mkcomplex(L, ax, ay, dt)); /* hypot(|x|, |y|) without overflow */
  pj_val_t one = pj_full(H, rb, 1), zr = zeros(L, rb);
  pj_val_t rz = CMP("EQ", r, zr), xz = CMP("EQ", ax, zr);
  pj_val_t rs = SEL(rz, one, r);
  pj_val_t px = SEL(xz, pj_full(H, x.t, 1), DIV(x, as_cplx(L, SEL(xz, one, ax), dt)));
  *c = SEL(rz, one, DIV(ax, rs));
  *s = SEL(rz, zeros(L, x.t), DIV(MUL(px, conj_(L, y)), as_cplx(L, rs, dt)));
}

/* One rotation of the bulge chase. state: Hm, Q [B,n,n]; k, lo, hi [B] i32; sigma [B];
 * act [B] bool (the matrix takes a QR step this outer iteration). Rotation k acts on rows and
 * columns k, k+1: the first (k == lo) is determined by the shifted first column of the window,
 * the others zero the bulge Hm[k+1, k-1]. */
static void chase_step(pj_lower_t *L, pj_val_t it, pj_val_t *st, void *ctx) {
  (void)it;
  (void)ctx;
  pj_val_t Hm = st[0], Q = st[1], k = st[2], lo = st[3], hi = st[4], sigma = st[5], act = st[6];
  pj_dtype_t dt = Hm.t.dtype;
  int64_t n = Hm.t.dims[1];
  pj_type_t vb = k.t, t3 = Hm.t, vn = ty(dt, 2, t3.dims[0], n, 0);
  pj_val_t one = pj_full(H, vb, 1);
  pj_val_t kact = AND(act, CMP("LE", k, SUB(hi, pj_full(H, vb, 2))));
  pj_val_t kc = MIN(MAX(k, zeros(L, vb)), pj_full(H, vb, (double)(n - 2)));
  pj_val_t k1 = ADD(kc, one), km1 = MAX(SUB(kc, one), zeros(L, vb));
  pj_val_t first = CMP("EQ", k, lo);
  pj_val_t rk = rowv(L, Hm, kc), rk1 = rowv(L, Hm, k1);
  pj_val_t x = SEL(first, SUB(pick(L, rk, kc), sigma), pick(L, rk, km1));
  pj_val_t y = SEL(first, pick(L, rk1, kc), pick(L, rk1, km1));
  pj_val_t c, s;
  givens(L, x, y, &c, &s);
  pj_val_t cc = bdims(L, as_cplx(L, c, dt), vn, 0, -1), sv = bdims(L, s, vn, 0, -1);
  pj_val_t csv = conj_(L, sv);
  pj_val_t r3 = iota(L, t3, 1), c3 = iota(L, t3, 2);
  pj_val_t isk_r = CMP("EQ", r3, bk(L, kc, t3, -1)), isk1_r = CMP("EQ", r3, bk(L, k1, t3, -1));
  pj_val_t isk_c = CMP("EQ", c3, bk(L, kc, t3, -1)), isk1_c = CMP("EQ", c3, bk(L, k1, t3, -1));
  /* rows: G Hm */
  pj_val_t nrk = ADD(MUL(cc, rk), MUL(sv, rk1));
  pj_val_t nrk1 = SUB(MUL(cc, rk1), MUL(csv, rk));
  pj_val_t Hn = SEL(isk_r, bdims(L, nrk, t3, 0, 2), SEL(isk1_r, bdims(L, nrk1, t3, 0, 2), Hm));
  /* columns: (G Hm) G^H, and Q G^H */
  pj_val_t *mats[2] = {&Hn, &Q};
  pj_val_t outs[2];
  for (int m = 0; m < 2; m++) {
    pj_val_t M = *mats[m];
    pj_val_t ck = colv(L, M, kc), ck1 = colv(L, M, k1);
    pj_val_t nck = ADD(MUL(cc, ck), MUL(csv, ck1));
    pj_val_t nck1 = SUB(MUL(cc, ck1), MUL(sv, ck));
    outs[m] = SEL(isk_c, bdims(L, nck, t3, 0, 1), SEL(isk1_c, bdims(L, nck1, t3, 0, 1), M));
  }
  /* the chased bulge is zero by construction */
  pj_val_t bulge = AND(AND(isk1_r, CMP("EQ", c3, bk(L, km1, t3, -1))),
                       bdims(L, U("not", first), pj_type_with_dtype(t3, PJ_BOOL), 0, -1));
  Hn = SEL(bulge, zeros(L, t3), outs[0]);
  pj_val_t ka3 = bdims(L, kact, pj_type_with_dtype(t3, PJ_BOOL), 0, -1);
  st[0] = SEL(ka3, Hn, Hm);
  st[1] = SEL(ka3, outs[1], Q);
  st[2] = ADD(k, one);
}

static pj_val_t chase_more(pj_lower_t *L, pj_val_t *st, void *ctx) {
  (void)ctx;
  pj_val_t k = st[2], hi = st[4], act = st[6];
  pj_val_t more = AND(act, CMP("LE", k, SUB(hi, pj_full(H, hi.t, 2))));
  int64_t z = 0;
  return pj_reduce(H, more, &z, 1, "or");
}

/* One outer iteration. state: Hm, Q [B,n,n]; hi [B] i32 (end of the active window, < 2 when
 * the matrix is triangular); its [B] i32 (QR steps since the last deflation). */
static void qr_iter(pj_lower_t *L, pj_val_t it, pj_val_t *st, void *ctx) {
  (void)it;
  (void)ctx;
  pj_val_t Hm = st[0], Q = st[1], hi = st[2], its = st[3];
  pj_dtype_t dt = Hm.t.dtype, rt = real_of(dt);
  pj_type_t t3 = Hm.t, rt3 = pj_type_with_dtype(t3, rt), vb = hi.t;
  int64_t B = t3.dims[0], n = t3.dims[1];
  pj_type_t vi = ty(PJ_I32, 2, B, n, 0);
  pj_val_t r3 = iota(L, t3, 1), c3 = iota(L, t3, 2);
  pj_val_t ah = pivmag(L, Hm);
  pj_val_t d = diag3(L, ah); /* [B,n] */
  pj_val_t tst = ADD(bdims(L, d, rt3, 0, 1), bdims(L, d, rt3, 0, 2));
  pj_val_t sub = CMP("EQ", r3, ADD(c3, pj_full(H, c3.t, 1)));
  double eps = eps_of(dt);
  pj_val_t negl = OR(CMP("LE", ah, MUL(tst, pj_full(H, rt3, eps))),
                     CMP("LE", ah, pj_full(H, rt3, smlnum_of(dt, n))));
  negl = AND(sub, negl);
  Hm = SEL(negl, zeros(L, t3), Hm);
  /* nzj[b, j]: subdiagonal entry (j+1, j) still nonzero (NaN counts as zero: it deflates) */
  pj_val_t nz3 = AND(AND(sub, U("not", negl)), CMP("GT", ah, zeros(L, rt3)));
  int64_t one_d = 1;
  pj_val_t nzj = pj_reduce(H, nz3, &one_d, 1, "or");
  pj_val_t J = pj_iota(H, vi, 1);
  pj_val_t one = pj_full(H, vb, 1), two = pj_full(H, vb, 2), zb = zeros(L, vb);
  /* new end: after the last nonzero subdiagonal entry inside the old window (else 0) */
  pj_val_t inwin = CMP("LT", J, bk(L, SUB(hi, one), vi, -1));
  pj_val_t hin = pj_reduce(H, SEL(AND(inwin, nzj), ADD(J, pj_full(H, vi, 2)), zeros(L, vi)),
                           &one_d, 1, "max");
  its = SEL(CMP("NE", hin, hi), zb, its);
  hi = hin;
  pj_val_t act = CMP("GE", hi, two);
  /* start: after the last zero subdiagonal entry before the new end (else 0) */
  pj_val_t inw2 = CMP("LT", J, bk(L, SUB(hi, one), vi, -1));
  pj_val_t lo = pj_reduce(H, SEL(AND(inw2, U("not", nzj)), ADD(J, pj_full(H, vi, 1)), zeros(L, vi)),
                          &one_d, 1, "max");
  /* shift from the window's trailing 2x2 block */
  pj_val_t h1 = MAX(SUB(hi, two), zb), h2 = MAX(SUB(hi, one), zb);
  pj_val_t ra = rowv(L, Hm, h1), rb = rowv(L, Hm, h2);
  pj_val_t a = pick(L, ra, h1), b = pick(L, ra, h2), c = pick(L, rb, h1), dd = pick(L, rb, h2);
  pj_val_t sigma = wilkinson(L, a, b, c, dd);
  pj_val_t exc = AND(CMP("GT", its, zb),
                     CMP("EQ", pj_binary(H, "stablehlo.remainder", its, pj_full(H, vb, 10)), zb));
  pj_type_t rbt = pj_type_with_dtype(vb, rt);
  pj_val_t sexc = ADD(dd, as_cplx(L, MUL(pivmag(L, c), pj_full(H, rbt, 0.75)), dt));
  sigma = SEL(exc, sexc, sigma);
  pj_val_t ist[7] = {Hm, Q, lo, lo, hi, sigma, act};
  loop_while(L, n - 1, ist, 7, chase_step, chase_more, NULL);
  st[0] = ist[0];
  st[1] = ist[1];
  st[2] = hi;
  st[3] = SEL(act, ADD(its, one), its);
}

static pj_val_t qr_more(pj_lower_t *L, pj_val_t *st, void *ctx) {
  (void)ctx;
  pj_val_t hi = st[2];
  int64_t z = 0;
  return pj_reduce(H, CMP("GE", hi, pj_full(H, hi.t, 2)), &z, 1, "or");
}

/* Complex Schur form: *T = Q^H A Q upper triangular, *Q unitary. A3 [B,n,n] complex, n >= 2. */
static void schur(pj_lower_t *L, pj_val_t A3, pj_val_t *T, pj_val_t *Q) {
  int64_t B = A3.t.dims[0], n = A3.t.dims[1];
  pj_val_t st[4] = {A3, eye3(L, A3.t.dtype, B, n, n)};
  if (n > 2) loop(L, n - 2, st, 2, hess_step, NULL);
  st[0] = tri(L, st[0], false, -1); /* Hessenberg: exact zeros below the subdiagonal */
  pj_type_t vb = ty(PJ_I32, 1, B, 0, 0);
  st[2] = pj_full(H, vb, (double)n);
  st[3] = zeros(L, vb);
  loop_while(L, 30 * (n > 10 ? n : 10), st, 4, qr_iter, qr_more, NULL);
  *T = tri(L, st[0], false, 0);
  *Q = st[1];
}

/* ---- 4. eigenvectors of T ----
 * state: X [B,n,n] (column k: eigenvector of T for t_kk, rows > i final), T [B,n,n].
 * Iteration it computes row i = n-1-it of every column k > i. */
static void trevc_step(pj_lower_t *L, pj_val_t it, pj_val_t *st, void *ctx) {
  (void)ctx;
  pj_val_t X = st[0], T = st[1];
  pj_dtype_t dt = X.t.dtype, rt = real_of(dt);
  int64_t B = X.t.dims[0], n = X.t.dims[1];
  pj_type_t vn = ty(dt, 2, B, n, 0), rn = pj_type_with_dtype(vn, rt);
  pj_val_t i = SUB(ci(L, n - 1), it);
  pj_val_t r3 = iota(L, X.t, 1);
  pj_val_t J = iota(L, vn, 1);
  pj_val_t right = CMP("GT", J, bs(L, i, J.t));
  pj_val_t rowT = SEL(right, sum1(L, SEL(CMP("EQ", r3, bs(L, i, r3.t)), T, zeros(L, T.t)), 1),
                      zeros(L, vn));
  int64_t b0 = 0, one = 1;
  pj_val_t s = pj_dot_general(H, rowT, X, &b0, &b0, 1, &one, &one, 1, dt); /* [B,n] */
  pj_val_t lam = diag3(L, T);
  pj_val_t den = SUB(bdims(L, elt_at(L, lam, i), vn, 0, -1), lam);
  pj_val_t smin = MAX(MUL(pivmag(L, lam), pj_full(H, rn, eps_of(dt))), pj_full(H, rn, smlnum_of(dt, n)));
  den = SEL(CMP("LT", pivmag(L, den), smin), as_cplx(L, smin, dt), den);
  pj_val_t xi = U("negate", DIV(s, den));
  pj_val_t rowX = sum1(L, SEL(CMP("EQ", r3, bs(L, i, r3.t)), X, zeros(L, X.t)), 1);
  pj_val_t nrow = SEL(right, xi, rowX);
  X = SEL(CMP("EQ", r3, bs(L, i, r3.t)), bdims(L, nrow, X.t, 0, 2), X);
  /* rescale every column to largest |re|+|im| = 1 (zero columns cannot occur: x_kk != 0) */
  pj_val_t cm = pj_reduce(H, pivmag(L, X), &one, 1, "max"); /* [B,n] */
  pj_val_t ok = AND(CMP("GT", cm, zeros(L, rn)), CMP("LT", cm, pj_full(H, rn, INFINITY)));
  cm = SEL(ok, cm, pj_full(H, rn, 1));
  st[0] = DIV(X, bdims(L, as_cplx(L, cm, dt), X.t, 0, 2));
}

/* Eigenvectors V [B,n,n] of A = Q T Q^H: unit 2-norm columns, largest component real > 0. */
static pj_val_t eigvecs(pj_lower_t *L, pj_val_t T, pj_val_t Q) {
  pj_dtype_t dt = T.t.dtype, rt = real_of(dt);
  int64_t B = T.t.dims[0], n = T.t.dims[1];
  pj_val_t st[2] = {eye3(L, dt, B, n, n), T};
  loop(L, n, st, 2, trevc_step, NULL);
  pj_val_t V = bmm(L, Q, st[0]);
  pj_type_t rt3 = pj_type_with_dtype(V.t, rt), rn = ty(rt, 2, B, n, 0);
  pj_val_t re = U("real", V), im = U("imag", V);
  pj_val_t m2 = ADD(MUL(re, re), MUL(im, im));
  int64_t one = 1;
  pj_val_t nrm = U("sqrt", sum1(L, m2, 1)); /* [B,n] */
  pj_val_t nz = CMP("GT", nrm, zeros(L, rn));
  V = DIV(V, bdims(L, as_cplx(L, SEL(nz, nrm, pj_full(H, rn, 1)), dt), V.t, 0, 2));
  pj_val_t mx = pj_reduce(H, m2, &one, 1, "max");
  pj_val_t r3 = iota(L, V.t, 1);
  pj_val_t ti3 = r3;
  pj_val_t big = AND(CMP("EQ", m2, bdims(L, mx, rt3, 0, 2)), CMP("GT", m2, zeros(L, rt3)));
  pj_val_t idx = pj_reduce(H, SEL(big, ti3, pj_full(H, ti3.t, (double)n)), &one, 1, "min");
  pj_val_t at = CMP("EQ", r3, bdims(L, idx, ti3.t, 0, 2));
  pj_val_t vk = sum1(L, SEL(at, V, zeros(L, V.t)), 1); /* [B,n]; 0 when no entry is largest */
  pj_val_t avk = U("abs", vk);
  pj_val_t vz = CMP("EQ", avk, zeros(L, rn));
  pj_type_t vn = ty(dt, 2, B, n, 0);
  pj_val_t ph = SEL(vz, pj_full(H, vn, 1), DIV(conj_(L, vk), as_cplx(L, SEL(vz, pj_full(H, rn, 1), avk), dt)));
  V = MUL(V, bdims(L, ph, V.t, 0, 2));
  /* that component is real by construction: drop its rounding residue */
  return SEL(at, as_cplx(L, U("real", V), dt), V);
}

/* linalg_eig(self) -> (eigenvalues, eigenvectors) and _linalg_eigvals(self) -> eigenvalues;
 * linalg_eigvals reaches the device only as its out= overload (the functional form is
 * composite over _linalg_eigvals). Shapes, dtypes and the square check come from the Meta
 * kernels. */
static pj_status_t *lower_eig(pj_lower_t *L) {
  bool vectors = pj_nout(L) > 1;
  pj_val_t A = pj_tensor(L, "self");
  if (A.id < 0) return NULL;
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  if (!cplx(dt) || A.t.rank < 2) {
    pj_fail(L, PJ_ERR_RUNTIME, "linalg.eig: internal: unexpected result dtype or rank");
    return NULL;
  }
  pj_val_t A3 = to3(L, pj_convert(H, A, dt));
  int64_t B = A3.t.dims[0], n = A3.t.dims[1];
  if (B == 0 || n == 0) {
    for (int k = 0; k < pj_nout(L); k++) set_out(L, k, zeros(L, pj_out_type(L, k)));
    return NULL;
  }
  /* scaled to largest modulus 1 (as geev scales inputs whose norm is near under- or
   * overflow): the squares in the reflector norms and shifts then stay in range */
  pj_type_t rt3 = pj_type_with_dtype(A3.t, real_of(dt)), rb = ty(real_of(dt), 1, B, 0, 0);
  int64_t d12[2] = {1, 2};
  pj_val_t mx = pj_reduce(H, U("abs", A3), d12, 2, "max");
  pj_val_t ok = AND(CMP("GT", mx, zeros(L, rb)), CMP("LT", mx, pj_full(H, rb, INFINITY)));
  mx = SEL(ok, mx, pj_full(H, rb, 1)); /* zero, Inf or NaN: unscaled */
  A3 = DIV(A3, as_cplx(L, bdims(L, mx, rt3, 0, -1), dt));
  pj_val_t T = A3, Q = eye3(L, dt, B, n, n);
  if (n >= 2) schur(L, A3, &T, &Q);
  pj_val_t w = diag3(L, T);
  set_out(L, 0, MUL(w, as_cplx(L, bdims(L, mx, pj_type_with_dtype(w.t, real_of(dt)), 0, -1), dt)));
  if (vectors) set_out(L, 1, n >= 2 ? eigvecs(L, T, Q) : Q);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_linalg_eig[] = {
    {"linalg_eig", lower_eig, PJ_SHAPE_EXACT},
    {"_linalg_eigvals", lower_eig, PJ_SHAPE_EXACT},
    {"linalg_eigvals", lower_eig, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
