/* The floor under a Strict-mode op: what the PJRT plugin itself costs per execution of a tiny
 * program (an 8x8 float32 add), without PyTorch and without our dispatch.
 *
 *   bare:    PJRT_LoadedExecutable_Execute with no device-complete event, then
 *            PJRT_Buffer_Destroy of the output (the least any caller can do per op);
 *   runtime: pj_program_execute (the same call plus the event and its tracking in stream.c,
 *            as every Strict op makes it), then the same destroy.
 *
 * Blocks of 2,000 executions alternate between the two; prints the median and the 10th
 * percentile of 40 blocks each, in microseconds per execution. Built and run by
 * benchmarks/bench_host_overhead.py --floors (make build/bench/plugin_execute_floor). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pjrt_c_api.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/storage.h"
#include "torch_pjrt/stream.h"
#include "torch_pjrt/transfer.h"

#define BLOCKS 40
#define PER_BLOCK 2000

static const char kProgram[] =
    "func.func @main(%a: tensor<8x8xf32>, %b: tensor<8x8xf32>) -> tensor<8x8xf32> {\n"
    "  %c = stablehlo.add %a, %b : tensor<8x8xf32>\n"
    "  return %c : tensor<8x8xf32>\n"
    "}\n";

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int by_value(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static int fail(pj_status_t *st) {
  fprintf(stderr, "plugin_execute_floor: %s\n", pj_status_message(st));
  pj_status_free(st);
  return 1;
}

int main(void) {
  pj_status_t *st;
  float data[64];
  for (int i = 0; i < 64; i++) data[i] = (float)i;
  int64_t dims[2] = {8, 8};
  PJRT_Buffer *args[2];
  for (int i = 0; i < 2; i++)
    if ((st = pj_transfer_to_device(0, data, PJ_F32, dims, 2, &args[i]))) return fail(st);
  pj_program_t *prog;
  if ((st = pj_program_compile(kProgram, strlen(kProgram), &prog))) return fail(st);
  pj_runtime_t *rt;
  if ((st = pj_runtime_get(&rt))) return fail(st);
  const PJRT_Api *api = pj_runtime_api(rt);

  int64_t keep[2] = {0, 1};
  PJRT_ExecuteOptions opts = {.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE,
                              .non_donatable_input_indices = keep,
                              .num_non_donatable_input_indices = 2};
  PJRT_Buffer *const *arg_lists[1] = {args};
  double bare[BLOCKS], runtime[BLOCKS];
  for (int b = 0; b < BLOCKS; b++) {
    double t0 = now_us();
    for (int i = 0; i < PER_BLOCK; i++) {
      PJRT_Buffer *out;
      PJRT_Buffer **out_lists[1] = {&out};
      PJRT_LoadedExecutable_Execute_Args a = {
          .struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE,
          .executable = pj_program_loaded(prog),
          .options = &opts,
          .argument_lists = arg_lists,
          .num_devices = 1,
          .num_args = 2,
          .output_lists = out_lists,
          .execute_device = pj_runtime_device(rt, 0)};
      PJRT_Error *e = api->PJRT_LoadedExecutable_Execute(&a);
      if (e) return fail(pj_runtime_take_error(rt, e, "execute"));
      PJRT_Buffer_Destroy_Args d = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE,
                                    .buffer = out};
      api->PJRT_Buffer_Destroy(&d);
    }
    double t1 = now_us();
    for (int i = 0; i < PER_BLOCK; i++) {
      PJRT_Buffer *out;
      if ((st = pj_program_execute(prog, 0, args, 2, NULL, &out))) return fail(st);
      PJRT_Buffer_Destroy_Args d = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE,
                                    .buffer = out};
      api->PJRT_Buffer_Destroy(&d);
    }
    if ((st = pj_stream_synchronize(0))) return fail(st);
    double t2 = now_us();
    bare[b] = (t1 - t0) / PER_BLOCK;
    runtime[b] = (t2 - t1) / PER_BLOCK;
  }
  qsort(bare, BLOCKS, sizeof *bare, by_value);
  qsort(runtime, BLOCKS, sizeof *runtime, by_value);
  printf("bare %.3f %.3f runtime %.3f %.3f\n", bare[BLOCKS / 2], bare[BLOCKS / 10],
         runtime[BLOCKS / 2], runtime[BLOCKS / 10]);
  return 0;
}
