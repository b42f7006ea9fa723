// Python bindings for the dispatch layer: which ops have lowerings (so the Python front can
// register PyTorch decompositions for the others) and which ops fell back to the CPU.
#include <torch/extension.h>

#include "bridge.h"
extern "C" {
#include "torch_pjrt/call.h"
}

namespace torch_pjrt {

std::map<std::string, int64_t> fallback_ops();  // dispatch.cpp

void bind_dispatch(pybind11::module_& m) {
  m.def("_lowered_ops", [] {
    std::vector<std::string> names;
    pj_lowering_each([](const char* n, void* u) {
      static_cast<std::vector<std::string>*>(u)->push_back(n);
    }, &names);
    std::sort(names.begin(), names.end());
    return names;
  }, "Base names of the aten ops with a StableHLO lowering.");
  m.def("fallback_ops", [] { return fallback_ops(); },
        "aten ops that ran on the CPU through the fallback, with their counts.");
}

}  // namespace torch_pjrt
