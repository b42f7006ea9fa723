/* Transfers of the staged tpu_dist transport: see torch_pjrt/staged_transfer.h. */
#include "torch_pjrt/staged_transfer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "api_check.h"
#include "torch_pjrt/bucket.h"
#include "torch_pjrt/host_pool.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/transfer.h"

/* Events whose ready callback has run, destroyed later on a caller's thread: a singly linked
 * list of the released uploads themselves (each keeps its event until reaped). */
typedef struct release {
  void *block;
  size_t cap;
  PJRT_Event *ev;
  struct release *next;
} release_t;

static pthread_mutex_t g_reap_mu = PTHREAD_MUTEX_INITIALIZER;
static release_t *g_reap;

static void destroy_event(const pj_runtime_t *rt, PJRT_Event *ev) {
  PJRT_Event_Destroy_Args d = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = ev};
  pj_status_free(pj_runtime_take_error(rt, pj_runtime_api(rt)->PJRT_Event_Destroy(&d),
                                       "destroy event"));
}

void pj_staged_reap(void) {
  pthread_mutex_lock(&g_reap_mu);
  release_t *list = g_reap;
  g_reap = NULL;
  pthread_mutex_unlock(&g_reap_mu);
  if (!list) return;
  pj_runtime_t *rt;
  pj_status_t *st = pj_runtime_get(&rt); /* up: it fired these events */
  while (list) {
    release_t *next = list->next;
    if (!st) destroy_event(rt, list->ev);
    free(list);
    list = next;
  }
  pj_status_free(st);
}

/* PJRT is done with the block: back to the pool; the event waits for pj_staged_reap. Runs on
 * PJRT's threads and never calls into PJRT but to take the error it owns. */
static void on_block_released(PJRT_Error *err, void *arg) {
  release_t *r = arg;
  if (err) {
    pj_runtime_t *rt = NULL;
    pj_status_t *st = pj_runtime_get(&rt);
    if (!st) pj_status_free(pj_runtime_take_error(rt, err, "host buffer release"));
    pj_status_free(st);
  }
  pj_host_pool_give(r->block, r->cap);
  pthread_mutex_lock(&g_reap_mu);
  r->next = g_reap;
  g_reap = r;
  pthread_mutex_unlock(&g_reap_mu);
}

pj_status_t *pj_staged_upload(int device, void *block, size_t cap, pj_dtype_t dt, int64_t n,
                              PJRT_Buffer **out, bool *zero_copy) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  pj_staged_reap();
  PJRT_Device *dev = pj_runtime_device(rt, device);
  if (!dev) return pj_status_new(PJ_ERR_RUNTIME, "tpu_dist: invalid device index %d",
                                 device);
  const size_t nbytes = (size_t)n * pj_dtype_info(dt)->itemsize;
  if (nbytes > cap)
    return pj_status_new(PJ_ERR_RUNTIME,
                         "tpu_dist: %zu bytes to upload from a block of %zu", nbytes, cap);
  PJ_API_SLOT(from_host, api, PJRT_Client_BufferFromHostBuffer);
  release_t *r = malloc(sizeof *r); /* before the upload: nothing to undo if it fails */
  if (!r) return pj_status_new(PJ_ERR_OOM, "out of host memory starting an upload");
  /* kImmutableZeroCopy lets a plugin whose device memory is host memory (the CPU plugin) make
   * the block itself the buffer: no copy. Other plugins copy. Either way done_with_host_buffer
   * says when the block is free again; until then nothing writes it (the runtime promises not
   * to for this semantics, and the block is no longer the caller's). */
  PJRT_Client_BufferFromHostBuffer_Args a = {
      .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
      .client = pj_runtime_client(rt),
      .data = block,
      .type = (PJRT_Buffer_Type)pj_dtype_info(dt)->pjrt_type,
      .dims = &n,
      .num_dims = 1,
      .host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableZeroCopy,
      .device = dev};
  pj_status_t *st = pj_runtime_take_error(rt, from_host(&a), "tpu_dist host-to-device copy");
  if (st) {
    free(r);
    return st;
  }
  pj_metric_add(PJ_METRIC_H2D_TRANSFERS, 1);
  pj_metric_add(PJ_METRIC_H2D_BYTES, (int64_t)nbytes);
  bool aliased = true; /* unless the plugin says otherwise */
  *zero_copy = false;  /* confirmed aliases only */
  if (PJ_API_HAS(api, PJRT_Buffer_UnsafePointer)) {
    PJRT_Buffer_UnsafePointer_Args u = {.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE,
                                        .buffer = a.buffer};
    pj_status_t *e = pj_runtime_take_error(rt, api->PJRT_Buffer_UnsafePointer(&u),
                                           "unsafe pointer");
    if (e) {
      pj_status_free(e);
    } else {
      aliased = u.buffer_pointer == (uintptr_t)block;
      *zero_copy = aliased;
    }
  }
  *out = a.buffer;
  if (!a.done_with_host_buffer) {
    /* No event to say when the block is free: a copy is done with it now; an aliased block is
     * never reused (leaked) rather than risk writing into a live buffer. */
    if (!aliased) pj_host_pool_give(block, cap);
    free(r);
    return NULL;
  }
  *r = (release_t){.block = block, .cap = cap, .ev = a.done_with_host_buffer};
  PJRT_Event_OnReady_Args o = {.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE,
                               .event = r->ev,
                               .callback = on_block_released,
                               .user_arg = r};
  pj_status_t *e = pj_runtime_take_error(rt, api->PJRT_Event_OnReady(&o), "host buffer event");
  if (e) {
    /* No callback will come: wait here instead (the block is in use until the event fires). */
    pj_status_free(e);
    pj_status_free(pj_event_await(r->ev, "host-to-device copy"));
    pj_host_pool_give(block, cap);
    free(r);
  }
  return NULL;
}

pj_status_t *pj_staged_download_start_locked(pj_storage_t *s, pj_dtype_t dt, void *dst,
                                             size_t nbytes, PJRT_Event **ev) {
  if (s->nbytes != nbytes)
    return pj_status_new(PJ_ERR_RUNTIME, "tpu_dist: storage of %zu bytes, expected %zu",
                         s->nbytes, nbytes);
  PJ_TRY(pj_storage_readable(s)); /* undefined contents (a failed recorded op) raise */
  if (!s->buf) PJ_TRY(pj_storage_materialize(s, dt));
  PJ_TRY(pj_bucket_trim_locked(s)); /* a padded buffer is read exactly */
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  PJ_API_SLOT(to_host, pj_runtime_api(rt), PJRT_Buffer_ToHostBuffer);
  PJRT_Buffer_ToHostBuffer_Args a = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE,
                                     .src = s->buf,
                                     .dst = dst,
                                     .dst_size = nbytes};
  PJ_TRY(pj_runtime_take_error(rt, to_host(&a), "tpu_dist device-to-host copy"));
  pj_metric_add(PJ_METRIC_D2H_TRANSFERS, 1);
  pj_metric_add(PJ_METRIC_D2H_BYTES, (int64_t)nbytes);
  *ev = a.event;
  return NULL;
}

bool pj_staged_copy_ready_locked(pj_storage_t *s, void *dst, size_t nbytes) {
  pj_runtime_t *rt;
  pj_status_t *st = pj_runtime_get(&rt);
  if (st) {
    pj_status_free(st);
    return false;
  }
  const PJRT_Api *api = pj_runtime_api(rt);
  if (!s->buf || s->failed || s->nbytes != nbytes ||
      strcmp(pj_runtime_platform_name(rt), "cpu") != 0 ||
      !PJ_API_HAS(api, PJRT_Buffer_UnsafePointer) || !pj_buffer_is_ready(s->buf))
    return false;
  PJRT_Buffer_UnsafePointer_Args u = {.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE,
                                      .buffer = s->buf};
  st = pj_runtime_take_error(rt, api->PJRT_Buffer_UnsafePointer(&u), "unsafe pointer");
  if (st) {
    pj_status_free(st);
    return false;
  }
  memcpy(dst, (const void *)u.buffer_pointer, nbytes);
  pj_metric_add(PJ_METRIC_D2H_TRANSFERS, 1);
  pj_metric_add(PJ_METRIC_D2H_BYTES, (int64_t)nbytes);
  return true;
}
