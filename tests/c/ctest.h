/* Minimal C test helpers: EXPECT records a failure and continues; OK aborts the test program
 * (not the library) on a failed status. Tests that need the plugin read TORCH_PJRT_PLUGIN,
 * which `make ctest` sets from the installed CPU plugin package. */
#ifndef TORCH_PJRT_CTEST_H
#define TORCH_PJRT_CTEST_H
#include <stdio.h>
#include <stdlib.h>

#include "torch_pjrt/status.h"

static int ctest_failures;
#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ctest_failures++;                                                   \
    }                                                                     \
  } while (0)
#define OK(expr)                                                                           \
  do {                                                                                     \
    pj_status_t *ctest_st_ = (expr);                                                       \
    if (ctest_st_) {                                                                       \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,                 \
              pj_status_message(ctest_st_));                                               \
      pj_status_free(ctest_st_);                                                           \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)
#define CTEST_DONE()                                                \
  do {                                                              \
    if (ctest_failures) fprintf(stderr, "%d failure(s)\n", ctest_failures); \
    else printf("ok\n");                                            \
    return ctest_failures ? 1 : 0;                                  \
  } while (0)
#endif
