/* Completion tracking for torch.tpu.synchronize(), Stream and Event. Every execution registers
 * its device-complete event here; a marker is a snapshot of the executions still in flight when
 * it was recorded, so waiting on it orders host work after them and its completion time (the
 * latest completion among them, or the record time if none) times device work. */
#ifndef TORCH_PJRT_STREAM_H
#define TORCH_PJRT_STREAM_H
#include <stdint.h>
#include <stdbool.h>
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif
struct PJRT_Event;
typedef struct pj_marker pj_marker_t;

/* Takes ownership of `ev` (the PJRT device-complete event of one execution on `device`). */
void pj_stream_track(int device, struct PJRT_Event *ev);
/* The same for an execution that the timeline profile records (exec_profile.h): `label` (NULL:
 * not recorded) and `issued_ns` (CLOCK_MONOTONIC, taken before the launch) are kept with the
 * event, and its completion appends the record. */
void pj_stream_track_timed(int device, struct PJRT_Event *ev, int64_t issued_ns,
                           const char *label);
/* Waits for every tracked execution on the device (device < 0: all devices); returns the first
 * device error seen since the last synchronize, if any. */
pj_status_t *pj_stream_synchronize(int device);
/* Number of tracked executions not yet complete (for tests of asynchrony). */
int64_t pj_stream_pending(int device);

pj_status_t *pj_marker_record(int device, pj_marker_t **out);
bool pj_marker_query(pj_marker_t *m);
pj_status_t *pj_marker_wait(pj_marker_t *m);
/* Nanoseconds (monotonic clock) at which everything the marker covers had completed.
 * Waits first. */
pj_status_t *pj_marker_time_ns(pj_marker_t *m, int64_t *out);
void pj_marker_free(pj_marker_t *m);

#ifdef __cplusplus
}
#endif
#endif
