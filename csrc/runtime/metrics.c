#include "torch_pjrt/metrics.h"
#include <stdatomic.h>

static _Atomic int64_t counters[PJ_NUM_METRICS];
static const char *const kNames[PJ_NUM_METRICS] = {
    [PJ_METRIC_COMPILES] = "compiles",
    [PJ_METRIC_CACHE_HITS] = "cache_hits",
    [PJ_METRIC_CACHE_MISSES] = "cache_misses",
    [PJ_METRIC_EXECUTIONS] = "executions",
    [PJ_METRIC_H2D_TRANSFERS] = "transfers_to_device",
    [PJ_METRIC_D2H_TRANSFERS] = "transfers_to_host",
    [PJ_METRIC_H2D_BYTES] = "bytes_to_device",
    [PJ_METRIC_D2H_BYTES] = "bytes_to_host",
    [PJ_METRIC_FALLBACKS] = "cpu_fallbacks",
    [PJ_METRIC_COMPILE_NS] = "compile_ns",
    [PJ_METRIC_DISK_HITS] = "disk_cache_hits",
    [PJ_METRIC_DISK_MISSES] = "disk_cache_misses",
    [PJ_METRIC_DISK_STORES] = "disk_cache_stores",
    [PJ_METRIC_DISK_BYTES_READ] = "disk_cache_bytes_read",
    [PJ_METRIC_DISK_BYTES_WRITTEN] = "disk_cache_bytes_written",
    [PJ_METRIC_DISK_CORRUPT] = "disk_cache_corrupt_entries",
    [PJ_METRIC_DISK_EVICTIONS] = "disk_cache_evictions",
    [PJ_METRIC_DISK_REFUSED] = "disk_cache_refused_entries",
    [PJ_METRIC_DEFER_OPS] = "defer_ops",
    [PJ_METRIC_MEMO_HITS] = "memo_hits",
    [PJ_METRIC_BUCKET_CALLS] = "bucket_calls",
    [PJ_METRIC_BUCKET_TRIMS] = "bucket_trims",
    [PJ_METRIC_CACHE_MAP_EVICTIONS] = "cache_map_evictions",
    [PJ_METRIC_DEFER_FLUSHES] = "defer_flushes",
    [PJ_METRIC_DEFER_CUTS] = "defer_loop_cuts",
    [PJ_METRIC_DEFER_ELIDED] = "defer_elided_storages",
    [PJ_METRIC_PLAN_CAPTURES] = "graph_captures",
    [PJ_METRIC_PLAN_BROKEN] = "graph_captures_broken",
    [PJ_METRIC_PLAN_RUNS] = "graph_runs",
    [PJ_METRIC_D2D_TRANSFERS] = "transfers_device_to_device",
    [PJ_METRIC_D2D_BYTES] = "bytes_device_to_device",
};

static _Atomic int64_t device_counters[PJ_METRIC_MAX_DEVICES][PJ_NUM_DEVICE_METRICS];
static const char *const kDeviceNames[PJ_NUM_DEVICE_METRICS] = {
    [PJ_DEVICE_METRIC_EXECUTIONS] = "executions",
    [PJ_DEVICE_METRIC_H2D_TRANSFERS] = "transfers_to_device",
    [PJ_DEVICE_METRIC_D2H_TRANSFERS] = "transfers_to_host",
    [PJ_DEVICE_METRIC_D2D_IN] = "transfers_from_other_devices",
    [PJ_DEVICE_METRIC_D2D_OUT] = "transfers_to_other_devices",
};

static int counted(int device) { return device >= 0 && device < PJ_METRIC_MAX_DEVICES; }

void pj_metric_add(pj_metric_t m, int64_t delta) { atomic_fetch_add(&counters[m], delta); }
int64_t pj_metric_get(pj_metric_t m) { return atomic_load(&counters[m]); }
const char *pj_metric_name(pj_metric_t m) { return kNames[m]; }
void pj_metrics_reset(void) {
  for (int i = 0; i < PJ_NUM_METRICS; i++) atomic_store(&counters[i], 0);
  for (int d = 0; d < PJ_METRIC_MAX_DEVICES; d++)
    for (int i = 0; i < PJ_NUM_DEVICE_METRICS; i++) atomic_store(&device_counters[d][i], 0);
}

void pj_device_metric_add(int device, pj_device_metric_t m, int64_t delta) {
  if (counted(device)) atomic_fetch_add(&device_counters[device][m], delta);
}
int64_t pj_device_metric_get(int device, pj_device_metric_t m) {
  return counted(device) ? atomic_load(&device_counters[device][m]) : 0;
}
const char *pj_device_metric_name(pj_device_metric_t m) { return kDeviceNames[m]; }
