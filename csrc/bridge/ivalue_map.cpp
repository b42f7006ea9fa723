#include "ivalue_map.h"

namespace torch_pjrt {

c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f,
                        c10::Device tpu_device_becomes) {
  if (v.isTensor()) return f(v.toTensor());
  // factory ops (no tensor inputs) carry the device as an argument
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return tpu_device_becomes;
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isList()) {  // List[Optional[Tensor]]
    auto l = v.toList();
    bool tensors = l.size() > 0;
    for (const c10::IValue& e : l) tensors = tensors && (e.isTensor() || e.isNone());
    if (tensors) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : l)
        out.push_back(e.isNone() ? std::nullopt : std::optional<at::Tensor>(f(e.toTensor())));
      return out;
    }
  }
  return v;
}

}  // namespace torch_pjrt
