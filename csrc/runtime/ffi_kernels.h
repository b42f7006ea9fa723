/* Native kernels called from programs as XLA FFI custom calls (ffi_kernels.c). */
#ifndef TORCH_PJRT_FFI_KERNELS_H
#define TORCH_PJRT_FFI_KERNELS_H
#include "pjrt_c_api.h"

/* Registers the kernels with the plugin (CPU plugin only); failures only leave them off. Called
 * once, when the client is created. */
void pj_ffi_kernels_register(const PJRT_Api *api, const char *platform);

#endif
