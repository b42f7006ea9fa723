/* Status values: every public runtime function returns one. NULL means success; anything else is
 * a heap object owned by the caller (free with pj_status_free). Nothing in the C layers aborts:
 * the bridge turns a status into the matching Python exception. */
#ifndef TORCH_PJRT_STATUS_H
#define TORCH_PJRT_STATUS_H
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  PJ_OK = 0,
  PJ_ERR_RUNTIME,        /* RuntimeError */
  PJ_ERR_VALUE,          /* ValueError */
  PJ_ERR_TYPE,           /* TypeError */
  PJ_ERR_INDEX,          /* IndexError */
  PJ_ERR_UNIMPLEMENTED,  /* NotImplementedError: no lowering for this op / dtype */
  PJ_ERR_OOM,            /* torch.OutOfMemoryError */
  PJ_ERR_PLUGIN          /* plugin missing or incompatible (RuntimeError with install advice) */
} pj_code_t;

typedef struct pj_status pj_status_t;

pj_status_t *pj_status_new(pj_code_t code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Prepends context ("while lowering aten::add: ") to an existing status; returns it. */
pj_status_t *pj_status_wrap(pj_status_t *st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
pj_code_t pj_status_code(const pj_status_t *st);
const char *pj_status_message(const pj_status_t *st);
void pj_status_free(pj_status_t *st);

#define PJ_TRY(expr)                     \
  do {                                   \
    pj_status_t *pj_try_st_ = (expr);    \
    if (pj_try_st_) return pj_try_st_;   \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
