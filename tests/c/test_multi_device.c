/* Several devices of one client (the CPU plugin with cpu_device_count = 2): one compiled program
 * runs on either device (portable compile), buffers move between devices without the host,
 * per-device counters say which device did the work, and the copy's completion is tracked on
 * the destination device. Needs TORCH_PJRT_PLUGIN=/path/to/plugin.so (make ctest sets it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/stream.h"
#include "torch_pjrt/transfer.h"

#define N 6
static const char kTwice[] =
    "func.func @main(%a: tensor<6xf32>) -> tensor<6xf32> {\n"
    "  %0 = stablehlo.add %a, %a : tensor<6xf32>\n"
    "  return %0 : tensor<6xf32>\n"
    "}\n";

static int same(const float *a, const float *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

int main(void) {
  if (!getenv("TORCH_PJRT_PLUGIN")) {
    fprintf(stderr, "TORCH_PJRT_PLUGIN must name the CPU plugin .so (make ctest sets it)\n");
    return 1;
  }
  OK(pj_runtime_configure(getenv("TORCH_PJRT_PLUGIN"), 2));
  pj_runtime_t *rt;
  OK(pj_runtime_get(&rt));
  EXPECT(pj_runtime_device_count(rt) == 2);
  EXPECT(pj_runtime_device_index(rt, pj_runtime_device(rt, 1)) == 1);
  EXPECT(pj_runtime_device_index(rt, NULL) == -1);
  pj_metrics_reset();

  const float host[N] = {0, 1, 2, 3, 4, 5};
  const float twice[N] = {0, 2, 4, 6, 8, 10};
  int64_t n = N;
  struct PJRT_Buffer *on0;
  OK(pj_transfer_to_device(0, host, PJ_F32, &n, 1, &on0));
  EXPECT(pj_device_metric_get(0, PJ_DEVICE_METRIC_H2D_TRANSFERS) == 1);
  EXPECT(pj_device_metric_get(1, PJ_DEVICE_METRIC_H2D_TRANSFERS) == 0);

  /* Device 0 -> device 1, no host copy; the source may go at once. */
  struct PJRT_Buffer *on1;
  OK(pj_transfer_between_devices(on0, PJ_F32, N, 1, &on1));
  EXPECT(pj_metric_get(PJ_METRIC_D2D_TRANSFERS) == 1);
  EXPECT(pj_metric_get(PJ_METRIC_D2D_BYTES) == N * (int64_t)sizeof(float));
  EXPECT(pj_metric_get(PJ_METRIC_D2H_TRANSFERS) == 0);
  EXPECT(pj_device_metric_get(0, PJ_DEVICE_METRIC_D2D_OUT) == 1);
  EXPECT(pj_device_metric_get(1, PJ_DEVICE_METRIC_D2D_IN) == 1);
  OK(pj_stream_synchronize(1)); /* covers the copy */
  EXPECT(pj_stream_pending(1) == 0);

  /* A copy onto the buffer's own device is refused. */
  struct PJRT_Buffer *none = NULL;
  pj_status_t *st = pj_transfer_between_devices(on1, PJ_F32, N, 1, &none);
  EXPECT(st != NULL && none == NULL);
  pj_status_free(st);
  st = pj_transfer_between_devices(on1, PJ_F32, N, 7, &none);
  EXPECT(st && pj_status_code(st) == PJ_ERR_INDEX);
  pj_status_free(st);

  /* One program, both devices. */
  pj_program_t *p;
  OK(pj_program_compile(kTwice, strlen(kTwice), &p));
  struct PJRT_Buffer *r1, *r0;
  OK(pj_program_execute(p, 1, &on1, 1, NULL, &r1));
  EXPECT(pj_device_metric_get(1, PJ_DEVICE_METRIC_EXECUTIONS) == 1);
  EXPECT(pj_device_metric_get(0, PJ_DEVICE_METRIC_EXECUTIONS) == 0);
  OK(pj_program_execute(p, 0, &on0, 1, NULL, &r0));
  EXPECT(pj_device_metric_get(0, PJ_DEVICE_METRIC_EXECUTIONS) == 1);
  float out[N];
  OK(pj_transfer_to_host(r1, out, sizeof out));
  EXPECT(same(out, twice, N));
  EXPECT(pj_device_metric_get(1, PJ_DEVICE_METRIC_D2H_TRANSFERS) == 1);
  OK(pj_transfer_to_host(r0, out, sizeof out));
  EXPECT(same(out, twice, N));
  EXPECT(pj_device_metric_get(0, PJ_DEVICE_METRIC_D2H_TRANSFERS) == 1);

  /* A program loaded from its serialized form is portable too. */
  void *bytes = NULL;
  size_t len = 0;
  OK(pj_program_serialize(p, &bytes, &len));
  pj_program_t *q;
  OK(pj_program_deserialize(bytes, len, &q));
  struct PJRT_Buffer *q1;
  OK(pj_program_execute(q, 1, &on1, 1, NULL, &q1));
  OK(pj_transfer_to_host(q1, out, sizeof out));
  EXPECT(same(out, twice, N));

  /* A device the client lacks is an error, not a crash or a run elsewhere. */
  struct PJRT_Buffer *bad = NULL;
  st = pj_program_execute(p, 2, &on1, 1, NULL, &bad);
  EXPECT(st && pj_status_code(st) == PJ_ERR_INDEX && bad == NULL);
  pj_status_free(st);
  EXPECT(pj_device_metric_get(99, PJ_DEVICE_METRIC_EXECUTIONS) == 0);

  pj_metrics_reset();
  EXPECT(pj_device_metric_get(1, PJ_DEVICE_METRIC_EXECUTIONS) == 0);

  OK(pj_stream_synchronize(-1));
  free(bytes);
  pj_buffer_destroy(q1);
  pj_buffer_destroy(r0);
  pj_buffer_destroy(r1);
  pj_buffer_destroy(on1);
  pj_buffer_destroy(on0);
  pj_program_free(q);
  pj_program_free(p);
  CTEST_DONE();
}
