#include "meta_cache.h"

#include "ivalue_map.h"

#include <ATen/ATen.h>

#include <mutex>
#include <string>
#include <unordered_map>

namespace torch_pjrt {
namespace {

// ---- key: op + every argument's metadata and non-tensor value ----

void put(std::string& k, const void* p, size_t n) { k.append(static_cast<const char*>(p), n); }
void put_i(std::string& k, int64_t v) { put(k, &v, sizeof v); }

void put_tensor(std::string& k, const at::Tensor& t) {
  if (!t.defined()) return put_i(k, -1);
  put_i(k, static_cast<int64_t>(t.device().type()));
  put_i(k, static_cast<int64_t>(t.scalar_type()));
  put_i(k, t.dim());
  for (int64_t d = 0; d < t.dim(); d++) {
    put_i(k, t.size(d));
    put_i(k, t.stride(d));
  }
  put_i(k, t.unsafeGetTensorImpl()->is_wrapped_number());
}

// False for values the key cannot describe (then the call is not cached). scalar_values: put
// the values of Scalars, not only their types (see meta_returns).
bool put_value(std::string& k, const c10::IValue& v, bool scalar_values) {
  put_i(k, static_cast<int64_t>(v.tagKind().size()));
  k.append(v.tagKind());
  if (v.isNone()) return true;
  if (v.isTensor()) return put_tensor(k, v.toTensor()), true;
  if (v.isInt()) return put_i(k, v.toInt()), true;
  if (v.isDouble()) {  // (Scalar[] elements arrive as doubles)
    if (!scalar_values) return true;
    double d = v.toDouble();
    return put(k, &d, sizeof d), true;
  }
  if (v.isBool()) return put_i(k, v.toBool()), true;
  if (v.isString()) {
    const std::string& s = v.toStringRef();
    put_i(k, static_cast<int64_t>(s.size()));
    return k.append(s), true;
  }
  if (v.isScalar()) {  // Scalar values matter (arange's length), not only their types
    c10::Scalar s = v.toScalar();
    put_i(k, static_cast<int64_t>(s.type()));
    if (!scalar_values) return true;
    if (s.isComplex()) {
      auto z = s.toComplexDouble();
      double re = z.real(), im = z.imag();
      put(k, &re, sizeof re);
      put(k, &im, sizeof im);
    } else if (s.isFloatingPoint()) {
      double d = s.toDouble();
      put(k, &d, sizeof d);
    } else {
      put_i(k, s.toLong());
    }
    return true;
  }
  if (v.isDevice()) {
    put_i(k, static_cast<int64_t>(v.toDevice().type()));
    return put_i(k, v.toDevice().index()), true;
  }
  if (v.isList()) {
    auto l = v.toList();
    put_i(k, static_cast<int64_t>(l.size()));
    for (const c10::IValue& e : l)
      if (!put_value(k, e, scalar_values)) return false;
    return true;
  }
  if (v.isGenerator()) return true;  // generators do not shape outputs
  return false;
}

// ---- cached results ----

struct TensorSpec {
  bool defined = false;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::kFloat;
};
struct ReturnSpec {
  enum Kind { kNone, kTensor, kTensorList } kind = kNone;
  std::vector<TensorSpec> tensors;
};

std::mutex mu;
std::unordered_map<std::string, std::vector<ReturnSpec>> cache;  // guarded by mu

TensorSpec spec_of(const at::Tensor& t) {
  TensorSpec s;
  s.defined = t.defined();
  if (s.defined) {
    s.sizes = t.sizes().vec();
    s.strides = t.strides().vec();
    s.dtype = t.scalar_type();
  }
  return s;
}

at::Tensor meta_tensor(const TensorSpec& s) {
  if (!s.defined) return at::Tensor();
  return at::empty_strided(s.sizes, s.strides, at::TensorOptions().dtype(s.dtype).device(c10::kMeta));
}

// tpu tensors become meta tensors. So do CPU 0-d tensors (not wrapped Python numbers): CUDA and
// TensorIterator accept them beside device tensors in any position, but PyTorch's Python meta
// kernels for out= variants check that an input on another device than `out` is not the
// first argument ("copy from device cpu to device meta"). As a meta 0-d tensor it promotes
// exactly as the CPU one does (dim-0 tensors promote by category whatever their device).
at::Tensor meta_like(const at::Tensor& t) {
  if (!t.defined()) return t;
  const bool cpu_scalar = t.device().type() == c10::DeviceType::CPU && t.dim() == 0 &&
                          !t.unsafeGetTensorImpl()->is_wrapped_number();
  if (t.device().type() != c10::DeviceType::PrivateUse1 && !cpu_scalar) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

}  // namespace

namespace {
thread_local int meta_depth = 0;
struct InMetaKernel {
  InMetaKernel() { meta_depth++; }
  ~InMetaKernel() { meta_depth--; }
};
}  // namespace

bool in_meta_kernel() { return meta_depth > 0; }

std::optional<std::vector<c10::IValue>> meta_returns(const c10::OperatorHandle& op,
                                                     const torch::jit::Stack& args) {
  std::string key;
  key.reserve(256);
  const void* opid = &op.schema();
  put(key, &opid, sizeof opid);
  // Output dtypes follow torch.get_default_dtype() wherever a dtype is left out: factories
  // without dtype= (arange with float bounds, full, randn, linspace) and the promotion of an
  // integer tensor with a Python float. It is part of every key (one int; the ops it does not
  // concern just get one entry per default dtype used).
  put_i(key, static_cast<int64_t>(c10::typeMetaToScalarType(at::get_default_dtype())));
  bool cacheable = true;
  // A _foreach_* op's outputs mirror its tensor lists whatever its scalars are; its scalars
  // (AdamW's bias-corrected step sizes) change every step, so their values stay out of the
  // key there. Elsewhere they may shape the output (arange's length) and are part of it.
  const bool scalar_values = op.schema().name().rfind("aten::_foreach_", 0) != 0;
  for (const c10::IValue& v : args) cacheable = cacheable && put_value(key, v, scalar_values);
  if (cacheable) {
    std::lock_guard<std::mutex> g(mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      std::vector<c10::IValue> out;
      for (const ReturnSpec& r : it->second) {
        if (r.kind == ReturnSpec::kNone) {
          out.emplace_back();
        } else if (r.kind == ReturnSpec::kTensor) {
          out.emplace_back(meta_tensor(r.tensors[0]));
        } else {
          c10::List<at::Tensor> l;
          for (const TensorSpec& s : r.tensors) l.push_back(meta_tensor(s));
          out.emplace_back(l);
        }
      }
      return out;
    }
  }
  torch::jit::Stack meta;
  meta.reserve(args.size());
  // A generator never shapes an output, and some Meta kernels are Python refs that refuse one
  // (torch._refs.exponential asserts generator is None), so the Meta call gets None in its
  // place; every random op's schema has it as `Generator?`. The device op keeps the generator.
  for (const c10::IValue& v : args)
    meta.push_back(v.isGenerator() ? c10::IValue()
                                   : map_tensors(v, meta_like, c10::Device(c10::kMeta)));
  try {
    InMetaKernel scope;
    op.callBoxed(&meta);
  } catch (const c10::NotImplementedError&) {
    return std::nullopt;
  }
  std::vector<ReturnSpec> specs;
  for (const c10::IValue& r : meta) {
    ReturnSpec s;
    if (r.isTensor()) {
      s.kind = ReturnSpec::kTensor;
      s.tensors.push_back(spec_of(r.toTensor()));
    } else if (r.isTensorList()) {
      s.kind = ReturnSpec::kTensorList;
      for (const at::Tensor& t : r.toTensorList()) s.tensors.push_back(spec_of(t));
    } else if (!r.isNone()) {
      cacheable = false;  // non-tensor returns: recompute every time
    }
    specs.push_back(std::move(s));
  }
  if (cacheable) {
    std::lock_guard<std::mutex> g(mu);
    cache.emplace(std::move(key), std::move(specs));
  }
  return std::vector<c10::IValue>(meta.begin(), meta.end());
}

}  // namespace torch_pjrt
