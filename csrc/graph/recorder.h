/* The recorded graph shared by the defer_and_fuse recorder (defer.c) and whole-graph capture
 * (capture.c): recorded calls over graph storages, and what turns them into one program. */
#ifndef TORCH_PJRT_RECORDER_H
#define TORCH_PJRT_RECORDER_H
#include <stdbool.h>
#include <stdint.h>

#include "call_internal.h"

/* A recorded call: its key (pj_call_key with an empty identity) is the whole description the
 * program build needs; slots are mapped to graph storages; scalar values are kept because they
 * become arguments of the fused program. */
typedef struct {
  unsigned char *key;
  size_t keylen;
  uint64_t hash; /* of the key: the loop-period detector compares these */
  int nslots;
  int *gslot; /* graph storage of each slot */
  int nscalars;
  pj_scalar_t *scalars;
} dop_t;

/* A storage the graph touches. */
typedef struct {
  pj_storage_t *s;  /* retained by the graph until the flush */
  pj_dtype_t dtype; /* element type the graph sees (one per storage per graph) */
  int64_t numel;
  bool param;   /* its contents before the graph are read: a program parameter */
  bool written; /* some recorded op writes it */
} gstore_t;

typedef struct {
  dop_t *ops;
  int nops, cap_ops;
  gstore_t *st;
  int nst, cap_st;
  int *index; /* open-addressing map storage pointer -> st index (-1 empty) */
  int index_cap;
  int device;
} graph_t;

/* Releases everything the graph holds (storages it still references are released and marked
 * not pending) and leaves it empty. */
void pj_graph_clear(graph_t *g);

/* Context of pj_graph_build: live[i] says whether graph storage i is a result of the program
 * (results in storage order; a result whose storage is also a parameter aliases it).
 * scalar_values: NULL, every op's scalars are program arguments (one program serves every
 * value: the eager modes); else their values in op order, emitted as constants (a captured
 * graph, whose scalars are constants of the graph). */
typedef struct {
  const graph_t *g;
  const bool *live;
  const pj_scalar_t *scalar_values;
} pj_graph_build_t;

/* Builds the StableHLO text of the whole graph (a pj_program_for_key build callback, ctx is a
 * pj_graph_build_t): parameters are the storages read before written (storage order), then,
 * unless they are constants, every op's scalars (op order). Reads only the ops and each
 * storage's dtype, numel and role. */
pj_status_t *pj_graph_build(void *ctx, char **text, size_t *len);

/* Whether a scalar can be emitted as a program constant (complex values with an imaginary part
 * cannot: they stay arguments). */
bool pj_graph_scalar_is_constant(const pj_scalar_t *v);

/* Structural key of the graph: identity, every recorded call key with its storage wiring, and
 * each storage's role; with scalar_values (as in pj_graph_build_t, nscalars of them) also the
 * scalar values. Storage identities are never part of it. */
bool pj_graph_key(const graph_t *g, const bool *live, const pj_scalar_t *scalar_values,
                  int nscalars, const char *identity, pj_keybuf_t *k);

/* Runs the graph's ops one by one, each as its own program (what Strict would have done), after
 * its fused program could not be built or compiled (`why`, consumed): every op before a
 * failing one takes effect and the error names the op that failed. The graph must already be
 * detached from the recorder, so pj_call_run's own flush finds nothing to do. */
pj_status_t *pj_graph_run_each(const graph_t *g, pj_status_t *why);

/* Turns a detached, captured graph (consumed: cleared in every case) into a plan and runs it
 * once over the capture's own storages (capture.c; the arguments are pj_capture_end's). Sets
 * *plan to NULL when the graph cannot be a plan (it then runs as a defer_and_fuse flush would). */
struct pj_plan;
pj_status_t *pj_plan_capture(graph_t *g, pj_storage_t *const *inputs, int nin,
                             pj_storage_t *const *outputs, int nout, struct pj_plan **plan);

#endif
