/* The process-wide runtime: one loaded PJRT plugin, one client, its addressable devices.
 * Initialized lazily and once (pj_runtime_get); the plugin is chosen by TORCH_PJRT_PLUGIN
 * (read in config.c). All PJRT calls go through this module's checked helpers so an
 * older plugin whose function table lacks a slot fails with a message instead of a crash. */
#ifndef TORCH_PJRT_RUNTIME_H
#define TORCH_PJRT_RUNTIME_H
#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "torch_pjrt/status.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef struct pj_runtime pj_runtime_t;

/* Loads the plugin and creates the client on first use; later calls return the same object
 * (or the same failure, re-reported as a fresh status). Thread-safe. */
pj_status_t *pj_runtime_get(pj_runtime_t **out);
/* True when pj_runtime_get has already succeeded (never initializes). */
bool pj_runtime_ready(void);

int pj_runtime_device_count(const pj_runtime_t *rt);
const char *pj_runtime_platform_name(const pj_runtime_t *rt);   /* e.g. "cpu", "cuda", "tpu" */
/* The custom-call target of the native few-row f32 matrix product (csrc/runtime/ffi_kernels.c;
 * b_transposed: the form taking b as a row-major [n, k] matrix),
 * or NULL where this process has none registered (not the CPU plugin, no FFI extension,
 * TORCH_PJRT_SMALL_GEMM=0). Known once the runtime exists. */
const char *pj_ffi_small_gemm_target(bool b_transposed);
/* The same for the float32 paged-attention kernel (tpu::paged_attention's core). */
const char *pj_ffi_paged_attention_target(void);
/* Why it is or is not there, in words (tests and bug reports). */
const char *pj_ffi_kernels_status(void);
/* How many times programs have run that product so far in this process. */
long long pj_ffi_small_gemm_calls(void);
long long pj_ffi_paged_attention_calls(void);
const char *pj_runtime_platform_version(const pj_runtime_t *rt);
const char *pj_runtime_device_kind(const pj_runtime_t *rt, int device);
const char *pj_runtime_plugin_path(const pj_runtime_t *rt);
/* "major.minor" of the plugin's PJRT C API. */
void pj_runtime_api_version(const pj_runtime_t *rt, int *major, int *minor);
/* Stable text identifying plugin build + API version + platform (its digest, below, is part of
 * every cache key). */
const char *pj_runtime_identity(const pj_runtime_t *rt);
/* The identity as a 16-hex-digit digest: what program cache keys hold (every op's key starts
 * with it, so the full text would be hashed and compared on every cache hit). It also names
 * the current float32 product precision (pj_hlo_f32_product_precision), which programs' text
 * depends on. */
const char *pj_runtime_key_identity(const pj_runtime_t *rt);
/* Chooses the plugin file and the CPU plugin's device count before the first pj_runtime_get.
 * The Python front resolves names (cpu/cuda/tpu) to files; without a call the runtime uses
 * TORCH_PJRT_PLUGIN when it is a path. Fails once the runtime is initialized. */
pj_status_t *pj_runtime_configure(const char *plugin_path, int cpu_device_count);
/* Makes every later pj_runtime_get fail with this message instead of starting the plugin: for
 * a configuration the front has found would make the plugin abort the process (an XLA_FLAGS
 * flag it does not know). Fails once the runtime is initialized. */
pj_status_t *pj_runtime_refuse(pj_code_t code, const char *message);

/* Internal handles, for the other runtime modules only (storage.c, exec.c, transfer.c). */
struct PJRT_Api;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Error;
const struct PJRT_Api *pj_runtime_api(const pj_runtime_t *rt);
struct PJRT_Client *pj_runtime_client(const pj_runtime_t *rt);
struct PJRT_Device *pj_runtime_device(const pj_runtime_t *rt, int device);
/* The plugin's global id of device `device` (PJRT_DeviceDescription_Id; what a compiled device
 * assignment names), or -1 when the client has no such device. */
int64_t pj_runtime_device_id(const pj_runtime_t *rt, int device);
/* The plugin's attributes of a device (PJRT_DeviceDescription_Attributes: name, type and
 * value each; a TPU's `coords`, `core_on_chip`, ...), owned by the client; none (n = 0) when
 * the plugin has no such entry point. */
struct PJRT_NamedValue;
pj_status_t *pj_runtime_device_attributes(pj_runtime_t *rt, int device,
                                          const struct PJRT_NamedValue **attrs, size_t *n);
/* The index of an addressable device, or -1 when `dev` is not one of them. */
int pj_runtime_device_index(const pj_runtime_t *rt, const struct PJRT_Device *dev);
/* Converts (and destroys) a PJRT_Error into a status; NULL stays NULL. */
pj_status_t *pj_runtime_take_error(const pj_runtime_t *rt, struct PJRT_Error *err, const char *what);

#ifdef __cplusplus
}
#endif
#endif
