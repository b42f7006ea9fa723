/* Completion tracking (stream.c) against the real plugin: executions are tracked, markers wait for
 * and time exactly the work recorded before them, synchronize drains everything.
 * Needs TORCH_PJRT_PLUGIN=/path/to/plugin.so (make ctest sets it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/exec_profile.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/stream.h"
#include "torch_pjrt/transfer.h"

/* A matmul big enough to take milliseconds on a CPU, so work is still in flight when we look. */
#define N 768
static const char kProgram[] =
    "func.func @main(%a: tensor<768x768xf32>) -> tensor<768x768xf32> {\n"
    "  %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : "
    "(tensor<768x768xf32>, tensor<768x768xf32>) -> tensor<768x768xf32>\n"
    "  %1 = stablehlo.dot_general %0, %a, contracting_dims = [1] x [0] : "
    "(tensor<768x768xf32>, tensor<768x768xf32>) -> tensor<768x768xf32>\n"
    "  return %1 : tensor<768x768xf32>\n"
    "}\n";

int main(void) {
  if (!getenv("TORCH_PJRT_PLUGIN")) {
    fprintf(stderr, "TORCH_PJRT_PLUGIN must name the CPU plugin .so (make ctest sets it)\n");
    return 1;
  }
  pj_runtime_t *rt;
  OK(pj_runtime_get(&rt));

  /* Nothing tracked: a marker is complete at once, synchronize returns immediately. */
  pj_marker_t *m0;
  OK(pj_marker_record(0, &m0));
  EXPECT(pj_marker_query(m0));
  EXPECT(pj_stream_pending(0) == 0);
  OK(pj_stream_synchronize(0));
  OK(pj_stream_synchronize(-1));

  pj_program_t *p;
  OK(pj_program_compile(kProgram, strlen(kProgram), &p));
  float *host = malloc(sizeof(float) * N * N);
  for (int i = 0; i < N * N; i++) host[i] = (float)(i % 7) * 0.01f;
  int64_t dims[2] = {N, N};
  struct PJRT_Buffer *in;
  OK(pj_transfer_to_device(0, host, PJ_F32, dims, 2, &in));

  enum { RUNS = 8 };
  struct PJRT_Buffer *outs[RUNS];
  pj_marker_t *start;
  OK(pj_marker_record(0, &start));
  for (int i = 0; i < RUNS; i++) OK(pj_program_execute(p, 0, &in, 1, NULL, &outs[i]));
  pj_marker_t *end;
  OK(pj_marker_record(0, &end));
  int64_t pending = pj_stream_pending(0);
  printf("pending right after %d launches: %lld\n", RUNS, (long long)pending);
  EXPECT(pending >= 0 && pending <= RUNS);

  /* Waiting on the end marker means every launch before it has completed. */
  OK(pj_marker_wait(end));
  EXPECT(pj_marker_query(end));
  for (int i = 0; i < RUNS; i++) EXPECT(pj_buffer_is_ready(outs[i]));
  int64_t t0, t1;
  OK(pj_marker_time_ns(start, &t0));
  OK(pj_marker_time_ns(end, &t1));
  printf("elapsed over %d runs: %.3f ms\n", RUNS, (double)(t1 - t0) / 1e6);
  EXPECT(t1 > t0);

  /* A marker recorded after completion covers nothing and is done at once. */
  pj_marker_t *late;
  OK(pj_marker_record(0, &late));
  EXPECT(pj_marker_query(late));

  /* Many executions and a synchronize: nothing stays pending, and reaping keeps up. */
  for (int i = 0; i < 200; i++) {
    struct PJRT_Buffer *o;
    OK(pj_program_execute(p, 0, &in, 1, NULL, &o));
    pj_buffer_destroy(o);
  }
  OK(pj_stream_synchronize(-1));
  EXPECT(pj_stream_pending(-1) == 0);

  /* The execution timeline (exec_profile.h): nothing is recorded while it is off; while on,
   * each execution leaves one record with this thread's label (or "eager"), issued before it
   * completed, completions in issue order on the one device. */
  size_t n = 0;
  uint64_t dropped = 0;
  free(pj_exec_profile_take(&n, &dropped));
  EXPECT(n == 0);
  pj_exec_profile_enable(true);
  EXPECT(pj_exec_profile_enabled());
  pj_exec_profile_label("matmul pair");
  for (int i = 0; i < 3; i++) {
    struct PJRT_Buffer *o;
    OK(pj_program_execute(p, 0, &in, 1, NULL, &o));
    pj_buffer_destroy(o);
  }
  pj_exec_profile_label(NULL);
  struct PJRT_Buffer *o4;
  OK(pj_program_execute(p, 0, &in, 1, NULL, &o4));
  pj_buffer_destroy(o4);
  OK(pj_stream_synchronize(0));
  pj_exec_profile_enable(false);
  struct PJRT_Buffer *o5; /* after the profile: not recorded */
  OK(pj_program_execute(p, 0, &in, 1, NULL, &o5));
  pj_buffer_destroy(o5);
  OK(pj_stream_synchronize(0));
  pj_exec_record_t *recs = pj_exec_profile_take(&n, &dropped);
  EXPECT(n == 4 && dropped == 0);
  int64_t last_done = 0;
  for (size_t i = 0; recs && i < n; i++) {
    EXPECT(strcmp(recs[i].label, i < 3 ? "matmul pair" : "eager") == 0);
    EXPECT(recs[i].device == 0);
    EXPECT(recs[i].issued_ns > 0 && recs[i].issued_ns <= recs[i].done_ns);
    EXPECT(recs[i].done_ns >= last_done);
    last_done = recs[i].done_ns;
  }
  free(recs);
  free(pj_exec_profile_take(&n, &dropped)); /* taken once: nothing left */
  EXPECT(n == 0);

  /* Out-of-range devices are errors, not crashes. */
  pj_marker_t *bad = NULL;
  pj_status_t *st = pj_marker_record(1000, &bad);
  EXPECT(st && pj_status_code(st) == PJ_ERR_INDEX);
  pj_status_free(st);

  pj_marker_free(m0);
  pj_marker_free(start);
  pj_marker_free(end);
  pj_marker_free(late);
  for (int i = 0; i < RUNS; i++) pj_buffer_destroy(outs[i]);
  pj_buffer_destroy(in);
  pj_program_free(p);
  free(host);
  CTEST_DONE();
}
