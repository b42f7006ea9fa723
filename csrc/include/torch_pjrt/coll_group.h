/* In-process collective groups: N ranks that are threads of one process, each on its own
 * device of this runtime's client, meet here and run each collective as ONE multi-device program
 * (collective.h) over all their buffers: no host copy, no socket.
 *
 * Rendezvous. Every rank calls pj_cgroup_collective with its own description of the call (a
 * pj_cgroup_call_t: what c10d was asked, plus this rank's input storages and views). Calls are
 * numbered per rank; when all N ranks have entered call #s, the last one to arrive compares the
 * N descriptions (the fingerprint: kind, caller's name, reduce op, dtype, input shapes, list
 * form, root, all-to-all splits). If they differ, every rank gets the same error naming each
 * rank's call; else the last arriver runs the program (pj_coll_run) with every rank's buffers
 * and hands each rank its outputs (1-D buffers, a storage's form) and a completion marker. A
 * call returns once its program has been launched, not when it has completed: the marker says
 * when (the outputs are ordinary PJRT buffers, ready when the program is).
 *
 * Point-to-point: the k-th send from rank a to rank b with tag t meets the k-th recv at b from a
 * with tag t (order fixed by tickets taken at the call, pj_cgroup_p2p_ticket), and the pair runs
 * a PERMUTE program on their two devices.
 *
 * Never a hang: a rank waiting longer than the group timeout for its peers gets a timeout error
 * naming the ranks that did not come, and the group is then broken (its ranks may be out of step:
 * every later call fails at once, naming that first failure). pj_cgroup_shutdown (a rank's
 * process group aborted) wakes every waiter with an error the same way. pj_cgroup_leave (a
 * rank's process group destroyed after its last call) fails only what needs that rank. A call
 * whose round is already running is never abandoned: its outputs are delivered.
 *
 * Thread safety: any thread may call anything; one mutex per group, never held while a program
 * compiles or launches. Each rank calls pj_cgroup_collective from one thread at a time (c10d
 * calls of one rank are ordered anyway). */
#ifndef TORCH_PJRT_COLL_GROUP_H
#define TORCH_PJRT_COLL_GROUP_H
#include <stdbool.h>
#include <stdint.h>

#include "torch_pjrt/call.h"
#include "torch_pjrt/collective.h"
#include "torch_pjrt/status.h"
#include "torch_pjrt/stream.h"
#ifdef __cplusplus
extern "C" {
#endif
struct PJRT_Buffer;

typedef struct pj_cgroup pj_cgroup_t;

/* One rank's side of a program round: a whole compiled graph that holds collectives (a plan
 * captured in a rank thread, capture.h), run as ONE program over every rank's device. Every
 * rank must bring the same program (the same key: the fingerprint compares it, so ranks that
 * captured different graphs get an error naming each rank's, never a hang); the last arriver
 * compiles it for the group's devices (cached under key and placement) on a miss, with `build`
 * on its own description, and launches it with every rank's arguments. Each rank's result
 * buffers are written into its own `outs` (nouts of them, on its device), which it then owns. */
typedef struct {
  const void *key;
  size_t keylen;
  uint64_t keyhash;
  int nops; /* for messages */
  pj_status_t *(*build)(void *ctx, char **text, size_t *len);
  void *build_ctx;
  int nargs;
  struct PJRT_Buffer *const *args; /* this rank's arguments, on its device */
  const bool *donate;              /* per argument (the same on every rank) */
  int nouts;
  struct PJRT_Buffer **outs;       /* receives this rank's results */
} pj_cgroup_program_t;

/* One rank's side of a collective. The group reads it only while the call is inside
 * pj_cgroup_collective (the caller blocks there, so its arrays stay alive). Kinds and forms as
 * in collective.h with group_size = the group's ranks and one group. */
typedef struct {
  pj_coll_kind_t kind;
  pj_reduce_op_t op; /* reductions */
  pj_dtype_t dtype;
  int ninputs;
  const pj_coll_view_t *inputs;       /* this rank's views of its storages */
  struct PJRT_Buffer *const *buffers; /* this rank's storages, on its device (ninputs) */
  bool list_out;
  int root;
  const int64_t *in_splits;  /* ALL_TO_ALL uneven: rows this rank sends to each rank; else NULL */
  const int64_t *out_splits; /* optional (uneven): rows this rank expects from each rank */
  double factor;             /* PREMUL_SUM: this rank's factor */
  const char *name;          /* the caller's name of the call ("all_gather_into_tensor") for
                                fingerprints and messages; NULL: the kind's name */
  /* Non-NULL: a program round (above); the collective fields are then unused. */
  const pj_cgroup_program_t *program;
} pj_cgroup_call_t;

/* What a rank gets back. On success the caller owns outs[0..noutputs) (1-D buffers on its
 * device; free or install them) and done (pj_marker_free). */
typedef struct {
  int noutputs;
  struct PJRT_Buffer *outs[PJ_COLL_MAX_REPLICAS];
  pj_marker_t *done;
  int64_t out_numel; /* elements of each output buffer */
  int64_t out_rows;  /* rows of outs[0] that are data (uneven ALL_TO_ALL; else its rows) */
  /* Nothing ran because the ranks' views of their inputs differ (one program needs one view
   * on every replica): every rank of the round gets this, and calls again with contiguous
   * whole-storage inputs (which agree whenever the shapes do). Not an error. An uneven
   * ALL_TO_ALL whose ranks send different row counts is reported the same way, with pad_rows
   * the most rows any rank sends: each rank then pads its input to that many rows (zeros). */
  bool views_differ;
  int64_t pad_rows;
} pj_cgroup_result_t;

/* A group of nranks ranks, rank r on runtime device devices[r] (distinct). timeout_ms > 0. */
pj_status_t *pj_cgroup_new(int nranks, const int *devices, int64_t timeout_ms, pj_cgroup_t **out);
/* References: the creator holds one; every holder releases once; the last frees the group. */
void pj_cgroup_retain(pj_cgroup_t *g);
void pj_cgroup_release(pj_cgroup_t *g);
void pj_cgroup_set_timeout(pj_cgroup_t *g, int64_t timeout_ms);
int pj_cgroup_size(const pj_cgroup_t *g);

/* Rank `rank` is leaving after a failure (its process group aborted; rank -1: the whole group):
 * the group is broken, every call waiting and every later call fails with an error quoting
 * `why`. Rounds already running still deliver. Idempotent. */
void pj_cgroup_shutdown(pj_cgroup_t *g, int rank, const char *why);

/* Rank `rank` is done with the group (its process group destroyed, normally): collectives
 * waiting for it and later ones fail (they can never complete), as do sends and recvs with
 * it, quoting `why`; sends and recvs between other ranks go on. Ranks finish at different
 * times, so a finished rank must not break its peers' remaining point-to-point work.
 * Idempotent; a later pj_cgroup_shutdown still breaks the group. */
void pj_cgroup_leave(pj_cgroup_t *g, int rank, const char *why);

/* Rank `rank` enters its next collective and waits for the others (see the top of the file).
 * On error *res holds nothing. Errors: a malformed call or a bad rank (PJ_ERR_VALUE), the
 * ranks' calls differ, a timeout, a shut-down or broken group, the program's own failure
 * (all PJ_ERR_RUNTIME). */
pj_status_t *pj_cgroup_collective(pj_cgroup_t *g, int rank, const pj_cgroup_call_t *call,
                                  pj_cgroup_result_t *res);

/* A recorded _pj_collective call (csrc/ops/collective.c) run on its own as the group's
 * collective: what a graph holding one does when it runs op by op instead of as a plan (a
 * broken capture, defer.c). Its input must be readable; its destination is a whole contiguous
 * storage, which receives the result. Waits for the peers as pj_cgroup_collective does. */
pj_status_t *pj_cgroup_run_call(pj_cgroup_t *g, int rank, const pj_call_t *c);

/* Point-to-point: the ticket (the call's place on its channel (src, dst, tag)) is taken at the
 * call, in call order; the transfer itself (pj_cgroup_p2p, blocking until the partner arrives
 * and the PERMUTE program is launched) may then run on any thread. `buf` is a 1-D buffer of
 * numel elements of dt on the rank's device: the data (send), or any buffer of that type
 * (recv: replica the permute targets). A recv's res gets outs[0], the data; a send's only its
 * marker. Sender and receiver must agree on dtype and numel (else both get an error naming both
 * calls). A timeout does not break the group (the two sides are not in step with anyone else). */
pj_status_t *pj_cgroup_p2p_ticket(pj_cgroup_t *g, int src, int dst, int tag, bool is_send,
                                  uint64_t *ticket);
pj_status_t *pj_cgroup_p2p(pj_cgroup_t *g, int rank, int peer, int tag, uint64_t ticket,
                           bool is_send, pj_dtype_t dt, int64_t numel, struct PJRT_Buffer *buf,
                           pj_cgroup_result_t *res);

#ifdef __cplusplus
}
#endif
#endif
