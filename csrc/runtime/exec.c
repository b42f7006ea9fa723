#define _POSIX_C_SOURCE 200809L
/* Programs: compilation for a placement (portable or bound to devices), serialization, and
 * execution of portable programs on one device (multi_exec.c runs bound ones). */
#include "torch_pjrt/exec.h"
#include "torch_pjrt/exec_profile.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_check.h"
#include "program.h"
#include "torch_pjrt/compile_options.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/stream.h"

struct pj_program {
  PJRT_LoadedExecutable *exe;
  size_t num_outputs;
  int64_t num_params;   /* per device; -1 when the plugin does not report it */
  int64_t num_replicas; /* as the executable reports it; 1 when it does not */
  /* The placement (exec.h): ndev == 0 portable; else replica r runs on runtime device
   * devices[r] and its lists take position slot[r] of an execute call. Both arrays hold ndev
   * entries (NULL when portable) and are owned. */
  int ndev;
  int *devices;
  int *slot;
};

/* Compile options (compile_options.c). Portable single-device programs: one replica, one
 * partition, compile_portable_executable. Portable: a program compiled once runs on any of the
 * client's devices (execute_device picks it); without it the executable is bound to device 0
 * and executing it on tpu:1 fails ("not addressable"). One compile and one cache entry serve
 * every device, so program keys need not name the device. A bound program's options carry its
 * replica count and device assignment instead, which is why every cache key includes the
 * placement.
 *
 * The options round to the dtype at each op boundary (xla_allow_excess_precision off): XLA
 * would otherwise keep half-precision intermediates unrounded between the ops it fuses and
 * could even give the next op a different value from the one an in-place op stored; PyTorch
 * rounds every op's result to its dtype. A user who names the flag in XLA_FLAGS keeps their own
 * choice. */
static pj_status_t *options(const pj_runtime_t *rt, const pj_placement_t *pl, void **bytes,
                            size_t *size) {
  int64_t ids[PJ_PROGRAM_MAX_DEVICES];
  for (int r = 0; r < pl->ndev; r++) ids[r] = pj_runtime_device_id(rt, pl->devices[r]);
  return pj_compile_options_build(pl->ndev, ids, pj_compile_options_round_each_op(), bytes,
                                  size);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static pj_status_t *wrap_loaded(pj_runtime_t *rt, PJRT_LoadedExecutable *exe,
                                const pj_placement_t *want, pj_program_t **out);
static const pj_placement_t kPortable = {0, NULL};

/* TORCH_PJRT_DUMP_PROGRAMS=DIR writes every compiled program's StableHLO to
 * DIR/<sequence>-<compile microseconds>.mlir, for finding which programs are slow to compile.
 * Best effort: a file that cannot be written is skipped (a debugging aid must not fail a
 * compile). */
static void dump_program(const char *text, size_t len, int64_t took_ns) {
  static _Atomic long seq;
  const char *dir = getenv("TORCH_PJRT_DUMP_PROGRAMS");
  if (!dir || !*dir) return;
  char path[4096];
  long n = ++seq;
  if (snprintf(path, sizeof path, "%s/%06ld-%lldus.mlir", dir, n, (long long)(took_ns / 1000)) >=
      (int)sizeof path)
    return;
  FILE *f = fopen(path, "w");
  if (!f) return;
  fwrite(text, 1, len, f);
  fclose(f);
}

pj_status_t *pj_program_compile(const char *text, size_t len, pj_program_t **out) {
  return pj_program_compile_placed(text, len, &kPortable, out);
}

pj_status_t *pj_program_compile_placed(const char *text, size_t len, const pj_placement_t *pl,
                                       pj_program_t **out) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(compile, api, PJRT_Client_Compile);
  if (pl->ndev < 0 || pl->ndev > PJ_PROGRAM_MAX_DEVICES)
    return pj_status_new(PJ_ERR_VALUE, "compile: %d devices (at most %d)", pl->ndev,
                         PJ_PROGRAM_MAX_DEVICES);
  void *opts = NULL;
  size_t optlen = 0;
  PJ_TRY(options(rt, pl, &opts, &optlen));
  PJRT_Program prog = {.struct_size = PJRT_Program_STRUCT_SIZE,
                       .code = (char *)text,
                       .code_size = len,
                       .format = "mlir",
                       .format_size = 4};
  PJRT_Client_Compile_Args a = {.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE,
                                .client = pj_runtime_client(rt),
                                .program = &prog,
                                .compile_options = opts,
                                .compile_options_size = optlen};
  int64_t t0 = now_ns();
  pj_status_t *st = pj_runtime_take_error(rt, compile(&a), "compile");
  int64_t took = now_ns() - t0;
  free(opts);
  if (st) return st;
  pj_metric_add(PJ_METRIC_COMPILE_NS, took);
  pj_metric_add(PJ_METRIC_COMPILES, 1);
  dump_program(text, len, took);

  return wrap_loaded(rt, a.executable, pl, out);
}

/* What the executable reports of itself: outputs, parameters and replicas per device. The
 * latter two are optional slots (older plugins): unknown parameters leave the count check to
 * the plugin, unknown replicas mean one. */
static pj_status_t *describe(pj_runtime_t *rt, pj_program_t *p) {
  const PJRT_Api *api = pj_runtime_api(rt);
  PJRT_LoadedExecutable_GetExecutable_Args ga = {
      .struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE,
      .loaded_executable = p->exe};
  PJ_TRY(pj_runtime_take_error(rt, api->PJRT_LoadedExecutable_GetExecutable(&ga),
                               "get executable"));
  PJRT_Executable_NumOutputs_Args na = {
      .struct_size = PJRT_Executable_NumOutputs_Args_STRUCT_SIZE, .executable = ga.executable};
  pj_status_t *st = pj_runtime_take_error(rt, api->PJRT_Executable_NumOutputs(&na), "num outputs");
  p->num_outputs = na.num_outputs;
  p->num_params = -1;
  p->num_replicas = 1;
  if (!st && PJ_API_HAS(api, PJRT_Executable_NumReplicas)) {
    PJRT_Executable_NumReplicas_Args ra = {
        .struct_size = PJRT_Executable_NumReplicas_Args_STRUCT_SIZE, .executable = ga.executable};
    st = pj_runtime_take_error(rt, api->PJRT_Executable_NumReplicas(&ra), "num replicas");
    if (!st && ra.num_replicas > 0) p->num_replicas = (int64_t)ra.num_replicas;
  }
  if (!st && PJ_API_HAS(api, PJRT_Executable_ParameterMemoryKinds)) {
    PJRT_Executable_ParameterMemoryKinds_Args ka = {
        .struct_size = PJRT_Executable_ParameterMemoryKinds_Args_STRUCT_SIZE,
        .executable = ga.executable};
    pj_status_t *unknown = pj_runtime_take_error(
        rt, api->PJRT_Executable_ParameterMemoryKinds(&ka), "parameter memory kinds");
    if (unknown)
      pj_status_free(unknown); /* not every plugin implements it: the count stays unknown */
    else
      p->num_params = (int64_t)ka.num_parameters;
  }
  PJRT_Executable_Destroy_Args d = {.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE,
                                    .executable = ga.executable};
  api->PJRT_Executable_Destroy(&d);
  return st;
}

/* Records where a bound executable runs, from the executable itself: its addressable devices
 * and, per device, the replica it runs (PJRT_LoadedExecutable_AddressableDeviceLogicalIds; where
 * the plugin lacks it, the i-th device runs replica i). `want` NULL: take whatever the
 * executable says (a deserialized program); else it must match want exactly. */
static pj_status_t *bind(pj_runtime_t *rt, pj_program_t *p, const pj_placement_t *want) {
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(addressable, api, PJRT_LoadedExecutable_AddressableDevices);
  PJRT_LoadedExecutable_AddressableDevices_Args da = {
      .struct_size = PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE,
      .executable = p->exe};
  PJ_TRY(pj_runtime_take_error(rt, addressable(&da), "executable devices"));
  const size_t n = da.num_addressable_devices;
  if (n == 0 || n > PJ_PROGRAM_MAX_DEVICES || (int64_t)n != p->num_replicas ||
      (want && n != (size_t)want->ndev))
    return pj_status_new(PJ_ERR_RUNTIME,
                         "the compiled program runs on %zu devices for %lld replicas (wanted %d)",
                         n, (long long)p->num_replicas, want ? want->ndev : -1);
  const PJRT_LogicalDeviceIds *logical = NULL;
  if (PJ_API_HAS(api, PJRT_LoadedExecutable_AddressableDeviceLogicalIds)) {
    PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args la = {
        .struct_size = PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args_STRUCT_SIZE,
        .executable = p->exe};
    PJ_TRY(pj_runtime_take_error(
        rt, api->PJRT_LoadedExecutable_AddressableDeviceLogicalIds(&la), "executable replicas"));
    if (la.num_addressable_device_logical_ids == n) logical = la.addressable_device_logical_ids;
  }
  p->devices = malloc(n * sizeof *p->devices);
  p->slot = malloc(n * sizeof *p->slot);
  if (!p->devices || !p->slot) return pj_status_new(PJ_ERR_OOM, "out of host memory");
  for (size_t r = 0; r < n; r++) p->slot[r] = -1;
  for (size_t s = 0; s < n; s++) {
    const int r = logical ? logical[s].replica : (int)s;
    const int dev = pj_runtime_device_index(rt, da.addressable_devices[s]);
    if (r < 0 || (size_t)r >= n || p->slot[r] >= 0 || dev < 0)
      return pj_status_new(PJ_ERR_RUNTIME,
                           "the compiled program's device %zu (replica %d) is not one replica "
                           "on one of this client's devices",
                           s, r);
    p->slot[r] = (int)s;
    p->devices[r] = dev;
  }
  p->ndev = (int)n;
  for (int r = 0; want && r < want->ndev; r++)
    if (p->devices[r] != want->devices[r])
      return pj_status_new(PJ_ERR_RUNTIME,
                           "the compiled program runs replica %d on device %d, not on device %d",
                           r, p->devices[r], want->devices[r]);
  return NULL;
}

/* Takes ownership of a loaded executable (freed on failure too) and records its outputs,
 * parameters and placement. want: the placement it was compiled for, or NULL when unknown (a
 * deserialized program: portable unless the executable has several replicas). */
static pj_status_t *wrap_loaded(pj_runtime_t *rt, PJRT_LoadedExecutable *exe,
                                const pj_placement_t *want, pj_program_t **out) {
  pj_program_t *p = calloc(1, sizeof *p);
  if (!p) {
    PJRT_LoadedExecutable_Destroy_Args d = {
        .struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE, .executable = exe};
    pj_status_free(pj_runtime_take_error(
        rt, pj_runtime_api(rt)->PJRT_LoadedExecutable_Destroy(&d), "destroy executable"));
    return pj_status_new(PJ_ERR_OOM, "out of host memory");
  }
  p->exe = exe;
  pj_status_t *st = describe(rt, p);
  if (!st && want && want->ndev > 0)
    st = bind(rt, p, want);
  else if (!st && !want && p->num_replicas > 1)
    st = bind(rt, p, NULL);
  if (st) {
    pj_program_free(p);
    return st;
  }
  *out = p;
  return NULL;
}

void pj_program_free(pj_program_t *p) {
  if (!p) return;
  pj_runtime_t *rt;
  pj_status_t *st = pj_runtime_get(&rt);
  if (!st && p->exe) {
    PJRT_LoadedExecutable_Destroy_Args d = {
        .struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE, .executable = p->exe};
    st = pj_runtime_take_error(rt, pj_runtime_api(rt)->PJRT_LoadedExecutable_Destroy(&d),
                               "destroy executable");
  }
  pj_status_free(st);
  free(p->devices);
  free(p->slot);
  free(p);
}

size_t pj_program_num_outputs(const pj_program_t *p) { return p->num_outputs; }

pj_placement_t pj_program_placement(const pj_program_t *p) {
  return (pj_placement_t){p->ndev, p->devices};
}

int pj_program_slot(const pj_program_t *p, int replica) {
  return replica >= 0 && replica < p->ndev ? p->slot[replica] : -1;
}

int64_t pj_program_num_params(const pj_program_t *p) { return p->num_params; }

PJRT_LoadedExecutable *pj_program_loaded(const pj_program_t *p) { return p->exe; }

pj_status_t *pj_program_serialize(const pj_program_t *p, void **bytes, size_t *len) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(serialize, api, PJRT_Executable_Serialize);
  PJRT_LoadedExecutable_GetExecutable_Args ga = {
      .struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE,
      .loaded_executable = p->exe};
  PJ_TRY(pj_runtime_take_error(rt, api->PJRT_LoadedExecutable_GetExecutable(&ga), "get executable"));
  PJRT_Executable_Serialize_Args sa = {.struct_size = PJRT_Executable_Serialize_Args_STRUCT_SIZE,
                                       .executable = ga.executable};
  pj_status_t *st = pj_runtime_take_error(rt, serialize(&sa), "serialize executable");
  if (!st) {
    *bytes = malloc(sa.serialized_bytes_size ? sa.serialized_bytes_size : 1);
    if (!*bytes) {
      st = pj_status_new(PJ_ERR_OOM, "out of host memory");
    } else {
      memcpy(*bytes, sa.serialized_bytes, sa.serialized_bytes_size);
      *len = sa.serialized_bytes_size;
    }
    if (sa.serialized_executable_deleter) sa.serialized_executable_deleter(sa.serialized_executable);
  }
  PJRT_Executable_Destroy_Args d = {.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE,
                                    .executable = ga.executable};
  api->PJRT_Executable_Destroy(&d);
  return st;
}

/* want: as for wrap_loaded. */
static pj_status_t *deserialize(const void *bytes, size_t len, const pj_placement_t *want,
                                pj_program_t **out) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(load, api, PJRT_Executable_DeserializeAndLoad);
  PJRT_Executable_DeserializeAndLoad_Args a = {
      .struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE,
      .client = pj_runtime_client(rt),
      .serialized_executable = bytes,
      .serialized_executable_size = len};
  PJ_TRY(pj_runtime_take_error(rt, load(&a), "load serialized executable"));
  return wrap_loaded(rt, a.loaded_executable, want, out);
}

pj_status_t *pj_program_deserialize(const void *bytes, size_t len, pj_program_t **out) {
  return deserialize(bytes, len, NULL, out);
}

pj_status_t *pj_program_deserialize_placed(const void *bytes, size_t len,
                                           const pj_placement_t *pl, pj_program_t **out) {
  pj_program_t *p;
  PJ_TRY(deserialize(bytes, len, pl->ndev > 0 ? pl : NULL, &p));
  if (pl->ndev == 0 && p->ndev > 0) {
    pj_program_free(p);
    return pj_status_new(PJ_ERR_RUNTIME,
                         "the serialized program is bound to %d devices, not portable", p->ndev);
  }
  *out = p;
  return NULL;
}

int64_t *pj_program_keep_list(const bool *donate, size_t nargs, int64_t *small, size_t nsmall,
                              size_t *nkeep) {
  int64_t *keep = nargs <= nsmall ? small : malloc(nargs * sizeof *keep);
  *nkeep = 0;
  if (!keep) return NULL;
  for (size_t i = 0; i < nargs; i++)
    if (!donate || !donate[i]) keep[(*nkeep)++] = (int64_t)i;
  return keep;
}

pj_status_t *pj_program_execute(pj_program_t *p, int device, PJRT_Buffer *const *args,
                                size_t nargs, const bool *donate, PJRT_Buffer **outs) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(execute, api, PJRT_LoadedExecutable_Execute);
  if (p->ndev > 0)
    return pj_status_new(PJ_ERR_VALUE,
                         "execute: the program is bound to %d device(s); run it with "
                         "pj_program_execute_multi",
                         p->ndev);
  /* A portable program has no device of its own: a NULL execute_device would not mean "the
   * default device", so an index the client does not have is refused here. */
  PJRT_Device *dev = pj_runtime_device(rt, device);
  if (!dev)
    return pj_status_new(PJ_ERR_INDEX, "execute: no device %d (the client has %d)", device,
                         pj_runtime_device_count(rt));
  /* Donation is opt-in per argument: everything not marked is listed as non-donatable, so a
   * program compiled with aliasing can still be run without consuming an input. */
  int64_t keep_small[64];
  size_t nkeep = 0;
  int64_t *keep = pj_program_keep_list(donate, nargs, keep_small, 64, &nkeep);
  if (!keep) return pj_status_new(PJ_ERR_OOM, "out of host memory");
  PJRT_ExecuteOptions opts = {.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE,
                              .non_donatable_input_indices = keep,
                              .num_non_donatable_input_indices = nkeep};
  PJRT_Buffer *const *arg_lists[1] = {args};
  PJRT_Buffer **out_lists[1] = {outs};
  /* The device-complete event goes to stream.c, which owns it from here on: it is what
   * synchronize(), Stream and Event wait on and time. */
  PJRT_Event *done[1] = {NULL};
  const bool profiled = pj_exec_profile_enabled();
  const int64_t issued_ns = profiled ? now_ns() : 0;
  PJRT_LoadedExecutable_Execute_Args a = {
      .struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE,
      .executable = p->exe,
      .options = &opts,
      .argument_lists = arg_lists,
      .num_devices = 1,
      .num_args = nargs,
      .output_lists = out_lists,
      .device_complete_events = done,
      .execute_device = dev};
  pj_status_t *st = pj_runtime_take_error(rt, execute(&a), "execute");
  if (keep != keep_small) free(keep);
  if (!st) {
    pj_metric_add(PJ_METRIC_EXECUTIONS, 1);
    pj_device_metric_add(device, PJ_DEVICE_METRIC_EXECUTIONS, 1);
    pj_stream_track_timed(device, done[0], issued_ns,
                          profiled ? pj_exec_profile_current_label() : NULL);
  }
  return st;
}
