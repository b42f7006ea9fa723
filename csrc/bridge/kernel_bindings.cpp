// Python binding of the custom-kernel registry (torch_pjrt/kernel.h): torch_pjrt/kernels/
// registers each exported or hand-written kernel's functions before its first call.
#include <torch/extension.h>

#include "bridge.h"
extern "C" {
#include "torch_pjrt/kernel.h"
}

namespace torch_pjrt {

void bind_kernels(pybind11::module_& m) {
  m.def("_kernel_register",
        [](const std::string& id, const std::string& callee, const std::string& text) {
          check(pj_kernel_register(id.c_str(), callee.c_str(), text.c_str()));
        },
        "Registers a kernel's StableHLO functions under its fingerprint id (tpu::kernel_call).");
  m.def("_kernel_known", [](const std::string& id) { return pj_kernel_known(id.c_str()); });
}

}  // namespace torch_pjrt
