/* Low-precision float formats (float8 variants, e8m0, packed e2m1): their conversions to and from
 * float32, in programs (integer ops on the stored bytes) and on the host (constants). The rules
 * are PyTorch's CPU ones, which differ per format in overflow and NaN handling; the table is in
 * docs/low_precision.md. One implementation: hlo/float8.c. */
#ifndef TORCH_PJRT_LOWP_H
#define TORCH_PJRT_LOWP_H
#include <stdint.h>
#include "torch_pjrt/hlo.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Conversion between any two dtypes of which at least one is low-precision: through float32, as
 * PyTorch's CPU kernels convert (a double or int64 rounds to float32 first). The packed float4
 * type converts to nothing (PyTorch has no such kernel): an UNIMPLEMENTED error. */
pj_val_t pj_lowp_convert(pj_hlo_t *h, pj_val_t x, pj_dtype_t dt);

/* float4_e2m1fn_x2 values (x) unpacked to float32: dim `axis` doubles, each byte giving its low
 * nibble's value first. */
pj_val_t pj_lowp_unpack_f4(pj_hlo_t *h, pj_val_t x, int axis);

/* Host-side encoding of one float32 value (the code a constant of the format holds) and its
 * decoding; dt must be one of the 8-bit formats (not the packed float4). */
uint8_t pj_lowp_from_float(pj_dtype_t dt, float f);
float pj_lowp_to_float(pj_dtype_t dt, uint8_t code);

#ifdef __cplusplus
}
#endif
#endif
