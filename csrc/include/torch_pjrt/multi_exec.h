/* Multi-device programs: one StableHLO program compiled for N replicas, replica r bound to a
 * chosen device, and launched on all N devices in one PJRT execute call, so the collectives
 * inside it (all_reduce, all_gather, reduce_scatter, collective_permute, all_to_all) run
 * between those devices. Placements and their cache-key forms live here too. */
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
 * a device named twice (PJ_ERR_VALUE). Not cached: see pj_program_for_placement. */
pj_status_t *pj_program_compile_multi(const char *text, size_t len, int ndev, const int *devices,
                                      pj_program_t **out);

/* The memory cache, then the persistent cache, then a compile (stored in both), under `key`
 * and the placement (ndev, devices) together. The cache owns *out; as for every cached
 * program, the caller uses it only while no other thread inserts into the cache (an insert may
 * evict it: graph/call.c's run lock is that rule for the eager path). */
pj_status_t *pj_program_for_placement(const void *key, size_t keylen, const char *text,
                                      size_t len, int ndev, const int *devices,
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

/* Placements as keys. Equal placements run on the same devices in the same replica order. */
bool pj_placement_equal(const pj_placement_t *a, const pj_placement_t *b);
/* Mixes the placement into a key's hash; a portable placement leaves it unchanged. */
uint64_t pj_placement_hash(const pj_placement_t *pl, uint64_t key_hash);
/* The placement as bytes for persistent keys: 'P', then the replica count and each replica's
 * global device id (what the serialized executable names; stable across processes, unlike a
 * pointer), little-endian. *len bytes at most PJ_PLACEMENT_KEY_MAX. */
#define PJ_PLACEMENT_KEY_MAX (1 + 4 + 8 * 64)
pj_status_t *pj_placement_key(const pj_placement_t *pl, unsigned char *buf, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
