/* Native kernels the lowerings may call from inside a program, as XLA FFI custom calls.
 *
 * Registered once per process with the plugin's FFI extension (PJRT_Extension_Type_FFI) when the
 * client is created, and only on the CPU plugin: the handlers run on the host and read device
 * buffers as host memory, which holds for the CPU plugin alone. A lowering asks
 * pj_ffi_small_gemm_target() whether a kernel is there and emits its custom call only then, so
 * a program never names a handler its process lacks (the target name is in the program text,
 * hence in its cache key).
 *
 * torch_pjrt_small_gemm_f32(x f32[m, k], b f32[k, n]) -> f32[m, n]: x @ b for the few-row
 * products of decoding (csrc/ops/linalg.c uses it for m <= 8). XLA's CPU dot runs such products
 * well under the memory bandwidth its one-row path reaches (it packs the whole weight per call);
 * small_gemm.c reads b once. TORCH_PJRT_SMALL_GEMM=0 leaves every product to XLA. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pjrt_c_api.h"
#include "xla/ffi/api/c_api.h"
#include "xla/pjrt/c/pjrt_c_api_ffi_extension.h"

#include "ffi_kernels.h"
#include "torch_pjrt/runtime.h"
#include "small_gemm.h"

#define SMALL_GEMM_TARGET "torch_pjrt_small_gemm_f32"

static atomic_bool g_small_gemm;   /* set once the handler is registered */
static atomic_llong g_small_gemm_calls; /* executions of the handler (tests read it) */
static char g_reason[256] = "not registered yet";

/* Reports a bad call back to XLA as an error (the program's execution fails with it). */
static XLA_FFI_Error *ffi_error(const XLA_FFI_CallFrame *cf, const char *msg) {
  XLA_FFI_Error_Create_Args a = {.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE,
                                 .message = msg,
                                 .errc = XLA_FFI_Error_Code_INVALID_ARGUMENT};
  return cf->api->XLA_FFI_Error_Create(&a);
}

/* XLA first calls a handler with a metadata extension to learn the FFI version it was built
 * for (and its traits); every other call is an execution stage. Returns true when this call was
 * the metadata query (answered). */
static bool answer_metadata(XLA_FFI_CallFrame *cf) {
  for (XLA_FFI_Extension_Base *e = cf->extension_start; e; e = e->next) {
    if (e->type != XLA_FFI_Extension_Metadata) continue;
    XLA_FFI_Metadata *md = ((XLA_FFI_Metadata_Extension *)e)->metadata;
    md->api_version.major_version = XLA_FFI_API_MAJOR;
    md->api_version.minor_version = XLA_FFI_API_MINOR;
    md->traits = 0;
    return true;
  }
  return false;
}

static const XLA_FFI_Buffer *f32_matrix(void *p) {
  const XLA_FFI_Buffer *b = p;
  return (b && b->dtype == XLA_FFI_DataType_F32 && b->rank == 2) ? b : NULL;
}

static XLA_FFI_Error *small_gemm_handler(XLA_FFI_CallFrame *cf) {
  if (answer_metadata(cf)) return NULL;
  if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  if (cf->args.size != 2 || cf->rets.size != 1 ||
      cf->args.types[0] != XLA_FFI_ArgType_BUFFER || cf->args.types[1] != XLA_FFI_ArgType_BUFFER ||
      cf->rets.types[0] != XLA_FFI_RetType_BUFFER)
    return ffi_error(cf, SMALL_GEMM_TARGET ": expects two buffers and one result");
  const XLA_FFI_Buffer *x = f32_matrix(cf->args.args[0]);
  const XLA_FFI_Buffer *b = f32_matrix(cf->args.args[1]);
  const XLA_FFI_Buffer *o = f32_matrix(cf->rets.rets[0]);
  if (!x || !b || !o || x->dims[1] != b->dims[0] || o->dims[0] != x->dims[0] ||
      o->dims[1] != b->dims[1])
    return ffi_error(cf, SMALL_GEMM_TARGET ": expects f32 [m, k] x [k, n] -> [m, n]");
  pj_small_gemm_f32(x->data, b->data, o->data, x->dims[0], x->dims[1], b->dims[1]);
  atomic_fetch_add_explicit(&g_small_gemm_calls, 1, memory_order_relaxed);
  return NULL;
}

static const PJRT_FFI_Extension *find_ffi(const PJRT_Api *api) {
  for (const PJRT_Extension_Base *e = api->extension_start; e; e = e->next)
    if (e->type == PJRT_Extension_Type_FFI) return (const PJRT_FFI_Extension *)e;
  return NULL;
}

void pj_ffi_kernels_register(const PJRT_Api *api, const char *platform) {
  const char *env = getenv("TORCH_PJRT_SMALL_GEMM");
  if (env && strcmp(env, "0") == 0) {
    snprintf(g_reason, sizeof g_reason, "off (TORCH_PJRT_SMALL_GEMM=0)");
    return;
  }
  if (strcmp(platform, "cpu") != 0) {
    snprintf(g_reason, sizeof g_reason, "not on the %s platform (host kernels: cpu only)",
             platform);
    return;
  }
  const PJRT_FFI_Extension *ffi = find_ffi(api);
  if (!ffi || !ffi->register_handler) {
    snprintf(g_reason, sizeof g_reason, "the plugin has no FFI extension");
    return;
  }
  PJRT_FFI_Register_Handler_Args a = {.struct_size = PJRT_FFI_Register_Handler_Args_STRUCT_SIZE,
                                      .target_name = SMALL_GEMM_TARGET,
                                      .target_name_size = strlen(SMALL_GEMM_TARGET),
                                      .handler = (void *)small_gemm_handler,
                                      .platform_name = "Host",
                                      .platform_name_size = strlen("Host")};
  PJRT_Error *err = ffi->register_handler(&a);
  if (err) {
    PJRT_Error_Message_Args ma = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE,
                                  .error = err};
    api->PJRT_Error_Message(&ma);
    snprintf(g_reason, sizeof g_reason, "registration failed: %.*s", (int)ma.message_size,
             ma.message);
    PJRT_Error_Destroy_Args da = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE,
                                  .error = err};
    api->PJRT_Error_Destroy(&da);
    return;
  }
  snprintf(g_reason, sizeof g_reason, "registered (%d threads)", pj_small_gemm_threads());
  atomic_store(&g_small_gemm, true);
}

const char *pj_ffi_small_gemm_target(void) {
  return atomic_load(&g_small_gemm) ? SMALL_GEMM_TARGET : NULL;
}

const char *pj_ffi_kernels_status(void) { return g_reason; }

long long pj_ffi_small_gemm_calls(void) { return atomic_load(&g_small_gemm_calls); }
