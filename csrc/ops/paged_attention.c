/* Lowerings: paged attention for serving (torch_pjrt/paged_attention_ops.py defines the
 * schemas and Meta kernels; torch_pjrt/serving/vllm/attention.py calls them once per layer).
 *
 * The KV cache of a layer is one tensor, physically [NB, BS, KVH, 2*D] (block, offset in the
 * block, kv head, channel: keys in the first D channels, values in the rest). A token's slot is
 * block * BS + offset, so the cache is read and written here as rows of a [NB*BS, KVH*2*D]
 * matrix: one row per slot.
 *
 * tpu::reshape_and_cache(Tensor(a!) kv_cache, key [T, KVH, D], value [T, KVH, D],
 *                        slot_mapping [T] int) -> ()
 *   One row scatter of the T new tokens into the cache. The cache is the call's destination
 *   (its schema marks it written), so call.c makes the program's result alias the cache's
 *   parameter and donates the old buffer: XLA updates the rows in place and the cost grows with
 *   T, not with the cache. A negative slot (vLLM's padding tokens, -1) is replaced by NB*BS,
 *   out of range, which a StableHLO scatter skips; slots >= NB*BS are skipped the same way.
 *
 * tpu::paged_attention(query [T, H, D], kv_cache, context_slots [R, S], query_index [R, Q],
 *                      query_pos [R, Q], output_index [T], scale, soft_cap, sliding_window)
 *   -> [T, H, D]
 *   Every request of a step (prefill, chunked prefill and decode alike) is a row r of an
 *   [R, Q] grid of query rows: query_index picks its tokens from `query`, query_pos gives
 *   their positions in the request (-1: a padding row), context_slots the cache slot of each
 *   of its positions 0..S-1. In one program: gather the queries and context rows, scores in
 *   float32 grouped by kv head (query head h reads kv head h / (H / KVH), as Hugging Face's
 *   repeat_kv shares them), scale, optional tanh soft cap (cap * tanh(s / cap)), the mask
 *   computed here from the positions (key position k is seen by a query at position p when
 *   k <= p, and p - k < sliding_window when a window is given), softmax, the weighted sum of
 *   values, and output_index's gather of each token's row back into token order.
 *   tpu::paged_attention_into(Tensor(a!) out, query, ...) -> () is the same program with `out`
 *   (any view of query's shape and dtype) as its destination. A token whose output_index is
 *   negative is not this call's: its row of `out` keeps its value (paged_attention: 0), so
 *   two calls over disjoint groups of requests (decodes, prefills: grids of different Q) fill
 *   one output.
 *   Invariants that make padding harmless: a row whose every key is masked (padding rows)
 *   gets weights 0 and output 0, never NaN (the row max is replaced by 0 where it is -inf and
 *   a zero denominator by 1); context positions past a request's last query position (the
 *   pad of context_slots) have their values zeroed before the weighted sum, so whatever those
 *   slots hold (an uninitialized block, NaN) cannot reach the output through 0 * NaN. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"
#include "emit.h"
#include "linalg_util.h"
#include "torch_pjrt/runtime.h"

static const pj_val_t kNone = {.id = -1, .sub = -1};

static bool is_float(pj_dtype_t dt) {
  return dt == PJ_F32 || dt == PJ_F16 || dt == PJ_BF16 || dt == PJ_F64;
}
static bool is_index(pj_dtype_t dt) { return dt == PJ_I64 || dt == PJ_I32; }

/* The cache [NB, BS, KVH, 2D] as slot rows [NB*BS, KVH*2D]. */
static pj_val_t cache_rows(pj_lower_t *L, pj_val_t cache) {
  int64_t d[2] = {cache.t.dims[0] * cache.t.dims[1], cache.t.dims[2] * cache.t.dims[3]};
  return pj_reshape(H, cache, 2, d);
}

/* Rows of x [N, W] at int64 indices idx [K] -> [K, W] (an out-of-range index is clamped by
 * the gather; callers mask what such rows contribute). */
static pj_val_t take_rows(pj_lower_t *L, pj_val_t x, pj_val_t idx) {
  int64_t k = idx.t.dims[0], w = x.t.dims[1], kd[2] = {k, 1}, od[2] = {k, w};
  if (k == 0 || x.t.dims[0] == 0) return pj_full(H, pj_type(x.t.dtype, 2, od), 0);
  char attrs[320];
  snprintf(attrs, sizeof attrs,
           "dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], "
           "start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, %lld>, "
           "indices_are_sorted = false",
           (long long)w);
  pj_val_t ins[2] = {x, pj_reshape(H, idx, 2, kd)};
  return pj_hlo_op(H, "stablehlo.gather", ins, 2, attrs, pj_type(x.t.dtype, 2, od));
}

/* x [N, W] with rows idx [K] replaced by upd [K, W]; out-of-range indices are skipped. */
static pj_val_t put_rows(pj_lower_t *L, pj_val_t x, pj_val_t idx, pj_val_t upd) {
  int64_t kd[2] = {idx.t.dims[0], 1};
  pj_type_t st = pj_type_scalar(x.t.dtype);
  pj_type_t sts[2] = {st, st};
  pj_val_t a[2];
  pj_hlo_region_begin(H, sts, 2, a);
  char *region = pj_hlo_region_end(H, &a[1], 1); /* replace */
  const char *attrs =
      "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], "
      "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
      "indices_are_sorted = false, unique_indices = false";
  pj_val_t ins[3] = {x, pj_reshape(H, idx, 2, kd), upd}, out = kNone;
  if (region) pj_hlo_op_multi(H, "stablehlo.scatter", ins, 3, region, attrs, &x.t, 1, &out);
  free(region);
  return out;
}

/* The result's token rows: row output_index[t] of the grid's rows o [R * Q, H * D] (float32;
 * invalid: an empty grid, zeros), and where output_index[t] < 0 (a token another call
 * computes) the destination's current row when the op has one (paged_attention_into), else 0. */
static void set_output(pj_lower_t *L, pj_val_t o, pj_val_t oidx) {
  pj_type_t ot = pj_out_type(L, 0);
  int64_t t = ot.dims[0], w = pj_type_numel(&ot) / (t ? t : 1), td[2] = {t, w}, d0 = 0;
  pj_type_t rt = pj_type(PJ_F32, 2, td);
  pj_val_t idx = pj_convert(H, oidx, PJ_I64);
  pj_val_t mine = CMP("GE", idx, pj_full(H, idx.t, 0));
  pj_val_t rows = o.id >= 0 ? take_rows(L, o, SEL(mine, idx, pj_full(H, idx.t, 0))) : zeros(L, rt);
  pj_val_t other = pj_has(L, "out") ? pj_convert(H, pj_reshape(H, pj_tensor(L, "out"), 2, td),
                                                 PJ_F32)
                                    : zeros(L, rt);
  rows = SEL(pj_broadcast_in_dim(H, mine, pj_type_with_dtype(rt, PJ_BOOL), &d0), rows, other);
  pj_set_result(L, 0, pj_reshape(H, pj_convert(H, rows, ot.dtype), ot.rank, ot.dims));
}

/* Shape checks shared by both ops; the Meta kernels make the same ones first (with the
 * messages users see), these keep the lowering safe when called some other way. */
static pj_status_t *check_cache(pj_val_t cache) {
  if (cache.t.rank != 4 || cache.t.dims[3] % 2 != 0)
    return pj_status_new(PJ_ERR_VALUE,
                         "paged attention: kv_cache must be [num_blocks, block_size, "
                         "num_kv_heads, 2 * head_size]");
  if (!is_float(cache.t.dtype))
    return pj_status_new(PJ_ERR_VALUE, "paged attention: kv_cache must be floating point");
  return NULL;
}

static pj_status_t *lower_reshape_and_cache(pj_lower_t *L) {
  pj_val_t cache = pj_tensor(L, "kv_cache"), key = pj_tensor(L, "key");
  pj_val_t value = pj_tensor(L, "value"), slots = pj_tensor(L, "slot_mapping");
  pj_status_t *st = check_cache(cache);
  if (st) return st;
  int64_t nslots = cache.t.dims[0] * cache.t.dims[1], kvh = cache.t.dims[2];
  int64_t hd = cache.t.dims[3] / 2, t = slots.t.rank == 1 ? slots.t.dims[0] : -1;
  int64_t kv_dims[3] = {t, kvh, hd};
  pj_type_t kvt = pj_type(key.t.dtype, 3, kv_dims);
  if (t < 0 || !is_index(slots.t.dtype))
    return pj_status_new(PJ_ERR_VALUE, "reshape_and_cache: slot_mapping must be an int [T]");
  if (!pj_type_same_shape(&key.t, &kvt) || !pj_type_same_shape(&value.t, &kvt))
    return pj_status_new(PJ_ERR_VALUE, "reshape_and_cache: key and value must be [T, %lld, %lld]",
                         (long long)kvh, (long long)hd);
  if (!is_float(key.t.dtype) || !is_float(value.t.dtype))
    return pj_status_new(PJ_ERR_VALUE, "reshape_and_cache: key and value must be floating point");
  if (t == 0 || nslots == 0) {
    pj_set_result(L, 0, cache);
    return NULL;
  }
  pj_dtype_t ct = cache.t.dtype;
  pj_val_t kv[2] = {pj_convert(H, key, ct), pj_convert(H, value, ct)};
  int64_t rd[2] = {t, kvh * 2 * hd};
  pj_val_t upd = pj_reshape(H, pj_concat(H, kv, 2, 2), 2, rd);
  pj_val_t idx = pj_convert(H, slots, PJ_I64);
  pj_val_t pad = CMP("LT", idx, pj_full(H, idx.t, 0));
  /* A slot past the cache is the caller's bug: reported as CPU's kernel raises it, at the next
   * synchronization (device-side index checks); negative slots are padding, not checked. */
  pj_val_t bad =
      pj_check_index(L, SEL(pad, pj_full(H, idx.t, 0), idx), nslots, 0, false, PJ_CHECK_DIM);
  /* padding tokens: an out-of-range row, which the scatter skips; with a bad slot every row
   * is skipped (the write is all or nothing, as on CPU, which raises before writing) */
  idx = pj_check_drop_all(L, bad, SEL(pad, pj_full(H, idx.t, (double)nslots), idx), nslots);
  pj_val_t rows = put_rows(L, cache_rows(L, cache), idx, upd);
  /* A barrier between the write and its readers: in a fused program (DeferAndFuse, a compiled
   * graph) where paged_attention reads the written cache, XLA turned a one-token write into a
   * dynamic-update-slice and duplicated it into each reader's fusion, each on its own copy of
   * the whole cache (4 copies of a 128 MB cache: a one-token layer took 188 ms in
   * DeferAndFuse against 2.3 ms in Strict mode; benchmarks/bench_paged_attention.py). */
  rows = pj_hlo_op(H, "stablehlo.optimization_barrier", &rows, 1, NULL, rows.t);
  pj_set_result(L, 0, pj_reshape(H, rows, 4, cache.t.dims));
  return NULL;
}

static pj_status_t *lower_paged_attention(pj_lower_t *L) {
  pj_val_t q = pj_tensor(L, "query"), cache = pj_tensor(L, "kv_cache");
  pj_val_t cslots = pj_tensor(L, "context_slots"), qidx = pj_tensor(L, "query_index");
  pj_val_t qpos = pj_tensor(L, "query_pos"), oidx = pj_tensor(L, "output_index");
  double scale = pj_float(L, "scale", 1.0), cap = pj_float(L, "soft_cap", 0.0);
  int64_t window = pj_int(L, "sliding_window", -1);
  pj_status_t *st = check_cache(cache);
  if (st) return st;
  const int64_t kvh = cache.t.dims[2], D = cache.t.dims[3] / 2;
  if (q.t.rank != 3 || q.t.dims[2] != D || !is_float(q.t.dtype))
    return pj_status_new(PJ_ERR_VALUE, "paged_attention: query must be a float [T, H, %lld]",
                         (long long)D);
  const int64_t T = q.t.dims[0], Hq = q.t.dims[1];
  if (kvh == 0 || Hq % kvh != 0)
    return pj_status_new(PJ_ERR_VALUE,
                         "paged_attention: %lld query heads are not a multiple of %lld kv heads",
                         (long long)Hq, (long long)kvh);
  if (cslots.t.rank != 2 || qidx.t.rank != 2 || qpos.t.rank != 2 || oidx.t.rank != 1 ||
      !is_index(cslots.t.dtype) || !is_index(qidx.t.dtype) || !is_index(qpos.t.dtype) ||
      !is_index(oidx.t.dtype) || qidx.t.dims[0] != cslots.t.dims[0] ||
      !pj_type_same_shape(&qidx.t, &qpos.t) || oidx.t.dims[0] != T)
    return pj_status_new(PJ_ERR_VALUE,
                         "paged_attention: metadata must be int context_slots [R, S], "
                         "query_index [R, Q], query_pos [R, Q], output_index [T]");
  const int64_t R = cslots.t.dims[0], S = cslots.t.dims[1], Q = qidx.t.dims[1];
  const int64_t G = Hq / kvh;
  if (T == 0 || R == 0 || Q == 0 || S == 0 || pj_type_numel(&cache.t) == 0) {
    set_output(L, kNone, oidx);
    return NULL;
  }
  const pj_dtype_t f = PJ_F32;
  /* Metadata out of range is the caller's bug (the gathers below would clamp it): reported as
   * CPU's kernel raises it, at the next synchronization, and then no output row is written
   * (output_index all -1). output_index -1 is another grid's token. */
  const int64_t nslots = cache.t.dims[0] * cache.t.dims[1];
  pj_val_t oi = pj_convert(H, oidx, PJ_I64);
  pj_val_t bad[3] = {
      pj_check_index(L, cslots, nslots, 0, false, PJ_CHECK_DIM),
      pj_check_index(L, qidx, T, 0, false, PJ_CHECK_DIM),
      pj_check_index(L, SEL(CMP("LT", oi, pj_full(H, oi.t, 0)), pj_full(H, oi.t, 0), oi), R * Q,
                     0, false, PJ_CHECK_DIM)};
  pj_val_t any_bad = kNone;
  for (int i = 0; i < 3; i++)
    if (bad[i].id >= 0) any_bad = any_bad.id < 0 ? bad[i] : OR(any_bad, bad[i]);
  oidx = pj_check_drop_all(L, any_bad, oi, -1);

  /* float32 data on the CPU plugin: the host kernel (csrc/runtime/attention_kernel.c) as a
   * custom call, the same contract; XLA's code for it below costs several times more there */
  const char *target = pj_ffi_paged_attention_target();
  if (target && q.t.dtype == PJ_F32 && cache.t.dtype == PJ_F32) {
    int64_t one1 = 1, od[2] = {R * Q, Hq * D};
    pj_type_t s1 = pj_type(PJ_F32, 1, &one1);
    pj_val_t params[3] = {pj_full(H, s1, scale), pj_full(H, s1, cap),
                          pj_full(H, s1, (double)window)};
    pj_val_t ins[6] = {q, cache, pj_convert(H, cslots, PJ_I64), pj_convert(H, qidx, PJ_I64),
                       pj_convert(H, qpos, PJ_I64), pj_concat(H, params, 3, 0)};
    char attrs[512];
    snprintf(attrs, sizeof attrs,
             "call_target_name = \"%s\", api_version = 4 : i32, operand_layouts = ["
             "dense<[2, 1, 0]> : tensor<3xindex>, dense<[3, 2, 1, 0]> : tensor<4xindex>, "
             "dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, "
             "dense<[1, 0]> : tensor<2xindex>, dense<[0]> : tensor<1xindex>], "
             "result_layouts = [dense<[1, 0]> : tensor<2xindex>]",
             target);
    set_output(L, pj_hlo_op(H, "stablehlo.custom_call", ins, 6, attrs, pj_type(f, 2, od)), oidx);
    return NULL;
  }

  /* queries [R, Q, KVH, G, D] (float32) */
  int64_t td[2] = {T, Hq * D}, rq = R * Q;
  pj_val_t qrows = take_rows(L, pj_reshape(H, q, 2, td),
                             pj_reshape(H, pj_convert(H, qidx, PJ_I64), 1, &rq));
  int64_t q5[5] = {R, Q, kvh, G, D};
  pj_val_t qv = pj_convert(H, pj_reshape(H, qrows, 5, q5), f);

  /* context keys and values [R, S, KVH, D] (float32) */
  int64_t rs = R * S;
  pj_val_t ctx = take_rows(L, cache_rows(L, cache),
                           pj_reshape(H, pj_convert(H, cslots, PJ_I64), 1, &rs));
  int64_t c4[4] = {R, S, kvh, 2 * D};
  ctx = pj_convert(H, pj_reshape(H, ctx, 4, c4), f);
  int64_t k0[4] = {0, 0, 0, 0}, k1[4] = {R, S, kvh, D}, v0[4] = {0, 0, 0, D},
          v1[4] = {R, S, kvh, 2 * D};
  pj_val_t keys = pj_slice(H, ctx, k0, k1, NULL), vals = pj_slice(H, ctx, v0, v1, NULL);

  /* positions: query [R, Q] (int64), key [R, S] */
  pj_val_t pos = pj_convert(H, qpos, PJ_I64);
  int64_t rqs[3] = {R, Q, S}, one = 1;
  pj_type_t mt = pj_type(PJ_I64, 3, rqs);
  int64_t d01[2] = {0, 1};
  pj_val_t p3 = pj_broadcast_in_dim(H, pos, mt, d01), k3 = pj_iota(H, mt, 2);
  pj_val_t seen = AND(CMP("LE", k3, p3), CMP("GE", p3, pj_full(H, mt, 0)));
  if (window > 0)
    seen = AND(seen, CMP("LT", SUB(p3, k3), pj_full(H, mt, (double)window)));

  /* values at positions no query of the request reaches are zeroed (see the header) */
  pj_val_t last = pj_reduce(H, pos, &one, 1, "max"); /* [R] */
  int64_t rsd[2] = {R, S}, d0 = 0, d01v[2] = {0, 1};
  pj_type_t rst = pj_type(PJ_I64, 2, rsd);
  pj_val_t reach = CMP("LE", pj_iota(H, rst, 1), pj_broadcast_in_dim(H, last, rst, &d0));
  vals = SEL(pj_broadcast_in_dim(H, reach, pj_type_with_dtype(vals.t, PJ_BOOL), d01v), vals,
             zeros(L, vals.t));

  /* Batched matrices with the batch (request, kv head) leading, B = R * KVH: queries
   * [B, Q*G, D], keys and values [B, S, D]. The XLA CPU backend runs a dot_general whose batch
   * dims lead as one batched matmul; with them interleaved (dot_general straight on the
   * gathered layouts) it measured several times slower. */
  const int64_t B = R * kvh, QG = Q * G;
  int64_t pq[5] = {0, 2, 1, 3, 4}, pk[4] = {0, 2, 1, 3};
  int64_t q3[3] = {B, QG, D}, k3d[3] = {B, S, D};
  qv = pj_reshape(H, pj_transpose(H, qv, pq), 3, q3);
  keys = pj_reshape(H, pj_transpose(H, keys, pk), 3, k3d);
  vals = pj_reshape(H, pj_transpose(H, vals, pk), 3, k3d);

  /* scores [B, Q*G, S] */
  int64_t zb = 0, c2 = 2, c1 = 1;
  pj_val_t s = pj_dot_general(H, qv, keys, &zb, &zb, 1, &c2, &c2, 1, f);
  s = MUL(s, pj_full(H, s.t, scale));
  if (cap > 0.0) s = MUL(U("tanh", MUL(s, pj_full(H, s.t, 1.0 / cap))), pj_full(H, s.t, cap));
  /* the [R, Q, S] mask as [R, KVH, Q, G, S], then [B, Q*G, S] */
  int64_t m5d[5] = {R, kvh, Q, G, S}, mdims[3] = {0, 2, 4};
  pj_val_t m5 = pj_broadcast_in_dim(H, seen, pj_type(PJ_BOOL, 5, m5d), mdims);
  s = SEL(pj_reshape(H, m5, 3, s.t.dims), s, pj_full(H, s.t, -INFINITY));
  int64_t last_dim = 2, bd2[2] = {0, 1};
  pj_val_t mx = pj_reduce(H, s, &last_dim, 1, "max"); /* [B, Q*G] */
  mx = SEL(CMP("EQ", mx, pj_full(H, mx.t, -INFINITY)), zeros(L, mx.t), mx);
  pj_val_t e = U("exponential", SUB(s, pj_broadcast_in_dim(H, mx, s.t, bd2)));
  pj_val_t den = pj_reduce(H, e, &last_dim, 1, "add");
  den = SEL(CMP("EQ", den, zeros(L, den.t)), pj_full(H, den.t, 1.0), den);

  /* out [B, Q*G, D] = e @ V / den, back to token rows [R * Q, H * D] */
  pj_val_t o = pj_dot_general(H, e, vals, &zb, &zb, 1, &c2, &c1, 1, f);
  o = DIV(o, pj_broadcast_in_dim(H, den, o.t, bd2));
  int64_t o5[5] = {R, kvh, Q, G, D}, perm[5] = {0, 2, 1, 3, 4};
  int64_t od[2] = {R * Q, Hq * D};
  o = pj_reshape(H, pj_transpose(H, pj_reshape(H, o, 5, o5), perm), 2, od);
  set_output(L, o, oidx);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_paged_attention[] = {
    {"tpu::reshape_and_cache", lower_reshape_and_cache, PJ_SHAPE_EXACT},
    {"tpu::paged_attention", lower_paged_attention, PJ_SHAPE_EXACT},
    {"tpu::paged_attention_into", lower_paged_attention, PJ_SHAPE_EXACT}, /* the same into `out` */
    {NULL, NULL, PJ_SHAPE_EXACT},
};
