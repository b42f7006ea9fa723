/* The serialized xla.CompileOptionsProto handed to PJRT_Client_Compile: one replica compiled
 * portable (the single-device programs of exec.h), or N replicas bound to N devices by a device
 * assignment (multi_exec.h). */
#ifndef TORCH_PJRT_COMPILE_OPTIONS_H
#define TORCH_PJRT_COMPILE_OPTIONS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Whether programs are compiled to round to their dtype at every op boundary (the default;
 * false when the user's XLA_FLAGS names xla_allow_excess_precision: their choice wins). */
bool pj_compile_options_round_each_op(void);

/* *bytes (malloc'd, the caller frees) = the options for:
 *  - nreplicas == 0: one replica, one partition, compile_portable_executable (runs on any
 *    device; device_ids is ignored);
 *  - nreplicas >= 1: nreplicas replicas, one partition, and a device assignment placing
 *    replica r on the device whose global id (PJRT_DeviceDescription_Id) is device_ids[r].
 * round_each_op adds the override that turns xla_allow_excess_precision off. */
pj_status_t *pj_compile_options_build(int nreplicas, const int64_t *device_ids,
                                      bool round_each_op, void **bytes, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
