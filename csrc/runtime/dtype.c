#include "torch_pjrt/dtype.h"
#include "pjrt_c_api.h"

/* Indexed by pj_dtype_t. MLIR integers are signless: `i32` is signed by StableHLO convention,
 * unsigned types are spelled `ui8`. */
static const pj_dtype_info_t kDtypes[PJ_NUM_DTYPES] = {
    [PJ_BOOL] = {"bool", "i1", 1, PJRT_Buffer_Type_PRED, false, false, false},
    [PJ_U8] = {"uint8", "ui8", 1, PJRT_Buffer_Type_U8, false, false, false},
    [PJ_I8] = {"int8", "i8", 1, PJRT_Buffer_Type_S8, false, false, true},
    [PJ_I16] = {"int16", "i16", 2, PJRT_Buffer_Type_S16, false, false, true},
    [PJ_I32] = {"int32", "i32", 4, PJRT_Buffer_Type_S32, false, false, true},
    [PJ_I64] = {"int64", "i64", 8, PJRT_Buffer_Type_S64, false, false, true},
    [PJ_F16] = {"float16", "f16", 2, PJRT_Buffer_Type_F16, true, false, true},
    [PJ_BF16] = {"bfloat16", "bf16", 2, PJRT_Buffer_Type_BF16, true, false, true},
    [PJ_F32] = {"float32", "f32", 4, PJRT_Buffer_Type_F32, true, false, true},
    [PJ_F64] = {"float64", "f64", 8, PJRT_Buffer_Type_F64, true, false, true},
    [PJ_C64] = {"complex64", "complex<f32>", 8, PJRT_Buffer_Type_C64, false, true, true},
    [PJ_C128] = {"complex128", "complex<f64>", 16, PJRT_Buffer_Type_C128, false, true, true},
    /* Low-precision formats: bytes on the device (dtype.h says why). */
    [PJ_F8E4M3FN] = {"float8_e4m3fn", "ui8", 1, PJRT_Buffer_Type_U8, false, false, false, true},
    [PJ_F8E5M2] = {"float8_e5m2", "ui8", 1, PJRT_Buffer_Type_U8, false, false, false, true},
    [PJ_F8E4M3FNUZ] = {"float8_e4m3fnuz", "ui8", 1, PJRT_Buffer_Type_U8, false, false, false, true},
    [PJ_F8E5M2FNUZ] = {"float8_e5m2fnuz", "ui8", 1, PJRT_Buffer_Type_U8, false, false, false, true},
    [PJ_F8E8M0FNU] = {"float8_e8m0fnu", "ui8", 1, PJRT_Buffer_Type_U8, false, false, false, true},
    [PJ_F4E2M1FN_X2] = {"float4_e2m1fn_x2", "ui8", 1, PJRT_Buffer_Type_U8, false, false, false,
                        true},
    [PJ_U16] = {"uint16", "ui16", 2, PJRT_Buffer_Type_U16, false, false, false},
    [PJ_U32] = {"uint32", "ui32", 4, PJRT_Buffer_Type_U32, false, false, false},
    [PJ_U64] = {"uint64", "ui64", 8, PJRT_Buffer_Type_U64, false, false, false},
};

const pj_dtype_info_t *pj_dtype_info(pj_dtype_t dt) { return &kDtypes[dt]; }
