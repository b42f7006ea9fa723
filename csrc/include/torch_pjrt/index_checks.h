/* Device-side index checks (Strict and defer_and_fuse modes, compiled graphs): CPU raises for
 * an out-of-range index (gather, index_select, advanced indexing, scatter, nll_loss targets,
 * ...), XLA clamps or drops it. Checking on the host would cost a sync per op, so a program
 * whose lowerings check indices computes the verdict itself and threads it through one small
 * per-device *check state* buffer: the state is the program's last parameter and its last
 * result (donated, so the chain costs no copy), and the first failure it sees is kept. The host
 * reads the state at the next synchronizing point (a read to the host, synchronize, an event
 * wait) and raises CPU's exception there, like CUDA's device-side assert at its next sync, but
 * with CPU's message, the op and its Python source line. Reading clears it (sticky until read).
 *
 * State layout (PJ_CHECK_STATE_LEN int64s):
 *   [0] 1 once a check failed     [1] sequence number of the failing execution
 *   [2] op index in that program  [3] pj_check_kind_t   [4] the offending value
 *   [5] its dim                   [6] the size it was checked against
 *   [7] its flat position         [8] executions with checks since the state was made
 * Only the first failure is kept: later checks leave a failed state unchanged.
 *
 * Sites: each execution with checks commits the (op index, op name, source line) of its
 * checking ops; the failing execution's sequence number and op index select the one the error
 * names. The last PJ_CHECK_RING executions are remembered; an older failure is reported
 * without its line.
 *
 * Locking: pj_checks_acquire .. pj_checks_release hold the module's lock (callers also hold
 * pj_run_lock, which orders executions), so a report never takes a state buffer a launch is
 * donating. Thread-safe. */
#ifndef TORCH_PJRT_INDEX_CHECKS_H
#define TORCH_PJRT_INDEX_CHECKS_H
#include <stdbool.h>
#include <stdint.h>
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

#define PJ_CHECK_STATE_LEN 9
#define PJ_CHECK_RING 1024

/* What failed, and so which exception and message CPU gives. */
typedef enum {
  PJ_CHECK_NONE = 0,
  /* IndexError "index V is out of bounds for dimension D with size S" (advanced indexing,
   * index_put, index_fill) */
  PJ_CHECK_DIM,
  /* RuntimeError with the same text (gather, scatter) */
  PJ_CHECK_DIM_RUNTIME,
  /* IndexError "index out of range in self" (index_select, embedding, index_add, index_reduce) */
  PJ_CHECK_SELF,
  /* IndexError "index_copy_(): index V is out of bounds for dimension D with size S" */
  PJ_CHECK_INDEX_COPY,
  /* IndexError "out of range: tried to access index V on a tensor of S elements." (take, put) */
  PJ_CHECK_TAKE,
  /* IndexError "Target V is out of bounds." (nll_loss, cross_entropy) */
  PJ_CHECK_TARGET,
  /* RuntimeError "Index P of input takes value V which is not in the valid range [0, S)"
   * (embedding_bag) */
  PJ_CHECK_EMBEDDING_BAG,
  /* RuntimeError "INDICES element is out of DATA bounds, id=V axis_dim=S" (CPU's index_select
   * along dim 1 of a tensor of rank > 1) */
  PJ_CHECK_DATA_BOUNDS,
  /* RuntimeError "Number of elements of source < number of ones in mask" (masked_scatter; the
   * checked value is the mask's true count, the size the source's numel + 1) */
  PJ_CHECK_MASKED_SCATTER,
  PJ_CHECK_KINDS
} pj_check_kind_t;

/* One checking op of a program: its index among the program's ops, its aten base name and
 * the Python source line it came from (" at file:line", or ""). Borrowed; commit copies. */
typedef struct {
  int op_index;
  const char *op;
  const char *where;
} pj_check_site_t;

struct PJRT_Buffer;

/* Whether calls made now check their indices: TORCH_PJRT_CHECK_BOUNDS (read once; 0 turns
 * the checks off, XLA's clamping; default on), or what pj_checks_set_enabled set since. A call
 * records the setting in its key (pj_call_t.checked), so programs of both kinds coexist in
 * the caches and switching never reuses one for the other. */
bool pj_checks_enabled(void);
void pj_checks_set_enabled(bool on);

/* Locks the device's check state and gives its buffer (a zeroed one is made when there is
 * none) for a launch that donates it. Always pair with pj_checks_release, also on failure. */
pj_status_t *pj_checks_acquire(int device, struct PJRT_Buffer **state);
/* Unlocks. new_state: the launch's state result (it replaces the donated buffer, whose handle
 * is destroyed here), with the sites of its checking ops; NULL when the launch failed: the
 * state is then lost and the pending checks with it. */
void pj_checks_release(int device, struct PJRT_Buffer *new_state, const pj_check_site_t *sites,
                       int nsites);

/* The first failed check on the device (every device: -1) since the last report, as CPU's
 * exception (code and message naming the op and its source line), or NULL. Clears what it
 * reads. Blocks until the checking executions launched so far are done; cheap (no device
 * access) when none ran since the last report. */
pj_status_t *pj_checks_report(int device);


#ifdef __cplusplus
}
#endif
#endif
