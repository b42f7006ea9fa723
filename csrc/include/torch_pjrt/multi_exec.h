/* Multi-device programs: one StableHLO program compiled for N replicas, replica r bound to a
 * chosen device, and launched on all N devices in one PJRT execute call, so the collectives
 * inside it (all_reduce, all_gather, reduce_scatter, collective_permute, all_to_all) run
 * between those devices. */
#ifndef TORCH_PJRT_MULTI_EXEC_H
#define TORCH_PJRT_MULTI_EXEC_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "torch_pjrt/exec.h"
#include "torch_pjrt/status.h"
#include "torch_pjrt/stream.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Compiles `text` for ndev replicas (one partition), replica r on runtime device devices[r]
 * (devices NULL: devices 0..ndev-1). Inside the program, replica ids (replica_groups,
 * source_target_pairs, replica_id) are replica numbers r, not device numbers. Errors: ndev < 1
 * or more than the client's devices (PJ_ERR_VALUE), a device the client lacks (PJ_ERR_INDEX),
 * a device named twice (PJ_ERR_VALUE). */
pj_status_t *pj_program_compile_multi(const char *text, size_t len, int ndev, const int *devices,
                                      pj_program_t **out);

/* Launches a bound program on all its devices in one call. args[r][i]: argument i of replica r
 * (a buffer on the replica's device), nargs per replica; donate (may be NULL) as in
 * pj_program_execute, the same for every replica. outs[r] receives num_outputs new buffers of
 * replica r. done (may be NULL) receives one marker per replica (stream.h): it completes when
 * the replica's execution (and what ran before it on that device) has completed; free each with
 * pj_marker_free. Every device's completion is tracked by stream.c too, so
 * pj_stream_synchronize covers it. On error nothing is launched or handed out: outs and done
 * are left NULL. Errors: a portable program, a wrong argument count, an argument on another
 * device than its replica's (PJ_ERR_VALUE), and the plugin's own. */
pj_status_t *pj_program_execute_multi(pj_program_t *p, struct PJRT_Buffer *const *const *args,
                                      size_t nargs, const bool *donate,
                                      struct PJRT_Buffer **const *outs, pj_marker_t **done);

#ifdef __cplusplus
}
#endif
#endif
