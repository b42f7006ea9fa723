/* Heap policy for the CPU plugin (host_heap.h). */
#include "torch_pjrt/host_heap.h"

#include <stdlib.h>
#include <string.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

int pj_host_heap_configure(void) {
  const char *v = getenv("TORCH_PJRT_HOST_HEAP");
  if (v && !strcmp(v, "system")) return 0;
#if defined(__GLIBC__)
  /* At most one arena, so a block freed by one thread is found by the next allocation of any
   * thread. glibc reads this when a second thread first allocates; by the time torch_pjrt is
   * imported that has usually happened, and XLA's threads still get arenas of their own
   * (measured: 14,000 faults per grouped GEMM left, none with the limit set at process start
   * through GLIBC_TUNABLES). */
  mallopt(M_ARENA_MAX, 1);
  /* Large blocks come from the heap, not an mmap each (glibc falls back to mmap by itself
   * when the heap cannot grow). */
  mallopt(M_MMAP_MAX, 0);
  /* Freed memory stays in the heap (2^30 bytes: the largest value mallopt takes as an int
   * that is a power of two; a larger trim threshold changes nothing for this purpose). */
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  return 1;
#else
  return 0;
#endif
}
