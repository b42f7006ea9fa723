/* Free and total memory of a device (see memory_info.c for where the figures come from). */
#ifndef TORCH_PJRT_MEMORY_INFO_H
#define TORCH_PJRT_MEMORY_INFO_H
#include <stdint.h>
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Bytes free and in total on `device`. PJ_ERR_RUNTIME for a device the client does not have,
 * PJ_ERR_UNIMPLEMENTED when neither the plugin nor the platform says. */
pj_status_t *pj_device_memory_info(int device, int64_t *free_bytes, int64_t *total_bytes);

#ifdef __cplusplus
}
#endif
#endif
