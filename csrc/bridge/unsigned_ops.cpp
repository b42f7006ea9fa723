// Which ops run lowered when one of PyTorch's "barebones" unsigned dtypes (uint16, uint32,
// uint64) takes part. StableHLO computes on them natively, so most lowerings would accept
// them, but CPU has kernels for only a few ops on them (add, lt, max, ... raise "not
// implemented for 'UInt16'"); tpu computes what CPU computes and raises where CPU raises. The
// table lists the ops whose CPU kernel takes these dtypes and whose lowering computes CPU's
// values (tests/test_unsigned_dtypes.py checks rows against CPU); any other op involving them
// goes to CPU's own kernel through the fallback, which computes what CPU computes or raises
// CPU's error. uint8 is an ordinary dtype, not one of these.
#include "bridge.h"

#include <ATen/ExpandUtils.h>
#include <ATen/core/function_schema.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/result_type.h>

namespace torch_pjrt {
namespace {

bool is_barebones_unsigned(at::ScalarType t) {
  return t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64;
}

// base_name()s of the ops lowered for these dtypes (in-place and out= forms share them) when
// they compute in one of them: CPU's kernels for these exist (index_select, masked_select,
// flip, add, lt, max, ... CPU refuses).
const char* const kLowered[] = {
    // data movement: copies and conversions (any dtype to and from them), views materialized
    "_to_copy", "_pj_copy", "copy", "clone", "cat", "index", "repeat", "roll", "fill", "zero",
    // the elementwise ops CPU has for them (div only without rounding_mode: div_rounding)
    "eq", "ne", "mul", "div", "bitwise_and", "bitwise_or", "bitwise_xor", "where",
    "ceil", "floor", "trunc",  // the identity on integers
    // reductions and sorting
    "sum", "prod", "cumsum", "any", "all", "equal", "isnan", "sort", "_unique2",
    // random_(from, to) only: see unsigned_goes_to_cpu
    "random",
};

// Elementwise ops whose CPU kernel is chosen by the operands' common dtype (TensorIterator):
// with a float operand (uint16 + 1.5, uint16 < float tensor) it is the float kernel, which
// CPU has; with an integer of another type CPU raises "Promotion for uint16, uint32, uint64
// types is not supported", which at::result_type raises here alike. The index of the first of
// the two operands in the schema (where's condition comes first).
struct Binary {
  const char* base;
  size_t first;
};
const Binary kBinary[] = {
    {"add", 0},       {"sub", 0},       {"rsub", 0},        {"mul", 0},       {"div", 0},
    {"eq", 0},        {"ne", 0},        {"lt", 0},          {"le", 0},        {"gt", 0},
    {"ge", 0},        {"maximum", 0},   {"minimum", 0},     {"fmax", 0},      {"fmin", 0},
    {"bitwise_and", 0}, {"bitwise_or", 0}, {"bitwise_xor", 0},
    {"pow", 0},       {"fmod", 0},      {"remainder", 0},   {"floor_divide", 0},
    {"hypot", 0},     {"where", 1},
    // no integer kernel on CPU ("igamma_cpu" not implemented for 'UInt16'): lowered only where
    // a float operand makes the common dtype float
    {"igamma", 0},    {"igammac", 0},
};

// Ops that compute in the default float dtype for integer inputs (CPU converts first and runs
// its float kernel): uint16.sin() and copysign(uint16, uint16) are float32 on CPU, as are the
// special functions of one tensor (torch.special.i1(uint32), polygamma(n, uint16)) and
// logsumexp (which converts integer input itself).
const char* const kIntToFloat[] = {
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "erf", "erfc", "erfinv",
    "exp", "exp2", "expm1", "log", "log10", "log1p", "log2", "reciprocal", "rsqrt", "sigmoid",
    "sin", "sinc", "sinh", "sqrt", "tan", "tanh", "lgamma", "digamma", "copysign", "atan2",
    "i0", "logit", "polygamma", "logsumexp", "special_airy_ai", "special_bessel_j0",
    "special_bessel_j1", "special_bessel_y0", "special_bessel_y1", "special_entr",
    "special_erfcx", "special_i0e", "special_i1", "special_i1e", "special_log_ndtr",
    "special_modified_bessel_i0", "special_modified_bessel_i1", "special_modified_bessel_k0",
    "special_modified_bessel_k1", "special_ndtr", "special_ndtri",
    "special_scaled_modified_bessel_k0", "special_scaled_modified_bessel_k1",
    "special_spherical_bessel_j0",
};

// Functions of two operands that compute in float32 for integer operands of one type on CPU,
// after its promotion check (an unsigned dtype with another integer type raises "Promotion
// for uint16, uint32, uint64 types is not supported"): the orthogonal polynomials (x, n),
// zeta, xlogy and xlog1py, each with a Scalar in either place too.
const char* const kBinaryIntToFloat[] = {
    "special_chebyshev_polynomial_t", "special_chebyshev_polynomial_u",
    "special_chebyshev_polynomial_v", "special_chebyshev_polynomial_w",
    "special_shifted_chebyshev_polynomial_t", "special_shifted_chebyshev_polynomial_u",
    "special_shifted_chebyshev_polynomial_v", "special_shifted_chebyshev_polynomial_w",
    "special_hermite_polynomial_h", "special_hermite_polynomial_he",
    "special_laguerre_polynomial_l", "special_legendre_polynomial_p",
    "special_zeta", "xlogy", "special_xlog1py",
};

bool in(const std::string& base, const char* const* names, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (base == names[i]) return true;
  return false;
}

// A Tensor or Scalar argument's part in at::result_type (a 0-d CPU tensor counts as a tensor).
bool operand(const c10::IValue& v) { return v.isTensor() || v.isScalar(); }

// The dtype the elementwise op computes in, by PyTorch's promotion (raising its errors).
at::ScalarType common_dtype(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTensor() && b.isTensor()) return at::result_type(a.toTensor(), b.toTensor());
  if (a.isTensor()) return at::result_type(a.toTensor(), b.toScalar());
  if (b.isTensor()) return at::result_type(b.toTensor(), a.toScalar());
  return at::result_type(a.toScalar(), b.toScalar());
}

// Whether a tensor or dtype argument of the call is a barebones unsigned dtype.
bool involves_unsigned(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  auto unsigned_dtype = [](at::ScalarType t) { return is_barebones_unsigned(t); };
  return any_arg_dtype(schema, args, unsigned_dtype, unsigned_dtype);
}

}  // namespace

bool unsigned_goes_to_cpu(const std::string& base, const c10::FunctionSchema& schema,
                          c10::ArrayRef<c10::IValue> args) {
  if (!involves_unsigned(schema, args)) return false;
  for (const Binary& b : kBinary) {
    if (base != b.base || args.size() < b.first + 2) continue;
    if (!operand(args[b.first]) || !operand(args[b.first + 1])) break;
    if (!is_barebones_unsigned(common_dtype(args[b.first], args[b.first + 1])))
      return false;  // CPU's kernel of the common (float) dtype
    break;
  }
  // cat computes in its tensors' common dtype (raising CPU's promotion error)
  if (base == "cat" && !args.empty() && args[0].isTensorList()) {
    const auto list = args[0].toTensorList();
    const std::vector<at::Tensor> tensors(list.begin(), list.end());
    at::native::result_type(tensors);
  }
  if (in(base, kIntToFloat, sizeof kIntToFloat / sizeof *kIntToFloat)) return false;
  if (in(base, kBinaryIntToFloat, sizeof kBinaryIntToFloat / sizeof *kBinaryIntToFloat)) {
    if (args.size() >= 2 && operand(args[0]) && operand(args[1])) common_dtype(args[0], args[1]);
    return false;
  }
  if (!in(base, kLowered, sizeof kLowered / sizeof *kLowered)) return true;
  // random_ with both bounds: CPU's from-to kernel takes these dtypes; random_() and
  // random_(from) (to=None) use kernels that do not ("random_kernel_cpu" not implemented)
  if (base == "random") {
    for (size_t i = 0; i < args.size() && i < schema.arguments().size(); i++)
      if (schema.arguments()[i].name() == "to" && args[i].isInt()) return false;
    return true;
  }
  // div with rounding_mode="floor"/"trunc": CPU has no kernel ("div_floor_cpu")
  if (base == "div") {
    for (size_t i = 0; i < args.size() && i < schema.arguments().size(); i++)
      if (schema.arguments()[i].name() == "rounding_mode" && args[i].isString()) return true;
  }
  return false;
}

}  // namespace torch_pjrt
