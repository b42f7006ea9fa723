/* Execution timeline for attribution (torch_pjrt/compile/attribution.py): while enabled, every
 * program execution leaves a record of its device, a label, the time it was issued and the time
 * its device-complete event fired (both CLOCK_MONOTONIC, the clock of Python's
 * time.monotonic_ns()). A program's device time is then its completion minus the later of its
 * issue and the previous completion on the same device: executions on one device run in issue
 * order, so that interval is the device working on it alone.
 *
 * The label is per thread (pj_exec_profile_label): whoever issues programs names them (a compiled
 * graph's runner names its plan); unnamed executions get "eager". Records go into one bounded
 * buffer (PJ_EXEC_PROFILE_MAX records; later ones are counted as dropped). Thread-safe. When
 * disabled, the cost on the execute path is one relaxed atomic load. */
#ifndef TORCH_PJRT_EXEC_PROFILE_H
#define TORCH_PJRT_EXEC_PROFILE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

#define PJ_EXEC_PROFILE_LABEL 64
#define PJ_EXEC_PROFILE_MAX (1 << 20)

typedef struct {
  int device;
  char label[PJ_EXEC_PROFILE_LABEL];
  int64_t issued_ns;
  int64_t done_ns;
} pj_exec_record_t;

/* Starts recording (clearing what an earlier session left) or stops it. */
void pj_exec_profile_enable(bool on);
bool pj_exec_profile_enabled(void);
/* Names the programs this thread issues from now on (NULL or "": "eager"). Copied, truncated to
 * PJ_EXEC_PROFILE_LABEL - 1 bytes. */
void pj_exec_profile_label(const char *label);
/* This thread's current label ("eager" when none). */
const char *pj_exec_profile_current_label(void);
/* Appends one record (called on completion, from any thread). */
void pj_exec_profile_record(int device, const char *label, int64_t issued_ns, int64_t done_ns);
/* Moves the records collected so far to the caller (malloc'd array, *n entries; NULL when none)
 * and reports how many were dropped since the last take. */
pj_exec_record_t *pj_exec_profile_take(size_t *n, uint64_t *dropped);

#ifdef __cplusplus
}
#endif
#endif
