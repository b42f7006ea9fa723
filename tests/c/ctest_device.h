/* Helpers for C tests that run programs on the plugin's device 0. */
#ifndef TORCH_PJRT_CTEST_DEVICE_H
#define TORCH_PJRT_CTEST_DEVICE_H
#include "ctest.h"
#include "torch_pjrt/storage.h"
#include "torch_pjrt/transfer.h"

/* A float32 storage on device 0 holding data[0..n). */
static pj_storage_t *ctest_f32_storage(const float *data, int64_t n) {
  pj_storage_t *s;
  OK(pj_storage_new(0, (size_t)n * sizeof(float), &s));
  struct PJRT_Buffer *buf;
  OK(pj_transfer_to_device(0, data, PJ_F32, &n, 1, &buf));
  pj_storage_swap(s, buf, PJ_F32);
  return s;
}

/* main() of a device test starts with this: the plugin comes from the environment. */
#define CTEST_REQUIRE_PLUGIN()                                                               \
  do {                                                                                       \
    if (!getenv("TORCH_PJRT_PLUGIN")) {                                                      \
      fprintf(stderr, "TORCH_PJRT_PLUGIN must name the CPU plugin .so (make ctest sets it)\n"); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)
#endif
