#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(pj_sb_t *b, size_t extra) {
  if (b->failed) return false;
  if (b->len + extra + 1 <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  char *s = realloc(b->s, cap);
  if (!s) {
    b->failed = true;
    return false;
  }
  b->s = s;
  b->cap = cap;
  return true;
}

void pj_sb_printf(pj_sb_t *b, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n > 0 && reserve(b, (size_t)n)) {
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap2);
    b->len += (size_t)n;
  }
  va_end(ap2);
}

void pj_sb_puts(pj_sb_t *b, const char *s) {
  size_t n = strlen(s);
  if (!reserve(b, n)) return;
  memcpy(b->s + b->len, s, n + 1);
  b->len += n;
}

void pj_sb_ints(pj_sb_t *b, const long long *v, int n) {
  for (int i = 0; i < n; i++) pj_sb_printf(b, i ? ", %lld" : "%lld", v[i]);
}

void pj_sb_free(pj_sb_t *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}

char *pj_sb_take(pj_sb_t *b, size_t *len) {
  if (b->failed) {
    pj_sb_free(b);
    return NULL;
  }
  if (!b->s && !reserve(b, 0)) return NULL;
  b->s[b->len] = '\0';
  char *s = b->s;
  if (len) *len = b->len;
  memset(b, 0, sizeof *b);
  return s;
}
