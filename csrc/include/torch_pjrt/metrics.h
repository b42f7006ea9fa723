/* Process-wide counters (atomics), and a few of them per device. Names are stable: they are
 * shown by torch.tpu.metrics() and torch.tpu.metrics(device). */
#ifndef TORCH_PJRT_METRICS_H
#define TORCH_PJRT_METRICS_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  PJ_METRIC_COMPILES = 0,
  PJ_METRIC_CACHE_HITS,
  PJ_METRIC_CACHE_MISSES,
  PJ_METRIC_EXECUTIONS,
  PJ_METRIC_H2D_TRANSFERS,
  PJ_METRIC_D2H_TRANSFERS,
  PJ_METRIC_H2D_BYTES,
  PJ_METRIC_D2H_BYTES,
  PJ_METRIC_FALLBACKS,
  PJ_METRIC_COMPILE_NS,
  PJ_METRIC_DISK_HITS,
  PJ_METRIC_DISK_MISSES,
  PJ_METRIC_DISK_STORES,
  PJ_METRIC_DISK_BYTES_READ,
  PJ_METRIC_DISK_BYTES_WRITTEN,
  PJ_METRIC_DISK_CORRUPT,
  PJ_METRIC_DISK_EVICTIONS,
  PJ_METRIC_DISK_REFUSED,    /* persistent cache entries not trusted (disk_cache.h): not loaded */
  PJ_METRIC_DEFER_OPS,       /* ops recorded by the defer_and_fuse mode */
  PJ_METRIC_DEFER_FLUSHES,   /* fused programs executed */
  PJ_METRIC_DEFER_CUTS,      /* flushes at a detected loop-iteration boundary */
  PJ_METRIC_DEFER_ELIDED,    /* written storages never materialized (no live tensor left) */
  PJ_METRIC_PLAN_CAPTURES,   /* graphs captured into plans (capture.h) */
  PJ_METRIC_PLAN_BROKEN,     /* captures that something forced to run early: no plan */
  PJ_METRIC_PLAN_RUNS,       /* plan executions (one program execution each) */
  PJ_METRIC_D2D_TRANSFERS,   /* copies from one device's buffer to another device */
  PJ_METRIC_D2D_BYTES,
  PJ_METRIC_MEMO_HITS,       /* eager calls run from the bridge's call memo (call_memo.h) */
  PJ_METRIC_BUCKET_CALLS,    /* eager calls run by their size bucket's program (bucket.h) */
  PJ_METRIC_BUCKET_TRIMS,    /* padded storages trimmed exact (one program execution each) */
  PJ_METRIC_CACHE_MAP_EVICTIONS, /* in-memory program evictions for the memory-map budget */
  PJ_NUM_METRICS
} pj_metric_t;

/* Per-device counters: which device did the work. Devices beyond PJ_METRIC_MAX_DEVICES are
 * not counted (the runtime holds at most that many). */
#define PJ_METRIC_MAX_DEVICES 64
typedef enum {
  PJ_DEVICE_METRIC_EXECUTIONS = 0,   /* programs executed on the device */
  PJ_DEVICE_METRIC_H2D_TRANSFERS,    /* host-to-device copies into the device */
  PJ_DEVICE_METRIC_D2H_TRANSFERS,    /* device-to-host copies out of the device */
  PJ_DEVICE_METRIC_D2D_IN,           /* device-to-device copies into the device */
  PJ_DEVICE_METRIC_D2D_OUT,          /* device-to-device copies out of the device */
  PJ_NUM_DEVICE_METRICS
} pj_device_metric_t;

void pj_metric_add(pj_metric_t m, int64_t delta);
int64_t pj_metric_get(pj_metric_t m);
const char *pj_metric_name(pj_metric_t m);
/* Resets the process-wide and the per-device counters. */
void pj_metrics_reset(void);

void pj_device_metric_add(int device, pj_device_metric_t m, int64_t delta);
/* 0 for a device index out of range. */
int64_t pj_device_metric_get(int device, pj_device_metric_t m);
const char *pj_device_metric_name(pj_device_metric_t m);

#ifdef __cplusplus
}
#endif
#endif
