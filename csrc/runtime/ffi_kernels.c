/* Native kernels the lowerings may call from inside a program, as XLA FFI custom calls.
 *
 * Registered once per process with the plugin's FFI extension (PJRT_Extension_Type_FFI) when the
 * client is created, and only on the CPU plugin: the handlers run on the host and read device
 * buffers as host memory, which holds for the CPU plugin alone. A lowering asks
 * pj_ffi_small_gemm_target() / pj_ffi_paged_attention_target() whether its kernel is there and
 * emits the custom call only then, so a program never names a handler its process lacks (and
 * the runtime identity, part of every program cache key, says whether they are registered).
 *
 * torch_pjrt_small_gemm_f32(x f32[m, k], b f32[k, n]) -> f32[m, n]: x @ b for the few-row
 *   products of decoding (csrc/ops/linalg.c: mm/addmm at 1 to 8 rows). XLA's CPU dot runs them
 *   well below memory bandwidth (8 rows cost about twice one row); small_gemm.c reads b once.
 *   torch_pjrt_small_gemm_nt_f32(x, w f32[n, k]): the same with b = w^T, for a b that is the
 *   transposed view of a row-major matrix (nn.Linear's weight), so XLA passes w as it is stored
 *   instead of copying it into b's layout.
 * torch_pjrt_paged_attention_f32(...): tpu::paged_attention's core for float32 query and cache
 *   (csrc/ops/paged_attention.c; attention_kernel.c): each context row read once per query row,
 *   where XLA's form gathers every context and runs batched products of a few rows.
 * TORCH_PJRT_SMALL_GEMM=0 registers neither: every product and attention stays XLA's. */
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
#include "attention_kernel.h"

#define SMALL_GEMM_TARGET "torch_pjrt_small_gemm_f32"
#define SMALL_GEMM_NT_TARGET "torch_pjrt_small_gemm_nt_f32"
#define ATTENTION_TARGET "torch_pjrt_paged_attention_f32"

static atomic_bool g_small_gemm;   /* set once every handler is registered */
static atomic_llong g_small_gemm_calls, g_attention_calls; /* executions (tests read them) */
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

static const XLA_FFI_Buffer *buffer_of(void *p, XLA_FFI_DataType dt, int64_t rank) {
  const XLA_FFI_Buffer *b = p;
  return (b && b->dtype == dt && b->rank == rank) ? b : NULL;
}

/* x f32[m, k] with b f32[k, n] (nt: w f32[n, k], the product x @ w^T) -> f32[m, n] */
static XLA_FFI_Error *gemm_call(XLA_FFI_CallFrame *cf, bool nt) {
  if (answer_metadata(cf)) return NULL;
  if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  if (cf->args.size != 2 || cf->rets.size != 1 ||
      cf->args.types[0] != XLA_FFI_ArgType_BUFFER || cf->args.types[1] != XLA_FFI_ArgType_BUFFER ||
      cf->rets.types[0] != XLA_FFI_RetType_BUFFER)
    return ffi_error(cf, SMALL_GEMM_TARGET ": expects two buffers and one result");
  const XLA_FFI_Buffer *x = buffer_of(cf->args.args[0], XLA_FFI_DataType_F32, 2);
  const XLA_FFI_Buffer *b = buffer_of(cf->args.args[1], XLA_FFI_DataType_F32, 2);
  const XLA_FFI_Buffer *o = buffer_of(cf->rets.rets[0], XLA_FFI_DataType_F32, 2);
  const int64_t kdim = nt ? 1 : 0, ndim = nt ? 0 : 1;
  if (!x || !b || !o || x->dims[1] != b->dims[kdim] || o->dims[0] != x->dims[0] ||
      o->dims[1] != b->dims[ndim])
    return ffi_error(cf, SMALL_GEMM_TARGET ": expects f32 [m, k] x [k, n] -> [m, n]");
  if (nt)
    pj_small_gemm_nt_f32(x->data, b->data, o->data, x->dims[0], x->dims[1], b->dims[0]);
  else
    pj_small_gemm_f32(x->data, b->data, o->data, x->dims[0], x->dims[1], b->dims[1]);
  atomic_fetch_add_explicit(&g_small_gemm_calls, 1, memory_order_relaxed);
  return NULL;
}

static XLA_FFI_Error *small_gemm_handler(XLA_FFI_CallFrame *cf) { return gemm_call(cf, false); }
static XLA_FFI_Error *small_gemm_nt_handler(XLA_FFI_CallFrame *cf) { return gemm_call(cf, true); }

/* (query f32 [T, H, D], cache f32 [NB, BS, KVH, 2D], context_slots s64 [R, S],
 *  query_index s64 [R, Q], query_pos s64 [R, Q], params f32 [3] = scale, soft_cap, window)
 *  -> f32 [R * Q, H * D] (attention_kernel.h) */
static XLA_FFI_Error *attention_handler(XLA_FFI_CallFrame *cf) {
  if (answer_metadata(cf)) return NULL;
  if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  const char *bad = ATTENTION_TARGET ": unexpected operands";
  if (cf->args.size != 6 || cf->rets.size != 1) return ffi_error(cf, bad);
  for (int i = 0; i < 6; i++)
    if (cf->args.types[i] != XLA_FFI_ArgType_BUFFER) return ffi_error(cf, bad);
  if (cf->rets.types[0] != XLA_FFI_RetType_BUFFER) return ffi_error(cf, bad);
  const XLA_FFI_Buffer *q = buffer_of(cf->args.args[0], XLA_FFI_DataType_F32, 3);
  const XLA_FFI_Buffer *c = buffer_of(cf->args.args[1], XLA_FFI_DataType_F32, 4);
  const XLA_FFI_Buffer *cs = buffer_of(cf->args.args[2], XLA_FFI_DataType_S64, 2);
  const XLA_FFI_Buffer *qi = buffer_of(cf->args.args[3], XLA_FFI_DataType_S64, 2);
  const XLA_FFI_Buffer *qp = buffer_of(cf->args.args[4], XLA_FFI_DataType_S64, 2);
  const XLA_FFI_Buffer *pr = buffer_of(cf->args.args[5], XLA_FFI_DataType_F32, 1);
  const XLA_FFI_Buffer *o = buffer_of(cf->rets.rets[0], XLA_FFI_DataType_F32, 2);
  if (!q || !c || !cs || !qi || !qp || !pr || !o || pr->dims[0] != 3) return ffi_error(cf, bad);
  const float *params = pr->data;
  pj_paged_attention_args_t a = {
      .query = q->data, .cache = c->data, .context_slots = cs->data,
      .query_index = qi->data, .query_pos = qp->data,
      .T = q->dims[0], .nslots = c->dims[0] * c->dims[1], .R = cs->dims[0], .S = cs->dims[1],
      .Q = qi->dims[1], .heads = q->dims[1], .kv_heads = c->dims[2], .head_size = q->dims[2],
      .scale = params[0], .soft_cap = params[1], .window = (int64_t)params[2]};
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || c->dims[3] != 2 * a.head_size ||
      qi->dims[0] != a.R || qp->dims[0] != a.R || qp->dims[1] != a.Q ||
      o->dims[0] != a.R * a.Q || o->dims[1] != a.heads * a.head_size)
    return ffi_error(cf, bad);
  if (pj_paged_attention_f32(&a, o->data) != 0)
    return ffi_error(cf, ATTENTION_TARGET ": out of host memory for the scores");
  atomic_fetch_add_explicit(&g_attention_calls, 1, memory_order_relaxed);
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
  const struct {
    const char *name;
    XLA_FFI_Handler *handler;
  } kernels[] = {{SMALL_GEMM_TARGET, small_gemm_handler},
                 {SMALL_GEMM_NT_TARGET, small_gemm_nt_handler},
                 {ATTENTION_TARGET, attention_handler}};
  for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
    PJRT_FFI_Register_Handler_Args a = {
        .struct_size = PJRT_FFI_Register_Handler_Args_STRUCT_SIZE,
        .target_name = kernels[i].name,
        .target_name_size = strlen(kernels[i].name),
        .handler = (void *)kernels[i].handler,
        .platform_name = "Host",
        .platform_name_size = strlen("Host")};
    PJRT_Error *err = ffi->register_handler(&a);
    if (!err) continue;
    PJRT_Error_Message_Args ma = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE,
                                  .error = err};
    api->PJRT_Error_Message(&ma);
    snprintf(g_reason, sizeof g_reason, "registration of %s failed: %.*s", kernels[i].name,
             (int)ma.message_size, ma.message);
    PJRT_Error_Destroy_Args da = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE,
                                  .error = err};
    api->PJRT_Error_Destroy(&da);
    return;
  }
  snprintf(g_reason, sizeof g_reason, "registered (%d threads)", pj_small_gemm_threads());
  atomic_store(&g_small_gemm, true);
}

const char *pj_ffi_small_gemm_target(bool b_transposed) {
  if (!atomic_load(&g_small_gemm)) return NULL;
  return b_transposed ? SMALL_GEMM_NT_TARGET : SMALL_GEMM_TARGET;
}

const char *pj_ffi_paged_attention_target(void) {
  return atomic_load(&g_small_gemm) ? ATTENTION_TARGET : NULL;
}

const char *pj_ffi_kernels_status(void) { return g_reason; }

long long pj_ffi_small_gemm_calls(void) { return atomic_load(&g_small_gemm_calls); }

long long pj_ffi_paged_attention_calls(void) { return atomic_load(&g_attention_calls); }
