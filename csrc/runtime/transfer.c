/* Host <-> device copies and buffer queries. */
#include "torch_pjrt/transfer.h"

#include "api_check.h"
#include <stdlib.h>
#include <string.h>

#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/stream.h"

/* Awaits and destroys an event; returns the event's error, if any. */
static pj_status_t *await_event(const pj_runtime_t *rt, PJRT_Event *ev, const char *what) {
  if (!ev) return NULL;
  const PJRT_Api *api = pj_runtime_api(rt);
  PJRT_Event_Await_Args aw = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE, .event = ev};
  pj_status_t *st = pj_runtime_take_error(rt, api->PJRT_Event_Await(&aw), what);
  PJRT_Event_Destroy_Args d = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = ev};
  api->PJRT_Event_Destroy(&d);
  return st;
}

pj_status_t *pj_event_await(PJRT_Event *ev, const char *what) {
  if (!ev) return NULL;
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  return await_event(rt, ev, what);
}

/* The index of the device holding `buf`, -1 when it cannot be told. */
static int buffer_device(const pj_runtime_t *rt, PJRT_Buffer *buf) {
  const PJRT_Api *api = pj_runtime_api(rt);
  if (!PJ_API_HAS(api, PJRT_Buffer_Device)) return -1;
  PJRT_Buffer_Device_Args a = {.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE, .buffer = buf};
  pj_status_t *st = pj_runtime_take_error(rt, api->PJRT_Buffer_Device(&a), "buffer device");
  if (st) {
    pj_status_free(st);
    return -1;
  }
  return pj_runtime_device_index(rt, a.device);
}

pj_status_t *pj_transfer_to_device(int device, const void *data, pj_dtype_t dt,
                                   const int64_t *dims, int rank, PJRT_Buffer **out) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJRT_Device *dev = pj_runtime_device(rt, device);
  if (!dev) return pj_status_new(PJ_ERR_RUNTIME, "invalid device index %d", device);
  PJ_API_SLOT(from_host, api, PJRT_Client_BufferFromHostBuffer);
  PJRT_Client_BufferFromHostBuffer_Args a = {
      .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
      .client = pj_runtime_client(rt),
      .data = data,
      .type = (PJRT_Buffer_Type)pj_dtype_info(dt)->pjrt_type,
      .dims = dims,
      .num_dims = (size_t)rank,
      /* The plugin copies (or finishes using) the host data before the event; we wait on
       * done_with_host_buffer below, so the caller's memory is free to reuse on return. */
      .host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes,
      .device = dev};
  PJ_TRY(pj_runtime_take_error(rt, from_host(&a), "host-to-device copy"));
  pj_status_t *st = await_event(rt, a.done_with_host_buffer, "host-to-device copy");
  if (st) {
    pj_buffer_destroy(a.buffer);
    return st;
  }
  size_t n = pj_dtype_info(dt)->itemsize;
  for (int i = 0; i < rank; i++) n *= (size_t)dims[i];
  pj_metric_add(PJ_METRIC_H2D_TRANSFERS, 1);
  pj_metric_add(PJ_METRIC_H2D_BYTES, (int64_t)n);
  pj_device_metric_add(device, PJ_DEVICE_METRIC_H2D_TRANSFERS, 1);
  *out = a.buffer;
  return NULL;
}

pj_status_t *pj_transfer_to_host(PJRT_Buffer *buf, void *dst, size_t nbytes) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(to_host, api, PJRT_Buffer_ToHostBuffer);
  size_t have = pj_buffer_nbytes(buf);
  if (have < nbytes)
    return pj_status_new(PJ_ERR_RUNTIME, "device-to-host copy of %zu bytes into %zu bytes", have,
                         nbytes);
  if (nbytes == 0) return pj_buffer_await(buf);
  if (have > nbytes) { /* a padded buffer (storage.h): the whole of it, then its front */
    void *whole = malloc(have);
    if (!whole) return pj_status_new(PJ_ERR_OOM, "out of host memory reading a padded buffer");
    pj_status_t *st = pj_transfer_to_host(buf, whole, have);
    if (!st) memcpy(dst, whole, nbytes);
    free(whole);
    return st;
  }
  PJRT_Buffer_ToHostBuffer_Args a = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE,
                                     .src = buf,
                                     .dst = dst,
                                     .dst_size = nbytes};
  PJ_TRY(pj_runtime_take_error(rt, to_host(&a), "device-to-host copy"));
  PJ_TRY(await_event(rt, a.event, "device-to-host copy"));
  pj_metric_add(PJ_METRIC_D2H_TRANSFERS, 1);
  pj_metric_add(PJ_METRIC_D2H_BYTES, (int64_t)nbytes);
  pj_device_metric_add(buffer_device(rt, buf), PJ_DEVICE_METRIC_D2H_TRANSFERS, 1);
  return NULL;
}

/* Through host memory, for plugins without PJRT_Buffer_CopyToDevice: blocks until the source
 * is computed and the upload has taken the bytes. */
static pj_status_t *copy_through_host(PJRT_Buffer *src, pj_dtype_t dt, int64_t numel,
                                      int device, PJRT_Buffer **out) {
  size_t nbytes = (size_t)numel * pj_dtype_info(dt)->itemsize;
  void *host = malloc(nbytes ? nbytes : 1);
  if (!host) return pj_status_new(PJ_ERR_OOM, "out of host memory staging a device copy");
  pj_status_t *st = pj_transfer_to_host(src, host, nbytes);
  if (!st) st = pj_transfer_to_device(device, host, dt, &numel, 1, out);
  free(host);
  return st;
}

pj_status_t *pj_transfer_between_devices(PJRT_Buffer *src, pj_dtype_t dt, int64_t numel,
                                         int device, PJRT_Buffer **out) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJRT_Device *dst = pj_runtime_device(rt, device);
  if (!dst) return pj_status_new(PJ_ERR_INDEX, "device copy: no device %d", device);
  const int from = buffer_device(rt, src);
  if (from == device)
    return pj_status_new(PJ_ERR_RUNTIME, "device copy: the buffer is already on device %d",
                         device);
  if (!PJ_API_HAS(api, PJRT_Buffer_CopyToDevice) || !PJ_API_HAS(api, PJRT_Buffer_ReadyEvent))
    return copy_through_host(src, dt, numel, device, out);
  PJRT_Buffer_CopyToDevice_Args a = {.struct_size = PJRT_Buffer_CopyToDevice_Args_STRUCT_SIZE,
                                     .buffer = src,
                                     .dst_device = dst};
  PJ_TRY(pj_runtime_take_error(rt, api->PJRT_Buffer_CopyToDevice(&a), "device-to-device copy"));
  /* The copy's completion is tracked like an execution on the destination device. */
  PJRT_Buffer_ReadyEvent_Args r = {.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE,
                                   .buffer = a.dst_buffer};
  pj_status_t *st = pj_runtime_take_error(rt, api->PJRT_Buffer_ReadyEvent(&r), "ready event");
  if (st) {
    pj_buffer_destroy(a.dst_buffer);
    return st;
  }
  pj_stream_track(device, r.event);
  pj_metric_add(PJ_METRIC_D2D_TRANSFERS, 1);
  pj_metric_add(PJ_METRIC_D2D_BYTES, numel * (int64_t)pj_dtype_info(dt)->itemsize);
  pj_device_metric_add(from, PJ_DEVICE_METRIC_D2D_OUT, 1);
  pj_device_metric_add(device, PJ_DEVICE_METRIC_D2D_IN, 1);
  *out = a.dst_buffer;
  return NULL;
}

pj_status_t *pj_buffer_await(PJRT_Buffer *buf) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(ready, api, PJRT_Buffer_ReadyEvent);
  PJRT_Buffer_ReadyEvent_Args a = {.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE,
                                   .buffer = buf};
  PJ_TRY(pj_runtime_take_error(rt, ready(&a), "buffer ready event"));
  return await_event(rt, a.event, "device computation");
}

int pj_buffer_is_ready(PJRT_Buffer *buf) {
  pj_runtime_t *rt;
  pj_status_t *st = pj_runtime_get(&rt);
  if (st) {
    pj_status_free(st);
    return 1;
  }
  const PJRT_Api *api = pj_runtime_api(rt);
  PJRT_Buffer_ReadyEvent_Args a = {.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE,
                                   .buffer = buf};
  st = pj_runtime_take_error(rt, api->PJRT_Buffer_ReadyEvent(&a), "ready event");
  if (st) {
    pj_status_free(st);
    return 1;
  }
  PJRT_Event_IsReady_Args r = {.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE,
                               .event = a.event};
  int ready = 1;
  st = pj_runtime_take_error(rt, api->PJRT_Event_IsReady(&r), "event is ready");
  if (st)
    pj_status_free(st);
  else
    ready = r.is_ready ? 1 : 0;
  PJRT_Event_Destroy_Args d = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE,
                               .event = a.event};
  api->PJRT_Event_Destroy(&d);
  return ready;
}

void pj_buffer_destroy(PJRT_Buffer *buf) {
  pj_runtime_t *rt;
  if (!buf) return;
  pj_status_t *st = pj_runtime_get(&rt);
  if (st) {
    pj_status_free(st);
    return;
  }
  PJRT_Buffer_Destroy_Args d = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE,
                                .buffer = buf};
  pj_status_free(
      pj_runtime_take_error(rt, pj_runtime_api(rt)->PJRT_Buffer_Destroy(&d), "destroy"));
}

size_t pj_buffer_nbytes(PJRT_Buffer *buf) {
  pj_runtime_t *rt;
  pj_status_t *st = pj_runtime_get(&rt);
  if (st) {
    pj_status_free(st);
    return 0;
  }
  PJRT_Buffer_OnDeviceSizeInBytes_Args a = {
      .struct_size = PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE, .buffer = buf};
  st = pj_runtime_take_error(rt, pj_runtime_api(rt)->PJRT_Buffer_OnDeviceSizeInBytes(&a),
                             "buffer size");
  if (st) {
    pj_status_free(st);
    return 0;
  }
  return a.on_device_size_in_bytes;
}
