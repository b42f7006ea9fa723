#define _POSIX_C_SOURCE 200809L
/* Compilation and execution of single-device programs. */
#include "torch_pjrt/exec.h"
#include "torch_pjrt/exec_profile.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_check.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/stream.h"

struct pj_program {
  PJRT_LoadedExecutable *exe;
  size_t num_outputs;
};

/* xla.CompileOptionsProto with executable_build_options (field 3) { num_replicas (4) = 1,
 * num_partitions (5) = 1 } and compile_portable_executable (field 4) = true. Empty options are
 * unsafe: the default replica count is 0. Portable: a program compiled once runs on any of the
 * client's devices (execute_device picks it); without it the executable is bound to device 0
 * and executing it on tpu:1 fails ("not addressable"). One compile and one cache entry serve
 * every device, so program keys need not name the device. */
static const char kCompileOptions[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};

/* The same options followed by env_option_overrides (field 7, a map entry { key (1):
 * "xla_allow_excess_precision", value (2): OptionOverrideProto { bool_field (2) = false } }).
 * By default XLA keeps half-precision intermediates unrounded between the ops it fuses, so a
 * fused program (DeferAndFuse, torch.compile) computes sin(a + b) of bfloat16 tensors from the
 * unrounded sum and can even give the next op a different value from the one an in-place op
 * stored; PyTorch rounds every op's result to its dtype. The override makes XLA round at each
 * op boundary; a user who names the flag in XLA_FLAGS keeps their own choice (see options()). */
static const char kCompileOptionsRounded[] = {
    0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01, 0x3a, 0x20, 0x0a, 0x1a, 'x', 'l',
    'a',  '_',  'a',  'l',  'l',  'o',  'w',  '_',  'e',  'x',  'c',  'e',  's',  's',
    '_',  'p',  'r',  'e',  'c',  'i',  's',  'i',  'o',  'n',  0x12, 0x02, 0x10, 0x00};

/* The compile options for this process: the rounded ones unless XLA_FLAGS mentions the flag. */
static void options(const char **bytes, size_t *size) {
  const char *flags = getenv("XLA_FLAGS");
  if (flags && strstr(flags, "xla_allow_excess_precision")) {
    *bytes = kCompileOptions;
    *size = sizeof kCompileOptions;
  } else {
    *bytes = kCompileOptionsRounded;
    *size = sizeof kCompileOptionsRounded;
  }
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static pj_status_t *wrap_loaded(pj_runtime_t *rt, PJRT_LoadedExecutable *exe, pj_program_t **out);

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
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(compile, api, PJRT_Client_Compile);
  PJRT_Program prog = {.struct_size = PJRT_Program_STRUCT_SIZE,
                       .code = (char *)text,
                       .code_size = len,
                       .format = "mlir",
                       .format_size = 4};
  PJRT_Client_Compile_Args a = {.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE,
                                .client = pj_runtime_client(rt),
                                .program = &prog};
  options(&a.compile_options, &a.compile_options_size);
  int64_t t0 = now_ns();
  PJ_TRY(pj_runtime_take_error(rt, compile(&a), "compile"));
  int64_t took = now_ns() - t0;
  pj_metric_add(PJ_METRIC_COMPILE_NS, took);
  pj_metric_add(PJ_METRIC_COMPILES, 1);
  dump_program(text, len, took);

  return wrap_loaded(rt, a.executable, out);
}

/* Takes ownership of a loaded executable and records its output count. */
static pj_status_t *wrap_loaded(pj_runtime_t *rt, PJRT_LoadedExecutable *exe, pj_program_t **out) {
  const PJRT_Api *api = pj_runtime_api(rt);
  pj_program_t *p = calloc(1, sizeof *p);
  if (!p) return pj_status_new(PJ_ERR_OOM, "out of host memory");
  p->exe = exe;
  PJRT_LoadedExecutable_GetExecutable_Args ga = {
      .struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE,
      .loaded_executable = p->exe};
  pj_status_t *st = pj_runtime_take_error(rt, api->PJRT_LoadedExecutable_GetExecutable(&ga),
                                          "get executable");
  if (!st) {
    PJRT_Executable_NumOutputs_Args na = {
        .struct_size = PJRT_Executable_NumOutputs_Args_STRUCT_SIZE, .executable = ga.executable};
    st = pj_runtime_take_error(rt, api->PJRT_Executable_NumOutputs(&na), "num outputs");
    p->num_outputs = na.num_outputs;
    PJRT_Executable_Destroy_Args d = {.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE,
                                      .executable = ga.executable};
    api->PJRT_Executable_Destroy(&d);
  }
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
  free(p);
}

size_t pj_program_num_outputs(const pj_program_t *p) { return p->num_outputs; }

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

pj_status_t *pj_program_deserialize(const void *bytes, size_t len, pj_program_t **out) {
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
  return wrap_loaded(rt, a.loaded_executable, out);
}

pj_status_t *pj_program_execute(pj_program_t *p, int device, PJRT_Buffer *const *args,
                                size_t nargs, const bool *donate, PJRT_Buffer **outs) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  const PJRT_Api *api = pj_runtime_api(rt);
  PJ_API_SLOT(execute, api, PJRT_LoadedExecutable_Execute);
  /* A portable program has no device of its own: a NULL execute_device would not mean "the
   * default device", so an index the client does not have is refused here. */
  PJRT_Device *dev = pj_runtime_device(rt, device);
  if (!dev)
    return pj_status_new(PJ_ERR_INDEX, "execute: no device %d (the client has %d)", device,
                         pj_runtime_device_count(rt));
  /* Donation is opt-in per argument: everything not marked is listed as non-donatable, so a
   * program compiled with aliasing can still be run without consuming an input. */
  int64_t keep_small[64];
  int64_t *keep = nargs <= 64 ? keep_small : malloc(nargs * sizeof *keep);
  if (!keep) return pj_status_new(PJ_ERR_OOM, "out of host memory");
  size_t nkeep = 0;
  for (size_t i = 0; i < nargs; i++)
    if (!donate || !donate[i]) keep[nkeep++] = (int64_t)i;
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
