/* An op call as the runtime sees it: an aten op's base name, its arguments by schema name, the
 * storages its tensors live in (slots), and where each result goes. The bridge fills it from a
 * PyTorch boxed call; pj_call_run turns it into one program (cached under a key serialized from
 * everything here except scalar values and storage identities) and executes it.
 *
 * Results: the lowering produces values for outs[0..nout). Each out is a view (dtype, sizes,
 * strides, offset) into a storage slot; the program writes the value into that view and returns
 * the slot's whole new buffer, which replaces the storage's buffer. In-place ops and out= ops
 * are therefore the same lowering as the functional op with different destinations. */
#ifndef TORCH_PJRT_CALL_H
#define TORCH_PJRT_CALL_H
#include <stdbool.h>
#include <stdint.h>
#include "torch_pjrt/dtype.h"
#include "torch_pjrt/hlo.h"
#include "torch_pjrt/status.h"
#include "torch_pjrt/storage.h"
#ifdef __cplusplus
extern "C" {
#endif

#define PJ_CALL_MAX_ARGS 40
#define PJ_CALL_MAX_TENSORS 512
#define PJ_CALL_MAX_INTS 512
#define PJ_CALL_MAX_SLOTS 512
#define PJ_CALL_MAX_SCALARS 512
#define PJ_CALL_MAX_OUTS 512

typedef enum {
  PJ_ARG_NONE = 0, /* None / undefined optional */
  PJ_ARG_TENSOR,   /* tensors[first] */
  PJ_ARG_TENSORS,  /* tensors[first .. first+count) (an element may be absent: rank < 0) */
  PJ_ARG_SCALAR,   /* a runtime value passed as a 0-d argument: scalars[first] */
  PJ_ARG_SCALARS,  /* Scalar[]: runtime values scalars[first .. first+count) */
  PJ_ARG_INT,      /* i (also dtype codes: pj_dtype_t, and enums) */
  PJ_ARG_FLOAT,    /* f */
  PJ_ARG_BOOL,     /* i */
  PJ_ARG_INTS,     /* ints[first .. first+count) */
  PJ_ARG_FLOATS,   /* floats[first .. first+count) */
  PJ_ARG_STR       /* s (static or owned by the caller for the call's duration) */
} pj_arg_kind_t;

typedef struct {
  pj_dtype_t dtype;
  int rank; /* < 0: absent element of an optional-tensor list */
  int64_t sizes[PJ_MAX_RANK];
  int64_t strides[PJ_MAX_RANK];
  int64_t offset;  /* in elements */
  int slot;        /* storage slot; -1 for a scalar tensor passed by value (see scalar) */
  int scalar;      /* for slot == -1: index into scalars */
  bool wrapped;    /* a Python number wrapped as a 0-d tensor (type promotion treats it so) */
  /* The offset is a runtime value, scalars[offset_scalar] (an int64), not part of the program:
   * one program serves a view at every offset (x[i] in a loop). The key then holds neither
   * offset nor its value; `offset` is still the true value where the caller knows it (a call
   * decoded from a key has 0). Set by the bridge for views of a storage at a nonzero offset. */
  bool dyn_offset;
  int offset_scalar;
  /* A size bucket's padded input (bucket.h): the elements from scalars[numel_scalar] (an int64,
   * the tensor's true element count) on read as element 0, so that a reduction that ignores
   * repeats (max, any, ...) sees the true elements only. Part of the key (the marker and the
   * scalar's index, never the count). */
  bool pad_repeats;
  int numel_scalar;
} pj_tensor_desc_t;

typedef struct {
  const char *name;
  pj_arg_kind_t kind;
  int first, count;
  int64_t i;
  double f;
  const char *s;
} pj_arg_t;

typedef struct {
  pj_dtype_t dtype; /* PJ_F64, PJ_I64, PJ_BOOL or PJ_C128 for Python numbers; else a tensor's */
  double f;
  int64_t i;
  double imag;
} pj_scalar_t;

typedef struct {
  pj_storage_t *storage; /* borrowed for the call */
  pj_dtype_t dtype;      /* element type the program sees for this storage */
  int64_t numel;         /* storage size in elements of dtype */
  bool read;             /* passed to the program (read by a tensor arg or partly written) */
} pj_slot_t;

typedef struct {
  const char *op; /* aten base name without overload or in-place suffix, e.g. "add" */
  const char *overload;
  int device;
  int nargs;
  pj_arg_t args[PJ_CALL_MAX_ARGS];
  int ntensors;
  pj_tensor_desc_t tensors[PJ_CALL_MAX_TENSORS];
  int nints;
  int64_t ints[PJ_CALL_MAX_INTS];
  int nfloats;
  double floats[PJ_CALL_MAX_INTS];
  int nscalars;
  pj_scalar_t scalars[PJ_CALL_MAX_SCALARS];
  int nslots;
  pj_slot_t slots[PJ_CALL_MAX_SLOTS];
  int nout;
  pj_tensor_desc_t outs[PJ_CALL_MAX_OUTS];
  /* Whether the lowering checks its indices on the device (index_checks.h): the setting when
   * the call was made, part of the key. */
  bool checked;
  /* Where the call came from (" at file:line" of the Python caller), named by an index-check
   * error (index_checks.h); NULL when unknown. Borrowed for the call; not part of the key. */
  const char *where;
  /* The op an index-check error names when the call stands for another one (a user's
   * index_copy_ written through a view as _pj_view_put); NULL: op. Not part of the key. */
  const char *display;
} pj_call_t;

typedef struct pj_lower pj_lower_t;
typedef pj_status_t *(*pj_lower_fn)(pj_lower_t *L);

/* How an op's program depends on its tensors' shapes, which decides whether one program can
 * serve every size up to a bucket (csrc/graph/bucket.c). A row of the op's family table. */
typedef enum {
  PJ_SHAPE_EXACT = 0,   /* one program per shape (the default) */
  PJ_SHAPE_ELEMENTWISE, /* element i of each result depends only on element i of the inputs of
                           its shape and on 0-d values; a random draw for element i uses
                           counter offset + i (random.c), whatever the size */
  PJ_SHAPE_PREFIX,      /* on rank-1 tensors, element i depends on elements 0..i (scans) */
  PJ_SHAPE_IDEMPOTENT,  /* a reduction to 0-d results whose value does not change when elements
                           repeat, in any order (max, min, any, all): padding repeats element 0 */
  PJ_SHAPE_EXACT_INPUTS /* one program per shape, reading exact buffers: a padded storage it
                           reads is trimmed first (XLA:CPU compiles a product or convolution of
                           a slice as a slower loop, up to 2x in compile and run time) */
} pj_shape_class_t;

/* The lowering registered for a base op name, or NULL. */
pj_lower_fn pj_lowering_find(const char *op);
/* The shape class of an op's lowering (PJ_SHAPE_EXACT for an op without one). */
pj_shape_class_t pj_lowering_shape_class(const char *op);
/* Calls fn(name, user) for every op with a lowering. */
void pj_lowering_each(void (*fn)(const char *name, void *user), void *user);

/* Compiles (or finds in the cache) and executes the call's program; on success every written
 * slot's storage holds its new buffer. Thread-safe. */
pj_status_t *pj_call_run(pj_call_t *c);

/* pj_call_run for Strict mode with background compiles (csrc/graph/compile_async.h): when the
 * call's program is not cached, its text is built now (a lowering error returns now) and
 * compiled by a worker while the call is queued, with the calls after it, until the next
 * synchronizing point (a read, a sync, an event, the queue's size bound). where_fn (may be
 * NULL) gives the Python source line (" at file:line", malloc'd) a queued call's error names;
 * it is called only for a call that waits for a compile. With background compiles off, or
 * during a capture, this is pj_call_run. */
pj_status_t *pj_call_run_async(pj_call_t *c, char *(*where_fn)(void));

/* A call made ready for reuse (the bridge's call memo, csrc/bridge/call_memo.cpp): its program
 * key and slot roles, taken once from a full call that has run (so its program is cached), for
 * later calls that differ from it only in storage identities and scalar values. Running one
 * skips the call description, the key and its hash: a cache-hit op's host work. Immutable once
 * made; usable from any thread. */
#define PJ_PREPARED_MAX_SLOTS 64
typedef struct pj_prepared pj_prepared_t;
/* deferred: for recording in defer_and_fuse (else for Strict). NULL when the call cannot be
 * prepared (too many slots, out of memory). */
pj_prepared_t *pj_prepared_new(const pj_call_t *c, bool deferred);
void pj_prepared_free(pj_prepared_t *p);
/* Runs (Strict) or records (deferred) the prepared call with storages[s] in slot s,
 * scalars[i] as its scalar values and `where` as its source line (pj_call_t.where; may be
 * NULL). Sets *missed, doing nothing, when a Strict call's program is no longer in the memory
 * cache (evicted): the caller then runs the full call. */
pj_status_t *pj_prepared_run(const pj_prepared_t *p, pj_storage_t *const *storages,
                             const pj_scalar_t *scalars, const char *where, bool *missed);

#ifdef __cplusplus
}
#endif
#endif
