/* Private to the runtime: checked access to PJRT_Api function slots. A plugin built against an
 * older header has a smaller PJRT_Api; reading a slot past its struct_size would read garbage,
 * so every call site fetches the slot through PJ_API_SLOT and reports a missing one. */
#ifndef TORCH_PJRT_API_CHECK_H
#define TORCH_PJRT_API_CHECK_H
#include <stddef.h>
#include "pjrt_c_api.h"
#include "torch_pjrt/status.h"

#define PJ_API_HAS(api, slot) \
  ((api)->struct_size >= offsetof(PJRT_Api, slot) + sizeof((api)->slot) && (api)->slot != NULL)

/* Declares `fn` as the slot or returns a PJ_ERR_PLUGIN status naming it. */
#define PJ_API_SLOT(fn, api, slot)                                                            \
  if (!PJ_API_HAS(api, slot))                                                                 \
    return pj_status_new(PJ_ERR_PLUGIN,                                                       \
                         "the loaded PJRT plugin (C API %d.%d) does not provide " #slot       \
                         "; install a newer plugin",                                          \
                         (api)->pjrt_api_version.major_version,                               \
                         (api)->pjrt_api_version.minor_version);                              \
  slot *fn = (api)->slot

#endif
