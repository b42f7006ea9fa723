/* Lowerings: the fused recurrent cells PyTorch's RNN code calls for accelerator devices
 * (aten::lstm / gru / lstm_cell / gru_cell reach them for any non-CPU tensor) and their
 * backwards. The gate matmuls happen outside (mm / linear); these ops receive the two gate
 * pre-activations and apply the pointwise part of one time step.
 *
 * LSTM (gates are [B, 4H], chunks i, f, g, o along dim 1):
 *   i, f, o = sigmoid(chunk), g = tanh(chunk)
 *   cy = f * cx + i * g,  hy = o * tanh(cy)
 *   workspace [B, 4H]: the activated gates i, f, g, o (what the backward reads; it gets cx, cy
 *   separately). grad_hy and grad_cy are each optional: an undefined one is a zero gradient.
 * GRU (gates are [B, 3H], chunks r, z, n):
 *   r = sigmoid(ir + hr), z = sigmoid(iz + hz), n = tanh(in + r * hn)   (biases folded in)
 *   hy = n + z * (hx - n)  (= (1 - z) * n + z * hx)
 *   workspace [B, 5H]: r, z, n, hx, hn (the hidden side's n chunk, hidden bias included: the
 *   backward needs it for dL/dr, and it is the one pre-activation not recoverable from r, z, n).
 * Both workspace layouts are the ones PyTorch's CUDA kernels use, so a workspace means the same
 * on every device (the backwards only ever read workspaces these forwards wrote).
 *
 * Biases: input_bias and hidden_bias ([4H] / [3H]) are optional (nn modules with bias=False).
 * The gate sums are grouped as (input_gates + input_bias) + (hidden_gates + hidden_bias), the
 * order of CPU's unfused cell (two linear calls, then add), so float32 results round alike.
 * Bias gradients are the batch sums of the gate gradients; with has_bias false there are none
 * (the Meta kernels return None there, and the destinations are one fewer each).
 * Half types compute in float32 and round once per result (as the CUDA kernels accumulate). */
#include <string.h>

#include "table.h"
#include "emit.h"

static pj_dtype_t acc_of(pj_dtype_t dt) { return dt == PJ_BF16 || dt == PJ_F16 ? PJ_F32 : dt; }

static pj_val_t none_val(void) { return (pj_val_t){.id = -1, .sub = -1}; }

static pj_val_t sigmoid(pj_lower_t *L, pj_val_t x) { return U("logistic", x); }

static pj_val_t one_minus(pj_lower_t *L, pj_val_t x) { return SUB(pj_full(H, x.t, 1.0), x); }

/* Chunk k of width n along dim 1 of a [B, m] value. */
static pj_val_t chunk(pj_lower_t *L, pj_val_t x, int64_t k, int64_t n) {
  int64_t start[2] = {0, k * n}, limit[2] = {x.t.dims[0], (k + 1) * n}, strides[2] = {1, 1};
  return pj_slice(H, x, start, limit, strides);
}

/* A [B, m] tensor argument in the compute dtype, checked to be 2-D with `cols` columns when
 * cols > 0 (the Meta kernels check the public contract; this guards the lowering's own
 * assumptions so a mismatch is an error, never a misread slice). */
static pj_val_t mat_arg(pj_lower_t *L, const char *name, pj_dtype_t ct, int64_t rows,
                        int64_t cols) {
  pj_val_t v = pj_tensor(L, name);
  if (v.id < 0) return v;
  if (v.t.rank != 2 || (rows >= 0 && v.t.dims[0] != rows) || (cols > 0 && v.t.dims[1] != cols))
    return pj_fail(L, PJ_ERR_RUNTIME, "aten::%s: %s has an unexpected shape", L->c->op, name);
  return pj_convert(H, v, ct);
}

/* gates + bias (bias [m] broadcast over the batch), or gates alone when the bias is None. */
static pj_val_t add_bias(pj_lower_t *L, pj_val_t gates, const char *bias, pj_dtype_t ct) {
  if (!pj_has(L, bias)) return gates;
  pj_val_t b = pj_tensor(L, bias);
  if (b.id < 0) return b;
  if (b.t.rank != 1 || b.t.dims[0] != gates.t.dims[1])
    return pj_fail(L, PJ_ERR_RUNTIME, "aten::%s: %s has an unexpected shape", L->c->op, bias);
  return ADD(gates, pj_broadcast_to(H, pj_convert(H, b, ct), 2, gates.t.dims));
}

/* Hands results to the destinations in schema order. `n` candidates, of which the trailing
 * `nbias` are bias gradients that exist only when has_bias: the functional op then has
 * n - nbias destinations without it. An out= call always passes every destination, so a count
 * of n receives all of them (bias sums included: they are well defined either way). Any other
 * count is a mismatch between these rules and the bridge, reported rather than misplaced. */
static void put_results(pj_lower_t *L, const pj_val_t *v, int n, int nbias, bool has_bias) {
  if (!pj_hlo_ok(H)) return;
  int nout = pj_nout(L);
  int want = has_bias ? n : n - nbias;
  if (nout != want && nout != n) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s produced %d results for %d destinations",
            L->c->op, want, nout);
    return;
  }
  for (int k = 0; k < nout; k++) {
    pj_type_t t = pj_out_type(L, k);
    if (pj_type_numel(&t) == 0) continue; /* empty destinations are left unwritten */
    pj_val_t x = v[k];
    if (pj_type_numel(&x.t) != pj_type_numel(&t)) {
      pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s result %d has %lld elements, want %lld",
              L->c->op, k, (long long)pj_type_numel(&x.t), (long long)pj_type_numel(&t));
      return;
    }
    pj_set_result(L, k, pj_reshape(H, x, t.rank, t.dims));
  }
}

static pj_val_t batch_sum(pj_lower_t *L, pj_val_t x) {
  int64_t d0[1] = {0};
  return pj_reduce(H, x, d0, 1, "add");
}

/* ---- LSTM ---- */

static pj_status_t *lower_lstm_cell(pj_lower_t *L) {
  pj_val_t cx0 = pj_tensor(L, "cx");
  if (cx0.id < 0) return NULL;
  if (cx0.t.rank != 2) {
    pj_fail(L, PJ_ERR_RUNTIME, "aten::%s: cx must be 2-D", L->c->op);
    return NULL;
  }
  const int64_t b = cx0.t.dims[0], hs = cx0.t.dims[1];
  pj_dtype_t ct = acc_of(pj_arg_dtype(L, "input_gates"));
  pj_val_t cx = pj_convert(H, cx0, ct);
  pj_val_t gi = add_bias(L, mat_arg(L, "input_gates", ct, b, 4 * hs), "input_bias", ct);
  pj_val_t gh = add_bias(L, mat_arg(L, "hidden_gates", ct, b, 4 * hs), "hidden_bias", ct);
  if (!pj_hlo_ok(H)) return NULL;
  pj_val_t gates = ADD(gi, gh);
  pj_val_t i = sigmoid(L, chunk(L, gates, 0, hs));
  pj_val_t f = sigmoid(L, chunk(L, gates, 1, hs));
  pj_val_t g = U("tanh", chunk(L, gates, 2, hs));
  pj_val_t o = sigmoid(L, chunk(L, gates, 3, hs));
  pj_val_t cy = ADD(MUL(f, cx), MUL(i, g));
  pj_val_t hy = MUL(o, U("tanh", cy));
  pj_val_t acts[4] = {i, f, g, o};
  pj_val_t v[3] = {hy, cy, pj_concat(H, acts, 4, 1)};
  put_results(L, v, 3, 0, false);
  return NULL;
}

/* The gradient with respect to the gate pre-activations, from the saved activations:
 *   dc = grad_cy + grad_hy * o * (1 - tanh(cy)^2)     (the total gradient reaching cy)
 *   di = dc * g * i (1 - i),  df = dc * cx * f (1 - f),  dg = dc * i * (1 - g^2),
 *   do = grad_hy * tanh(cy) * o (1 - o),  grad_cx = dc * f. */
static pj_status_t *lower_lstm_cell_backward(pj_lower_t *L) {
  pj_val_t cx0 = pj_tensor(L, "cx");
  if (cx0.id < 0) return NULL;
  if (cx0.t.rank != 2) {
    pj_fail(L, PJ_ERR_RUNTIME, "aten::%s: cx must be 2-D", L->c->op);
    return NULL;
  }
  const int64_t b = cx0.t.dims[0], hs = cx0.t.dims[1];
  pj_dtype_t ct = acc_of(pj_arg_dtype(L, "workspace"));
  pj_val_t cx = pj_convert(H, cx0, ct);
  pj_val_t cy = mat_arg(L, "cy", ct, b, hs);
  pj_val_t ws = mat_arg(L, "workspace", ct, b, 4 * hs);
  pj_val_t ghy = pj_has(L, "grad_hy") ? mat_arg(L, "grad_hy", ct, b, hs) : none_val();
  pj_val_t gcy = pj_has(L, "grad_cy") ? mat_arg(L, "grad_cy", ct, b, hs) : none_val();
  if (!pj_hlo_ok(H)) return NULL;
  pj_val_t i = chunk(L, ws, 0, hs), f = chunk(L, ws, 1, hs);
  pj_val_t g = chunk(L, ws, 2, hs), o = chunk(L, ws, 3, hs);
  pj_val_t zero = pj_full(H, cx.t, 0.0);
  pj_val_t tc = U("tanh", cy);
  pj_val_t dc = gcy.id >= 0 ? gcy : zero, dout = zero;
  if (ghy.id >= 0) {
    dc = ADD(dc, MUL(MUL(ghy, o), one_minus(L, MUL(tc, tc))));
    dout = MUL(MUL(ghy, tc), MUL(o, one_minus(L, o)));
  }
  pj_val_t di = MUL(MUL(dc, g), MUL(i, one_minus(L, i)));
  pj_val_t df = MUL(MUL(dc, cx), MUL(f, one_minus(L, f)));
  pj_val_t dg = MUL(MUL(dc, i), one_minus(L, MUL(g, g)));
  pj_val_t parts[4] = {di, df, dg, dout};
  pj_val_t dgates = pj_concat(H, parts, 4, 1);
  bool has_bias = pj_bool(L, "has_bias", false);
  pj_val_t v[3] = {dgates, MUL(dc, f), batch_sum(L, dgates)};
  put_results(L, v, 3, 1, has_bias);
  return NULL;
}

/* ---- GRU ---- */

static pj_status_t *lower_gru_cell(pj_lower_t *L) {
  pj_val_t hx0 = pj_tensor(L, "hx");
  if (hx0.id < 0) return NULL;
  if (hx0.t.rank != 2) {
    pj_fail(L, PJ_ERR_RUNTIME, "aten::%s: hx must be 2-D", L->c->op);
    return NULL;
  }
  const int64_t b = hx0.t.dims[0], hs = hx0.t.dims[1];
  pj_dtype_t ct = acc_of(pj_arg_dtype(L, "input_gates"));
  pj_val_t hx = pj_convert(H, hx0, ct);
  pj_val_t gi = add_bias(L, mat_arg(L, "input_gates", ct, b, 3 * hs), "input_bias", ct);
  pj_val_t gh = add_bias(L, mat_arg(L, "hidden_gates", ct, b, 3 * hs), "hidden_bias", ct);
  if (!pj_hlo_ok(H)) return NULL;
  pj_val_t r = sigmoid(L, ADD(chunk(L, gi, 0, hs), chunk(L, gh, 0, hs)));
  pj_val_t z = sigmoid(L, ADD(chunk(L, gi, 1, hs), chunk(L, gh, 1, hs)));
  pj_val_t hn = chunk(L, gh, 2, hs);
  pj_val_t n = U("tanh", ADD(chunk(L, gi, 2, hs), MUL(r, hn)));
  pj_val_t hy = ADD(n, MUL(z, SUB(hx, n)));
  pj_val_t saved[5] = {r, z, n, hx, hn};
  pj_val_t v[2] = {hy, pj_concat(H, saved, 5, 1)};
  put_results(L, v, 2, 0, false);
  return NULL;
}

/* From the workspace (r, z, n, hx, hn) and dL/dhy = d:
 *   dz = d (hx - n) z (1 - z),  dhx = d z,  dn_pre = d (1 - z) (1 - n^2)   (n's pre-activation)
 *   dr = dn_pre * hn * r (1 - r),  d(hn) = dn_pre * r
 * grad_input_gates = [dr, dz, dn_pre], grad_hidden_gates = [dr, dz, dn_pre * r]. */
static pj_status_t *lower_gru_cell_backward(pj_lower_t *L) {
  pj_val_t d0 = pj_tensor(L, "grad_hy");
  if (d0.id < 0) return NULL;
  if (d0.t.rank != 2) {
    pj_fail(L, PJ_ERR_RUNTIME, "aten::%s: grad_hy must be 2-D", L->c->op);
    return NULL;
  }
  const int64_t b = d0.t.dims[0], hs = d0.t.dims[1];
  pj_dtype_t ct = acc_of(pj_arg_dtype(L, "workspace"));
  pj_val_t d = pj_convert(H, d0, ct);
  pj_val_t ws = mat_arg(L, "workspace", ct, b, 5 * hs);
  if (!pj_hlo_ok(H)) return NULL;
  pj_val_t r = chunk(L, ws, 0, hs), z = chunk(L, ws, 1, hs), n = chunk(L, ws, 2, hs);
  pj_val_t hx = chunk(L, ws, 3, hs), hn = chunk(L, ws, 4, hs);
  pj_val_t dz = MUL(MUL(d, SUB(hx, n)), MUL(z, one_minus(L, z)));
  pj_val_t dn = MUL(MUL(d, one_minus(L, z)), one_minus(L, MUL(n, n)));
  pj_val_t dr = MUL(MUL(dn, hn), MUL(r, one_minus(L, r)));
  pj_val_t in_parts[3] = {dr, dz, dn}, hid_parts[3] = {dr, dz, MUL(dn, r)};
  pj_val_t dgi = pj_concat(H, in_parts, 3, 1), dgh = pj_concat(H, hid_parts, 3, 1);
  bool has_bias = pj_bool(L, "has_bias", false);
  pj_val_t v[5] = {dgi, dgh, MUL(d, z), batch_sum(L, dgi), batch_sum(L, dgh)};
  put_results(L, v, 5, 2, has_bias);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_rnn[] = {
    {"_thnn_fused_lstm_cell", lower_lstm_cell, PJ_SHAPE_EXACT},
    {"_thnn_fused_lstm_cell_backward_impl", lower_lstm_cell_backward, PJ_SHAPE_EXACT},
    {"_thnn_fused_gru_cell", lower_gru_cell, PJ_SHAPE_EXACT},
    {"_thnn_fused_gru_cell_backward", lower_gru_cell_backward, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
