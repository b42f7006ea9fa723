/* Collectives as StableHLO (collective.h): descriptions, their checks and shapes, and the ops
 * that express each collective inside a program (pj_coll_emit). Whole programs and running them
 * are graph/collective_run.c's; a collective inside a captured graph is the lowering at the end.
 *
 * Each collective is built from the five the CPU plugin compiles (all_reduce, all_gather,
 * reduce_scatter, all_to_all, collective_permute; syntax in runtime/multi_exec.c):
 *  - broadcast = all_gather, then the root's slice: selecting moves bits, so every value
 *    (NaN, infinities, -0.0) arrives exactly, which a masked SUM would not guarantee;
 *  - reduce = all_reduce, then non-roots take their own input back;
 *  - gather = all_gather (the root's result is the gather list);
 *  - scatter = all_to_all of the root's chunks, then the chunk that came from the root;
 *  - barrier = an all_reduce of one int32;
 *  - uneven all_to_all = each chunk padded to the largest split (a gather of rows by a
 *    per-replica index table), a regular all_to_all, and the received rows compacted by a
 *    second table;
 *  - permute = collective_permute, then replicas nobody sends to keep their input.
 * Bool travels as ui8 (0/1) and is turned back at the end: every reduction on bool is then an
 * integer op on 0/1 (Gloo reduces bool as C++ bool arithmetic: SUM and MAX are or, PRODUCT and
 * MIN are and), and no plugin needs pred collectives. */
#include "torch_pjrt/collective.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../hlo/strbuf.h"
#include "table.h"

/* ---- ReduceOps: one row each ---- */

/* The combiner of each ReduceOp per dtype class (StableHLO op name without "stablehlo."), or
 * NULL where c10d/Gloo refuses the pair; `post` says what follows the combine. Complex tensors
 * take the float combiner where c10d admits complex (SUM, AVG, PREMUL_SUM: c10d's
 * supports_complex), and nothing else. Bool's or / and are maximum / minimum of 0/1 bytes.
 * XLA's CPU all-reduce takes only add, multiply, minimum and maximum regions ("Unsupported
 * reduction computation" for and/or/xor), so the bitwise combiners are not sent as regions:
 * see is_native. */
typedef enum { POST_NONE, POST_DIVIDE, POST_PREMUL } post_t;
typedef struct {
  const char *name;
  const char *fop;  /* floating point (and complex where complex_ok) */
  const char *iop;  /* integers */
  const char *bop;  /* bool, as ui8 0/1 */
  bool complex_ok;
  post_t post;      /* AVG divides by the group size after the SUM; PREMUL_SUM scales before */
} reduce_row_t;

static const reduce_row_t kReduce[PJ_REDUCE_NUM_OPS] = {
    [PJ_REDUCE_SUM] = {"ReduceOp.SUM", "add", "add", "maximum", true, POST_NONE},
    [PJ_REDUCE_AVG] = {"ReduceOp.AVG", "add", NULL, NULL, true, POST_DIVIDE},
    [PJ_REDUCE_PRODUCT] = {"ReduceOp.PRODUCT", "multiply", "multiply", "minimum", false,
                           POST_NONE},
    [PJ_REDUCE_MIN] = {"ReduceOp.MIN", "minimum", "minimum", "minimum", false, POST_NONE},
    [PJ_REDUCE_MAX] = {"ReduceOp.MAX", "maximum", "maximum", "maximum", false, POST_NONE},
    [PJ_REDUCE_BAND] = {"ReduceOp.BAND", NULL, "and", "minimum", false, POST_NONE},
    [PJ_REDUCE_BOR] = {"ReduceOp.BOR", NULL, "or", "maximum", false, POST_NONE},
    [PJ_REDUCE_BXOR] = {"ReduceOp.BXOR", NULL, "xor", "xor", false, POST_NONE},
    [PJ_REDUCE_PREMUL_SUM] = {"ReduceOp.PREMUL_SUM", "add", NULL, NULL, true, POST_PREMUL},
};

static const char *const kKindNames[PJ_COLL_NUM_KINDS] = {
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
    "reduce",     "gather",     "scatter",        "barrier",    "permute"};

const char *pj_coll_kind_name(pj_coll_kind_t k) {
  return (unsigned)k < PJ_COLL_NUM_KINDS ? kKindNames[k] : "collective";
}

const char *pj_reduce_op_name(pj_reduce_op_t op) {
  return (unsigned)op < PJ_REDUCE_NUM_OPS ? kReduce[op].name : "ReduceOp.UNUSED";
}

bool pj_coll_is_reduction(pj_coll_kind_t k) {
  return k == PJ_COLL_ALL_REDUCE || k == PJ_COLL_REDUCE || k == PJ_COLL_REDUCE_SCATTER;
}

bool pj_coll_has_root(pj_coll_kind_t k) {
  return k == PJ_COLL_BROADCAST || k == PJ_COLL_REDUCE || k == PJ_COLL_GATHER ||
         k == PJ_COLL_SCATTER;
}

/* Chunked kinds: their input is G chunks (tensor form: dim 0 divided by G). */
static bool is_chunked(pj_coll_kind_t k) {
  return k == PJ_COLL_REDUCE_SCATTER || k == PJ_COLL_SCATTER;
}

/* The combiner of (op, dtype), or NULL after filling msg with the refusal. */
static const char *combiner(pj_reduce_op_t op, pj_dtype_t dt, char *msg, size_t cap) {
  const reduce_row_t *row = &kReduce[op];
  const pj_dtype_info_t *info = pj_dtype_info(dt);
  const char *c = NULL;
  if (info->is_lowp)
    snprintf(msg, cap, "Cannot use %s with dtype %s: it has no arithmetic here", row->name,
             info->name);
  else if (info->is_complex && !row->complex_ok)
    snprintf(msg, cap, "all_reduce does not support %s on complex tensors", row->name);
  else if (info->is_float || info->is_complex) {
    c = row->fop;
    if (!c) snprintf(msg, cap, "Cannot use %s with non-integral dtype", row->name);
  } else {
    c = dt == PJ_BOOL ? row->bop : row->iop;
    /* Gloo adds integers and divides in place, which fails (an integer tensor cannot hold the
     * quotient); PREMUL_SUM scales by a float factor, as NCCL does, on floats only. */
    if (!c)
      snprintf(msg, cap, "Cannot use %s with integral dtype %s", row->name, info->name);
  }
  return c;
}

/* ---- checks ---- */

static bool same_shape(const pj_coll_view_t *a, const pj_coll_view_t *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->sizes[i] != b->sizes[i]) return false;
  return true;
}

int pj_coll_ngroups(const pj_coll_desc_t *d) { return d->nreplicas / d->group_size; }

int pj_coll_member(const pj_coll_desc_t *d, int k, int g) {
  return d->groups ? d->groups[k * d->group_size + g] : k * d->group_size + g;
}

/* The group and rank of every replica (the description was checked). */
static void locate(const pj_coll_desc_t *d, int *group_of, int *rank_of) {
  for (int k = 0; k < pj_coll_ngroups(d); k++)
    for (int g = 0; g < d->group_size; g++) {
      const int r = pj_coll_member(d, k, g);
      group_of[r] = k;
      rank_of[r] = g;
    }
}

static pj_status_t *check_view(const pj_coll_desc_t *d, const pj_coll_view_t *v, int i) {
  const char *what = pj_coll_kind_name(d->kind);
  if (v->rank < 0 || v->rank > PJ_MAX_RANK || (v->rank > 0 && (!v->sizes || !v->strides)))
    return pj_status_new(PJ_ERR_VALUE, "%s: input %d has rank %d", what, i, v->rank);
  if (v->numel < 0 || v->offset < 0)
    return pj_status_new(PJ_ERR_VALUE, "%s: input %d has offset %lld in a storage of %lld", what,
                         i, (long long)v->offset, (long long)v->numel);
  int64_t last = v->offset; /* the farthest element the view reaches */
  bool empty = false;
  for (int j = 0; j < v->rank; j++) {
    if (v->sizes[j] < 0 || v->strides[j] < 0)
      return pj_status_new(PJ_ERR_VALUE, "%s: input %d has size %lld, stride %lld in dim %d",
                           what, i, (long long)v->sizes[j], (long long)v->strides[j], j);
    empty = empty || v->sizes[j] == 0;
    if (v->sizes[j] > 0) last += (v->sizes[j] - 1) * v->strides[j];
  }
  if (!empty && last >= v->numel)
    return pj_status_new(PJ_ERR_VALUE,
                         "%s: input %d's view reaches element %lld of a storage of %lld", what,
                         i, (long long)last, (long long)v->numel);
  return NULL;
}

static pj_status_t *check_splits(const pj_coll_desc_t *d) {
  const int G = d->group_size, R = d->nreplicas;
  const int64_t rows = d->inputs[0].rank > 0 ? d->inputs[0].sizes[0] : -1;
  if (rows < 0)
    return pj_status_new(PJ_ERR_VALUE, "all_to_all: a 0-d input cannot be split");
  if (!d->in_splits) {
    if (d->out_splits)
      return pj_status_new(PJ_ERR_VALUE, "all_to_all: output splits without input splits");
    if (rows % G)
      return pj_status_new(PJ_ERR_VALUE,
                           "all_to_all: Tensor's dim 0 (%lld) does not divide equally across "
                           "group size %d",
                           (long long)rows, G);
    return NULL;
  }
  int64_t most = 0;
  for (int r = 0; r < R; r++) {
    int64_t sum = 0;
    for (int g = 0; g < G; g++) {
      if (d->in_splits[r * G + g] < 0)
        return pj_status_new(PJ_ERR_VALUE, "all_to_all: negative split size of replica %d", r);
      sum += d->in_splits[r * G + g];
    }
    if (sum > rows)
      return pj_status_new(PJ_ERR_VALUE,
                           "all_to_all: Split sizes doesn't match total dim 0 size: replica %d "
                           "sends %lld rows of %lld",
                           r, (long long)sum, (long long)rows);
    if (sum > most) most = sum;
  }
  /* The view is the largest replica's input: a taller one would hold rows nobody sends. */
  if (most != rows)
    return pj_status_new(PJ_ERR_VALUE,
                         "all_to_all: Split sizes doesn't match total dim 0 size: the input has "
                         "%lld rows, the largest split sum is %lld",
                         (long long)rows, (long long)most);
  if (d->out_splits) {
    int *group_of = malloc(sizeof(int) * (size_t)R), *rank_of = malloc(sizeof(int) * (size_t)R);
    if (!group_of || !rank_of) {
      free(group_of);
      free(rank_of);
      return pj_status_new(PJ_ERR_OOM, "out of host memory");
    }
    locate(d, group_of, rank_of);
    pj_status_t *st = NULL;
    for (int r = 0; r < R && !st; r++)
      for (int g = 0; g < G && !st; g++) {
        const int src = pj_coll_member(d, group_of[r], g);
        if (d->out_splits[r * G + g] != d->in_splits[src * G + rank_of[r]])
          st = pj_status_new(PJ_ERR_VALUE,
                             "all_to_all: replica %d expects %lld rows from rank %d, which "
                             "sends it %lld",
                             r, (long long)d->out_splits[r * G + g], g,
                             (long long)d->in_splits[src * G + rank_of[r]]);
      }
    free(group_of);
    free(rank_of);
    return st;
  }
  return NULL;
}

pj_status_t *pj_coll_check(const pj_coll_desc_t *d) {
  if (!d || (unsigned)d->kind >= PJ_COLL_NUM_KINDS)
    return pj_status_new(PJ_ERR_VALUE, "collective: unknown kind %d", d ? (int)d->kind : -1);
  const char *what = pj_coll_kind_name(d->kind);
  if (!pj_dtype_is_valid((int)d->dtype))
    return pj_status_new(PJ_ERR_VALUE, "%s: unknown dtype %d", what, (int)d->dtype);
  if (d->nreplicas < 1 || d->nreplicas > PJ_COLL_MAX_REPLICAS || d->group_size < 1 ||
      d->nreplicas % d->group_size)
    return pj_status_new(PJ_ERR_VALUE,
                         "%s: %d replicas in groups of %d (groups must split the replicas "
                         "evenly, at most %d replicas)",
                         what, d->nreplicas, d->group_size, PJ_COLL_MAX_REPLICAS);
  /* Groups partition the replicas: a replica in no group would run the program without a
   * partner, one in two groups would be two ranks at once. */
  unsigned char seen[PJ_COLL_MAX_REPLICAS] = {0};
  for (int k = 0; k < pj_coll_ngroups(d); k++)
    for (int g = 0; g < d->group_size; g++) {
      const int r = pj_coll_member(d, k, g);
      if (r < 0 || r >= d->nreplicas)
        return pj_status_new(PJ_ERR_VALUE, "%s: group %d names replica %d of %d", what, k, r,
                             d->nreplicas);
      if (seen[r]++)
        return pj_status_new(PJ_ERR_VALUE, "%s: replica %d is in two groups", what, r);
    }
  if (pj_coll_has_root(d->kind) && (d->root < 0 || d->root >= d->group_size))
    return pj_status_new(PJ_ERR_VALUE, "%s: invalid root rank: %d (group size %d)", what,
                         d->root, d->group_size);
  const int want_inputs = d->kind == PJ_COLL_BARRIER ? 0 : 1;
  const bool list_in = is_chunked(d->kind) && d->ninputs == d->group_size && d->group_size > 1;
  if (d->ninputs != want_inputs && !list_in)
    return pj_status_new(PJ_ERR_VALUE, "%s: %d inputs (expected %d%s)", what, d->ninputs,
                         want_inputs, is_chunked(d->kind) ? " or the group size" : "");
  if (d->ninputs > 0 && !d->inputs)
    return pj_status_new(PJ_ERR_VALUE, "%s: no input views", what);
  for (int i = 0; i < d->ninputs; i++) {
    PJ_TRY(check_view(d, &d->inputs[i], i));
    if (!same_shape(&d->inputs[i], &d->inputs[0]))
      return pj_status_new(PJ_ERR_VALUE, "%s: the list's tensors differ in shape", what);
  }
  if (d->list_out && d->kind != PJ_COLL_ALL_GATHER && d->kind != PJ_COLL_GATHER)
    return pj_status_new(PJ_ERR_VALUE, "%s has no list of outputs", what);
  if (pj_coll_is_reduction(d->kind)) {
    if ((unsigned)d->op >= PJ_REDUCE_NUM_OPS)
      return pj_status_new(PJ_ERR_VALUE, "%s: invalid reduce op %d", what, (int)d->op);
    char msg[200];
    if (!combiner(d->op, d->dtype, msg, sizeof msg))
      return pj_status_new(PJ_ERR_RUNTIME, "%s: %s", what, msg);
  }
  if (is_chunked(d->kind) && !list_in) {
    const pj_coll_view_t *v = &d->inputs[0];
    if (v->rank == 0 || v->sizes[0] % d->group_size)
      return pj_status_new(PJ_ERR_VALUE,
                           "%s: the input's dim 0 (%lld) must be the output's times the group "
                           "size %d",
                           what, v->rank ? (long long)v->sizes[0] : 0LL, d->group_size);
  }
  if (d->kind == PJ_COLL_ALL_TO_ALL) PJ_TRY(check_splits(d));
  else if (d->in_splits || d->out_splits)
    return pj_status_new(PJ_ERR_VALUE, "%s takes no split sizes", what);
  if (d->kind == PJ_COLL_PERMUTE) {
    if (d->npairs < 0 || (d->npairs > 0 && !d->pairs))
      return pj_status_new(PJ_ERR_VALUE, "permute: %d pairs", d->npairs);
    unsigned char src[PJ_COLL_MAX_REPLICAS] = {0}, dst[PJ_COLL_MAX_REPLICAS] = {0};
    for (int p = 0; p < d->npairs; p++) {
      const int s = d->pairs[2 * p], t = d->pairs[2 * p + 1];
      if (s < 0 || s >= d->nreplicas || t < 0 || t >= d->nreplicas)
        return pj_status_new(PJ_ERR_VALUE, "permute: pair (%d, %d) outside %d replicas", s, t,
                             d->nreplicas);
      /* collective_permute sends each replica's one buffer once and fills each target from one
       * source: more needs several rounds. */
      if (src[s]++ || dst[t]++)
        return pj_status_new(PJ_ERR_VALUE, "permute: replica %d %s twice", src[s] > 1 ? s : t,
                             src[s] > 1 ? "sends" : "receives");
    }
  } else if (d->npairs)
    return pj_status_new(PJ_ERR_VALUE, "%s takes no permute pairs", what);
  return NULL;
}

/* ---- shapes ---- */

int pj_coll_num_outputs(const pj_coll_desc_t *d) {
  return (d->kind == PJ_COLL_ALL_GATHER || d->kind == PJ_COLL_GATHER) && d->list_out
             ? d->group_size
             : 1;
}

int pj_coll_num_args(const pj_coll_desc_t *d) {
  return d->ninputs + (pj_coll_is_reduction(d->kind) && d->op == PJ_REDUCE_PREMUL_SUM);
}

/* The largest number of rows any replica receives in an uneven all_to_all. */
static int64_t recv_rows(const pj_coll_desc_t *d, int r, const int *group_of, const int *rank_of) {
  int64_t n = 0;
  for (int g = 0; g < d->group_size; g++)
    n += d->in_splits[pj_coll_member(d, group_of[r], g) * d->group_size + rank_of[r]];
  return n;
}

int64_t pj_coll_out_rows(const pj_coll_desc_t *d, int r) {
  pj_type_t t;
  pj_status_t *st = pj_coll_output_type(d, 0, &t);
  if (st) {
    pj_status_free(st);
    return -1;
  }
  if (d->kind != PJ_COLL_ALL_TO_ALL || !d->in_splits) return t.rank ? t.dims[0] : 1;
  int group_of[PJ_COLL_MAX_REPLICAS], rank_of[PJ_COLL_MAX_REPLICAS];
  locate(d, group_of, rank_of);
  return r >= 0 && r < d->nreplicas ? recv_rows(d, r, group_of, rank_of) : -1;
}

pj_status_t *pj_coll_output_type(const pj_coll_desc_t *d, int k, pj_type_t *out) {
  PJ_TRY(pj_coll_check(d));
  if (k < 0 || k >= pj_coll_num_outputs(d))
    return pj_status_new(PJ_ERR_INDEX, "%s has no output %d", pj_coll_kind_name(d->kind), k);
  if (d->kind == PJ_COLL_BARRIER) {
    *out = pj_type_scalar(PJ_I32);
    return NULL;
  }
  const pj_coll_view_t *v = &d->inputs[0];
  pj_type_t t = pj_type(d->dtype, v->rank, v->sizes);
  const int G = d->group_size;
  switch (d->kind) {
    case PJ_COLL_ALL_GATHER:
    case PJ_COLL_GATHER:
      if (d->list_out) break;
      if (t.rank == 0) t = pj_type(d->dtype, 1, (int64_t[]){G});
      else t.dims[0] *= G;
      break;
    case PJ_COLL_REDUCE_SCATTER:
    case PJ_COLL_SCATTER:
      if (d->ninputs == 1) t.dims[0] /= G;
      break;
    case PJ_COLL_ALL_TO_ALL:
      if (d->in_splits) {
        int group_of[PJ_COLL_MAX_REPLICAS], rank_of[PJ_COLL_MAX_REPLICAS];
        locate(d, group_of, rank_of);
        int64_t most = 0;
        for (int r = 0; r < d->nreplicas; r++) {
          const int64_t n = recv_rows(d, r, group_of, rank_of);
          if (n > most) most = n;
        }
        t.dims[0] = most;
      }
      break;
    default:
      break;
  }
  *out = t;
  return NULL;
}

/* ---- the program ---- */

typedef struct {
  pj_hlo_t *h;
  const pj_coll_desc_t *d;
  char *groups_attr; /* "replica_groups = dense<...> : tensor<KxGxi64>" */
  int group_of[PJ_COLL_MAX_REPLICAS], rank_of[PJ_COLL_MAX_REPLICAS];
} bld_t;

static pj_dtype_t wire(pj_dtype_t dt) { return dt == PJ_BOOL ? PJ_U8 : dt; }

static pj_val_t flatten(pj_hlo_t *h, pj_val_t x) {
  const int64_t n = pj_type_numel(&x.t);
  return pj_reshape(h, x, 1, &n);
}

/* A 1-D or 2-D int64 constant. */
static pj_val_t const_table(pj_hlo_t *h, const int64_t *v, int rank, const int64_t *dims) {
  pj_type_t t = pj_type(PJ_I64, rank, dims);
  const int64_t n = pj_type_numel(&t);
  pj_sb_t b = {0};
  pj_sb_puts(&b, "value = dense<");
  for (int64_t i = 0; i < n; i++) {
    if (rank == 2 && i % dims[1] == 0) pj_sb_puts(&b, i ? "], [" : "[[");
    else if (i) pj_sb_puts(&b, ", ");
    else if (rank == 1) pj_sb_puts(&b, "[");
    pj_sb_printf(&b, "%lld", (long long)v[i]);
  }
  pj_sb_puts(&b, rank == 2 ? "]]" : "]");
  char ts[PJ_TYPE_STR_CAP];
  pj_sb_printf(&b, "> : %s", pj_type_str(&t, ts, sizeof ts));
  char *attrs = pj_sb_take(&b, NULL);
  if (!attrs) return pj_hlo_fail(h, PJ_ERR_OOM, "out of host memory building a program");
  pj_val_t c = pj_hlo_op(h, "stablehlo.constant", NULL, 0, attrs, t);
  free(attrs);
  return c;
}

/* This replica's number, a 0-d int64. */
static pj_val_t replica_id(pj_hlo_t *h) {
  pj_val_t id = pj_hlo_op(h, "stablehlo.replica_id", NULL, 0, NULL, pj_type_scalar(PJ_U32));
  return pj_convert(h, id, PJ_I64);
}

/* Row `row` (0-d int64) of a [n, w] table (or element of a [n] one), as [w] (or 0-d). */
static pj_val_t table_row(pj_hlo_t *h, pj_val_t table, pj_val_t row) {
  const int rank = table.t.rank;
  char attrs[96];
  if (rank == 1)
    snprintf(attrs, sizeof attrs, "slice_sizes = array<i64: 1>");
  else
    snprintf(attrs, sizeof attrs, "slice_sizes = array<i64: 1, %lld>",
             (long long)table.t.dims[1]);
  pj_val_t ins[3] = {table, row, pj_const_i(h, PJ_I64, 0)};
  int64_t dims[2] = {1, rank == 2 ? table.t.dims[1] : 0};
  pj_val_t s = pj_hlo_op(h, "stablehlo.dynamic_slice", ins, rank + 1, attrs,
                         pj_type(PJ_I64, rank, dims));
  return rank == 1 ? pj_reshape(h, s, 0, NULL) : pj_reshape(h, s, 1, &dims[1]);
}

/* Whether this replica's entry of a per-replica 0/1 table is 1, broadcast to x's shape. */
static pj_val_t replica_flag(bld_t *b, const int64_t *flags, pj_type_t like) {
  pj_hlo_t *h = b->h;
  const int64_t R = b->d->nreplicas;
  pj_val_t f = table_row(h, const_table(h, flags, 1, &R), replica_id(h));
  pj_val_t yes = pj_compare(h, "NE", f, pj_const_i(h, PJ_I64, 0));
  return pj_broadcast_to(h, yes, like.rank, like.dims);
}

/* Combiners every plugin's all_reduce / reduce_scatter region takes. The others (and, or, xor)
 * gather the group's values and combine them locally: the same result, exactly, at G times the
 * traffic of a reduction (bitwise reductions are rare and small: flags, masks). */
static bool is_native(const char *comb) {
  return !strcmp(comb, "add") || !strcmp(comb, "multiply") || !strcmp(comb, "minimum") ||
         !strcmp(comb, "maximum");
}

/* [G, n] -> [n]: the G rows combined by `comb` ("and", "or", "xor"), in rank order. A chain of
 * binary ops rather than a reduce: it needs no identity (all ones for an integer and). */
static pj_val_t combine_rows(bld_t *b, pj_val_t rows, const char *comb) {
  pj_hlo_t *h = b->h;
  const int64_t n = rows.t.dims[1];
  char op[48];
  snprintf(op, sizeof op, "stablehlo.%s", comb);
  pj_val_t acc = {.id = -1};
  for (int64_t g = 0; g < rows.t.dims[0]; g++) {
    const int64_t lo[2] = {g, 0}, hi[2] = {g + 1, n};
    pj_val_t row = pj_reshape(h, pj_slice(h, rows, lo, hi, NULL), 1, &n);
    acc = g ? pj_binary(h, op, acc, row) : row;
  }
  return acc;
}

static pj_val_t all_gather(bld_t *b, pj_val_t x);
static pj_val_t all_to_all(bld_t *b, pj_val_t x);

/* The reduction region of all_reduce and reduce_scatter: `comb` on two 0-d values of dt
 * (malloc'd text; NULL when out of memory). */
static char *combiner_region(pj_hlo_t *h, pj_dtype_t dt, const char *comb) {
  pj_type_t st = pj_type_scalar(dt), sts[2] = {st, st};
  pj_val_t a[2];
  char op[48];
  snprintf(op, sizeof op, "stablehlo.%s", comb);
  pj_hlo_region_begin(h, sts, 2, a);
  pj_val_t r = pj_binary(h, op, a[0], a[1]);
  return pj_hlo_region_end(h, &r, 1);
}

static pj_val_t all_reduce(bld_t *b, pj_val_t x, const char *comb) {
  pj_hlo_t *h = b->h;
  if (!is_native(comb)) {
    const int64_t n = pj_type_numel(&x.t), rows[2] = {b->d->group_size, n};
    pj_val_t g = pj_reshape(h, all_gather(b, pj_reshape(h, x, 1, &n)), 2, rows);
    return pj_reshape(h, combine_rows(b, g, comb), x.t.rank, x.t.dims);
  }
  pj_val_t res;
  char *region = combiner_region(h, x.t.dtype, comb);
  if (!region) return pj_hlo_fail(h, PJ_ERR_OOM, "out of host memory building a program");
  pj_hlo_op_multi(h, "stablehlo.all_reduce", &x, 1, region, b->groups_attr, &x.t, 1, &res);
  free(region);
  return res;
}

/* [G*n] -> [n]: rank g keeps chunk g of the reduction. */
static pj_val_t reduce_scatter(bld_t *b, pj_val_t x, const char *comb) {
  pj_hlo_t *h = b->h;
  if (!is_native(comb)) { /* every rank's chunk for me, then their combine */
    const int64_t rows[2] = {b->d->group_size, x.t.dims[0] / b->d->group_size};
    return combine_rows(b, pj_reshape(h, all_to_all(b, x), 2, rows), comb);
  }
  pj_val_t res;
  char *region = combiner_region(h, x.t.dtype, comb);
  pj_sb_t sb = {0};
  pj_sb_printf(&sb, "scatter_dimension = 0 : i64, %s", b->groups_attr);
  char *attrs = pj_sb_take(&sb, NULL);
  pj_type_t t = x.t;
  t.dims[0] /= b->d->group_size;
  if (!region || !attrs) res = pj_hlo_fail(h, PJ_ERR_OOM, "out of host memory");
  else pj_hlo_op_multi(h, "stablehlo.reduce_scatter", &x, 1, region, attrs, &t, 1, &res);
  free(region);
  free(attrs);
  return res;
}

/* [n] -> [G*n]: chunk g from rank g. */
static pj_val_t all_gather(bld_t *b, pj_val_t x) {
  pj_sb_t sb = {0};
  pj_sb_printf(&sb, "all_gather_dim = 0 : i64, %s", b->groups_attr);
  char *attrs = pj_sb_take(&sb, NULL);
  if (!attrs) return pj_hlo_fail(b->h, PJ_ERR_OOM, "out of host memory");
  pj_type_t t = x.t;
  t.dims[0] *= b->d->group_size;
  pj_val_t y = pj_hlo_op(b->h, "stablehlo.all_gather", &x, 1, attrs, t);
  free(attrs);
  return y;
}

/* [G*m, ...] -> [G*m, ...]: chunk g goes to rank g; chunk g of the result came from rank g. */
static pj_val_t all_to_all(bld_t *b, pj_val_t x) {
  pj_sb_t sb = {0};
  pj_sb_printf(&sb, "split_dimension = 0 : i64, concat_dimension = 0 : i64, split_count = %d : "
               "i64, %s", b->d->group_size, b->groups_attr);
  char *attrs = pj_sb_take(&sb, NULL);
  if (!attrs) return pj_hlo_fail(b->h, PJ_ERR_OOM, "out of host memory");
  pj_val_t y = pj_hlo_op(b->h, "stablehlo.all_to_all", &x, 1, attrs, x.t);
  free(attrs);
  return y;
}

/* Chunk c of [G*n] as [n]. */
static pj_val_t chunk(bld_t *b, pj_val_t x, int c) {
  const int64_t n = x.t.dims[0] / b->d->group_size;
  const int64_t lo = c * n, hi = lo + n;
  return pj_slice(b->h, x, &lo, &hi, NULL);
}

/* x in the dtype's compute type, combined with f (0-d f64) by `op`, back in x's dtype. */
static pj_val_t scale(pj_hlo_t *h, pj_val_t x, pj_val_t f, const char *op) {
  const pj_dtype_t dt = x.t.dtype, cd = pj_dtype_compute(dt);
  pj_val_t xc = pj_convert(h, x, cd);
  pj_val_t fc = pj_broadcast_to(h, pj_convert(h, f, cd), xc.t.rank, xc.t.dims);
  return pj_convert(h, pj_binary(h, op, xc, fc), dt);
}

/* The reduction of x (any shape) over the group: combine, AVG's division. */
static pj_val_t reduce_all(bld_t *b, pj_val_t x, const char *comb) {
  pj_val_t y = all_reduce(b, x, comb);
  if (kReduce[b->d->op].post == POST_DIVIDE)
    y = scale(b->h, y, pj_const(b->h, PJ_F64, b->d->group_size), "stablehlo.divide");
  return y;
}

/* Uneven all_to_all of x [rows, ...] (x already in the wire dtype). */
static pj_val_t all_to_all_uneven(bld_t *b, pj_val_t x, pj_type_t out) {
  pj_hlo_t *h = b->h;
  const pj_coll_desc_t *d = b->d;
  const int G = d->group_size, R = d->nreplicas;
  const int64_t rows = x.t.dims[0], K = rows ? pj_type_numel(&x.t) / rows : 0;
  int64_t M = 0; /* the largest split: every chunk travels padded to it */
  for (int i = 0; i < R * G; i++)
    if (d->in_splits[i] > M) M = d->in_splits[i];
  const int64_t maxrecv = out.dims[0];
  if (M == 0 || K == 0 || maxrecv == 0) return pj_full(h, out, 0);
  /* send[r][g*M + k]: the input row replica r sends as row k of its chunk for rank g, or
   * `rows` (an appended zero row) past its split. recv[r][j]: where output row j of replica r
   * lies in the received [G*M] rows (rank g's chunk first), or G*M (a zero row) past its
   * count. */
  int64_t *send = malloc(sizeof(int64_t) * (size_t)(R * G * M));
  int64_t *recv = malloc(sizeof(int64_t) * (size_t)(R * maxrecv));
  if (!send || !recv) {
    free(send);
    free(recv);
    return pj_hlo_fail(h, PJ_ERR_OOM, "out of host memory building a program");
  }
  for (int r = 0; r < R; r++) {
    int64_t off = 0, j = 0;
    for (int g = 0; g < G; g++) {
      const int64_t s = d->in_splits[r * G + g];
      for (int64_t k = 0; k < M; k++) send[(r * G + g) * M + k] = k < s ? off + k : rows;
      off += s;
      const int64_t got = d->in_splits[pj_coll_member(d, b->group_of[r], g) * G + b->rank_of[r]];
      for (int64_t k = 0; k < got; k++) recv[r * maxrecv + j++] = g * M + k;
    }
    for (; j < maxrecv; j++) recv[r * maxrecv + j] = G * M;
  }
  const int64_t sdims[2] = {R, G * M}, rdims[2] = {R, maxrecv};
  pj_val_t rid = replica_id(h);
  pj_val_t my_send = table_row(h, const_table(h, send, 2, sdims), rid);
  pj_val_t my_recv = table_row(h, const_table(h, recv, 2, rdims), rid);
  free(send);
  free(recv);
  /* Rows of K elements, with one zero row appended as the padding's source. */
  const int64_t mat[2] = {rows, K}, zrow[2] = {1, K};
  pj_val_t zero = pj_full(h, pj_type(x.t.dtype, 2, zrow), 0);
  pj_val_t parts[2] = {pj_reshape(h, x, 2, mat), zero};
  pj_val_t src = pj_concat(h, parts, 2, 0);
  char attrs[320];
  snprintf(attrs, sizeof attrs,
           "dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = "
           "[0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, "
           "%lld>, indices_are_sorted = false",
           (long long)K);
  const int64_t sidx[2] = {G * M, 1}, ridx[2] = {maxrecv, 1};
  const int64_t padded[2] = {G * M, K}, got[2] = {maxrecv, K};
  pj_val_t gin[2] = {src, pj_reshape(h, my_send, 2, sidx)};
  pj_val_t sendbuf = pj_hlo_op(h, "stablehlo.gather", gin, 2, attrs, pj_type(x.t.dtype, 2, padded));
  pj_val_t recvd = all_to_all(b, sendbuf);
  pj_val_t parts2[2] = {recvd, zero};
  pj_val_t rsrc = pj_concat(h, parts2, 2, 0);
  pj_val_t gout[2] = {rsrc, pj_reshape(h, my_recv, 2, ridx)};
  pj_val_t y = pj_hlo_op(h, "stablehlo.gather", gout, 2, attrs, pj_type(x.t.dtype, 2, got));
  return pj_reshape(h, y, out.rank, out.dims);
}

/* The program's results in the wire dtype; n receives their count. */
static void emit(bld_t *b, const pj_val_t *in, pj_val_t factor, pj_val_t *res) {
  pj_hlo_t *h = b->h;
  const pj_coll_desc_t *d = b->d;
  const int G = d->group_size;
  char msg[200];
  const char *comb = pj_coll_is_reduction(d->kind) ? combiner(d->op, d->dtype, msg, sizeof msg) : NULL;
  pj_type_t out;
  pj_status_t *st = pj_coll_output_type(d, 0, &out);
  if (st) { /* checked by the caller */
    pj_hlo_fail(h, pj_status_code(st), "%s", pj_status_message(st));
    pj_status_free(st);
    return;
  }
  out.dtype = wire(d->dtype);
  /* Inputs of the chunked kinds as one [G*n] value (the list form concatenated). */
  pj_val_t x = d->ninputs ? in[0] : (pj_val_t){.id = -1};
  if (d->ninputs > 1) {
    pj_val_t flat[PJ_COLL_MAX_REPLICAS];
    for (int i = 0; i < d->ninputs; i++) flat[i] = flatten(h, in[i]);
    x = pj_concat(h, flat, d->ninputs, 0);
  }
  switch (d->kind) {
    case PJ_COLL_ALL_REDUCE:
    case PJ_COLL_REDUCE: {
      pj_val_t y = x;
      if (d->op == PJ_REDUCE_PREMUL_SUM) y = scale(h, y, factor, "stablehlo.multiply");
      y = reduce_all(b, y, comb);
      if (d->kind == PJ_COLL_REDUCE) {
        int64_t is_root[PJ_COLL_MAX_REPLICAS];
        for (int r = 0; r < d->nreplicas; r++) is_root[r] = b->rank_of[r] == d->root;
        y = pj_select(h, replica_flag(b, is_root, y.t), y, x);
      }
      res[0] = y;
      return;
    }
    case PJ_COLL_REDUCE_SCATTER: {
      pj_val_t y = flatten(h, x);
      if (d->op == PJ_REDUCE_PREMUL_SUM) y = scale(h, y, factor, "stablehlo.multiply");
      y = reduce_scatter(b, y, comb);
      if (kReduce[d->op].post == POST_DIVIDE)
        y = scale(h, y, pj_const(h, PJ_F64, G), "stablehlo.divide");
      res[0] = pj_reshape(h, y, out.rank, out.dims);
      return;
    }
    case PJ_COLL_ALL_GATHER:
    case PJ_COLL_GATHER: {
      pj_val_t y = all_gather(b, flatten(h, x));
      if (!d->list_out) res[0] = pj_reshape(h, y, out.rank, out.dims);
      else
        for (int g = 0; g < G; g++) res[g] = pj_reshape(h, chunk(b, y, g), x.t.rank, x.t.dims);
      return;
    }
    case PJ_COLL_BROADCAST:
      res[0] = pj_reshape(h, chunk(b, all_gather(b, flatten(h, x)), d->root), out.rank, out.dims);
      return;
    case PJ_COLL_SCATTER:
      res[0] = pj_reshape(h, chunk(b, all_to_all(b, flatten(h, x)), d->root), out.rank, out.dims);
      return;
    case PJ_COLL_ALL_TO_ALL:
      res[0] = d->in_splits ? all_to_all_uneven(b, x, out)
                            : pj_reshape(h, all_to_all(b, flatten(h, x)), out.rank, out.dims);
      return;
    case PJ_COLL_BARRIER:
      res[0] = all_reduce(b, pj_const_i(h, PJ_I32, 0), "add");
      return;
    case PJ_COLL_PERMUTE: {
      pj_sb_t sb = {0};
      pj_sb_puts(&sb, "source_target_pairs = dense<");
      for (int p = 0; p < d->npairs; p++)
        pj_sb_printf(&sb, "%s[%d, %d]", p ? ", " : "[", d->pairs[2 * p], d->pairs[2 * p + 1]);
      pj_sb_printf(&sb, "%s> : tensor<%dx2xi64>", d->npairs ? "]" : "", d->npairs);
      char *attrs = pj_sb_take(&sb, NULL);
      if (!attrs) {
        pj_hlo_fail(h, PJ_ERR_OOM, "out of host memory");
        return;
      }
      /* An empty pair list moves nothing (and StableHLO's verifier wants a 2-D attribute). */
      pj_val_t y = d->npairs ? pj_hlo_op(h, "stablehlo.collective_permute", &x, 1, attrs, x.t) : x;
      free(attrs);
      int64_t gets[PJ_COLL_MAX_REPLICAS] = {0};
      for (int p = 0; p < d->npairs; p++) gets[d->pairs[2 * p + 1]] = 1;
      res[0] = d->npairs ? pj_select(h, replica_flag(b, gets, x.t), y, x) : x;
      return;
    }
    default:
      pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: collective kind %d", (int)d->kind);
  }
}

pj_status_t *pj_coll_emit(pj_hlo_t *h, const pj_coll_desc_t *d, const pj_val_t *in,
                          pj_val_t factor, pj_val_t *res) {
  PJ_TRY(pj_coll_check(d));
  bld_t b = {.h = h, .d = d};
  locate(d, b.group_of, b.rank_of);
  pj_sb_t sb = {0};
  pj_sb_puts(&sb, "replica_groups = dense<[");
  for (int k = 0; k < pj_coll_ngroups(d); k++) {
    pj_sb_puts(&sb, k ? ", [" : "[");
    for (int g = 0; g < d->group_size; g++)
      pj_sb_printf(&sb, "%s%d", g ? ", " : "", pj_coll_member(d, k, g));
    pj_sb_puts(&sb, "]");
  }
  pj_sb_printf(&sb, "]> : tensor<%dx%dxi64>", pj_coll_ngroups(d), d->group_size);
  b.groups_attr = pj_sb_take(&sb, NULL);
  if (!b.groups_attr) return pj_status_new(PJ_ERR_OOM, "out of host memory building a program");
  pj_val_t wired[PJ_COLL_MAX_REPLICAS];
  for (int i = 0; i < d->ninputs; i++) wired[i] = pj_convert(h, in[i], wire(d->dtype));
  emit(&b, wired, factor, res);
  /* Bool went over the wire as 0/1 bytes. */
  if (d->dtype == PJ_BOOL && d->kind != PJ_COLL_BARRIER)
    for (int k = 0; k < pj_coll_num_outputs(d); k++)
      res[k] = pj_compare(h, "NE", res[k], pj_full(h, res[k].t, 0));
  free(b.groups_attr);
  return NULL;
}

/* ---- a collective inside a captured graph ---- */

/* _pj_collective(Tensor self, int kind, int reduce_op, int group_size) -> Tensor: one
 * collective (all_reduce, all_gather into one tensor, reduce_scatter of one tensor) over all
 * group_size replicas of the program, in one group, as the c10d functional collectives that
 * torch.compile puts into graphs. Only a program compiled for that many replicas can hold it:
 * the bridge records it into a rank thread's capture (defer.h, pj_capture_record_collective),
 * whose plan then runs as one SPMD program over the group's devices (capture.c). */
static pj_status_t *lower_collective(pj_lower_t *L) {
  const pj_tensor_desc_t *td = pj_tensor_desc(L, "self");
  if (!td) return pj_status_new(PJ_ERR_VALUE, "_pj_collective: no input");
  /* the input arrives materialized (lower.h): a contiguous value of the view's shape */
  int64_t strides[PJ_MAX_RANK], numel = 1;
  for (int i = td->rank - 1; i >= 0; i--) {
    strides[i] = numel;
    numel *= td->sizes[i];
  }
  const pj_coll_view_t view = {td->rank, td->sizes, strides, 0, numel};
  const int n = (int)pj_int(L, "group_size", 1);
  const pj_coll_desc_t d = {.kind = (pj_coll_kind_t)pj_int(L, "kind", PJ_COLL_ALL_REDUCE),
                            .op = (pj_reduce_op_t)pj_int(L, "reduce_op", PJ_REDUCE_SUM),
                            .dtype = td->dtype,
                            .ninputs = 1,
                            .inputs = &view,
                            .nreplicas = n,
                            .group_size = n};
  if (d.kind != PJ_COLL_ALL_REDUCE && d.kind != PJ_COLL_ALL_GATHER &&
      d.kind != PJ_COLL_REDUCE_SCATTER)
    return pj_status_new(PJ_ERR_VALUE, "_pj_collective: %s is not recorded into graphs",
                         pj_coll_kind_name(d.kind));
  if (d.op == PJ_REDUCE_PREMUL_SUM)
    return pj_status_new(PJ_ERR_VALUE, "_pj_collective: PREMUL_SUM needs a factor");
  pj_val_t x = pj_tensor(L, "self"), res[1];
  PJ_TRY(pj_coll_emit(L->h, &d, &x, (pj_val_t){.id = -1}, res));
  pj_set_result(L, 0, res[0]);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_collective[] = {
    {"_pj_collective", lower_collective, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
