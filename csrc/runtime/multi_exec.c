#define _POSIX_C_SOURCE 200809L
/* Multi-device programs (multi_exec.h): checked compile for a placement, the cached form, and
 * the one-call launch on every device of a bound program.
 *
 * StableHLO collectives the CPU plugin compiles in such programs (checked by
 * tests/c/test_multi_device_program.c; learned from the StableHLO specification's syntax):
 *  - replica_groups is a 2-D i64 dense attribute, one row per group, rows of equal length:
 *    `replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>`; ids are replica numbers
 *    (0..N-1 of the compile), not device numbers.
 *  - all_reduce / reduce_scatter carry their reduction as a region of 0-d tensors:
 *    `"stablehlo.all_reduce"(%x) ({ ^bb0(%a: tensor<f32>, %b: tensor<f32>): ...
 *    stablehlo.return %s : tensor<f32> }) {replica_groups = ...} : (T) -> T`.
 *  - all_gather: `all_gather_dim = 0 : i64`; reduce_scatter: `scatter_dimension = 0 : i64`;
 *    all_to_all: `split_dimension`, `concat_dimension`, `split_count` (= the group size).
 *  - collective_permute: `source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>`;
 *    a replica that no pair targets receives zeros.
 *  - channel_handle = #stablehlo.channel_handle<handle = 1, type = 0> is optional; without it
 *    (and without use_global_device_ids) groups hold replica ids, the cross-replica mode that
 *    a program of N replicas and one partition needs. */
#include "torch_pjrt/multi_exec.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_check.h"
#include "program.h"
#include "torch_pjrt/disk_cache.h"
#include "torch_pjrt/exec_profile.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

bool pj_placement_equal(const pj_placement_t *a, const pj_placement_t *b) {
  if (a->ndev != b->ndev) return false;
  for (int r = 0; r < a->ndev; r++)
    if (a->devices[r] != b->devices[r]) return false;
  return true;
}

uint64_t pj_placement_hash(const pj_placement_t *pl, uint64_t key_hash) {
  /* Portable keeps the key's own hash, so callers that hash a key once and look it up as
   * portable (pj_cache_lookup_hashed) need not know placements exist. */
  if (pl->ndev == 0) return key_hash;
  return pj_hash_bytes(pl->devices, (size_t)pl->ndev * sizeof *pl->devices,
                       key_hash ^ (0x9e3779b97f4a7c15ull * (uint64_t)pl->ndev));
}

pj_status_t *pj_placement_key(const pj_placement_t *pl, unsigned char *buf, size_t *len) {
  if (pl->ndev < 0 || pl->ndev > PJ_PROGRAM_MAX_DEVICES)
    return pj_status_new(PJ_ERR_VALUE, "placement of %d devices", pl->ndev);
  pj_runtime_t *rt = NULL;
  if (pl->ndev > 0) PJ_TRY(pj_runtime_get(&rt));
  size_t n = 0;
  buf[n++] = 'P';
  for (int b = 0; b < 4; b++) buf[n++] = (unsigned char)((uint32_t)pl->ndev >> (8 * b));
  for (int r = 0; r < pl->ndev; r++) {
    const uint64_t id = (uint64_t)pj_runtime_device_id(rt, pl->devices[r]);
    for (int b = 0; b < 8; b++) buf[n++] = (unsigned char)(id >> (8 * b));
  }
  *len = n;
  return NULL;
}

/* Checks (ndev, devices) against the client and fills `ids` (devices NULL: 0..ndev-1). */
static pj_status_t *check_devices(int ndev, const int *devices, int *ids) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const int count = pj_runtime_device_count(rt);
  if (ndev < 1 || ndev > count || ndev > PJ_PROGRAM_MAX_DEVICES)
    return pj_status_new(PJ_ERR_VALUE,
                         "a multi-device program needs 1 to %d devices (the client has %d); "
                         "%d were asked for",
                         count < PJ_PROGRAM_MAX_DEVICES ? count : PJ_PROGRAM_MAX_DEVICES, count,
                         ndev);
  for (int r = 0; r < ndev; r++) {
    ids[r] = devices ? devices[r] : r;
    if (ids[r] < 0 || ids[r] >= count)
      return pj_status_new(PJ_ERR_INDEX, "replica %d: no device %d (the client has %d)", r,
                           ids[r], count);
    for (int q = 0; q < r; q++)
      if (ids[q] == ids[r])
        return pj_status_new(PJ_ERR_VALUE, "device %d is named for replicas %d and %d", ids[r],
                             q, r);
  }
  return NULL;
}

pj_status_t *pj_program_compile_multi(const char *text, size_t len, int ndev, const int *devices,
                                      pj_program_t **out) {
  int ids[PJ_PROGRAM_MAX_DEVICES];
  PJ_TRY(check_devices(ndev, devices, ids));
  const pj_placement_t pl = {ndev, ids};
  return pj_program_compile_placed(text, len, &pl, out);
}

pj_status_t *pj_program_for_placement(const void *key, size_t keylen, const char *text,
                                      size_t len, int ndev, const int *devices,
                                      pj_program_t **out) {
  int ids[PJ_PROGRAM_MAX_DEVICES];
  PJ_TRY(check_devices(ndev, devices, ids));
  const pj_placement_t pl = {ndev, ids};
  pj_program_t *p = pj_cache_lookup_placed(&pl, key, keylen);
  if (p) {
    *out = p;
    return NULL;
  }
  pj_disk_cache_lookup_placed(&pl, key, keylen, &p);
  if (!p) {
    PJ_TRY(pj_program_compile_placed(text, len, &pl, &p));
    pj_disk_cache_store(key, keylen, p);
  }
  *out = pj_cache_insert(key, keylen, p);
  return NULL;
}

/* Which device holds `buf` (a runtime index, or -1). */
static pj_status_t *buffer_device(pj_runtime_t *rt, PJRT_Buffer *buf, int *device) {
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(bdev, api, PJRT_Buffer_Device);
  PJRT_Buffer_Device_Args a = {.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE, .buffer = buf};
  PJ_TRY(pj_runtime_take_error(rt, bdev(&a), "buffer device"));
  *device = pj_runtime_device_index(rt, a.device);
  return NULL;
}

static void destroy_buffer(const PJRT_Api *api, PJRT_Buffer *b) {
  PJRT_Buffer_Destroy_Args d = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE, .buffer = b};
  PJRT_Error *err = api->PJRT_Buffer_Destroy(&d);
  if (err) {
    PJRT_Error_Destroy_Args e = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE, .error = err};
    api->PJRT_Error_Destroy(&e);
  }
}

/* Every argument list is complete and each buffer lives on its replica's device: the plugin
 * would otherwise copy it over, or fail with a message that names no replica. */
static pj_status_t *check_args(pj_runtime_t *rt, const pj_program_t *p,
                               PJRT_Buffer *const *const *args, size_t nargs,
                               PJRT_Buffer **const *outs) {
  const pj_placement_t pl = pj_program_placement(p);
  if (pl.ndev == 0)
    return pj_status_new(PJ_ERR_VALUE,
                         "execute_multi: the program is portable (compiled for one device); "
                         "run it with pj_program_execute or compile it with "
                         "pj_program_compile_multi");
  const int64_t want = pj_program_num_params(p);
  if (want >= 0 && (int64_t)nargs != want)
    return pj_status_new(PJ_ERR_VALUE, "execute_multi: the program takes %lld argument(s) per "
                         "device, %zu were given", (long long)want, nargs);
  if (!outs || (nargs > 0 && !args))
    return pj_status_new(PJ_ERR_VALUE, "execute_multi: no argument or output lists");
  for (int r = 0; r < pl.ndev; r++) {
    if ((nargs > 0 && !args[r]) || (pj_program_num_outputs(p) > 0 && !outs[r]))
      return pj_status_new(PJ_ERR_VALUE, "execute_multi: replica %d has no %s list", r,
                           !outs[r] ? "output" : "argument");
    for (size_t i = 0; i < nargs; i++) {
      if (!args[r][i])
        return pj_status_new(PJ_ERR_VALUE, "execute_multi: replica %d, argument %zu is NULL", r,
                             i);
      int dev = -1;
      PJ_TRY(buffer_device(rt, args[r][i], &dev));
      if (dev != pl.devices[r])
        return pj_status_new(PJ_ERR_VALUE,
                             "execute_multi: argument %zu of replica %d is on device %d; the "
                             "replica runs on device %d",
                             i, r, dev, pl.devices[r]);
    }
  }
  return NULL;
}

pj_status_t *pj_program_execute_multi(pj_program_t *p, PJRT_Buffer *const *const *args,
                                      size_t nargs, const bool *donate, PJRT_Buffer **const *outs,
                                      pj_marker_t **done) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(execute, api, PJRT_LoadedExecutable_Execute);
  PJ_TRY(check_args(rt, p, args, nargs, outs));
  const pj_placement_t pl = pj_program_placement(p);
  const int n = pl.ndev;
  const size_t nout = pj_program_num_outputs(p);
  for (int r = 0; r < n; r++) {
    for (size_t o = 0; o < nout; o++) outs[r][o] = NULL;
    if (done) done[r] = NULL;
  }
  /* PJRT wants the lists in the executable's device order (slot), callers give replica order. */
  PJRT_Buffer *const *arg_lists[PJ_PROGRAM_MAX_DEVICES];
  PJRT_Buffer **out_lists[PJ_PROGRAM_MAX_DEVICES];
  PJRT_Event *events[PJ_PROGRAM_MAX_DEVICES] = {0};
  for (int r = 0; r < n; r++) {
    const int s = pj_program_slot(p, r);
    arg_lists[s] = nargs > 0 ? args[r] : NULL;
    out_lists[s] = outs[r];
  }
  int64_t keep_small[64];
  size_t nkeep = 0;
  int64_t *keep = pj_program_keep_list(donate, nargs, keep_small, 64, &nkeep);
  if (!keep) return pj_status_new(PJ_ERR_OOM, "out of host memory");
  PJRT_ExecuteOptions opts = {.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE,
                              .non_donatable_input_indices = keep,
                              .num_non_donatable_input_indices = nkeep};
  const bool profiled = pj_exec_profile_enabled();
  const int64_t issued_ns = profiled ? now_ns() : 0;
  /* execute_device NULL: run on the devices the compile assigned, all N in this one call (the
   * collectives inside need every replica launched). */
  PJRT_LoadedExecutable_Execute_Args a = {
      .struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE,
      .executable = pj_program_loaded(p),
      .options = &opts,
      .argument_lists = arg_lists,
      .num_devices = (size_t)n,
      .num_args = nargs,
      .output_lists = out_lists,
      .device_complete_events = events,
      .execute_device = NULL};
  pj_status_t *st = pj_runtime_take_error(rt, execute(&a), "execute_multi");
  if (keep != keep_small) free(keep);
  if (st) {
    /* The C API promises no outputs or events on failure; whatever a plugin left anyway is
     * released here, so the caller never owns a partial result. */
    for (int r = 0; r < n; r++) {
      for (size_t o = 0; o < nout; o++)
        if (outs[r][o]) {
          destroy_buffer(api, outs[r][o]);
          outs[r][o] = NULL;
        }
      const int s = pj_program_slot(p, r);
      if (events[s]) pj_stream_track(pl.devices[r], events[s]);
    }
    return st;
  }
  pj_metric_add(PJ_METRIC_EXECUTIONS, 1);
  const char *label = profiled ? pj_exec_profile_current_label() : NULL;
  for (int r = 0; r < n; r++) {
    const int dev = pl.devices[r];
    pj_device_metric_add(dev, PJ_DEVICE_METRIC_EXECUTIONS, 1);
    /* stream.c owns each device's event from here: synchronize, Stream and Event wait on it. */
    pj_stream_track_timed(dev, events[pj_program_slot(p, r)], issued_ns, label);
  }
  for (int r = 0; done && r < n && !st; r++) st = pj_marker_record(pl.devices[r], &done[r]);
  if (st) {
    /* Launched, but the completion handles could not be made: hand nothing out (buffers still
     * in use by the execution are released by PJRT once it completes). */
    for (int r = 0; r < n; r++) {
      pj_marker_free(done[r]);
      done[r] = NULL;
      for (size_t o = 0; o < nout; o++) {
        destroy_buffer(api, outs[r][o]);
        outs[r][o] = NULL;
      }
    }
  }
  return st;
}
