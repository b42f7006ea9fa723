/* Whole-graph capture for torch.compile: the ops a compiled graph runs once are recorded by the
 * defer_and_fuse recorder (defer.h) into one graph, which becomes a plan: one program plus the
 * wiring of its parameters and results to the graph's inputs and outputs. Running a plan is one
 * program execution over new input storages; no op is dispatched, recorded or lowered again.
 *
 * Invariants:
 *  - A capture is all or nothing: if anything forces the recorded graph to run before the
 *    capture ends (a read to the host, a synchronize, a CPU fallback, an op on another device, a
 *    data-dependent shape), the capture is broken; its ops still run exactly as
 *    defer_and_fuse would run them, and pj_capture_end gives no plan.
 *  - Parameters of a plan are the storages the graph reads before writing: each is one of the
 *    inputs, or a constant the plan keeps (a storage no input holds, e.g. a graph constant).
 *    An output storage the graph reads before writing (an in-place op such as uniform_ or
 *    fill_ on a tensor the graph created) is no parameter: it held nothing at capture (read as
 *    zeros) and each run's output storage is as fresh, so the program starts it as zeros. One
 *    that held data at capture gives no plan.
 *  - The graph's scalars (Python numbers in its ops) are constants of the program: the caller
 *    keys plans on everything that varies between calls. The exception is random numbers: a
 *    random op's "__seed"/"__offset" scalars come from a generator draw (the bridge reports
 *    each draw made while capturing, pj_capture_note_draw); in a plan they are two program
 *    arguments, the seed and a base offset (each op's offset is the base plus its draw's
 *    distance from the capture's first draw, a constant). Every run is given a fresh base, so
 *    a run draws what the same ops run eagerly would draw. Only draws from the default
 *    generator of the graph's device can be replayed so: a capture with any other draw, or
 *    with a "__seed"/"__offset" pair that matches no draw, gives no plan.
 *  - Results are written into: inputs the graph writes (mutations, installed in place; their
 *    old buffers are donated), the given output storages, and constants the graph writes.
 *    Storages only the graph itself used are never materialized.
 *  - Scope: a process-wide capture (pj_capture_begin) records every thread's ops, and every
 *    thread's flush breaks it (torch.tpu.graph: the backward of a captured step runs on the
 *    autograd engine's thread). A thread's capture (pj_capture_begin_thread) records only the
 *    ops of the thread that began it, and only that thread's flushes break it; other threads
 *    run and record as they would without it, and may capture at the same time (the ranks of
 *    torch_pjrt.distributed.run_threads each capture their compiled graphs). A thread reading
 *    a storage that another thread's capture writes, before that capture ends, reads none of
 *    its results (as on CUDA, another stream's work is not waited for). Begin, end and abort
 *    are called by the capturing thread; a thread's own capture wins over a process-wide one.
 * Thread-safe otherwise. */
#ifndef TORCH_PJRT_CAPTURE_H
#define TORCH_PJRT_CAPTURE_H
#include <stdbool.h>
#include <stdint.h>
#include "torch_pjrt/call.h"
#include "torch_pjrt/status.h"
#include "torch_pjrt/storage.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef struct pj_plan pj_plan_t;

/* Generator of a draw that is not a device's default generator (see pj_capture_note_draw). */
#define PJ_GENERATOR_OTHER (-1)

/* Runs whatever is recorded, then records every lowered op (whatever the thread's eager mode
 * says, the bridge routes ops to the recorder while capturing) without size bound or loop cuts. */
pj_status_t *pj_capture_begin(void);
/* The same for the calling thread's ops only (see Scope above). Either begin fails while the
 * calling thread already records into a capture. */
pj_status_t *pj_capture_begin_thread(void);
/* Whether the calling thread's ops are being captured (its own capture or a process-wide one). */
bool pj_capture_active(void);
/* Reports a draw from a tpu generator: generator is the device whose default generator it is
 * (PJ_GENERATOR_OTHER for any other generator), (seed, offset) what the random op was given as
 * its "__seed"/"__offset" scalars, increment how far the draw advanced the generator's offset.
 * Kept, in order, when a capture is in progress; ignored otherwise. Out of host memory, the
 * capture is broken (it then runs as defer_and_fuse would), so there is nothing to report. */
void pj_capture_note_draw(int generator, uint64_t seed, uint64_t offset, uint64_t increment);
/* Records a collective into the calling thread's own capture (pj_capture_begin_thread), where
 * it becomes part of the captured graph's program: c is a _pj_collective call
 * (csrc/ops/collective.c) over the whole group g, of which the thread is rank `rank`. A plan of
 * that graph is then one SPMD program over g's devices, run through g's rendezvous with every
 * rank's arguments (pj_plan_run; the ranks must have captured the same program, else each
 * gets an error naming every rank's). Sets *recorded false and records nothing (the caller
 * then runs the collective on its own) when the thread has no capture of its own, its capture
 * is broken, or it already holds a collective of another group. */
struct pj_cgroup;
pj_status_t *pj_capture_record_collective(pj_call_t *c, struct pj_cgroup *g, int rank,
                                          bool *recorded);
/* Ends a capture without a plan: what was recorded runs as defer_and_fuse would run it (used
 * when the captured code raised). */
pj_status_t *pj_capture_abort(void);
/* Ends the capture. inputs[0..nin) are the storages of the graph's tensor inputs (repeats
 * allowed), outputs[0..nout) the distinct storages of its tensor outputs that are not inputs.
 * Runs the recorded graph once (so the outputs hold their values) and, unless the capture was
 * broken, sets *plan to a plan the caller owns (NULL when broken). */
pj_status_t *pj_capture_end(pj_storage_t *const *inputs, int nin, pj_storage_t *const *outputs,
                            int nout, pj_plan_t **plan);
/* The same without the run, as a CUDA graph's capture runs nothing: the plan holds the
 * recorded work, every storage keeps what it held before the capture (one the graph created
 * reads as zeros), and the first pj_plan_run does the work. A broken capture (or a graph that
 * cannot be a plan) still runs what it recorded, as pj_capture_end does, and gives no plan. */
pj_status_t *pj_capture_end_unrun(pj_storage_t *const *inputs, int nin,
                                  pj_storage_t *const *outputs, int nout, pj_plan_t **plan);

/* How a plan draws random numbers: returns how many generator draws the captured graph made
 * (0: none; then *device and *increment are not set), and sets *device to the device whose
 * default generator they came from and *increment to their total offset increment. */
int pj_plan_draws(const pj_plan_t *p, int *device, uint64_t *increment);

/* A run's generator state: what the device's default generator held before the run, taken
 * (and advanced by the plan's increment) by the caller. */
typedef struct {
  uint64_t seed, offset;
} pj_plan_rng_t;

/* Runs the plan over new storages: inputs as in pj_capture_end, with the same element types
 * and sizes, outputs fresh storages (of the captured sizes) that receive the results. Anything
 * recorded by defer_and_fuse runs first. rng: NULL for a plan without draws; for one with
 * draws, the state its random ops draw from (draw k gets the seed and rng->offset plus the
 * sum of the increments of the draws before it, as eager draws would). */
pj_status_t *pj_plan_run(pj_plan_t *p, pj_storage_t *const *inputs, int nin,
                         pj_storage_t *const *outputs, int nout, const pj_plan_rng_t *rng);
/* StableHLO text of the plan's program (malloc'd; the caller frees it). */
pj_status_t *pj_plan_text(pj_plan_t *p, char **text);
/* Where each program parameter comes from, in the program's argument order (the scalar
 * arguments follow them): an input index (>= 0) or PJ_PLAN_CONSTANT. Returns the count (at most
 * cap are written). */
#define PJ_PLAN_CONSTANT (-1)
int pj_plan_params(const pj_plan_t *p, int *src, int cap);
/* Where each program result goes, in result order: an input index (>= 0: an input updated in
 * place), PJ_PLAN_CONSTANT, or -2 - j for output j. Returns the count. */
int pj_plan_results(const pj_plan_t *p, int *dst, int cap);
/* The plan's scalar arguments (values recorded at capture, in argument order): for a plan with
 * draws, first the seed and the base offset (int64), then every scalar that cannot be a program
 * constant (a complex value with an imaginary part), in op order. Returns the count. */
int pj_plan_scalars(const pj_plan_t *p, pj_scalar_t *out, int cap);
/* Number of recorded ops in the plan, and of its parameters, results and scalar arguments. */
void pj_plan_stats(const pj_plan_t *p, int *nops, int *nparams, int *nresults, int *nscalars);
void pj_plan_free(pj_plan_t *p);

#ifdef __cplusplus
}
#endif
#endif
