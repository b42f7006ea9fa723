/* Growable string used by the HLO builder. Allocation failure sets `failed` and later appends
 * become no-ops, so callers check once at the end. */
#ifndef TORCH_PJRT_STRBUF_H
#define TORCH_PJRT_STRBUF_H
#include <stddef.h>
#include <stdbool.h>

typedef struct {
  char *s;
  size_t len, cap;
  bool failed;
} pj_sb_t;

void pj_sb_printf(pj_sb_t *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void pj_sb_puts(pj_sb_t *b, const char *s);
/* Appends "a, b, c" for an int64 list. */
void pj_sb_ints(pj_sb_t *b, const long long *v, int n);
void pj_sb_free(pj_sb_t *b);
/* Returns the buffer (caller owns) and resets b. Never NULL unless failed. */
char *pj_sb_take(pj_sb_t *b, size_t *len);
#endif
