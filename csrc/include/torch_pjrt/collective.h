/* Collectives as StableHLO programs: one description of a c10d collective (all_reduce with
 * every ReduceOp, all_gather, reduce_scatter, all_to_all even and uneven, broadcast, reduce,
 * gather, scatter, barrier, point-to-point permutes) becomes one program compiled for the
 * group's replicas (multi_exec.h) and launched on all their devices in one call.
 *
 * The program is SPMD: every replica runs the same text, so every replica's arguments have
 * the same types and its results too. What differs per replica (is it the root, what it sends
 * in an uneven all_to_all, does a permute reach it) is looked up in constant tables indexed by
 * stablehlo.replica_id inside the program.
 *
 * Inputs are storages (1-D buffers of `numel` elements) read through a view, so a
 * non-contiguous input is read inside the program as every op here reads one. Outputs are new
 * contiguous buffers of the shapes pj_coll_output_type gives, installed by the caller. */
#ifndef TORCH_PJRT_COLLECTIVE_H
#define TORCH_PJRT_COLLECTIVE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "torch_pjrt/dtype.h"
#include "torch_pjrt/hlo.h"
#include "torch_pjrt/status.h"
#include "torch_pjrt/stream.h"
#ifdef __cplusplus
extern "C" {
#endif
struct PJRT_Buffer;

/* The most replicas a collective program runs on (the runtime's limit of a placement). */
#define PJ_COLL_MAX_REPLICAS 64

typedef enum {
  PJ_COLL_ALL_REDUCE = 0,
  PJ_COLL_ALL_GATHER,
  PJ_COLL_REDUCE_SCATTER,
  PJ_COLL_ALL_TO_ALL,
  PJ_COLL_BROADCAST,
  PJ_COLL_REDUCE,
  PJ_COLL_GATHER,
  PJ_COLL_SCATTER,
  PJ_COLL_BARRIER,
  PJ_COLL_PERMUTE,
  PJ_COLL_NUM_KINDS
} pj_coll_kind_t;

/* c10d's ReduceOp, with its numbering (RedOpType). */
typedef enum {
  PJ_REDUCE_SUM = 0,
  PJ_REDUCE_AVG = 1,
  PJ_REDUCE_PRODUCT = 2,
  PJ_REDUCE_MIN = 3,
  PJ_REDUCE_MAX = 4,
  PJ_REDUCE_BAND = 5,
  PJ_REDUCE_BOR = 6,
  PJ_REDUCE_BXOR = 7,
  PJ_REDUCE_PREMUL_SUM = 8,
  PJ_REDUCE_NUM_OPS
} pj_reduce_op_t;

/* One input: a view (sizes, strides, offset in elements) of a 1-D storage of `numel` elements
 * of the description's dtype. The same view on every replica (each replica's own storage). */
typedef struct {
  int rank;
  const int64_t *sizes;
  const int64_t *strides;
  int64_t offset;
  int64_t numel;
} pj_coll_view_t;

/* One collective over `nreplicas` replicas split into groups of `group_size` (replica numbers
 * 0..nreplicas-1 of the program; pj_coll_run binds replica r to a device). Every replica belongs
 * to exactly one group; several groups run the same collective side by side, which is how a
 * sub-group partition or one dimension of a DeviceMesh is expressed: a 2x2 mesh's rows are
 * {{0,1},{2,3}}, its columns {{0,2},{1,3}}. Ranks (root, splits) are positions in a group.
 *
 * Per kind (G = group_size, S = the input view's shape, "rows" = its dim 0):
 *  ALL_REDUCE      one input; one output S. `op` any ReduceOp the dtype admits.
 *  REDUCE          as ALL_REDUCE at the root; every other replica gets its input back unchanged
 *                  (c10d leaves non-root tensors as they were).
 *  ALL_GATHER      one input; list_out: G outputs S, else one output [G*rows, ...] (a 0-d
 *                  input gives [G]).
 *  GATHER          as ALL_GATHER (the root's outputs are c10d's gather list; the same program
 *                  runs everywhere, so non-roots receive the same values, which callers drop).
 *  REDUCE_SCATTER  one input [G*n, ...] and one output [n, ...], or (list form) G inputs of
 *                  one shape S and one output S; chunk g of the reduction goes to rank g.
 *  SCATTER         the root's chunks, forms as REDUCE_SCATTER; non-roots pass inputs of the
 *                  same type whose contents are ignored. Output: the root's chunk for this rank.
 *  ALL_TO_ALL      one input. in_splits NULL: rows divide by G, chunk g goes to rank g and the
 *                  output (S) holds chunk g from rank g. in_splits given: a nreplicas x G
 *                  matrix, in_splits[r*G+g] = rows replica r sends to rank g of its group; the
 *                  view's rows must equal the largest row sum (a replica with fewer rows leaves
 *                  the rest as padding: all replicas' storages have one type). The output is
 *                  [max received rows, ...]: replica r's pj_coll_out_rows(r) rows, in source
 *                  rank order, then zeros. out_splits (may be NULL) is checked against it.
 *  BROADCAST       one input; output S: the root's input (exact for every value, NaN and
 *                  infinities included: the root's slice is selected, nothing is summed).
 *  BARRIER         no input; one 0-d int32 output (zero) that completes when every replica of
 *                  the group has reached it.
 *  PERMUTE         one input; output S: for each pair (src, dst) of replica numbers, dst gets
 *                  src's input; a replica no pair targets gets its own input back. groups are
 *                  not used (group_size may be nreplicas). Each replica sends at most once and
 *                  receives at most once (send/recv and batch_isend_irecv rounds).
 *
 * PREMUL_SUM takes one float64 factor per replica (pj_coll_run's factors), applied to the
 * replica's input in its compute dtype before the SUM. */
typedef struct {
  pj_coll_kind_t kind;
  pj_reduce_op_t op; /* ALL_REDUCE, REDUCE, REDUCE_SCATTER */
  pj_dtype_t dtype;
  int ninputs; /* 0 (BARRIER), 1, or group_size (list forms of REDUCE_SCATTER, SCATTER) */
  const pj_coll_view_t *inputs;
  bool list_out; /* ALL_GATHER, GATHER: group_size outputs instead of one */
  int nreplicas;
  int group_size;
  const int *groups; /* nreplicas/group_size rows of group_size replica numbers; NULL: one
                        group 0..nreplicas-1 */
  int root;          /* a rank within each group */
  const int64_t *in_splits;  /* ALL_TO_ALL uneven: nreplicas x group_size, else NULL */
  const int64_t *out_splits; /* optional: nreplicas x group_size, what each receives */
  int npairs;
  const int *pairs; /* PERMUTE: npairs x (src, dst) */
  bool flat_out;    /* every output a 1-D buffer of its elements (a storage's form: the
                       in-process group, coll_group.h, installs them into storages) */
} pj_coll_desc_t;

/* Checks a description: every error a status (PJ_ERR_VALUE for a malformed description,
 * PJ_ERR_RUNTIME for a ReduceOp the dtype does not admit, with Gloo's wording). */
pj_status_t *pj_coll_check(const pj_coll_desc_t *d);
/* Outputs per replica, and output k's type (the same on every replica). */
int pj_coll_num_outputs(const pj_coll_desc_t *d);
pj_status_t *pj_coll_output_type(const pj_coll_desc_t *d, int k, pj_type_t *out);
/* Rows of replica r's result that are data (uneven ALL_TO_ALL; otherwise the output's rows). */
int64_t pj_coll_out_rows(const pj_coll_desc_t *d, int r);
/* Arguments per replica: the input storages, then PREMUL_SUM's 0-d float64 factor. */
int pj_coll_num_args(const pj_coll_desc_t *d);

/* Kinds that take a ReduceOp; kinds that have a root. */
bool pj_coll_is_reduction(pj_coll_kind_t k);
bool pj_coll_has_root(pj_coll_kind_t k);
/* Groups of a (checked) description, and the replica number of rank j of group k. */
int pj_coll_ngroups(const pj_coll_desc_t *d);
int pj_coll_member(const pj_coll_desc_t *d, int k, int j);

/* Emits the collective into a program being built: in[0..ninputs) are the inputs as values of
 * d->dtype shaped like their views (already read), factor PREMUL_SUM's 0-d float64 value (else
 * unused). Writes the pj_coll_num_outputs(d) results, of d->dtype and pj_coll_output_type's
 * shapes, into res. The program must be compiled for d->nreplicas replicas. A malformed
 * description is returned as a status; builder errors are recorded in h. */
pj_status_t *pj_coll_emit(pj_hlo_t *h, const pj_coll_desc_t *d, const pj_val_t *in,
                          pj_val_t factor, pj_val_t *res);

/* The cache key of a description (everything that shapes its program, plus the runtime's
 * identity); malloc'd, the caller frees it. Built before any program text. */
pj_status_t *pj_coll_key(const pj_coll_desc_t *d, unsigned char **key, size_t *len);
/* The program text (malloc'd, caller frees). */
pj_status_t *pj_coll_build(const pj_coll_desc_t *d, char **text, size_t *len);

/* Runs the collective: replica r on runtime device devices[r] (NULL: r). inputs[r*ninputs+i]
 * is replica r's storage i (on its device); factors[r] PREMUL_SUM's factor of replica r (NULL
 * otherwise). outs[r*nout+k] receives output k of replica r (new buffers on its device). done
 * (may be NULL) gets one completion marker per replica (stream.h). The program is compiled once
 * per description and placement (memory and persistent caches). On error nothing is handed
 * out. */
pj_status_t *pj_coll_run(const pj_coll_desc_t *d, const int *devices,
                         struct PJRT_Buffer *const *inputs, const double *factors,
                         struct PJRT_Buffer **outs, pj_marker_t **done);

/* Launches a program over ndev devices (replica r on runtime device devices[r]) in the order
 * every collective program keeps (one in flight at a time, process-wide: see
 * graph/collective_run.c): found under key and the placement in the memory or persistent
 * cache, else built by build(ctx) and compiled; args, nargs, donate, outs and done as in
 * pj_program_execute_multi. pj_coll_run and the in-process group's program rounds
 * (coll_group.h) launch through it. */
pj_status_t *pj_coll_launch(const void *key, size_t keylen,
                            pj_status_t *(*build)(void *ctx, char **text, size_t *len), void *ctx,
                            int ndev, const int *devices, struct PJRT_Buffer *const *const *args,
                            size_t nargs, const bool *donate, struct PJRT_Buffer **const *outs,
                            pj_marker_t **done);

/* Names for messages: "all_reduce", "ReduceOp.SUM". */
const char *pj_coll_kind_name(pj_coll_kind_t k);
const char *pj_reduce_op_name(pj_reduce_op_t op);

#ifdef __cplusplus
}
#endif
#endif
