/* Element types known to the runtime and their StableHLO / PJRT spellings (one table, dtype.c). */
#ifndef TORCH_PJRT_DTYPE_H
#define TORCH_PJRT_DTYPE_H
#include <stddef.h>
#include <stdbool.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  PJ_BOOL = 0,
  PJ_U8,
  PJ_I8,
  PJ_I16,
  PJ_I32,
  PJ_I64,
  PJ_F16,
  PJ_BF16,
  PJ_F32,
  PJ_F64,
  PJ_C64,
  PJ_C128,
  PJ_NUM_DTYPES
} pj_dtype_t;

typedef struct {
  const char *name;  /* torch-style name, for messages */
  const char *mlir;  /* element type in StableHLO text */
  size_t itemsize;
  int pjrt_type;     /* PJRT_Buffer_Type value */
  bool is_float;     /* floating point (not complex) */
  bool is_complex;
  bool is_signed;    /* signed integer */
} pj_dtype_info_t;

const pj_dtype_info_t *pj_dtype_info(pj_dtype_t dt);
static inline bool pj_dtype_is_valid(int dt) { return dt >= 0 && dt < PJ_NUM_DTYPES; }
static inline bool pj_dtype_is_float(pj_dtype_t dt) { return pj_dtype_info(dt)->is_float; }
static inline bool pj_dtype_is_integral(pj_dtype_t dt) {
  return !pj_dtype_info(dt)->is_float && !pj_dtype_info(dt)->is_complex && dt != PJ_BOOL;
}

#ifdef __cplusplus
}
#endif
#endif
