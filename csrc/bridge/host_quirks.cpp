// CPU results that depend on the host CPU (host_quirks.h).
#include "host_quirks.h"

#include <cmath>
#include <mutex>
#include <unordered_map>

#include "torch_pjrt/host_quirks.h"

namespace torch_pjrt {

// Whether CPU's reduced-precision (bfloat16, float16) convolutions run in oneDNN on this host:
// PyTorch runs them there only where the CPU has the instructions oneDNN needs (its own check
// of the host ISA), and oneDNN keeps a channels-last input channels-last. Asked of CPU once per
// dtype per process with a tiny 3-d convolution (batch 2, so no other rule decides): the answer
// is CPU's on this host by construction.
bool cpu_onednn_takes(at::ScalarType dt) {
  static std::mutex mu;
  static std::unordered_map<int, bool> known;
  std::lock_guard<std::mutex> g(mu);
  auto it = known.find(static_cast<int>(dt));
  if (it != known.end()) return it->second;
  bool takes = false;
  try {
    at::AutoDispatchBelowAutograd no_autograd;
    const auto opts = at::TensorOptions().dtype(dt).device(c10::kCPU);
    at::Tensor x = at::zeros({2, 2, 4, 4, 4}, opts).contiguous(at::MemoryFormat::ChannelsLast3d);
    at::Tensor w = at::zeros({4, 2, 3, 3, 3}, opts);
    takes = at::conv3d(x, w).suggest_memory_format() == at::MemoryFormat::ChannelsLast3d;
  } catch (const std::exception&) {
    takes = false;  // a dtype CPU cannot convolve: the tpu result stays contiguous
  }
  known.emplace(static_cast<int>(dt), takes);
  return takes;
}

namespace {

// Whether CPU's erf-form gelu of +inf is NaN in dtype dt (its AVX-512 kernels) or +inf.
bool cpu_gelu_of_inf_is_nan(at::ScalarType dt) {
  try {
    at::AutoDispatchBelowAutograd no_autograd;
    // a vector long enough for the vectorized kernel (the quirk is in its vector path)
    at::Tensor x = at::full({64}, INFINITY, at::TensorOptions().dtype(dt).device(c10::kCPU));
    return at::gelu(x).isnan().all().item<bool>();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

void configure_host_quirks() {
  pj_host_quirks_set_gelu_inf_is_nan(cpu_gelu_of_inf_is_nan(at::kFloat),
                                     cpu_gelu_of_inf_is_nan(at::kBFloat16));
}

}  // namespace torch_pjrt
