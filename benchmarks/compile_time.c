/* Compile time of StableHLO programs on the PJRT plugin alone: no PyTorch, no dispatch, no
 * caches. Each file given (programs written by TORCH_PJRT_DUMP_PROGRAMS=DIR, or any StableHLO
 * text) is compiled `reps` times through pj_program_compile, the files interleaved so that a
 * change in the machine's load touches all of them alike; prints each file's median and
 * minimum in milliseconds.
 *
 *   make build/bench/compile_time
 *   TORCH_PJRT_PLUGIN=<the CPU plugin .so> build/bench/compile_time 9 DIR/<file>.mlir ...
 *
 * (the Makefile exports the plugin path it builds against as TORCH_PJRT_PLUGIN). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "torch_pjrt/exec.h"
#include "torch_pjrt/status.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *b = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)len + 1))) {
      *n = fread(b, 1, (size_t)len, f);
      b[*n] = 0;
    }
  }
  fclose(f);
  return b;
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 3 || atoi(argv[1]) < 1) {
    fprintf(stderr, "usage: %s REPS FILE.mlir...\n", argv[0]);
    return 2;
  }
  const int reps = atoi(argv[1]), nfiles = argc - 2;
  double *ms = calloc((size_t)nfiles * (size_t)reps, sizeof *ms);
  if (!ms) return 1;
  for (int r = 0; r < reps; r++) {
    for (int i = 0; i < nfiles; i++) {
      size_t n = 0;
      char *text = read_file(argv[i + 2], &n);
      if (!text) {
        fprintf(stderr, "cannot read %s\n", argv[i + 2]);
        return 1;
      }
      pj_program_t *p = NULL;
      const double t0 = now_ms();
      pj_status_t *st = pj_program_compile(text, n, &p);
      ms[i * reps + r] = now_ms() - t0;
      free(text);
      if (st) {
        fprintf(stderr, "%s: %s\n", argv[i + 2], pj_status_message(st));
        pj_status_free(st);
        return 1;
      }
      pj_program_free(p);
    }
  }
  for (int i = 0; i < nfiles; i++) {
    qsort(ms + i * reps, (size_t)reps, sizeof *ms, by_value);
    printf("%8.1f ms median %8.1f ms min  %s\n", ms[i * reps + reps / 2], ms[i * reps],
           argv[i + 2]);
  }
  free(ms);
  return 0;
}
