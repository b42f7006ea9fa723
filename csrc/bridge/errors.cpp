// Status -> exception: the one place where the runtime's error values become c10 exceptions,
// which PyTorch's Python bindings translate to the Python exception of the same name.
#include "bridge.h"

#include <string>

namespace torch_pjrt {

void check(pj_status_t* st) {
  if (!st) return;
  // Copy before freeing: the message lives inside the status object.
  const std::string msg = pj_status_message(st);
  const pj_code_t code = pj_status_code(st);
  pj_status_free(st);
  switch (code) {
    case PJ_ERR_VALUE:
      C10_THROW_ERROR(ValueError, msg);
    case PJ_ERR_TYPE:
      C10_THROW_ERROR(TypeError, msg);
    case PJ_ERR_INDEX:
      C10_THROW_ERROR(IndexError, msg);
    case PJ_ERR_UNIMPLEMENTED:
      C10_THROW_ERROR(NotImplementedError, msg);
    case PJ_ERR_OOM:
      C10_THROW_ERROR(OutOfMemoryError, msg);
    case PJ_OK:  // a non-NULL status always carries an error code; treat a stray OK as one
    case PJ_ERR_RUNTIME:
    case PJ_ERR_PLUGIN:
      break;
  }
  C10_THROW_ERROR(Error, msg);
}

pj_runtime_t* runtime() {
  pj_runtime_t* rt = nullptr;
  check(pj_runtime_get(&rt));
  return rt;
}

}  // namespace torch_pjrt
