/* Private to the runtime: program construction for a placement and what an execute call needs
 * to know of a bound program (exec.c owns pj_program; multi_exec.c, cache.c and disk_cache.c
 * use these). */
#ifndef TORCH_PJRT_PROGRAM_H
#define TORCH_PJRT_PROGRAM_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "torch_pjrt/exec.h"

/* The most devices one program may be bound to (the runtime's device table is as large). */
#define PJ_PROGRAM_MAX_DEVICES 64

/* Compiles for `pl` (portable when pl->ndev == 0); pl's devices must be valid, distinct
 * runtime device indices (multi_exec.c checks them for its callers). */
pj_status_t *pj_program_compile_placed(const char *text, size_t len, const pj_placement_t *pl,
                                       pj_program_t **out);
/* Deserializes and checks that the executable runs where `pl` says (a mismatch is an error:
 * the persistent cache treats it as an unusable entry). */
pj_status_t *pj_program_deserialize_placed(const void *bytes, size_t len,
                                           const pj_placement_t *pl, pj_program_t **out);
/* Where replica r's argument and output lists go in a PJRT execute call: the executable's
 * own order of its addressable devices, which need not be the replica order. */
int pj_program_slot(const pj_program_t *p, int replica);
/* The indices of the arguments not marked in `donate` (NULL: none marked), for an execute
 * call's non_donatable_input_indices: donation is opt-in per argument. Written into `small`
 * when nargs <= nsmall, else into a malloc'd array (the caller frees it when it is not
 * `small`); NULL when out of memory. */
int64_t *pj_program_keep_list(const bool *donate, size_t nargs, int64_t *small, size_t nsmall,
                              size_t *nkeep);
/* Parameters per device, or -1 when the plugin does not report them. */
int64_t pj_program_num_params(const pj_program_t *p);
#endif
