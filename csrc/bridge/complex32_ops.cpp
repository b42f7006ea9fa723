// torch.complex32 (ComplexHalf) on tpu. XLA has no complex element type of half parts, so the
// runtime never sees complex32: a complex32 tensor's storage holds float16 values, each
// element's (real, imag) pair side by side, exactly its bytes on CPU. The bridge presents a
// complex32 tensor to the runtime as that float16 view with a trailing dim of 2
// (complex_parts_view), so view_as_real / view_as_complex are metadata only, and every alias
// (views, dtype views) shares the same buffer.
//
// Ops: CPU has kernels for a few ops on complex32 (data movement, fills, add/sub/mul, eq/ne,
// abs, ...; the table below). Those run here in complex64, on complex64 copies of the complex32
// operands, and their complex32 results (and writes into complex32 destinations) are the
// complex64 values rounded to half, both parts: CUDA's way (opmath in float). A few ops whose
// meaning is per part run on the float16 pairs directly (fill_, zero_, normal_, uniform_ and
// complex()). Any other op involving complex32 goes to CPU's kernel through the fallback, which
// raises CPU's error (most have no complex32 kernel) or computes what CPU computes.
#include "bridge.h"

#include <ATen/core/function_schema.h>
#include <ATen/ExpandUtils.h>

#include <cmath>
#include <unordered_map>

#include "meta_cache.h"

namespace torch_pjrt {
namespace {

constexpr at::ScalarType kC32 = at::kComplexHalf;

enum How {
  kComplex64,  // computed in complex64, rounded back to complex32
  kFill,       // fill_ / fill: the value's two parts into the pairs
  kZero,       // zero_: zeros into the pairs
  kNormal,     // normal_: both parts N(mean, std^2 / 2), as CPU draws complex normals
  kUniform,    // uniform_: both parts U(from, to), as CPU draws complex uniforms
  kComplex,    // complex(real, imag) of float16 parts
};

struct Row {
  const char* base;  // base_name of the op (in-place and out= forms share it)
  How how;
  // kComplex64: the results' dtypes come from the Meta kernel, except for ops whose output
  // sizes depend on the values (no Meta kernel): their complex results take self's dtype
  bool by_meta = true;
};

// The ops CPU 2.13 computes on complex32 that reach the tpu kernel (composite ops such as
// clone, _to_copy, stack, outer or allclose reach it as these or as copies). tests/
// test_complex32.py checks that CPU computes each of them.
const Row kRows[] = {
    // arithmetic and comparisons CPU has complex32 kernels for
    {"add", kComplex64}, {"sub", kComplex64}, {"rsub", kComplex64}, {"mul", kComplex64},
    {"addcmul", kComplex64}, {"neg", kComplex64}, {"conj_physical", kComplex64},
    {"abs", kComplex64}, {"sgn", kComplex64}, {"eq", kComplex64}, {"ne", kComplex64},
    {"isnan", kComplex64}, {"any", kComplex64}, {"all", kComplex64},
    {"linalg_vector_norm", kComplex64}, {"var", kComplex64}, {"std", kComplex64},
    {"var_mean", kComplex64}, {"std_mean", kComplex64},
    // data movement
    {"copy", kComplex64}, {"clone", kComplex64}, {"cat", kComplex64}, {"stack", kComplex64},
    {"where", kComplex64}, {"index", kComplex64, false}, {"index_select", kComplex64},
    {"masked_select", kComplex64, false}, {"nonzero", kComplex64, false}, {"roll", kComplex64},
    {"repeat", kComplex64}, {"index_put", kComplex64}, {"_index_put_impl", kComplex64},
    {"masked_fill", kComplex64}, {"index_fill", kComplex64}, {"index_copy", kComplex64},
    {"index_add", kComplex64}, {"constant_pad_nd", kComplex64}, {"tril", kComplex64},
    {"triu", kComplex64}, {"narrow_copy", kComplex64}, {"diag_embed", kComplex64},
    {"as_strided_scatter", kComplex64}, {"select_scatter", kComplex64},
    {"slice_scatter", kComplex64}, {"count_nonzero", kComplex64},
    // per part on the float16 pairs
    {"fill", kFill}, {"zero", kZero}, {"normal", kNormal}, {"uniform", kUniform},
    {"complex", kComplex},
};

const Row* find_row(const std::string& base) {
  for (const Row& r : kRows)
    if (base == r.base) return &r;
  return nullptr;
}

bool is_tpu(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// Whether the call involves complex32: a complex32 tensor, a complex32 dtype argument, or
// float16 parts of a complex32 result (complex, polar).
bool involves_c32(const std::string& base, const c10::FunctionSchema& schema,
                  c10::ArrayRef<c10::IValue> args) {
  const bool half_parts = base == "complex" || base == "polar";
  return any_arg_dtype(
      schema, args,
      [&](at::ScalarType t) { return t == kC32 || (half_parts && t == at::kHalf); },
      [](at::ScalarType t) { return t == kC32; });
}

// A tensor of `dt` on t's device with t's sizes: t's strides where they are dense and
// non-overlapping (as CPU's TensorIterator keeps a layout), else row-major.
at::Tensor empty_like_dtype(const at::Tensor& t, at::ScalarType dt) {
  if (t.is_non_overlapping_and_dense())
    return at::empty_strided(t.sizes(), t.strides(), t.options().dtype(dt));
  return at::empty(t.sizes(), t.options().dtype(dt));
}

// complex32 tensors widened to complex64 (one copy per distinct tensor of the call).
struct Widen {
  std::unordered_map<c10::TensorImpl*, at::Tensor> done;
  at::Tensor operator()(const at::Tensor& t) {
    if (!t.defined() || t.scalar_type() != kC32) return t;
    auto it = done.find(t.unsafeGetTensorImpl());
    if (it != done.end()) return it->second;
    at::Tensor w = is_tpu(t) ? complex32_widen(t) : t.to(at::kComplexFloat);
    done.emplace(t.unsafeGetTensorImpl(), w);
    return w;
  }
};

c10::IValue widen_value(const c10::IValue& v, const c10::Argument& arg, Widen& widen) {
  if (v.isTensor()) return widen(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorList()) l.push_back(widen(t));
    return l;
  }
  if (v.isList() && v.type()->containedType(0)->kind() == c10::TypeKind::OptionalType) {
    c10::List<std::optional<at::Tensor>> l;  // Tensor?[] (index's indices)
    for (const c10::IValue& e : v.toListRef())
      l.push_back(e.isTensor() ? std::optional<at::Tensor>(widen(e.toTensor())) : std::nullopt);
    return l;
  }
  if (v.isInt() && is_scalar_type_arg(arg) && static_cast<at::ScalarType>(v.toInt()) == kC32)
    return c10::IValue(static_cast<int64_t>(at::kComplexFloat));
  return v;
}

// A complex32 copy of a tpu complex tensor (its layout where dense), both parts rounded.
at::Tensor complex32_narrow(const at::Tensor& w) {
  at::Tensor out = empty_like_dtype(w, kC32);
  if (w.numel() > 0) complex_parts_view(out).copy_(complex_parts_view(w));
  return out;
}

// r with the dtype (and, where it applies, the layout) of the Meta kernel's result m.
at::Tensor like_meta(const at::Tensor& r, const at::Tensor& m) {
  if (!r.defined() || !m.defined() || r.scalar_type() == m.scalar_type()) return r;
  at::Tensor out = m.sizes().equals(r.sizes()) && m.is_non_overlapping_and_dense()
                       ? at::empty_strided(m.sizes(), m.strides(), r.options().dtype(m.scalar_type()))
                       : at::empty(r.sizes(), r.options().dtype(m.scalar_type()));
  out.copy_(r);
  return out;
}

c10::IValue like_meta_value(const c10::IValue& r, const c10::IValue* m) {
  if (!m) return r;
  if (r.isTensor() && m->isTensor()) return like_meta(r.toTensor(), m->toTensor());
  if (r.isTensorList() && m->isTensorList()) {
    auto rl = r.toTensorList();
    auto ml = m->toTensorList();
    if (rl.size() != ml.size()) return r;
    c10::List<at::Tensor> out;
    for (size_t i = 0; i < rl.size(); i++) out.push_back(like_meta(rl[i], ml[i]));
    return out;
  }
  return r;
}

// The op computed in complex64: every complex32 operand widened, every complex32 dtype argument
// complex64; complex32 destinations (in-place self, out=) receive the results rounded, and
// fresh results take the dtype the Meta kernel gives for the complex32 call (complex32 where
// CPU's result is complex32, float16 for abs). The Meta call first also raises CPU's errors
// for shapes and for results a destination's dtype cannot hold.
void run_in_complex64(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool by_meta) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  torch::jit::Stack args(stack->end() - n, stack->end());
  std::optional<std::vector<c10::IValue>> meta;
  if (by_meta) meta = meta_returns(op, args);
  const at::ScalarType self_dtype =
      n > 0 && args[0].isTensor() ? args[0].toTensor().scalar_type() : kC32;
  Widen widen;
  torch::jit::Stack wide;
  wide.reserve(n);
  for (size_t i = 0; i < n; i++) wide.push_back(widen_value(args[i], schema.arguments()[i], widen));
  op.callBoxed(&wide);
  // destinations: the widened copies' values go back into the complex32 tensors
  for (size_t i = 0; i < n; i++) {
    const c10::Argument& a = schema.arguments()[i];
    if (!a.alias_info() || !a.alias_info()->isWrite()) continue;
    std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
    if (args[i].isTensor()) {
      pairs.emplace_back(args[i].toTensor(), widen(args[i].toTensor()));
    } else if (args[i].isTensorList()) {
      for (const at::Tensor& t : args[i].toTensorList()) pairs.emplace_back(t, widen(t));
    }
    for (auto& [orig, w] : pairs) {
      if (!orig.defined() || orig.scalar_type() != kC32 || orig.is_same(w)) continue;
      if (!orig.sizes().equals(w.sizes())) orig.resize_(w.sizes());
      orig.copy_(w);
    }
  }
  std::vector<c10::IValue> out;
  for (size_t r = 0; r < schema.returns().size() && r < wide.size(); r++) {
    const c10::Argument& ret = schema.returns()[r];
    if (ret.alias_info() && ret.alias_info()->isWrite()) {  // returns a destination
      bool found = false;
      for (size_t a = 0; a < n && !found; a++) {
        const auto& ai = schema.arguments()[a].alias_info();
        if (ai && ai->beforeSets() == ret.alias_info()->beforeSets()) {
          out.push_back(args[a]);
          found = true;
        }
      }
      if (!found) out.push_back(wide[r]);
      continue;
    }
    if (!by_meta) {  // complex results in self's dtype
      const bool widened = wide[r].isTensor() && wide[r].toTensor().defined() &&
                           wide[r].toTensor().is_complex() && self_dtype == kC32;
      out.push_back(widened ? c10::IValue(complex32_narrow(wide[r].toTensor())) : wide[r]);
      continue;
    }
    out.push_back(like_meta_value(wide[r], meta && r < meta->size() ? &(*meta)[r] : nullptr));
  }
  torch::jit::drop(*stack, n);
  for (c10::IValue& v : out) stack->push_back(std::move(v));
}

// The tensor the op writes: self for in-place forms, else a new tensor like self (functional
// forms such as aten::fill).
at::Tensor target_of(const c10::FunctionSchema& schema, const at::Tensor& self) {
  const auto& ai = schema.arguments()[0].alias_info();
  if (ai && ai->isWrite()) return self;
  return empty_like_dtype(self, self.scalar_type());
}

void fill_c32(const c10::FunctionSchema& schema, torch::jit::Stack& args, at::Tensor& result) {
  const at::Tensor& self = args[0].toTensor();
  c10::Scalar v;
  if (args[1].isTensor()) {
    const at::Tensor& value = args[1].toTensor();
    TORCH_CHECK(value.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor "
                "with ", value.dim(), " dimensions.");
    v = value.item();
  } else {
    v = args[1].toScalar();
  }
  // CPU's conversion of the value to complex32, with its overflow check and message
  at::empty({self.numel() == 1 ? 1 : 2}, at::TensorOptions().dtype(kC32)).fill_(v);
  result = target_of(schema, self);
  // each part rounded to half as CPU converts the value (past half's range: inf, where a
  // float16 fill_ would raise its overflow error)
  const c10::complex<double> z = v.toComplexDouble();
  auto half = [](double x) {
    return static_cast<double>(static_cast<float>(c10::Half(static_cast<float>(x))));
  };
  at::Tensor parts = complex_parts_view(result);
  parts.select(-1, 0).fill_(half(z.real()));
  parts.select(-1, 1).fill_(half(z.imag()));
}

void complex_c32(const c10::OperatorHandle& op, torch::jit::Stack& args, at::Tensor& result) {
  // Meta's checks (matching float dtypes of the parts) and the result's sizes and layout
  const std::optional<std::vector<c10::IValue>> meta = meta_returns(op, args);
  const at::Tensor& re = args[0].toTensor();
  const at::Tensor& im = args[1].toTensor();
  TORCH_CHECK(re.scalar_type() == im.scalar_type(), "Expected object of scalar type ",
              re.scalar_type(), " but got scalar type ", im.scalar_type(),
              " for second argument");
  const auto& ai = op.schema().arguments().back().alias_info();
  if (ai && ai->isWrite()) {  // complex.out
    result = args.back().toTensor();
    const std::vector<int64_t> shape = at::infer_size(re.sizes(), im.sizes());
    if (!result.sizes().equals(shape)) result.resize_(shape);
  } else {
    TORCH_CHECK(meta && !meta->empty() && (*meta)[0].isTensor(), "complex: no output metadata");
    const at::Tensor& m = (*meta)[0].toTensor();
    result = at::empty_strided(m.sizes(), m.strides(), re.options().dtype(m.scalar_type()));
  }
  if (result.scalar_type() != kC32) {  // complex(half, half, out=complex64)
    at::Tensor parts = at::view_as_real(result);
    parts.select(-1, 0).copy_(re.expand(result.sizes()));
    parts.select(-1, 1).copy_(im.expand(result.sizes()));
    return;
  }
  at::Tensor parts = complex_parts_view(result);
  parts.select(-1, 0).copy_(re.expand(result.sizes()));
  parts.select(-1, 1).copy_(im.expand(result.sizes()));
}

std::optional<at::Generator> generator_arg(const torch::jit::Stack& args, size_t i) {
  if (i < args.size() && args[i].isGenerator()) return args[i].toGenerator();
  return std::nullopt;
}

}  // namespace

at::Tensor complex_parts_view(const at::Tensor& t) {
  TORCH_CHECK(t.is_complex(), "complex_parts_view of a ", t.scalar_type(), " tensor");
  auto keys = t.key_set().remove(c10::DispatchKey::Conjugate).remove(c10::DispatchKey::Negative);
  const at::ScalarType part = c10::toRealValueType(t.scalar_type());
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), keys,
                                                      c10::scalarTypeToTypeMeta(part));
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  std::vector<int64_t> strides;
  strides.reserve(sizes.size() + 1);
  for (int64_t s : t.strides()) strides.push_back(2 * s);
  sizes.push_back(2);
  strides.push_back(1);
  out.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, 2 * t.storage_offset());
  return out;
}

at::Tensor complex32_widen(const at::Tensor& t) {
  at::Tensor w = empty_like_dtype(t, at::kComplexFloat);
  if (t.numel() == 0) return w;
  complex_parts_view(w).copy_(complex_parts_view(t));
  if (t.is_conj()) complex_parts_view(w).select(-1, 1).neg_();
  if (t.is_neg()) complex_parts_view(w).neg_();
  return w;
}

void complex32_device_copy(const at::Tensor& src, const at::Tensor& dst) {
  const at::Tensor s = src.expand(dst.sizes());
  if (dst.is_complex() && s.is_complex()) {
    complex_parts_view(dst).copy_(complex_parts_view(s));
  } else if (dst.is_complex()) {  // real to complex32: the imaginary parts are zeros
    at::Tensor parts = complex_parts_view(dst);
    parts.select(-1, 0).copy_(s);
    parts.select(-1, 1).zero_();
  } else {  // complex32 to real: the real parts, as CPU casts
    dst.copy_(complex_parts_view(s).select(-1, 0));
  }
}

Complex32Call complex32_call(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                             const std::string& base) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  {
    const auto args = torch::jit::last(*stack, n);
    if (!involves_c32(base, schema, args)) return Complex32Call::kNotInvolved;
  }
  const Row* row = find_row(base);
  if (!row) {
    // CPU's refusals of complex operands that raise another error than its missing kernels'
    // (sort, topk, maximum, clamp, ...), before the call goes to CPU's kernel
    cpu_kernel_checks(base, schema, torch::jit::last(*stack, n).vec());
    return Complex32Call::kToCpu;
  }
  if (row->how == kComplex64) {
    run_in_complex64(op, stack, row->by_meta);
    return Complex32Call::kDone;
  }
  // The per-part forms handle a complex32 self of the schema named; the other overloads (a
  // complex32 fill value for a real self, normal's functional forms) go to CPU's kernel.
  const std::string name = schema.name();
  torch::jit::Stack args(stack->end() - n, stack->end());
  const bool c32_self = n > 0 && args[0].isTensor() && args[0].toTensor().scalar_type() == kC32;
  if ((row->how == kNormal && name != "aten::normal_") ||
      (row->how == kUniform && name != "aten::uniform_") ||
      (row->how != kComplex && !c32_self))
    return Complex32Call::kToCpu;
  at::Tensor result;
  switch (row->how) {
    case kFill:
      fill_c32(schema, args, result);
      break;
    case kZero:
      result = target_of(schema, args[0].toTensor());
      complex_parts_view(result).zero_();
      break;
    case kNormal: {  // normal_(self, mean, std, generator)
      result = args[0].toTensor();
      const double mean = args[1].toDouble(), sd = args[2].toDouble();
      TORCH_CHECK(sd >= 0.0, "normal expects std >= 0.0, but found std ", sd);
      complex_parts_view(result).normal_(mean, sd / std::sqrt(2.0), generator_arg(args, 3));
      break;
    }
    case kUniform:  // uniform_(self, from, to, generator)
      result = args[0].toTensor();
      complex_parts_view(result).uniform_(args[1].toDouble(), args[2].toDouble(),
                                          generator_arg(args, 3));
      break;
    case kComplex:
      complex_c32(op, args, result);
      break;
    case kComplex64:
      break;
  }
  torch::jit::drop(*stack, n);
  stack->push_back(result);
  return Complex32Call::kDone;
}

}  // namespace torch_pjrt
