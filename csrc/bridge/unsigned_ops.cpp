// Which ops run lowered when one of PyTorch's "barebones" unsigned dtypes (uint16, uint32,
// uint64) takes part. StableHLO computes on them natively, so most lowerings would accept
// them, but CPU has kernels for only a few ops on them (add, lt, max, ... raise "not
// implemented for 'UInt16'"); tpu computes what CPU computes and raises where CPU raises. The
// table lists the ops whose CPU kernel takes these dtypes and whose lowering computes CPU's
// values (tests/test_unsigned_dtypes.py checks rows against CPU); any other op involving them
// goes to CPU's own kernel through the fallback, which computes what CPU computes or raises
// CPU's error. uint8 is an ordinary dtype, not one of these.
#include "bridge.h"

#include <ATen/core/function_schema.h>

#include <cstring>

namespace torch_pjrt {
namespace {

bool is_barebones_unsigned(at::ScalarType t) {
  return t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64;
}

// base_name()s of the ops lowered for these dtypes (in-place and out= forms share them).
const char* const kLowered[] = {
    // data movement: copies and conversions (any dtype to and from them), views materialized
    "_to_copy", "_pj_copy", "copy", "clone", "cat", "index", "index_select", "repeat",
    "fill", "zero", "masked_select",
    // the comparisons CPU has for them (lt, gt, ... it has not)
    "eq", "ne", "equal",
    // the arithmetic CPU has for them (add and sub it has not)
    "mul", "div", "bitwise_and", "bitwise_or", "bitwise_xor",
    // reductions CPU has for them
    "sum", "prod", "cumsum", "any", "all",
    "isnan",
};

// Whether a tensor or dtype argument of the call is a barebones unsigned dtype.
bool involves_unsigned(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  auto of_tensor = [](const at::Tensor& t) {
    return t.defined() && is_barebones_unsigned(t.scalar_type());
  };
  for (size_t i = 0; i < args.size(); i++) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      if (of_tensor(v.toTensor())) return true;
    } else if (v.isList()) {  // Tensor[] and Tensor?[] (no copy of the list)
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor() && of_tensor(e.toTensor())) return true;
    } else if (v.isInt() && i < schema.arguments().size()) {
      // a ScalarType argument (dtype=) arrives as an int
      const c10::TypePtr& ty = schema.arguments()[i].real_type();
      const bool scalar_type = ty->kind() == c10::TypeKind::ScalarTypeType ||
                               (ty->kind() == c10::TypeKind::OptionalType &&
                                ty->containedType(0)->kind() == c10::TypeKind::ScalarTypeType);
      if (scalar_type && is_barebones_unsigned(static_cast<at::ScalarType>(v.toInt())))
        return true;
    }
  }
  return false;
}

}  // namespace

bool unsigned_goes_to_cpu(const std::string& base, const c10::FunctionSchema& schema,
                          c10::ArrayRef<c10::IValue> args) {
  if (!involves_unsigned(schema, args)) return false;
  for (const char* name : kLowered)
    if (base == name) return false;
  return true;
}

}  // namespace torch_pjrt
