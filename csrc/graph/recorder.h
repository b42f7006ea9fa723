/* The recorded graph shared by the defer_and_fuse recorder (defer.c) and whole-graph capture
 * (capture.c): recorded calls over graph storages, and what turns them into one program. */
#ifndef TORCH_PJRT_RECORDER_H
#define TORCH_PJRT_RECORDER_H
#include <stdbool.h>
#include <stdint.h>

#include "call_internal.h"
#include "torch_pjrt/capture.h"

/* A recorded call: its key (pj_call_key with an empty identity) is the whole description the
 * program build needs; slots are mapped to graph storages; scalar values are kept because they
 * become arguments of the fused program. */
typedef struct {
  unsigned char *key;
  size_t keylen;
  uint64_t hash;  /* of the key: the loop-period detector compares these */
  uint64_t hash2; /* the key's second hash (PJ_KEY_SEED2): with hash, its digest in a graph key */
  int nslots;
  int *gslot; /* graph storage of each slot */
  int nscalars;
  pj_scalar_t *scalars;
  /* index-check site (index_checks.h): "op\0where" of a call that named its source line, else
   * NULL. Not part of the key. */
  char *site;
  /* a _pj_collective call (csrc/ops/collective.c) over the graph's cgroup */
  bool collective;
} dop_t;


/* A storage the graph touches. */
typedef struct {
  pj_storage_t *s;  /* retained by the graph until the flush */
  pj_dtype_t dtype; /* element type the graph sees (one per storage per graph) */
  int64_t numel;
  bool param;   /* its contents before the graph are read: a program parameter */
  bool written; /* some recorded op writes it */
  bool fresh;   /* it had no buffer when the graph first touched it: its contents before the
                 * graph are zeros (what pj_storage_materialize gives a never-written storage) */
} gstore_t;

typedef struct {
  dop_t *ops;
  int nops, cap_ops;
  gstore_t *st;
  int nst, cap_st;
  int *index; /* open-addressing map storage pointer -> st index (-1 empty) */
  int index_cap;
  int device;
  /* Strict ops recorded while their programs compile in the background (compile_async.h):
   * the flush runs them one by one, each its own program, never fused. */
  bool each;
  /* A rank thread's capture that recorded collectives (pj_capture_record_collective): the
   * in-process group they run over (a reference held) and this thread's rank in it. A plan of
   * this graph is one program over the group's devices (capture.c); run op by op, each
   * collective is the group's own (pj_cgroup_run_call). NULL in every other graph. */
  struct pj_cgroup *cgroup;
  int crank;
} graph_t;

/* Releases everything the graph holds (storages it still references are released and marked
 * not pending) and leaves it empty. */
void pj_graph_clear(graph_t *g);

/* The index-check sites of the graph's ops that have one (index_checks.h), op index = position
 * in g->ops; borrowed from the ops. Returns their number; *out is malloc'd (NULL when none). */
int pj_graph_sites(const graph_t *g, pj_check_site_t **out);

/* How a recorded scalar reaches a captured graph's program (a plan's binding, capture.c). The
 * eager modes pass every scalar as an argument of its own (a NULL binding). */
typedef enum {
  PJ_SCALAR_CONSTANT = 0, /* a constant of the program: its value is part of the key */
  PJ_SCALAR_ARGUMENT,     /* an argument of its own (a complex value with an imaginary part) */
  PJ_SCALAR_SEED,         /* a random op's "__seed": the program's seed argument */
  PJ_SCALAR_OFFSET        /* a random op's "__offset": the program's offset argument plus rel */
} pj_scalar_use_t;

typedef struct {
  pj_scalar_use_t use;
  uint64_t rel; /* PJ_SCALAR_OFFSET: its draw's distance from the first draw (part of the key) */
} pj_scalar_bind_t;

/* Context of pj_graph_build: live[i] says whether graph storage i is a result of the program
 * (results in storage order; a result whose storage is also a parameter aliases it).
 * zeros: NULL, or per storage whether one the graph reads before writing starts as zeros made
 * by the program instead of being a parameter (a captured graph's fresh output storage).
 * bind: NULL, every op's scalars are program arguments in op order (one program serves every
 * value: the eager modes); else bind[i] says how scalar i (op order) is passed, and
 * scalar_values[i] is the value of each PJ_SCALAR_CONSTANT one (a captured graph). */
typedef struct {
  const graph_t *g;
  const bool *live;
  const bool *zeros;
  const pj_scalar_t *scalar_values;
  const pj_scalar_bind_t *bind;
  bool unchecked; /* no index checks even when they are on (a plan's text for export) */
} pj_graph_build_t;

/* Builds the StableHLO text of the whole graph (a pj_program_for_key build callback, ctx is a
 * pj_graph_build_t): parameters are the storages read before written (storage order; not those
 * that start as zeros), then, when some scalar is PJ_SCALAR_SEED or PJ_SCALAR_OFFSET, the 0-d
 * int64 seed and base offset, then every scalar passed as an argument of its own (op order).
 * Reads only the ops and each storage's dtype, numel and role. */
pj_status_t *pj_graph_build(void *ctx, char **text, size_t *len);

/* Whether a scalar can be emitted as a program constant (complex values with an imaginary part
 * cannot: they stay arguments). */
bool pj_graph_scalar_is_constant(const pj_scalar_t *v);

/* Structural key of the graph: identity, every recorded call key with its storage wiring, and
 * each storage's role (zeros as in pj_graph_build_t, may be NULL); with a binding (bind and
 * scalar_values as in pj_graph_build_t, nscalars of them) also how each scalar is passed, the
 * values of the constants and the rel of the offsets. Storage identities and argument values
 * are never part of it. */
bool pj_graph_key(const graph_t *g, const bool *live, const bool *zeros,
                  const pj_scalar_t *scalar_values, const pj_scalar_bind_t *bind, int nscalars,
                  const char *identity, pj_keybuf_t *k);

/* Runs the graph's ops one by one, each as its own program (a collective as its group's) (what Strict would have done), after
 * its fused program could not be built or compiled (`why`, consumed): every op before a
 * failing one takes effect and the error names the op that failed. The graph must already be
 * detached from the recorder, so pj_call_run's own flush finds nothing to do. */
pj_status_t *pj_graph_run_each(const graph_t *g, pj_status_t *why);

/* A draw from a tpu generator made while capturing (pj_capture_note_draw's arguments). */
typedef struct {
  int generator; /* the device whose default generator it came from, or PJ_GENERATOR_OTHER */
  uint64_t seed, offset, increment;
} pj_draw_t;

/* Turns a detached, captured graph (consumed: cleared in every case) into a plan and, with
 * `run`, runs it once over the capture's own storages (capture.c; the arguments are
 * pj_capture_end's, draws the capture's generator draws in the order they were made, borrowed).
 * Without `run` nothing the graph writes changes (pj_capture_end_unrun). Sets *plan to NULL
 * when the graph cannot be a plan (it then runs as a defer_and_fuse flush would). */
struct pj_plan;
pj_status_t *pj_plan_capture(graph_t *g, const pj_draw_t *draws, int ndraws,
                             pj_storage_t *const *inputs, int nin, pj_storage_t *const *outputs,
                             int nout, bool run, struct pj_plan **plan);

#endif
