#include "torch_pjrt/status.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

struct pj_status {
  pj_code_t code;
  char msg[];
};

/* Returned when malloc fails while reporting an error; never freed. */
static struct {
  pj_code_t code;
  char msg[16];
} oom_status = {PJ_ERR_OOM, "out of memory"};

static pj_status_t *status_alloc(pj_code_t code, const char *fmt, va_list ap) {
  if (!fmt) fmt = "";
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  if (n < 0) n = 0;
  pj_status_t *st = malloc(sizeof(*st) + (size_t)n + 1);
  if (!st) {
    va_end(ap2);
    return (pj_status_t *)&oom_status;
  }
  st->code = code;
  vsnprintf(st->msg, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return st;
}

pj_status_t *pj_status_new(pj_code_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pj_status_t *st = status_alloc(code, fmt, ap);
  va_end(ap);
  return st;
}

pj_status_t *pj_status_wrap(pj_status_t *st, const char *fmt, ...) {
  if (!st) return NULL;
  char prefix[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  pj_status_t *out = pj_status_new(st->code, "%s%s", prefix, st->msg);
  pj_status_free(st);
  return out;
}

pj_code_t pj_status_code(const pj_status_t *st) { return st ? st->code : PJ_OK; }
const char *pj_status_message(const pj_status_t *st) { return st ? st->msg : ""; }

void pj_status_free(pj_status_t *st) {
  if (!st || st == (pj_status_t *)&oom_status) return;
  free(st);
}
