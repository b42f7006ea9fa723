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
  /* Low-precision formats (docs/low_precision.md). Stored as bytes on the device (element type
   * ui8, PJRT U8), whatever the plugin supports natively, so every plugin holds them alike and
   * casts follow PyTorch's CPU rules bit for bit: hlo/float8.c decodes and encodes them with
   * integer ops. Ops other than data movement and casts never see them (the bridge sends those
   * to CPU's kernels, lowp_ops.cpp). Appended after C128: codes 0..11 keep their values. */
  PJ_F8E4M3FN,
  PJ_F8E5M2,
  PJ_F8E4M3FNUZ,
  PJ_F8E5M2FNUZ,
  PJ_F8E8M0FNU,
  PJ_F4E2M1FN_X2, /* two e2m1 values per byte, opaque to every op but data movement */
  /* PyTorch's "barebones" unsigned integers (torch.uint16/32/64). StableHLO and PJRT hold them
   * natively; CPU has kernels for few ops on them, and the bridge lowers only those ops
   * (csrc/bridge/unsigned_ops.cpp). Appended last so the codes above, which cache keys hold,
   * keep their values. */
  PJ_U16,
  PJ_U32,
  PJ_U64,
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
  bool is_lowp;      /* a low-precision float stored as bytes (neither float nor integral here) */
} pj_dtype_info_t;

const pj_dtype_info_t *pj_dtype_info(pj_dtype_t dt);
static inline bool pj_dtype_is_valid(int dt) { return dt >= 0 && dt < PJ_NUM_DTYPES; }
static inline bool pj_dtype_is_float(pj_dtype_t dt) { return pj_dtype_info(dt)->is_float; }
/* The dtype an op on dt computes in: float32 for float16 and bfloat16 (torch's CPU kernels
 * compute half types in float32 and round once at the end), dt itself otherwise. */
static inline pj_dtype_t pj_dtype_compute(pj_dtype_t dt) {
  return dt == PJ_F16 || dt == PJ_BF16 ? PJ_F32 : dt;
}
static inline bool pj_dtype_is_lowp(pj_dtype_t dt) { return pj_dtype_info(dt)->is_lowp; }
static inline bool pj_dtype_is_integral(pj_dtype_t dt) {
  const pj_dtype_info_t *i = pj_dtype_info(dt);
  return !i->is_float && !i->is_complex && !i->is_lowp && dt != PJ_BOOL;
}

#ifdef __cplusplus
}
#endif
#endif
