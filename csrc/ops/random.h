/* random_'s bounds (random.c): the one statement of which [from, to) a random_(from, to) call
 * draws from and which of CPU's checks it fails, shared by the lowering (which needs the range)
 * and the bridge (which raises CPU's exact messages, naming the C++ element type, and issues
 * CPU's precision warnings for float dtypes, which a lowering cannot). */
#ifndef TORCH_PJRT_OPS_RANDOM_H
#define TORCH_PJRT_OPS_RANDOM_H
#include <stdbool.h>
#include <stdint.h>

#include "torch_pjrt/dtype.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  PJ_RANDOM_OK = 0,
  PJ_RANDOM_FROM_NOT_LESS,      /* from >= to, as given */
  PJ_RANDOM_CAST_FROM_NOT_LESS, /* float dtypes: from >= to once moved to representable values */
  PJ_RANDOM_CAST_FROM_TO_INC,   /* float dtypes, no to: from >= 2^digits once moved */
  PJ_RANDOM_FROM_OUT,           /* from outside the dtype's range */
  PJ_RANDOM_TO_OUT,             /* to - 1 (or the implied inclusive top) outside it */
  PJ_RANDOM_BAD_DTYPE,          /* complex and other dtypes random_ has no kernel for */
  /* random_(INT64_MIN, None), the full 64-bit range, on a dtype CPU's kernel for it refuses:
   * int8 / uint8 / int16 / int32 (a RuntimeError), the others (a NotImplementedError) */
  PJ_RANDOM_FULL_RANGE_DTYPE,
  PJ_RANDOM_FULL_RANGE_NO_KERNEL
} pj_random_check_t;

typedef struct {
  pj_random_check_t check; /* the first of CPU's checks that fails, in CPU's order */
  int64_t from;            /* first value drawn (floats: moved up to a representable value) */
  int64_t to_inc;          /* last value that may be drawn (to - 1, moved down for floats) */
  uint64_t range;          /* to_inc - from + 1 values; 0 stands for 2^64 */
  /* float dtypes: from / to_inc outside [-2^digits, 2^digits] (CPU warns; not an error) */
  bool warn_from, warn_to;
  int digits; /* float dtypes: significand bits, for the warning's text */
  /* For the messages: the pair the failing check compared. */
  int64_t msg_a, msg_b;
} pj_random_bounds_t;

/* The bounds of random_ on dtype dt: with has_to, [from, to); without it [from, max] when
 * has_from, else [0, max] (max: the dtype's largest integer, 2^digits for floats, 1 for bool).
 * from == INT64_MIN without to is the full 64-bit range. Never fails; see out->check. */
void pj_random_bounds(pj_dtype_t dt, bool has_from, int64_t from, bool has_to, int64_t to,
                      pj_random_bounds_t *out);

#ifdef __cplusplus
}
#endif
#endif
