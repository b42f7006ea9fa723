/* Lowerings: linalg_decomp family (matrix decompositions and the solvers built on them).
 *
 * StableHLO has cholesky and triangular_solve; every other factorization here is our own
 * algorithm written as stablehlo.while loops over whole batched matrices, so it runs on any
 * PJRT plugin:
 *  - LU with partial pivoting (getrf): one column per iteration, the pivot is the first row of
 *    largest magnitude (|re|+|im| for complex, as LAPACK's i?amax), multipliers are scaled by
 *    the pivot's reciprocal. Pivots are LAPACK's 1-based int32; info is the 1-based index of
 *    the first zero pivot, else 0. solve/inv/det/slogdet/lu_solve/lu_unpack build on it.
 *  - Householder QR (geqrf) with LAPACK's reflector convention (beta = -sign(re alpha)*norm,
 *    tau = (beta - alpha)/beta, v(0) = 1), so R, Q, the reflectors and tau agree with LAPACK's
 *    up to rounding, signs included. householder_product and ormqr apply the reflectors.
 *  - Symmetric/Hermitian eigenproblem: parallel cyclic Jacobi (round-robin pairing, n/2
 *    disjoint rotations per round applied as one rotation matrix), eigenvalues ascending.
 *    Eigenvectors are defined up to a sign (phase) per vector, as with LAPACK.
 *  - SVD: Householder QR of the (tall) matrix, one-sided Jacobi on R, then a QR of the rotated
 *    columns gives an orthonormal U even for zero singular values.
 *  - matrix_exp (scaling and squaring over a Taylor polynomial), lstsq (gels/gelsy through QR),
 *    ldl_factor/ldl_solve (Bunch-Kaufman as LAPACK's sytf2/sytrs).
 *
 * Matrices are handled as [B, m, n] (leading dims flattened). Loop bodies only use their carried
 * values and constants made inside the body (no implicit captures).
 * Compute dtype is the input's (float32/float64; complex64/128 where the algorithm allows). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"
#include "emit.h"
#include "linalg_util.h"

/* The while-loop builder declared in linalg_util.h. */
void pj_linalg_loop_while(pj_lower_t *L, int64_t n, pj_val_t *st, int ns, body_fn body,
                          cond_fn cond, void *ctx) {
  if (!pj_hlo_ok(H)) return;
  if (ns > MAX_STATE) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: loop state too large");
    return;
  }
  pj_type_t ts[MAX_STATE + 1];
  pj_val_t ins[MAX_STATE + 1], args[MAX_STATE + 1], outs[MAX_STATE + 1];
  ins[0] = ci(L, 0);
  ts[0] = ins[0].t;
  for (int i = 0; i < ns; i++) {
    ins[i + 1] = st[i];
    ts[i + 1] = st[i].t;
  }
  pj_hlo_region_begin(H, ts, ns + 1, args);
  pj_val_t c = CMP("LT", args[0], ci(L, n));
  if (cond) c = AND(c, cond(L, args + 1, ctx));
  char *cr = pj_hlo_region_end(H, &c, 1);
  pj_hlo_region_begin(H, ts, ns + 1, args);
  pj_val_t nst[MAX_STATE + 1];
  for (int i = 0; i < ns; i++) nst[i + 1] = args[i + 1];
  body(L, args[0], nst + 1, ctx);
  nst[0] = ADD(args[0], ci(L, 1));
  char *br = pj_hlo_region_end(H, nst, ns + 1);
  if (cr && br) {
    size_t len = strlen(cr) + strlen(br) + 4;
    char *both = malloc(len);
    if (both) {
      snprintf(both, len, "%s, %s", cr, br);
      pj_hlo_op_multi(H, "stablehlo.while", ins, ns + 1, both, NULL, ts, ns + 1, outs);
      free(both);
      for (int i = 0; i < ns; i++) st[i] = outs[i + 1];
    } else {
      pj_fail(L, PJ_ERR_OOM, "out of memory building a loop");
    }
  }
  free(cr);
  free(br);
}

/* ---- LU with partial pivoting ---- */

/* state: A [B,m,n], piv [B,K] i32, perm [B,m] i32, info [B] i32 */
static void lu_step(pj_lower_t *L, pj_val_t k, pj_val_t *st, void *ctx) {
  (void)ctx;
  pj_val_t A = st[0], piv = st[1], perm = st[2], info = st[3];
  int64_t B = A.t.dims[0], m = A.t.dims[1], n = A.t.dims[2];
  pj_type_t vm = ty(PJ_I32, 2, B, m, 0);
  pj_val_t rows = pj_iota(H, vm, 1);
  pj_val_t kk = bs(L, k, vm);
  pj_val_t col = col_at(L, A, k);
  pj_val_t mag = pivmag(L, col);
  mag = SEL(CMP("LT", rows, kk), pj_full(H, mag.t, -1), mag);
  int64_t one = 1;
  pj_val_t mx = pj_reduce(H, mag, &one, 1, "max");
  pj_val_t ismax = AND(CMP("EQ", mag, bdims(L, mx, mag.t, 0, -1)), CMP("GE", rows, kk));
  pj_val_t p = pj_reduce(H, SEL(ismax, rows, pj_full(H, vm, (double)m)), &one, 1, "min");
  pj_type_t vb = ty(PJ_I32, 1, B, 0, 0);
  p = SEL(CMP("GE", p, pj_full(H, vb, (double)m)), bs(L, k, vb), p); /* all-NaN column */
  pj_val_t ek = CMP("EQ", rows, kk), ep = CMP("EQ", rows, bdims(L, p, vm, 0, -1));
  pj_val_t ek3 = bdims(L, ek, A.t, 0, 1), ep3 = bdims(L, ep, A.t, 0, 1);
  pj_val_t rowk = sum1(L, SEL(ek3, A, zeros(L, A.t)), 1);
  pj_val_t rowp = sum1(L, SEL(ep3, A, zeros(L, A.t)), 1);
  A = SEL(ek3, bdims(L, rowp, A.t, 0, 2), SEL(ep3, bdims(L, rowk, A.t, 0, 2), A));
  pj_val_t pk = sum1(L, SEL(ek, perm, zeros(L, vm)), 1), pp = sum1(L, SEL(ep, perm, zeros(L, vm)), 1);
  perm = SEL(ek, bdims(L, pp, vm, 0, -1), SEL(ep, bdims(L, pk, vm, 0, -1), perm));
  piv = set_elt(L, piv, k, ADD(p, pj_full(H, vb, 1)));
  pj_val_t pv = elt_at(L, rowp, k); /* [B] */
  pj_val_t nz = CMP("NE", pv, zeros(L, pv.t));
  info = SEL(AND(CMP("EQ", info, zeros(L, vb)), pj_unary(H, "stablehlo.not", nz)),
             bs(L, ADD(k, ci(L, 1)), vb), info);
  pj_val_t colk = col_at(L, A, k);
  pj_val_t rec = DIV(pj_full(H, pv.t, 1), pv);
  pj_val_t l = SEL(bdims(L, nz, colk.t, 0, -1), MUL(colk, bdims(L, rec, colk.t, 0, -1)), colk);
  pj_val_t below = CMP("GT", rows, kk);
  l = SEL(below, l, zeros(L, l.t));
  pj_type_t vn = ty(PJ_I32, 2, B, n, 0);
  pj_val_t cols = pj_iota(H, vn, 1);
  pj_val_t u = SEL(CMP("GT", cols, bs(L, k, vn)), rowp, zeros(L, rowp.t));
  A = SUB(A, MUL(bdims(L, l, A.t, 0, 1), bdims(L, u, A.t, 0, 2)));
  pj_val_t c3 = iota(L, A.t, 2), r3 = iota(L, A.t, 1);
  pj_val_t k3 = bs(L, k, c3.t);
  A = SEL(AND(CMP("EQ", c3, k3), CMP("GT", r3, k3)), bdims(L, l, A.t, 0, 1), A);
  st[0] = A;
  st[1] = piv;
  st[2] = perm;
  st[3] = info;
}

typedef struct {
  pj_val_t LU, piv, perm, info; /* [B,m,n], [B,K], [B,m], [B] */
} lu_t;

static lu_t lu_factor(pj_lower_t *L, pj_val_t A3) {
  int64_t B = A3.t.dims[0], m = A3.t.dims[1], n = A3.t.dims[2], K = m < n ? m : n;
  pj_val_t st[4] = {A3, zeros(L, ty(PJ_I32, 2, B, K, 0)), pj_iota(H, ty(PJ_I32, 2, B, m, 0), 1),
                    zeros(L, ty(PJ_I32, 1, B, 0, 0))};
  loop(L, K, st, 4, lu_step, NULL);
  lu_t r = {st[0], st[1], st[2], st[3]};
  return r;
}

/* state: perm [B,m], piv [B,K] */
static void perm_step(pj_lower_t *L, pj_val_t k, pj_val_t *st, void *ctx) {
  (void)ctx;
  pj_val_t perm = st[0], piv = st[1];
  pj_val_t p = SUB(elt_at(L, piv, k), pj_full(H, ty(PJ_I32, 1, perm.t.dims[0], 0, 0), 1));
  pj_val_t rows = pj_iota(H, perm.t, 1);
  pj_val_t ek = CMP("EQ", rows, bs(L, k, perm.t)), ep = CMP("EQ", rows, bdims(L, p, perm.t, 0, -1));
  pj_val_t pk = sum1(L, SEL(ek, perm, zeros(L, perm.t)), 1);
  pj_val_t pp = sum1(L, SEL(ep, perm, zeros(L, perm.t)), 1);
  st[0] = SEL(ek, bdims(L, pp, perm.t, 0, -1), SEL(ep, bdims(L, pk, perm.t, 0, -1), perm));
}

/* Row permutation [B,m] from LAPACK pivots [B,K] (1-based sequential swaps). */
static pj_val_t perm_from_pivots(pj_lower_t *L, pj_val_t piv, int64_t m) {
  int64_t B = piv.t.dims[0];
  pj_val_t st[2] = {pj_iota(H, ty(PJ_I32, 2, B, m, 0), 1), pj_convert(H, piv, PJ_I32)};
  loop(L, piv.t.dims[1], st, 2, perm_step, NULL);
  return st[0];
}

/* P with A = P L U: P[r, c] = (r == perm[c]). */
static pj_val_t perm_matrix(pj_lower_t *L, pj_val_t perm, pj_dtype_t dt) {
  int64_t B = perm.t.dims[0], m = perm.t.dims[1];
  pj_type_t t = ty(dt, 3, B, m, m);
  pj_val_t r = iota(L, t, 1), pc = bdims(L, perm, pj_type_with_dtype(t, PJ_I32), 0, 2);
  return SEL(CMP("EQ", r, pc), pj_full(H, t, 1), zeros(L, t));
}

static const char *tr_kind(bool adjoint, bool cx) {
  return !adjoint ? "NO_TRANSPOSE" : cx ? "ADJOINT" : "TRANSPOSE";
}

/* stablehlo.triangular_solve on [B,.,.] operands; a is masked to its triangle first. */
static pj_val_t trsolve(pj_lower_t *L, pj_val_t a, pj_val_t b, bool left, bool lower, bool unit,
                        bool adjoint) {
  a = tri(L, a, lower, 0);
  char attrs[200];
  snprintf(attrs, sizeof attrs,
           "left_side = %s, lower = %s, unit_diagonal = %s, "
           "transpose_a = #stablehlo<transpose %s>",
           left ? "true" : "false", lower ? "true" : "false", unit ? "true" : "false",
           tr_kind(adjoint, cplx(a.t.dtype)));
  pj_val_t ins[2] = {a, b};
  return pj_hlo_op(H, "stablehlo.triangular_solve", ins, 2, attrs, b.t);
}

/* Solves with an LU factorization: op(A) X = Bm (left) or X op(A) = Bm (right), with
 * A = P L U and op = identity or adjoint. All [B,.,.]. */
static pj_val_t lu_solve3(pj_lower_t *L, pj_val_t LU, pj_val_t perm, pj_val_t Bm, bool left,
                          bool adjoint) {
  pj_val_t P = perm_matrix(L, perm, LU.t.dtype);
  if (left && !adjoint) { /* X = U^-1 L^-1 P^T B */
    pj_val_t y = bmm(L, tr3(L, P), Bm);
    y = trsolve(L, LU, y, true, true, true, false);
    return trsolve(L, LU, y, true, false, false, false);
  }
  if (left) { /* A^H = U^H L^H P^T: X = P L^-H U^-H B */
    pj_val_t y = trsolve(L, LU, Bm, true, false, false, true);
    y = trsolve(L, LU, y, true, true, true, true);
    return bmm(L, P, y);
  }
  if (!adjoint) { /* X P L U = B: X = B U^-1 L^-1 P^T */
    pj_val_t y = trsolve(L, LU, Bm, false, false, false, false);
    y = trsolve(L, LU, y, false, true, true, false);
    return bmm(L, y, tr3(L, P));
  }
  /* X U^H L^H P^T = B: X = B P L^-H U^-H */
  pj_val_t y = bmm(L, Bm, P);
  y = trsolve(L, LU, y, false, true, true, true);
  return trsolve(L, LU, y, false, false, false, true);
}

static pj_status_t *lower_lu_factor_ex(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "A");
  if (A.id < 0) return NULL;
  if (!pj_bool(L, "pivot", true)) {
    pj_fail(L, PJ_ERR_RUNTIME, "linalg.lu_factor: LU without pivoting is not implemented on tpu");
    return NULL;
  }
  lu_t f = lu_factor(L, to3(L, A));
  set_out(L, 0, f.LU);
  set_out(L, 1, f.piv);
  set_out(L, 2, f.info);
  return NULL;
}

/* P, L, U from a factorization LU [B,m,n] and perm. */
static void unpack(pj_lower_t *L, pj_val_t LU, pj_val_t perm, int kP, int kL, int kU) {
  int64_t B = LU.t.dims[0], m = LU.t.dims[1], n = LU.t.dims[2], K = m < n ? m : n;
  if (kP >= 0 && perm.id >= 0) set_out(L, kP, perm_matrix(L, perm, LU.t.dtype));
  pj_val_t Lm = slice3(L, LU, m, K);
  Lm = ADD(tri(L, Lm, true, 1), eye3(L, LU.t.dtype, B, m, K));
  set_out(L, kL, Lm);
  set_out(L, kU, tri(L, slice3(L, LU, K, n), false, 0));
}

static pj_status_t *lower_linalg_lu(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "A");
  if (A.id < 0) return NULL;
  bool pivot = pj_bool(L, "pivot", true);
  if (!pivot) {
    pj_fail(L, PJ_ERR_RUNTIME, "linalg.lu: LU without pivoting is not implemented on tpu");
    return NULL;
  }
  lu_t f = lu_factor(L, to3(L, A));
  unpack(L, f.LU, f.perm, 0, 1, 2);
  return NULL;
}

static pj_status_t *lower_lu_unpack(pj_lower_t *L) {
  pj_val_t LU = pj_tensor(L, "LU_data"), piv = pj_tensor(L, "LU_pivots");
  if (LU.id < 0 || piv.id < 0) return NULL;
  bool data = pj_bool(L, "unpack_data", true), pivots = pj_bool(L, "unpack_pivots", true);
  pj_val_t LU3 = to3(L, LU);
  int64_t m = LU3.t.dims[1];
  pj_val_t perm = {.id = -1};
  if (pivots) {
    int64_t B = 1, K = piv.t.dims[piv.t.rank - 1];
    for (int i = 0; i < piv.t.rank - 1; i++) B *= piv.t.dims[i];
    int64_t d[2] = {B, K};
    perm = perm_from_pivots(L, pj_reshape(H, piv, 2, d), m);
    set_out(L, 0, perm_matrix(L, perm, LU.t.dtype));
  } else {
    set_out(L, 0, zeros(L, pj_out_type(L, 0)));
  }
  if (data) {
    unpack(L, LU3, perm, -1, 1, 2);
  } else {
    set_out(L, 1, zeros(L, pj_out_type(L, 1)));
    set_out(L, 2, zeros(L, pj_out_type(L, 2)));
  }
  return NULL;
}

/* Batch shape of destination 0 without its last `keep` dims. */
static int out_batch(pj_lower_t *L, int k, int keep, int64_t *batch) {
  pj_type_t t = pj_out_type(L, k);
  int nb = t.rank - keep;
  for (int i = 0; i < nb; i++) batch[i] = t.dims[i];
  return nb;
}

static pj_val_t flat_piv(pj_lower_t *L, pj_val_t piv) {
  int64_t B = 1, K = piv.t.dims[piv.t.rank - 1];
  for (int i = 0; i < piv.t.rank - 1; i++) B *= piv.t.dims[i];
  int64_t d[2] = {B, K};
  return pj_reshape(H, piv, 2, d);
}

static pj_status_t *lower_lu_solve(pj_lower_t *L) {
  pj_val_t LU = pj_tensor(L, "LU"), piv = pj_tensor(L, "pivots"), Bm = pj_tensor(L, "B");
  if (LU.id < 0 || piv.id < 0 || Bm.id < 0) return NULL;
  bool left = pj_bool(L, "left", true), adjoint = pj_bool(L, "adjoint", false);
  int64_t batch[PJ_MAX_RANK];
  int nb = out_batch(L, 0, 2, batch);
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  LU = to3(L, bbatch(L, pj_convert(H, LU, dt), batch, nb, 2));
  piv = flat_piv(L, bbatch(L, piv, batch, nb, 1));
  Bm = to3(L, bbatch(L, pj_convert(H, Bm, dt), batch, nb, 2));
  pj_val_t perm = perm_from_pivots(L, piv, LU.t.dims[1]);
  set_out(L, 0, lu_solve3(L, LU, perm, Bm, left, adjoint));
  return NULL;
}

static pj_status_t *lower_solve_ex(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "A"), Bm = pj_tensor(L, "B");
  if (A.id < 0 || Bm.id < 0) return NULL;
  bool left = pj_bool(L, "left", true);
  pj_type_t rt = pj_out_type(L, 0), lt = pj_out_type(L, 1);
  pj_dtype_t dt = rt.dtype;
  /* B is a vector (one column) when it has rank 1, or A's rank - 1 and A's leading shape */
  bool vec = Bm.t.rank == 1;
  if (Bm.t.rank == A.t.rank - 1) {
    vec = true;
    for (int i = 0; i < Bm.t.rank; i++) vec = vec && Bm.t.dims[i] == A.t.dims[i];
  }
  /* LU keeps A's own batch shape; the solve runs over the broadcast batch of the result */
  pj_val_t A3 = to3(L, pj_convert(H, A, dt));
  lu_t f = lu_factor(L, A3);
  int64_t batch[PJ_MAX_RANK];
  int nb = rt.rank - (vec ? 1 : 2);
  for (int i = 0; i < nb; i++) batch[i] = rt.dims[i];
  int64_t n = A3.t.dims[1];
  pj_val_t LUb = to3(L, bbatch(L, pj_reshape(H, f.LU, lt.rank, lt.dims), batch, nb, 2));
  int64_t pd[PJ_MAX_RANK];
  for (int i = 0; i < lt.rank - 1; i++) pd[i] = lt.dims[i];
  pd[lt.rank - 1] = n;
  pj_val_t perm = flat_piv(L, bbatch(L, pj_reshape(H, f.perm, lt.rank - 1, pd), batch, nb, 1));
  Bm = pj_convert(H, Bm, dt);
  pj_val_t B3;
  if (vec) {
    Bm = bbatch(L, Bm, batch, nb, 1);
    int64_t d[3] = {LUb.t.dims[0], n, 1};
    B3 = pj_reshape(H, Bm, 3, d);
  } else {
    B3 = to3(L, bbatch(L, Bm, batch, nb, 2));
  }
  pj_val_t X = lu_solve3(L, LUb, perm, B3, left, false);
  set_out(L, 0, X);
  set_out(L, 1, f.LU);
  set_out(L, 2, f.piv);
  set_out(L, 3, f.info);
  return NULL;
}

static pj_status_t *lower_inv_ex(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "A");
  if (A.id < 0) return NULL;
  pj_val_t A3 = to3(L, pj_convert(H, A, pj_out_type(L, 0).dtype));
  lu_t f = lu_factor(L, A3);
  int64_t B = A3.t.dims[0], n = A3.t.dims[1];
  pj_val_t X = lu_solve3(L, f.LU, f.perm, eye3(L, A3.t.dtype, B, n, n), true, false);
  set_out(L, 0, X);
  set_out(L, 1, f.info);
  return NULL;
}

/* (-1)^(number of pivots that swap) as [B] of dtype dt. */
static pj_val_t pivot_sign(pj_lower_t *L, pj_val_t piv, pj_dtype_t dt) {
  pj_val_t want = ADD(pj_iota(H, piv.t, 1), pj_full(H, piv.t, 1));
  pj_val_t sw = pj_convert(H, CMP("NE", piv, want), PJ_I32);
  pj_val_t cnt = sum1(L, sw, 1);
  pj_val_t odd = CMP("EQ", pj_binary(H, "stablehlo.and", cnt, pj_full(H, cnt.t, 1)),
                     pj_full(H, cnt.t, 1));
  pj_type_t t = pj_type_with_dtype(cnt.t, dt);
  return SEL(odd, pj_full(H, t, -1), pj_full(H, t, 1));
}

static pj_status_t *lower_det(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "A");
  if (A.id < 0) return NULL;
  pj_val_t A3 = to3(L, pj_convert(H, A, pj_out_type(L, 0).dtype));
  /* CPU factors A^T for real dtypes (its F-contiguous copy); det(A^T) = det(A), and the
   * backward reads the saved LU and pivots, so they must be the same factorization */
  lu_t f = lu_factor(L, cplx(A3.t.dtype) ? A3 : tr3(L, A3));
  int64_t one = 1;
  pj_val_t d = pj_reduce(H, diag3(L, f.LU), &one, 1, "mul");
  set_out(L, 0, MUL(pivot_sign(L, f.piv, A3.t.dtype), d));
  set_out(L, 1, f.LU);
  set_out(L, 2, f.piv);
  return NULL;
}

static pj_status_t *lower_slogdet(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "A");
  if (A.id < 0) return NULL;
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  pj_val_t A3 = to3(L, pj_convert(H, A, dt));
  lu_t f = lu_factor(L, cplx(dt) ? A3 : tr3(L, A3)); /* as in lower_det */
  pj_val_t d = diag3(L, f.LU);
  pj_val_t ad = U("abs", d); /* real */
  int64_t one = 1;
  pj_val_t logabs = sum1(L, U("log", ad), 1);
  pj_val_t unit; /* d / |d|, 0 where d == 0 */
  pj_val_t isz = CMP("EQ", ad, zeros(L, ad.t));
  if (cplx(dt)) {
    pj_val_t safe = SEL(isz, pj_full(H, ad.t, 1), ad);
    unit = DIV(d, mkcomplex(L, safe, zeros(L, safe.t), dt));
    unit = SEL(isz, zeros(L, d.t), unit);
  } else {
    unit = U("sign", d);
  }
  pj_val_t sign = MUL(pivot_sign(L, f.piv, dt), pj_reduce(H, unit, &one, 1, "mul"));
  set_out(L, 0, sign);
  set_out(L, 1, logabs);
  set_out(L, 2, f.LU);
  set_out(L, 3, f.piv);
  return NULL;
}

/* ---- triangular solves ---- */

static pj_status_t *lower_triangular_solve(pj_lower_t *L) {
  /* triangular_solve(self=B, A, upper, transpose, unitriangular) -> (X, clone of A) */
  pj_val_t Bm = pj_tensor(L, "self"), A = pj_tensor(L, "A");
  if (Bm.id < 0 || A.id < 0) return NULL;
  bool upper = pj_bool(L, "upper", true), trans = pj_bool(L, "transpose", false);
  bool unit = pj_bool(L, "unitriangular", false);
  int64_t batch[PJ_MAX_RANK];
  int nb = out_batch(L, 0, 2, batch);
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  pj_val_t A3 = to3(L, bbatch(L, pj_convert(H, A, dt), batch, nb, 2));
  pj_val_t B3 = to3(L, bbatch(L, pj_convert(H, Bm, dt), batch, nb, 2));
  /* transpose here is the plain transpose, also for complex */
  pj_val_t a = trans ? tr3(L, A3) : A3;
  bool lower = trans ? upper : !upper;
  set_out(L, 0, trsolve(L, a, B3, true, lower, unit, false));
  set_out(L, 1, A3);
  return NULL;
}

static pj_status_t *lower_solve_triangular(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "self"), Bm = pj_tensor(L, "B");
  if (A.id < 0 || Bm.id < 0) return NULL;
  bool upper = pj_bool(L, "upper", false), left = pj_bool(L, "left", true);
  bool unit = pj_bool(L, "unitriangular", false);
  int64_t batch[PJ_MAX_RANK];
  int nb = out_batch(L, 0, 2, batch);
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  pj_val_t A3 = to3(L, bbatch(L, pj_convert(H, A, dt), batch, nb, 2));
  pj_val_t B3 = to3(L, bbatch(L, pj_convert(H, Bm, dt), batch, nb, 2));
  set_out(L, 0, trsolve(L, A3, B3, left, !upper, unit, false));
  return NULL;
}

/* ---- Cholesky family ---- */

/* Lower Cholesky factor of A3 (reads the lower triangle), with info [B]: 1-based order of the
 * first leading minor that is not positive definite, else 0. */
static pj_val_t chol_lower(pj_lower_t *L, pj_val_t A3, pj_val_t *info) {
  pj_val_t Lm = pj_hlo_op(H, "stablehlo.cholesky", &A3, 1, "lower = true", A3.t);
  Lm = tri(L, Lm, true, 0);
  if (info) {
    pj_val_t d = diag3(L, Lm);
    if (cplx(A3.t.dtype)) d = U("real", d);
    /* a failed minor shows as a NaN or non-positive diagonal entry */
    pj_val_t bad = pj_unary(H, "stablehlo.not", CMP("GT", d, zeros(L, d.t)));
    pj_val_t idx = ADD(pj_iota(H, pj_type_with_dtype(d.t, PJ_I32), 1),
                       pj_full(H, pj_type_with_dtype(d.t, PJ_I32), 1));
    pj_val_t big = pj_full(H, idx.t, 2147483647.0);
    int64_t one = 1;
    pj_val_t first = pj_reduce(H, SEL(bad, idx, big), &one, 1, "min");
    *info = SEL(CMP("EQ", first, pj_full(H, first.t, 2147483647.0)), zeros(L, first.t), first);
  }
  return Lm;
}

static pj_status_t *lower_cholesky_ex(pj_lower_t *L) {
  bool legacy = !strcmp(L->c->op, "cholesky");
  pj_val_t A = pj_tensor(L, "self");
  if (A.id < 0) return NULL;
  bool upper = pj_bool(L, "upper", false);
  pj_val_t A3 = to3(L, pj_convert(H, A, pj_out_type(L, 0).dtype));
  pj_val_t info;
  pj_val_t Lm = chol_lower(L, A3, legacy ? NULL : &info);
  set_out(L, 0, upper ? adj3(L, Lm) : Lm);
  if (!legacy) set_out(L, 1, info);
  return NULL;
}

static pj_status_t *lower_cholesky_inverse(pj_lower_t *L) {
  pj_val_t F = pj_tensor(L, "self");
  if (F.id < 0) return NULL;
  bool upper = pj_bool(L, "upper", false);
  pj_val_t F3 = to3(L, pj_convert(H, F, pj_out_type(L, 0).dtype));
  int64_t B = F3.t.dims[0], n = F3.t.dims[1];
  /* A = L L^H (or U^H U): A^-1 = L^-H L^-1 = (L^-1)^H L^-1 */
  pj_val_t Lm = upper ? adj3(L, tri(L, F3, false, 0)) : F3;
  pj_val_t Li = trsolve(L, Lm, eye3(L, F3.t.dtype, B, n, n), true, true, false, false);
  set_out(L, 0, bmm(L, adj3(L, Li), Li));
  return NULL;
}

static pj_status_t *lower_cholesky_solve_helper(pj_lower_t *L) {
  pj_val_t Bm = pj_tensor(L, "self"), F = pj_tensor(L, "A");
  if (Bm.id < 0 || F.id < 0) return NULL;
  bool upper = pj_bool(L, "upper", false);
  int64_t batch[PJ_MAX_RANK];
  int nb = out_batch(L, 0, 2, batch);
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  pj_val_t F3 = to3(L, bbatch(L, pj_convert(H, F, dt), batch, nb, 2));
  pj_val_t B3 = to3(L, bbatch(L, pj_convert(H, Bm, dt), batch, nb, 2));
  pj_val_t y;
  if (upper) { /* U^H U X = B */
    y = trsolve(L, F3, B3, true, false, false, true);
    y = trsolve(L, F3, y, true, false, false, false);
  } else { /* L L^H X = B */
    y = trsolve(L, F3, B3, true, true, false, false);
    y = trsolve(L, F3, y, true, true, false, true);
  }
  set_out(L, 0, y);
  return NULL;
}

/* ---- Householder QR ---- */

/* state: A [B,m,n], tau [B,K] */
static void qr_step(pj_lower_t *L, pj_val_t k, pj_val_t *st, void *ctx) {
  (void)ctx;
  pj_val_t A = st[0], tau = st[1];
  pj_dtype_t dt = A.t.dtype, rt = real_of(dt);
  int64_t B = A.t.dims[0], m = A.t.dims[1], n = A.t.dims[2];
  pj_type_t vm = ty(dt, 2, B, m, 0), vb = ty(dt, 1, B, 0, 0), rb = ty(rt, 1, B, 0, 0);
  pj_val_t rows = pj_iota(H, pj_type_with_dtype(vm, PJ_I32), 1);
  pj_val_t kk = bs(L, k, rows.t);
  pj_val_t col = col_at(L, A, k);
  pj_val_t alpha = elt_at(L, col, k);
  pj_val_t below = SEL(CMP("GT", rows, kk), col, zeros(L, vm));
  pj_val_t ab = U("abs", below);
  pj_val_t xn2 = sum1(L, MUL(ab, ab), 1); /* [B] real */
  pj_val_t ar = cplx(dt) ? U("real", alpha) : alpha;
  pj_val_t ai = cplx(dt) ? U("imag", alpha) : zeros(L, rb);
  pj_val_t zero = AND(CMP("EQ", xn2, zeros(L, rb)), CMP("EQ", ai, zeros(L, rb)));
  pj_val_t nrm = U("sqrt", ADD(ADD(MUL(ar, ar), MUL(ai, ai)), xn2));
  /* beta = -sign(re alpha) * norm, with sign(0) = + */
  pj_val_t neg = CMP("LT", ar, zeros(L, rb));
  pj_val_t beta = SEL(neg, nrm, U("negate", nrm));
  pj_val_t tr_ = DIV(SUB(beta, ar), beta);
  pj_val_t t = cplx(dt) ? mkcomplex(L, tr_, DIV(U("negate", ai), beta), dt) : tr_;
  pj_val_t betac = cplx(dt) ? mkcomplex(L, beta, zeros(L, rb), dt) : beta;
  pj_val_t scale = DIV(pj_full(H, vb, 1), SUB(alpha, betac));
  pj_val_t v = MUL(below, bdims(L, scale, vm, 0, -1));
  pj_val_t one_k = SEL(CMP("EQ", rows, kk), pj_full(H, vm, 1), zeros(L, vm));
  v = ADD(SEL(bdims(L, zero, pj_type_with_dtype(vm, PJ_BOOL), 0, -1), below, v), one_k);
  t = SEL(zero, zeros(L, vb), t);
  pj_val_t newd = SEL(zero, alpha, betac);
  /* A[:, k+1:] -= conj(tau) v (v^H A) */
  int64_t lb = 0, rb_ = 0, lc = 1, rc = 1;
  pj_val_t w = pj_dot_general(H, conj_(L, v), A, &lb, &rb_, 1, &lc, &rc, 1, dt); /* [B,n] */
  pj_val_t ct = conj_(L, t);
  pj_val_t upd = MUL(bdims(L, MUL(v, bdims(L, ct, vm, 0, -1)), A.t, 0, 1), bdims(L, w, A.t, 0, 2));
  pj_val_t c3 = iota(L, A.t, 2), r3 = iota(L, A.t, 1), k3 = bs(L, k, c3.t);
  A = SEL(CMP("GT", c3, k3), SUB(A, upd), A);
  /* column k: beta on the diagonal, v below */
  pj_val_t colk = SEL(CMP("EQ", rows, kk), bdims(L, newd, vm, 0, -1), v);
  A = SEL(AND(CMP("EQ", c3, k3), CMP("GE", r3, k3)), bdims(L, colk, A.t, 0, 1), A);
  st[0] = A;
  st[1] = set_elt(L, tau, k, t);
  (void)n;
}

static void geqrf3(pj_lower_t *L, pj_val_t A3, pj_val_t *QR, pj_val_t *tau) {
  int64_t B = A3.t.dims[0], m = A3.t.dims[1], n = A3.t.dims[2], K = m < n ? m : n;
  pj_val_t st[2] = {A3, zeros(L, ty(A3.t.dtype, 2, B, K, 0))};
  loop(L, K, st, 2, qr_step, NULL);
  *QR = st[0];
  *tau = st[1];
}

/* Applies the reflectors (columns of V [B,m,k'], tau [B,k]) to C: Q C, Q^H C, C Q or C Q^H,
 * with Q = H_0 H_1 ... H_{k-1}, H_j = I - tau_j v_j v_j^H. */
typedef struct {
  bool left, trans, desc;
  int64_t k;
} refl_ctx_t;

static void refl_step(pj_lower_t *L, pj_val_t i, pj_val_t *st, void *vctx) {
  refl_ctx_t *cx = vctx;
  pj_val_t C = st[0], V = st[1], tau = st[2];
  pj_dtype_t dt = C.t.dtype;
  pj_val_t j = cx->desc ? SUB(ci(L, cx->k - 1), i) : i;
  int64_t B = V.t.dims[0], m = V.t.dims[1];
  pj_type_t vm = ty(dt, 2, B, m, 0);
  pj_val_t rows = pj_iota(H, pj_type_with_dtype(vm, PJ_I32), 1), jj = bs(L, j, rows.t);
  pj_val_t v = col_at(L, V, j);
  v = SEL(CMP("GT", rows, jj), v, zeros(L, vm));
  v = ADD(v, SEL(CMP("EQ", rows, jj), pj_full(H, vm, 1), zeros(L, vm)));
  pj_val_t t = elt_at(L, tau, j);
  if (cx->trans) t = conj_(L, t);
  pj_val_t tv = MUL(v, bdims(L, t, vm, 0, -1));
  int64_t lb = 0, rb = 0;
  if (cx->left) { /* C -= t v (v^H C) */
    int64_t lc = 1, rc = 1;
    pj_val_t w = pj_dot_general(H, conj_(L, v), C, &lb, &rb, 1, &lc, &rc, 1, dt); /* [B,n] */
    C = SUB(C, MUL(bdims(L, tv, C.t, 0, 1), bdims(L, w, C.t, 0, 2)));
  } else { /* C -= (C v) t v^H */
    int64_t lc = 2, rc = 1;
    pj_val_t w = pj_dot_general(H, C, tv, &lb, &rb, 1, &lc, &rc, 1, dt); /* [B,r] */
    C = SUB(C, MUL(bdims(L, w, C.t, 0, 1), bdims(L, conj_(L, v), C.t, 0, 2)));
  }
  st[0] = C;
}

static pj_val_t apply_reflectors(pj_lower_t *L, pj_val_t V, pj_val_t tau, pj_val_t C, bool left,
                                 bool trans) {
  refl_ctx_t cx = {left, trans, left != trans, tau.t.dims[1]};
  /* tau has at most as many entries as V has columns (Meta checks it for the public ops) */
  pj_val_t st[3] = {C, V, tau};
  loop(L, cx.k, st, 3, refl_step, &cx);
  return st[0];
}

static pj_status_t *lower_geqrf(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "self");
  if (A.id < 0) return NULL;
  pj_val_t QR, tau;
  geqrf3(L, to3(L, pj_convert(H, A, pj_out_type(L, 0).dtype)), &QR, &tau);
  set_out(L, 0, QR);
  set_out(L, 1, tau);
  return NULL;
}

static pj_status_t *lower_linalg_qr(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "A");
  if (A.id < 0) return NULL;
  const char *mode = pj_str(L, "mode", "reduced");
  pj_val_t A3 = to3(L, pj_convert(H, A, pj_out_type(L, 1).dtype));
  int64_t B = A3.t.dims[0], m = A3.t.dims[1], n = A3.t.dims[2], K = m < n ? m : n;
  pj_val_t QR, tau;
  geqrf3(L, A3, &QR, &tau);
  bool complete = !strcmp(mode, "complete");
  int64_t qc = complete ? m : K;
  if (!strcmp(mode, "r")) {
    set_out(L, 0, zeros(L, pj_out_type(L, 0)));
  } else {
    pj_val_t Q = apply_reflectors(L, QR, tau, eye3(L, A3.t.dtype, B, m, qc), true, false);
    set_out(L, 0, Q);
  }
  set_out(L, 1, tri(L, slice3(L, QR, complete ? m : K, n), false, 0));
  return NULL;
}

static pj_status_t *lower_householder_product(pj_lower_t *L) {
  pj_val_t V = pj_tensor(L, "input"), tau = pj_tensor(L, "tau");
  if (V.id < 0 || tau.id < 0) return NULL;
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  pj_val_t V3 = to3(L, pj_convert(H, V, dt));
  pj_val_t t2 = flat_piv(L, pj_convert(H, tau, dt));
  int64_t B = V3.t.dims[0], m = V3.t.dims[1], n = V3.t.dims[2];
  set_out(L, 0, apply_reflectors(L, V3, t2, eye3(L, dt, B, m, n), true, false));
  return NULL;
}

static pj_status_t *lower_ormqr(pj_lower_t *L) {
  pj_val_t V = pj_tensor(L, "self"), tau = pj_tensor(L, "input2"), C = pj_tensor(L, "input3");
  if (V.id < 0 || tau.id < 0 || C.id < 0) return NULL;
  bool left = pj_bool(L, "left", true), trans = pj_bool(L, "transpose", false);
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  int64_t batch[PJ_MAX_RANK];
  int nb = out_batch(L, 0, 2, batch);
  pj_val_t V3 = to3(L, bbatch(L, pj_convert(H, V, dt), batch, nb, 2));
  pj_val_t t2 = flat_piv(L, bbatch(L, pj_convert(H, tau, dt), batch, nb, 1));
  pj_val_t C3 = to3(L, bbatch(L, pj_convert(H, C, dt), batch, nb, 2));
  set_out(L, 0, apply_reflectors(L, V3, t2, C3, left, trans));
  return NULL;
}


/* ---- Jacobi rotations (eigh, SVD) ---- */

/* Rotation matrix J [B,n,n] of round r of a cyclic sweep for the symmetric matrix G [B,n,n]:
 * the round-robin schedule pairs every index with one partner (indices i, j < M = n' - 1 with
 * n' = n rounded up to even meet when (i + j) mod M == r; the index paired with itself meets M,
 * a dummy when n is odd), and each pair (p < q) gets the classical rotation that zeros G[p,q]
 * in J^H G J: J[p,p] = J[q,q] = c, J[p,q] = s u, J[q,p] = -s conj(u), with u = G[p,q]/|G[p,q]|
 * (1 for real G; for Hermitian G the phase makes the pair real before the real rotation). */
static pj_val_t jacobi_rotation(pj_lower_t *L, pj_val_t G, pj_val_t r) {
  int64_t B = G.t.dims[0], n = G.t.dims[1];
  int64_t np = n + (n & 1), M = np - 1;
  pj_type_t vi = ty(PJ_I32, 1, n, 0, 0);
  pj_val_t i = pj_iota(H, vi, 0);
  pj_val_t rr = bs(L, r, vi), Mv = pj_full(H, vi, (double)M);
  pj_val_t j = pj_binary(H, "stablehlo.remainder", ADD(SUB(rr, i), Mv), Mv);
  j = SEL(CMP("EQ", j, i), Mv, j);
  /* the last real index (when n is even) meets the one with 2x == r (mod M) */
  pj_val_t half = pj_binary(H, "stablehlo.remainder", MUL(rr, pj_full(H, vi, (double)(np / 2))), Mv);
  pj_val_t partner = SEL(CMP("EQ", i, Mv), half, j); /* [n]; >= n means unpaired */
  pj_type_t t3 = G.t, ti3 = pj_type_with_dtype(G.t, PJ_I32);
  pj_val_t rows = pj_iota(H, ti3, 1), cols = pj_iota(H, ti3, 2);
  /* pm[b, x, y] = (y == partner[x]) */
  pj_val_t pm = CMP("EQ", cols, bdims(L, partner, ti3, 1, -1));
  pj_val_t z3 = zeros(L, t3);
  bool cx = cplx(G.t.dtype);
  pj_val_t d = diag3(L, G); /* [B,n] */
  if (cx) d = U("real", d);
  pj_val_t aval = sum1(L, SEL(pm, G, z3), 2); /* G[y, partner(y)] */
  pj_val_t apq = cx ? U("abs", aval) : aval;
  pj_type_t rt3 = pj_type_with_dtype(t3, d.t.dtype);
  pj_val_t dpart = sum1(L, SEL(pm, bdims(L, d, rt3, 0, 2), zeros(L, rt3)), 2);
  pj_type_t vb = d.t;
  pj_val_t iv = bdims(L, i, pj_type_with_dtype(vb, PJ_I32), 1, -1);
  pj_val_t pv = bdims(L, partner, pj_type_with_dtype(vb, PJ_I32), 1, -1);
  pj_val_t first = CMP("LT", iv, pv);
  pj_val_t app = SEL(first, d, dpart), aqq = SEL(first, dpart, d);
  pj_val_t two = pj_full(H, vb, 2), one = pj_full(H, vb, 1), zero = zeros(L, vb);
  pj_val_t theta = DIV(SUB(aqq, app), MUL(two, apq));
  pj_val_t sg = SEL(CMP("GE", theta, zero), one, U("negate", one));
  pj_val_t t = DIV(sg, ADD(U("abs", theta), U("sqrt", ADD(MUL(theta, theta), one))));
  pj_val_t skip = OR(CMP("EQ", apq, zero), CMP("GE", pv, pj_full(H, pv.t, (double)n)));
  skip = OR(skip, U("not", CMP("EQ", t, t))); /* NaN guard */
  t = SEL(skip, zero, t);
  pj_val_t c = U("rsqrt", ADD(MUL(t, t), one));
  pj_val_t s = MUL(t, c);
  /* J[x, y]: x == y -> c[y]; x == partner[y] -> (x < y ? s[y] : -s[y]) */
  pj_val_t pmT = CMP("EQ", rows, bdims(L, partner, ti3, 2, -1));
  pj_val_t c3 = bdims(L, c, rt3, 0, 2), s3 = bdims(L, s, rt3, 0, 2);
  if (cx) {
    pj_val_t safe = SEL(CMP("EQ", apq, zero), one, apq);
    pj_val_t u = conj_(L, DIV(aval, mkcomplex(L, safe, zero, G.t.dtype)));
    c3 = mkcomplex(L, c3, zeros(L, rt3), G.t.dtype);
    s3 = MUL(mkcomplex(L, s3, zeros(L, rt3), G.t.dtype), bdims(L, u, t3, 0, 2));
  }
  pj_val_t off = SEL(CMP("LT", rows, cols), s3, U("negate", s3));
  pj_val_t J = SEL(CMP("EQ", rows, cols), c3, SEL(pmT, off, z3));
  (void)B;
  return J;
}

/* Sum of squares of the off-diagonal part and of the whole of G [B,n,n], as [B] each. */
static pj_val_t off_ratio_exceeds(pj_lower_t *L, pj_val_t G, double tol) {
  pj_val_t rows = iota(L, G.t, 1), cols = iota(L, G.t, 2);
  pj_val_t ag = U("abs", G);
  pj_val_t sq = MUL(ag, ag);
  int64_t d12[2] = {1, 2};
  pj_val_t tot = pj_reduce(H, sq, d12, 2, "add");
  pj_val_t off = pj_reduce(H, SEL(CMP("NE", rows, cols), sq, zeros(L, sq.t)), d12, 2, "add");
  pj_val_t bad = CMP("GT", off, MUL(tot, pj_full(H, tot.t, tol * tol)));
  int64_t z = 0;
  return pj_reduce(H, bad, &z, 1, "or");
}

typedef struct {
  int64_t rounds;
  bool svd; /* one-sided: st[0] = W, rotations from W^T W; else st[0] = A two-sided */
} jac_ctx_t;

static void jac_round(pj_lower_t *L, pj_val_t r, pj_val_t *st, void *vctx) {
  jac_ctx_t *cx = vctx;
  pj_val_t X = st[0];
  pj_val_t J = jacobi_rotation(L, cx->svd ? bmm(L, adj3(L, X), X) : X, r);
  if (cx->svd) {
    st[0] = bmm(L, X, J);
  } else {
    pj_val_t A = bmm(L, adj3(L, J), bmm(L, X, J));
    st[0] = MUL(ADD(A, adj3(L, A)), pj_full(H, A.t, 0.5));
  }
  st[1] = bmm(L, st[1], J);
}

static void jac_sweep(pj_lower_t *L, pj_val_t k, pj_val_t *st, void *vctx) {
  jac_ctx_t *cx = vctx;
  loop(L, cx->rounds, st, 2, jac_round, cx);
}

static pj_val_t jac_cond(pj_lower_t *L, pj_val_t *st, void *vctx) {
  jac_ctx_t *cx = vctx;
  pj_val_t X = st[0];
  pj_val_t G = cx->svd ? bmm(L, adj3(L, X), X) : X;
  if (!cx->svd) return off_ratio_exceeds(L, G, eps_of(X.t.dtype));
  /* one-sided: any pair whose columns are not orthogonal to working precision */
  pj_val_t ag = U("abs", G);
  pj_val_t sd = U("sqrt", diag3(L, ag));
  pj_val_t den = MUL(bdims(L, sd, ag.t, 0, 1), bdims(L, sd, ag.t, 0, 2));
  pj_val_t rows = iota(L, G.t, 1), cols = iota(L, G.t, 2);
  pj_val_t tolv = MUL(den, pj_full(H, ag.t, eps_of(X.t.dtype)));
  pj_val_t bad = AND(CMP("NE", rows, cols), CMP("GT", ag, tolv));
  int64_t all[3] = {0, 1, 2};
  return pj_reduce(H, bad, all, 3, "or");
}

/* Runs Jacobi sweeps until converged (at most 30). */
static void jacobi(pj_lower_t *L, pj_val_t *X, pj_val_t *V, bool svd) {
  int64_t n = X->t.dims[2];
  if (n < 2) return;
  jac_ctx_t cx = {n + (n & 1) - 1, svd};
  pj_val_t st[2] = {*X, *V};
  loop_while(L, 30, st, 2, jac_sweep, jac_cond, &cx);
  *X = st[0];
  *V = st[1];
}

/* Sorts along dim 2 the columns of each operand (all [B,n,n]) by keys [B,n] (ascending or
 * descending, stable). Returns the sorted keys [B,n]. */
static pj_val_t sort_cols(pj_lower_t *L, pj_val_t keys, pj_val_t *ops, int nops, bool desc) {
  pj_val_t ins[4];
  pj_type_t ts[4], sts[8];
  pj_type_t t3 = ops[0].t;
  if (t3.dims[2] == 0 || t3.dims[1] == 0) return keys;
  ins[0] = bdims(L, keys, pj_type_with_dtype(t3, keys.t.dtype), 0, 2);
  ts[0] = ins[0].t;
  for (int i = 0; i < nops; i++) {
    ins[i + 1] = ops[i];
    ts[i + 1] = ops[i].t;
  }
  for (int i = 0; i <= nops; i++) {
    sts[2 * i] = pj_type_scalar(ts[i].dtype);
    sts[2 * i + 1] = sts[2 * i];
  }
  pj_val_t args[8];
  pj_hlo_region_begin(H, sts, 2 * (nops + 1), args);
  pj_val_t lt = CMP(desc ? "GT" : "LT", args[0], args[1]);
  char *reg = pj_hlo_region_end(H, &lt, 1);
  pj_val_t outs[4];
  if (reg)
    pj_hlo_op_multi(H, "stablehlo.sort", ins, nops + 1, reg, "dimension = 2 : i64, is_stable = true",
                    ts, nops + 1, outs);
  free(reg);
  if (!pj_hlo_ok(H)) return keys;
  for (int i = 0; i < nops; i++) ops[i] = outs[i + 1];
  int64_t B = t3.dims[0], n = t3.dims[2];
  int64_t s[3] = {0, 0, 0}, l[3] = {B, 1, n};
  int64_t d[2] = {B, n};
  return pj_reshape(H, pj_slice(H, outs[0], s, l, NULL), 2, d);
}

static pj_status_t *lower_eigh(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "A");
  if (A.id < 0) return NULL;
  pj_dtype_t dt = pj_out_type(L, 1).dtype;
  bool lower = strcmp(pj_str(L, "UPLO", "L"), "U") != 0;
  bool compute_v = pj_bool(L, "compute_v", true);
  pj_val_t A3 = to3(L, pj_convert(H, A, dt));
  /* symmetric matrix from the chosen triangle */
  pj_val_t T = tri(L, A3, lower, 0), S = tri(L, A3, lower, 1);
  pj_val_t X = ADD(T, adj3(L, S));
  if (cplx(dt)) { /* the diagonal of a Hermitian matrix is real: LAPACK ignores its imaginary part */
    pj_val_t dg = CMP("EQ", iota(L, X.t, 1), iota(L, X.t, 2));
    X = SEL(dg, mkcomplex(L, U("real", X), zeros(L, pj_type_with_dtype(X.t, real_of(dt))), dt), X);
  }
  int64_t B = A3.t.dims[0], n = A3.t.dims[1];
  pj_val_t V = eye3(L, dt, B, n, n);
  jacobi(L, &X, &V, false);
  pj_val_t w = diag3(L, X);
  if (cplx(dt)) w = U("real", w);
  w = sort_cols(L, w, &V, 1, false);
  set_out(L, 0, w);
  set_out(L, 1, compute_v ? V : zeros(L, pj_out_type(L, 1)));
  return NULL;
}

/* Column norms of W [B,m,n] as [B,n]. */
static pj_val_t col_norms(pj_lower_t *L, pj_val_t W) {
  pj_val_t a = U("abs", W);
  return U("sqrt", sum1(L, MUL(a, a), 1));
}

static pj_status_t *lower_svd(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "A");
  if (A.id < 0) return NULL;
  pj_dtype_t dt = pj_out_type(L, 1).dtype;
  if (cplx(A.t.dtype)) dt = A.t.dtype; /* S is real; the factors keep the input's dtype */
  bool full = pj_bool(L, "full_matrices", false), uv = pj_bool(L, "compute_uv", true);
  pj_val_t A3 = to3(L, pj_convert(H, A, dt));
  int64_t B = A3.t.dims[0], m0 = A3.t.dims[1], n0 = A3.t.dims[2];
  bool wide = m0 < n0;
  if (wide) A3 = adj3(L, A3);
  int64_t m = A3.t.dims[1], n = A3.t.dims[2]; /* m >= n */
  pj_val_t QR, tau;
  geqrf3(L, A3, &QR, &tau);
  pj_val_t W = tri(L, slice3(L, QR, n, n), false, 0);
  pj_val_t V = eye3(L, dt, B, n, n);
  jacobi(L, &W, &V, true);
  pj_val_t ops[2] = {W, V};
  pj_val_t sig = sort_cols(L, col_norms(L, W), ops, 2, true);
  W = ops[0];
  V = ops[1];
  set_out(L, 1, sig);
  if (!uv) {
    set_out(L, 0, zeros(L, pj_out_type(L, 0)));
    set_out(L, 2, zeros(L, pj_out_type(L, 2)));
    return NULL;
  }
  /* orthonormal basis of W's columns, signed so that W = Ur diag(sig) */
  pj_val_t WQ, wt;
  geqrf3(L, W, &WQ, &wt);
  pj_val_t rd = diag3(L, WQ);
  pj_val_t sgn;
  if (cplx(dt)) { /* phase of R's diagonal (1 where it is 0) */
    pj_val_t ar = U("abs", rd);
    pj_val_t z = CMP("EQ", ar, zeros(L, ar.t));
    pj_val_t safe = mkcomplex(L, SEL(z, pj_full(H, ar.t, 1), ar), zeros(L, ar.t), dt);
    sgn = SEL(z, pj_full(H, rd.t, 1), DIV(rd, safe));
  } else {
    sgn = SEL(CMP("LT", rd, zeros(L, rd.t)), pj_full(H, rd.t, -1), pj_full(H, rd.t, 1));
  }
  pj_val_t Ur = apply_reflectors(L, WQ, wt, eye3(L, dt, B, n, n), true, false);
  Ur = MUL(Ur, bdims(L, sgn, Ur.t, 0, 2));
  int64_t uc = full ? m : n;
  int64_t lo[3] = {0, 0, 0}, hi[3] = {0, m - n, uc - n};
  pj_val_t C = pj_pad(H, Ur, pj_const(H, dt, 0), lo, hi, NULL);
  if (full && m > n) { /* identity block for the complement */
    pj_val_t r = iota(L, C.t, 1), c = iota(L, C.t, 2);
    pj_val_t blk = AND(CMP("EQ", r, c), CMP("GE", r, pj_full(H, r.t, (double)n)));
    C = SEL(blk, pj_full(H, C.t, 1), C);
  }
  pj_val_t Um = apply_reflectors(L, QR, tau, C, true, false); /* [B,m,uc] */
  pj_val_t Vh = adj3(L, V);
  if (wide) { /* A^H = Um S V^H  =>  A = V S Um^H */
    set_out(L, 0, V);
    set_out(L, 2, adj3(L, Um));
  } else {
    set_out(L, 0, Um);
    set_out(L, 2, Vh);
  }
  return NULL;
}


/* ---- matrix exponential ---- */

/* Scaling and squaring: X = A / 2^s with ||X||_1 <= theta per matrix, exp(X) by its Taylor
 * polynomial of degree 18, then s squarings. s differs per matrix: every matrix squares while its own count lasts.
 * state: P [B,n,n], s [B] i32, it [B] i32 */
static void expm_square(pj_lower_t *L, pj_val_t i, pj_val_t *st, void *ctx) {
  (void)i;
  (void)ctx;
  pj_val_t P = st[0], sv = st[1], it = st[2];
  pj_val_t go = CMP("LT", it, sv);
  st[0] = SEL(bdims(L, go, pj_type_with_dtype(P.t, PJ_BOOL), 0, -1), bmm(L, P, P), P);
  st[2] = ADD(it, pj_full(H, it.t, 1));
}

static pj_val_t expm_more(pj_lower_t *L, pj_val_t *st, void *ctx) {
  (void)ctx;
  int64_t z = 0;
  return pj_reduce(H, CMP("LT", st[2], st[1]), &z, 1, "or");
}

static pj_status_t *lower_matrix_exp(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "self");
  if (A.id < 0) return NULL;
  pj_dtype_t ot = pj_out_type(L, 0).dtype;
  pj_dtype_t dt = pj_dtype_compute(ot);
  pj_val_t A3 = to3(L, pj_convert(H, A, dt));
  int64_t B = A3.t.dims[0], n = A3.t.dims[1];
  pj_dtype_t rt = real_of(dt);
  /* 1-norm: max column sum of |a| */
  pj_val_t colsum = sum1(L, U("abs", A3), 1); /* [B,n] real */
  int64_t one = 1;
  pj_val_t nrm = n ? pj_reduce(H, colsum, &one, 1, "max") : zeros(L, ty(rt, 1, B, 0, 0));
  pj_type_t rb = nrm.t;
  /* s = max(0, ceil(log2(norm / theta))), capped (beyond the exponent range all overflows).
   * theta bounds the Taylor truncation error (1/19! for float64, 2^19/19! for float32) while
   * keeping squarings, which each double the rounding error, few. */
  double theta = rt == PJ_F64 ? 1.0 : 2.0;
  pj_val_t lg = U("ceil", DIV(U("log", MUL(nrm, pj_full(H, rb, 1.0 / theta))),
                              pj_full(H, rb, log(2.0))));
  lg = MIN(MAX(lg, zeros(L, rb)), pj_full(H, rb, 1100));
  lg = SEL(CMP("EQ", lg, lg), lg, zeros(L, rb)); /* NaN norm: no scaling (NaN propagates) */
  pj_val_t sv = pj_convert(H, lg, PJ_I32);
  pj_val_t scale = U("exponential", MUL(U("negate", lg), pj_full(H, rb, log(2.0))));
  pj_val_t sc = cplx(dt) ? mkcomplex(L, scale, zeros(L, rb), dt) : scale;
  pj_val_t X = MUL(A3, bdims(L, sc, A3.t, 0, -1));
  pj_val_t I = eye3(L, dt, B, n, n);
  pj_val_t P = I;
  for (int k = 18; k >= 1; k--) /* Horner: P = I + X P / k */
    P = ADD(I, MUL(bmm(L, X, P), pj_full(H, A3.t, 1.0 / k)));
  pj_val_t st[3] = {P, sv, zeros(L, sv.t)};
  loop_while(L, 1100, st, 3, expm_square, expm_more, NULL);
  set_out(L, 0, st[0]);
  return NULL;
}


/* ---- least squares (drivers gels and gelsy; the others fall back, see _decompositions.py) ----
 * Full-rank solution by Householder QR: m >= n: X = R^-1 (Q^H B)[:n]; m < n (minimum norm):
 * A^H = Q R, X = Q [R^-H B; 0]. gels reports residuals (m > n) as the squared norms of the
 * rows of Q^H B below n; gelsy reports the rank, counted here from the singular values with
 * LAPACK's default tolerance rcond = eps * max(m, n). */
static pj_val_t svd_values(pj_lower_t *L, pj_val_t A3) {
  if (A3.t.dims[1] < A3.t.dims[2]) A3 = adj3(L, A3);
  int64_t B = A3.t.dims[0], n = A3.t.dims[2];
  pj_val_t QR, tau;
  geqrf3(L, A3, &QR, &tau);
  pj_val_t W = tri(L, slice3(L, QR, n, n), false, 0);
  pj_val_t V = eye3(L, A3.t.dtype, B, n, n);
  jacobi(L, &W, &V, true);
  pj_val_t ops[1] = {W};
  return sort_cols(L, col_norms(L, W), ops, 1, true);
}

static pj_status_t *lower_lstsq(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "self"), Bm = pj_tensor(L, "b");
  if (A.id < 0 || Bm.id < 0) return NULL;
  const char *driver = pj_str(L, "driver", NULL);
  bool gels = driver && !strcmp(driver, "gels");
  pj_type_t xt = pj_out_type(L, 0);
  pj_dtype_t dt = xt.dtype;
  bool vec = Bm.t.rank == A.t.rank - 1;
  int64_t batch[PJ_MAX_RANK];
  int nb = xt.rank - (vec ? 1 : 2);
  for (int i = 0; i < nb; i++) batch[i] = xt.dims[i];
  pj_val_t A3 = to3(L, bbatch(L, pj_convert(H, A, dt), batch, nb, 2));
  int64_t Bt = A3.t.dims[0], m = A3.t.dims[1], n = A3.t.dims[2];
  Bm = pj_convert(H, Bm, dt);
  pj_val_t B3;
  if (vec) {
    Bm = bbatch(L, Bm, batch, nb, 1);
    int64_t d[3] = {Bt, m, 1};
    B3 = pj_reshape(H, Bm, 3, d);
  } else {
    B3 = to3(L, bbatch(L, Bm, batch, nb, 2));
  }
  int64_t k = B3.t.dims[2];
  pj_val_t X, QR, tau;
  if (m >= n) {
    geqrf3(L, A3, &QR, &tau);
    pj_val_t QtB = apply_reflectors(L, QR, tau, B3, true, true);
    pj_val_t R = slice3(L, QR, n, n);
    X = trsolve(L, R, slice3(L, QtB, n, k), true, false, false, false);
    if (gels && m > n) {
      int64_t s0[3] = {0, n, 0}, l0[3] = {Bt, m, k};
      pj_val_t rest = U("abs", pj_slice(H, QtB, s0, l0, NULL));
      set_out(L, 1, sum1(L, MUL(rest, rest), 1));
    } else {
      set_out(L, 1, zeros(L, pj_out_type(L, 1)));
    }
  } else {
    geqrf3(L, adj3(L, A3), &QR, &tau); /* [B,n,m] */
    pj_val_t R = slice3(L, QR, m, m);
    pj_val_t Y = trsolve(L, R, B3, true, false, false, true); /* R^H Y = B */
    int64_t lo[3] = {0, 0, 0}, hi[3] = {0, n - m, 0};
    Y = pj_pad(H, Y, pj_const(H, dt, 0), lo, hi, NULL);
    X = apply_reflectors(L, QR, tau, Y, true, false);
    set_out(L, 1, zeros(L, pj_out_type(L, 1)));
  }
  set_out(L, 0, X);
  pj_type_t rkt = pj_out_type(L, 2);
  if (!gels && pj_type_numel(&rkt) > 0) {
    double eps = eps_of(dt) * (double)(m > n ? m : n);
    double rc = pj_has(L, "rcond") ? pj_float(L, "rcond", eps) : eps;
    pj_val_t sig = svd_values(L, A3); /* [B,K], descending */
    int64_t K = sig.t.dims[1];
    pj_val_t cnt;
    if (K == 0) {
      cnt = zeros(L, ty(PJ_I64, 1, Bt, 0, 0));
    } else {
      int64_t s0[2] = {0, 0}, l0[2] = {Bt, 1};
      int64_t d1[1] = {Bt};
      pj_val_t smax = pj_reshape(H, pj_slice(H, sig, s0, l0, NULL), 1, d1);
      pj_val_t thr = MUL(smax, pj_full(H, smax.t, rc));
      pj_val_t big = CMP("GT", sig, bdims(L, thr, sig.t, 0, -1));
      cnt = sum1(L, pj_convert(H, big, PJ_I64), 1);
    }
    set_out(L, 2, cnt);
  } else {
    set_out(L, 2, zeros(L, rkt));
  }
  set_out(L, 3, zeros(L, pj_out_type(L, 3)));
  return NULL;
}


/* ---- symmetric indefinite LDL^T (Bunch-Kaufman, lower, as LAPACK's unblocked sytf2) ----
 * Each matrix advances by its own 1x1 or 2x2 pivot step, so the step counter k is per matrix
 * and every update is masked by it. The working matrix keeps the finished columns' lower part
 * and the trailing block as a full symmetric matrix (its lower triangle computed as LAPACK
 * does, mirrored), so symmetric interchanges are one permutation of that block. Complex
 * matrices are handled as complex symmetric (hermitian=False, LAPACK's zsytf2/zsytrs).
 * state: A [B,n,n], piv [B,n] i32, info [B] i32, k [B] i32 (index helpers: linalg_util.h) */

/* Swaps rows a and b [B] of X [B,n,k] (a == b: no-op) */
static pj_val_t swap_rows(pj_lower_t *L, pj_val_t X, pj_val_t a, pj_val_t b) {
  pj_val_t ra = rowv(L, X, a), rb = rowv(L, X, b);
  pj_val_t r = iota(L, X.t, 1);
  pj_val_t ia = CMP("EQ", r, bk(L, a, X.t, -1)), ib = CMP("EQ", r, bk(L, b, X.t, -1));
  return SEL(ia, bdims(L, rb, X.t, 0, 2), SEL(ib, bdims(L, ra, X.t, 0, 2), X));
}

static void ldl_step(pj_lower_t *L, pj_val_t it, pj_val_t *st, void *ctx) {
  (void)it;
  (void)ctx;
  pj_val_t A = st[0], piv = st[1], info = st[2], k = st[3];
  int64_t n = A.t.dims[1];
  /* rb: element type; rr: real type of pivot magnitudes (|re| + |im| for complex, as LAPACK) */
  pj_type_t vb = k.t, rb = pj_type_with_dtype(k.t, A.t.dtype);
  pj_type_t rr = pj_type_with_dtype(k.t, real_of(A.t.dtype));
  pj_type_t vn = ty(A.t.dtype, 2, A.t.dims[0], n, 0), vi = pj_type_with_dtype(vn, PJ_I32);
  pj_type_t vr = pj_type_with_dtype(vn, rr.dtype);
  pj_val_t active = CMP("LT", k, pj_full(H, vb, (double)n));
  pj_val_t one = pj_full(H, vb, 1), kc = MIN(k, pj_full(H, vb, (double)(n - 1)));
  pj_val_t idx = pj_iota(H, vi, 1);
  pj_val_t K2 = bk(L, kc, vn, -1);
  pj_val_t colk = colv(L, A, kc);
  pj_val_t akk = pick(L, colk, kc), absakk = pivmag(L, akk);
  pj_val_t below = SEL(CMP("GT", idx, K2), pivmag(L, colk), pj_full(H, vr, -1));
  int64_t d1 = 1;
  pj_val_t colmax = MAX(pj_reduce(H, below, &d1, 1, "max"), zeros(L, rr));
  pj_val_t ismax = AND(CMP("EQ", below, bdims(L, colmax, vr, 0, -1)), CMP("GT", idx, K2));
  pj_val_t imax = pj_reduce(H, SEL(ismax, idx, pj_full(H, vi, (double)n)), &d1, 1, "min");
  imax = SEL(CMP("GE", imax, pj_full(H, vb, (double)n)), kc, imax);
  pj_val_t rowi = colv(L, A, imax); /* symmetric trailing block: row imax == column imax */
  pj_val_t oth = AND(CMP("GE", idx, K2), CMP("NE", idx, bk(L, imax, vn, -1)));
  pj_val_t rowmax = MAX(pj_reduce(H, SEL(oth, pivmag(L, rowi), pj_full(H, vr, -1)), &d1, 1, "max"),
                        zeros(L, rr));
  pj_val_t aimax = pivmag(L, pick(L, rowi, imax));
  double alpha = (1.0 + sqrt(17.0)) / 8.0;
  pj_val_t al = pj_full(H, rr, alpha), zr = zeros(L, rr);
  pj_val_t zero = OR(CMP("EQ", MAX(absakk, colmax), zr), U("not", CMP("EQ", absakk, absakk)));
  pj_val_t c1 = CMP("GE", absakk, MUL(al, colmax));
  pj_val_t c2 = CMP("GE", absakk, MUL(MUL(al, colmax), DIV(colmax, rowmax)));
  pj_val_t c3 = CMP("GE", aimax, MUL(al, rowmax));
  pj_val_t nopiv = OR(zero, OR(c1, c2));
  pj_val_t two = AND(U("not", nopiv), U("not", c3));
  pj_val_t kp = SEL(nopiv, kc, imax);
  pj_val_t kk = SEL(two, ADD(kc, one), kc);
  /* symmetric interchange of kk and kp inside the trailing block */
  pj_val_t pi = SEL(CMP("EQ", idx, bk(L, kk, vn, -1)), bk(L, kp, vn, -1),
                    SEL(CMP("EQ", idx, bk(L, kp, vn, -1)), bk(L, kk, vn, -1), idx));
  pj_val_t r3 = iota(L, A.t, 1), c3i = iota(L, A.t, 2);
  pj_val_t P = SEL(CMP("EQ", c3i, bdims(L, pi, pj_type_with_dtype(A.t, PJ_I32), 0, 1)),
                   pj_full(H, A.t, 1), zeros(L, A.t));
  pj_val_t K3 = bk(L, kc, A.t, -1);
  pj_val_t trail = AND(CMP("GE", r3, K3), CMP("GE", c3i, K3));
  pj_val_t Asw = SEL(trail, bmm(L, bmm(L, P, A), tr3(L, P)), A);
  /* 1x1 step */
  pj_val_t x = SEL(CMP("GT", idx, K2), colv(L, Asw, kc), zeros(L, vn));
  pj_val_t a11 = pick(L, colv(L, Asw, kc), kc);
  pj_val_t d11 = SEL(zero, zeros(L, rb), DIV(pj_full(H, rb, 1), a11));
  pj_val_t temp = MUL(U("negate", bdims(L, d11, vn, 0, -1)), x);
  pj_val_t A1 = ADD(Asw, MUL(bdims(L, x, A.t, 0, 1), bdims(L, temp, A.t, 0, 2)));
  pj_val_t in1 = AND(CMP("GT", r3, K3), CMP("GT", c3i, K3));
  A1 = SEL(in1, A1, Asw);
  pj_val_t colk1 = AND(CMP("EQ", c3i, K3), CMP("GT", r3, K3));
  A1 = SEL(AND(colk1, U("not", bdims(L, zero, pj_type_with_dtype(A.t, PJ_BOOL), 0, -1))),
           MUL(Asw, bdims(L, d11, A.t, 0, -1)), A1);
  /* 2x2 step on (k, k+1) */
  pj_val_t k1 = MIN(ADD(kc, one), pj_full(H, vb, (double)(n - 1)));
  pj_val_t ck = colv(L, Asw, kc), ck1 = colv(L, Asw, k1);
  pj_val_t d21 = pick(L, ck, k1), e11 = DIV(pick(L, ck1, k1), d21);
  pj_val_t e22 = DIV(pick(L, ck, kc), d21);
  pj_val_t t = DIV(pj_full(H, rb, 1), SUB(MUL(e11, e22), pj_full(H, rb, 1)));
  pj_val_t f21 = DIV(t, d21);
  pj_val_t F21 = bdims(L, f21, vn, 0, -1), E11 = bdims(L, e11, vn, 0, -1), E22 = bdims(L, e22, vn, 0, -1);
  pj_val_t wk = MUL(F21, SUB(MUL(E11, ck), ck1));
  pj_val_t wkp1 = MUL(F21, SUB(MUL(E22, ck1), ck));
  pj_val_t K13 = bk(L, k1, A.t, -1);
  pj_val_t A2 = SUB(SUB(Asw, MUL(bdims(L, ck, A.t, 0, 1), bdims(L, wk, A.t, 0, 2))),
                    MUL(bdims(L, ck1, A.t, 0, 1), bdims(L, wkp1, A.t, 0, 2)));
  pj_val_t in2 = AND(CMP("GT", r3, K13), CMP("GT", c3i, K13));
  A2 = SEL(in2, A2, Asw);
  pj_val_t rows2 = CMP("GT", r3, K13);
  A2 = SEL(AND(rows2, CMP("EQ", c3i, K3)), bdims(L, wk, A.t, 0, 1), A2);
  A2 = SEL(AND(rows2, CMP("EQ", c3i, K13)), bdims(L, wkp1, A.t, 0, 1), A2);
  pj_type_t tb = pj_type_with_dtype(A.t, PJ_BOOL);
  pj_val_t An = SEL(bdims(L, two, tb, 0, -1), A2, A1);
  /* the trailing block stays symmetric: mirror its lower triangle */
  pj_val_t Kn = bk(L, SEL(two, ADD(kc, pj_full(H, vb, 2)), ADD(kc, one)), A.t, -1);
  pj_val_t tr = AND(AND(CMP("GE", r3, Kn), CMP("GE", c3i, Kn)), CMP("LT", r3, c3i));
  An = SEL(tr, tr3(L, An), An);
  pj_val_t act3 = bdims(L, active, tb, 0, -1);
  st[0] = SEL(act3, An, A);
  /* pivots (1-based; a 2x2 block stores -(kp+1) twice) */
  pj_val_t pv1 = ADD(kp, one), pvm = U("negate", ADD(kp, one));
  pj_val_t act2 = bdims(L, active, pj_type_with_dtype(vi, PJ_BOOL), 0, -1);
  pj_val_t atk = AND(act2, CMP("EQ", idx, K2));
  pj_val_t atk1 = AND(AND(act2, bdims(L, two, pj_type_with_dtype(vi, PJ_BOOL), 0, -1)),
                      CMP("EQ", idx, bk(L, k1, vn, -1)));
  pj_val_t pval = SEL(two, pvm, pv1);
  piv = SEL(atk, bk(L, pval, vn, -1), piv);
  st[1] = SEL(atk1, bk(L, pvm, vn, -1), piv);
  st[2] = SEL(AND(AND(active, zero), CMP("EQ", info, zeros(L, vb))), ADD(kc, one), info);
  st[3] = SEL(active, SEL(two, ADD(k, pj_full(H, vb, 2)), ADD(k, one)), k);
}

static pj_val_t ldl_more(pj_lower_t *L, pj_val_t *st, void *ctx) {
  (void)ctx;
  int64_t z = 0;
  pj_val_t k = st[3];
  return pj_reduce(H, CMP("LT", k, pj_full(H, k.t, (double)st[0].t.dims[1])), &z, 1, "or");
}

static pj_status_t *lower_ldl_factor_ex(pj_lower_t *L) {
  pj_val_t A = pj_tensor(L, "self");
  if (A.id < 0) return NULL;
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  if (cplx(dt) && pj_bool(L, "hermitian", false)) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED,
            "aten::linalg_ldl_factor_ex with hermitian=True is not lowered for complex tensors on tpu");
    return NULL;
  }
  pj_val_t A3 = to3(L, pj_convert(H, A, dt));
  int64_t B = A3.t.dims[0], n = A3.t.dims[1];
  pj_val_t lo = tri(L, A3, true, 0);
  pj_val_t S = ADD(lo, tr3(L, tri(L, A3, true, 1)));
  pj_type_t vb = ty(PJ_I32, 1, B, 0, 0);
  pj_val_t st[4] = {S, zeros(L, ty(PJ_I32, 2, B, n, 0)), zeros(L, vb), zeros(L, vb)};
  loop_while(L, n, st, 4, ldl_step, ldl_more, NULL);
  set_out(L, 0, tri(L, st[0], true, 0));
  set_out(L, 1, st[1]);
  set_out(L, 2, st[2]);
  return NULL;
}

/* sytrs (lower): forward L D Y = P B, then backward. state: X, LD, piv, k [B] */
static void ldl_fwd(pj_lower_t *L, pj_val_t it, pj_val_t *st, void *ctx) {
  (void)it;
  (void)ctx;
  pj_val_t X = st[0], LD = st[1], piv = st[2], k = st[3];
  int64_t n = LD.t.dims[1];
  pj_type_t vb = k.t, rb = pj_type_with_dtype(vb, X.t.dtype);
  pj_val_t one = pj_full(H, vb, 1);
  pj_val_t active = CMP("LT", k, pj_full(H, vb, (double)n));
  pj_val_t kc = MIN(k, pj_full(H, vb, (double)(n - 1)));
  pj_val_t k1 = MIN(ADD(kc, one), pj_full(H, vb, (double)(n - 1)));
  pj_val_t p = pick(L, piv, kc);
  pj_val_t two = CMP("LT", p, zeros(L, vb));
  pj_val_t pr = SEL(two, SUB(U("negate", p), one), SUB(p, one));
  pj_val_t Xs = swap_rows(L, X, SEL(two, k1, kc), pr);
  pj_val_t r = iota(L, X.t, 1);
  pj_val_t ck = colv(L, LD, kc), ck1 = colv(L, LD, k1);
  pj_val_t xk = rowv(L, Xs, kc), xk1 = rowv(L, Xs, k1);
  /* 1x1 */
  pj_val_t X1 = SUB(Xs, MUL(bdims(L, ck, X.t, 0, 1), bdims(L, xk, X.t, 0, 2)));
  X1 = SEL(CMP("GT", r, bk(L, kc, X.t, -1)), X1, Xs);
  pj_val_t dk = pick(L, ck, kc);
  X1 = SEL(CMP("EQ", r, bk(L, kc, X.t, -1)), bdims(L, DIV(xk, bdims(L, dk, xk.t, 0, -1)), X.t, 0, 2), X1);
  /* 2x2 */
  pj_val_t X2 = SUB(Xs, MUL(bdims(L, ck, X.t, 0, 1), bdims(L, xk, X.t, 0, 2)));
  X2 = SUB(X2, MUL(bdims(L, ck1, X.t, 0, 1), bdims(L, xk1, X.t, 0, 2)));
  X2 = SEL(CMP("GT", r, bk(L, k1, X.t, -1)), X2, Xs);
  pj_val_t akm1k = pick(L, ck, k1);
  pj_val_t akm1 = DIV(pick(L, ck, kc), akm1k), ak = DIV(pick(L, ck1, k1), akm1k);
  pj_val_t denom = SUB(MUL(akm1, ak), pj_full(H, rb, 1));
  pj_type_t vk = xk.t;
  pj_val_t bkm1 = DIV(xk, bdims(L, akm1k, vk, 0, -1)), bkk = DIV(xk1, bdims(L, akm1k, vk, 0, -1));
  pj_val_t DEN = bdims(L, denom, vk, 0, -1);
  pj_val_t nk = DIV(SUB(MUL(bdims(L, ak, vk, 0, -1), bkm1), bkk), DEN);
  pj_val_t nk1 = DIV(SUB(MUL(bdims(L, akm1, vk, 0, -1), bkk), bkm1), DEN);
  X2 = SEL(CMP("EQ", r, bk(L, kc, X.t, -1)), bdims(L, nk, X.t, 0, 2), X2);
  X2 = SEL(CMP("EQ", r, bk(L, k1, X.t, -1)), bdims(L, nk1, X.t, 0, 2), X2);
  pj_type_t tb = pj_type_with_dtype(X.t, PJ_BOOL);
  pj_val_t Xn = SEL(bdims(L, two, tb, 0, -1), X2, X1);
  st[0] = SEL(bdims(L, active, tb, 0, -1), Xn, X);
  st[3] = SEL(active, SEL(two, ADD(k, pj_full(H, vb, 2)), ADD(k, one)), k);
}

static void ldl_bwd(pj_lower_t *L, pj_val_t it, pj_val_t *st, void *ctx) {
  (void)it;
  (void)ctx;
  pj_val_t X = st[0], LD = st[1], piv = st[2], k = st[3];
  pj_type_t vb = k.t;
  pj_val_t one = pj_full(H, vb, 1), zb = zeros(L, vb);
  pj_val_t active = CMP("GE", k, zb);
  pj_val_t kc = MAX(k, zb);
  pj_val_t km1 = MAX(SUB(kc, one), zb);
  pj_val_t p = pick(L, piv, kc);
  pj_val_t two = CMP("LT", p, zb);
  pj_val_t r = iota(L, X.t, 1);
  int64_t lb = 0, rb_ = 0, lc = 1, rc = 1;
  /* s_j = sum_{i>k} LD(i,j) X(i,:) for j = k, k-1 */
  pj_val_t Xb = SEL(CMP("GT", r, bk(L, kc, X.t, -1)), X, zeros(L, X.t));
  pj_val_t ck = colv(L, LD, kc), ckm1 = colv(L, LD, km1);
  pj_val_t sk = pj_dot_general(H, ck, Xb, &lb, &rb_, 1, &lc, &rc, 1, X.t.dtype);
  pj_val_t skm1 = pj_dot_general(H, ckm1, Xb, &lb, &rb_, 1, &lc, &rc, 1, X.t.dtype);
  pj_val_t Xn = SUB(X, SEL(CMP("EQ", r, bk(L, kc, X.t, -1)), bdims(L, sk, X.t, 0, 2), zeros(L, X.t)));
  pj_type_t tb = pj_type_with_dtype(X.t, PJ_BOOL);
  pj_val_t sub2 = AND(bdims(L, two, tb, 0, -1), CMP("EQ", r, bk(L, km1, X.t, -1)));
  Xn = SUB(Xn, SEL(sub2, bdims(L, skm1, X.t, 0, 2), zeros(L, X.t)));
  pj_val_t pr = SEL(two, SUB(U("negate", p), one), SUB(p, one));
  Xn = swap_rows(L, Xn, kc, pr);
  st[0] = SEL(bdims(L, active, tb, 0, -1), Xn, X);
  st[3] = SEL(active, SEL(two, SUB(k, pj_full(H, vb, 2)), SUB(k, one)), k);
}

static pj_val_t ldl_fwd_more(pj_lower_t *L, pj_val_t *st, void *ctx) {
  (void)ctx;
  int64_t z = 0;
  pj_val_t k = st[3];
  return pj_reduce(H, CMP("LT", k, pj_full(H, k.t, (double)st[1].t.dims[1])), &z, 1, "or");
}
static pj_val_t ldl_bwd_more(pj_lower_t *L, pj_val_t *st, void *ctx) {
  (void)ctx;
  int64_t z = 0;
  pj_val_t k = st[3];
  return pj_reduce(H, CMP("GE", k, zeros(L, k.t)), &z, 1, "or");
}

static pj_status_t *lower_ldl_solve(pj_lower_t *L) {
  pj_val_t LD = pj_tensor(L, "LD"), piv = pj_tensor(L, "pivots"), Bm = pj_tensor(L, "B");
  if (LD.id < 0 || piv.id < 0 || Bm.id < 0) return NULL;
  pj_dtype_t dt = pj_out_type(L, 0).dtype;
  if (cplx(dt) && pj_bool(L, "hermitian", false)) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED,
            "aten::linalg_ldl_solve with hermitian=True is not lowered for complex tensors on tpu");
    return NULL;
  }
  int64_t batch[PJ_MAX_RANK];
  int nb = out_batch(L, 0, 2, batch);
  pj_val_t LD3 = to3(L, bbatch(L, pj_convert(H, LD, dt), batch, nb, 2));
  pj_val_t P2 = flat_piv(L, bbatch(L, pj_convert(H, piv, PJ_I32), batch, nb, 1));
  pj_val_t B3 = to3(L, bbatch(L, pj_convert(H, Bm, dt), batch, nb, 2));
  int64_t Bt = LD3.t.dims[0], n = LD3.t.dims[1];
  pj_type_t vb = ty(PJ_I32, 1, Bt, 0, 0);
  pj_val_t st[4] = {B3, tri(L, LD3, true, 0), P2, zeros(L, vb)};
  loop_while(L, n, st, 4, ldl_fwd, ldl_fwd_more, NULL);
  st[3] = pj_full(H, vb, (double)(n - 1));
  loop_while(L, n, st, 4, ldl_bwd, ldl_bwd_more, NULL);
  set_out(L, 0, st[0]);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_linalg_decomp[] = {
    {"linalg_lu_factor_ex", lower_lu_factor_ex, PJ_SHAPE_EXACT},
    {"linalg_lu", lower_linalg_lu, PJ_SHAPE_EXACT},
    {"lu_unpack", lower_lu_unpack, PJ_SHAPE_EXACT},
    {"linalg_lu_solve", lower_lu_solve, PJ_SHAPE_EXACT},
    {"_linalg_solve_ex", lower_solve_ex, PJ_SHAPE_EXACT},
    {"linalg_inv_ex", lower_inv_ex, PJ_SHAPE_EXACT},
    {"_linalg_det", lower_det, PJ_SHAPE_EXACT},
    {"_linalg_slogdet", lower_slogdet, PJ_SHAPE_EXACT},
    {"triangular_solve", lower_triangular_solve, PJ_SHAPE_EXACT},
    {"linalg_solve_triangular", lower_solve_triangular, PJ_SHAPE_EXACT},
    {"linalg_cholesky_ex", lower_cholesky_ex, PJ_SHAPE_EXACT},
    {"cholesky", lower_cholesky_ex, PJ_SHAPE_EXACT},
    {"cholesky_inverse", lower_cholesky_inverse, PJ_SHAPE_EXACT},
    {"_cholesky_solve_helper", lower_cholesky_solve_helper, PJ_SHAPE_EXACT},
    {"geqrf", lower_geqrf, PJ_SHAPE_EXACT},
    {"linalg_qr", lower_linalg_qr, PJ_SHAPE_EXACT},
    {"linalg_householder_product", lower_householder_product, PJ_SHAPE_EXACT},
    {"ormqr", lower_ormqr, PJ_SHAPE_EXACT},
    {"_linalg_eigh", lower_eigh, PJ_SHAPE_EXACT},
    {"_linalg_svd", lower_svd, PJ_SHAPE_EXACT},
    {"linalg_matrix_exp", lower_matrix_exp, PJ_SHAPE_EXACT},
    {"linalg_lstsq", lower_lstsq, PJ_SHAPE_EXACT},
    {"linalg_ldl_factor_ex", lower_ldl_factor_ex, PJ_SHAPE_EXACT},
    {"linalg_ldl_solve", lower_ldl_solve, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
