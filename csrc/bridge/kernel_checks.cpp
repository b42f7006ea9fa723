// Argument checks that CPU's kernels make and PyTorch's Meta kernels (which give tpu its output
// metadata) do not: run before an op is run or recorded, so every eager mode raises CPU's error
// at the call. Without them Strict raised another message from the lowering, and
// defer_and_fuse raised it at the next flush, on an unrelated line (fuzz finding F9).
#include "bridge.h"
#include "call_builder.h"
#include "meta_cache.h"
#include "../ops/random.h"

#include <ATen/Dispatch_v2.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/function_schema.h>
#include <torch/headeronly/version.h>  // TORCH_VERSION_MINOR

#include <algorithm>
#include <cmath>
#include <mutex>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch_pjrt {
namespace {

const at::Tensor* tensor_arg(const torch::jit::Stack& args, size_t i) {
  return i < args.size() && args[i].isTensor() && args[i].toTensor().defined()
             ? &args[i].toTensor()
             : nullptr;
}

// The call's argument named `name` (the stack holds the schema's arguments last), or nullptr.
const c10::IValue* named_arg(const c10::FunctionSchema& schema, const torch::jit::Stack& args,
                             const char* name) {
  const size_t nargs = schema.arguments().size();
  if (args.size() < nargs) return nullptr;
  const size_t first = args.size() - nargs;
  for (size_t a = 0; a < nargs; a++)
    if (schema.arguments()[a].name() == name) return &args[first + a];
  return nullptr;
}

// The defined tensor argument named `name`, or nullptr.
const at::Tensor* named_tensor(const c10::FunctionSchema& schema, const torch::jit::Stack& args,
                               const char* name) {
  const c10::IValue* v = named_arg(schema, args, name);
  return v && v->isTensor() && v->toTensor().defined() ? &v->toTensor() : nullptr;
}

// CPU's bmm / baddbmm kernels: "expected scalar type A but found B".
void same_scalar_type(const at::Tensor* a, const at::Tensor* b) {
  if (a && b)
    TORCH_CHECK(a->scalar_type() == b->scalar_type(), "expected scalar type ", a->scalar_type(),
                " but found ", b->scalar_type());
}

// CPU's bitwise kernels exist for integer types (and bool, except the shifts): any other
// result type is CPU's NotImplementedError ("lshift_cpu" not implemented for 'Float'), raised
// before the Meta kernel, whose own check for << and >> is a RuntimeError. Their
// TensorIterator's overlap checks come before both (x[:-1] <<= x[1:] of a float x is refused
// for the overlap on CPU), and so before this check here too.
void bitwise_dtype_check(const std::string& base, const c10::FunctionSchema& schema,
                         const torch::jit::Stack& args) {
  iterator_overlap_checks(schema, args);
  const bool shift = base.find("shift") != std::string::npos;
  const bool left = base == "bitwise_left_shift" || base == "__lshift__" || base == "__ilshift__";
  const c10::IValue* a = args.size() > 0 ? &args[0] : nullptr;
  const c10::IValue* b = args.size() > 1 && (args[1].isTensor() || args[1].isScalar())
                             ? &args[1] : nullptr;
  if (!a || !(a->isTensor() || a->isScalar())) return;
  if (a->isTensor() && !a->toTensor().defined()) return;
  c10::ScalarType t;
  if (!b) {
    if (!a->isTensor()) return;
    t = a->toTensor().scalar_type();
  } else if (a->isTensor() && b->isTensor()) {
    t = at::result_type(a->toTensor(), b->toTensor());
  } else if (a->isTensor()) {
    t = at::result_type(a->toTensor(), b->toScalar());
  } else if (b->isTensor()) {
    t = at::result_type(a->toScalar(), b->toTensor());
  } else {
    return;
  }
  // an in-place form first checks, as CPU does, that the result type fits self
  const auto& self = schema.arguments()[0];
  if (a->isTensor() && self.alias_info() && self.alias_info()->isWrite())
    TORCH_CHECK(c10::canCast(t, a->toTensor().scalar_type()), "result type ", t,
                " can't be cast to the desired output type ", a->toTensor().scalar_type());
  const bool ok = c10::isIntegralType(t, /*includeBool=*/!shift);
  const std::string kernel = shift ? (left ? "lshift" : "rshift") : base;
  TORCH_CHECK_NOT_IMPLEMENTED(ok, "\"", kernel, "_tpu\" not implemented for '", c10::toString(t),
                              "'");
}

// CPU's fill kernels convert their Scalar to the element type with a checked conversion:
// "value cannot be converted to type int8_t without overflow" (torch.full((2,), 1000,
// dtype=torch.int8), x.fill_(1e10) of a float16 x). The lowering takes the value as a 0-d
// argument of the element type, which wraps or saturates silently, so the check is made here.
// CPU's masked_fill kernel takes bool masks only (its Meta kernel takes uint8 ones too; a
// uint8 mask also reaches it from index_put's masked_fill_ path, view_index_put.cpp). A value
// tensor of rank > 0 is refused first, by the Meta kernel's own check as on CPU. The dtype is
// printed as its type name ("unsigned char"), as CPU prints it.
void masked_fill_mask_check(const torch::jit::Stack& args) {
  const at::Tensor* mask = tensor_arg(args, 1);
  if (!mask || (args.size() > 2 && args[2].isTensor() && args[2].toTensor().dim() != 0)) return;
  TORCH_CHECK(mask->scalar_type() == at::kBool,
              "masked_fill_ only supports boolean masks, but got mask with dtype ", mask->dtype());
}

bool is_fill(const std::string& base) {
  return base == "fill" || base == "masked_fill" || base == "index_fill" || base == "full" ||
         base == "new_full" || base == "full_like";
}

void fill_value_check(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const size_t nargs = schema.arguments().size();
  if (args.size() < nargs) return;
  const size_t first = args.size() - nargs;
  const c10::IValue* value = nullptr;
  std::optional<c10::ScalarType> dtype;
  for (size_t a = 0; a < nargs; a++) {
    const std::string& name = schema.arguments()[a].name();
    const c10::IValue& v = args[first + a];
    if ((name == "value" || name == "fill_value") && v.isScalar()) value = &v;
    if (name == "dtype" && v.isInt()) dtype = static_cast<c10::ScalarType>(v.toInt());
    if (name == "self" && !dtype && v.isTensor() && v.toTensor().defined())
      dtype = v.toTensor().scalar_type();
  }
  if (!value || !dtype) return;  // full without a dtype takes the value's own type: it fits
  // the standard types only: float8 fills have their own check (lowp_ops.cpp's fill_check)
  const c10::ScalarType t = *dtype;
  if (!(c10::isIntegralType(t, /*includeBool=*/true) && !c10::isBarebonesUnsignedType(t)) &&
      !c10::isComplexType(t) && t != c10::kFloat && t != c10::kDouble && t != c10::kHalf &&
      t != c10::kBFloat16)
    return;
  const c10::Scalar s = value->toScalar();
  AT_DISPATCH_V2(*dtype, "fill_value_check", AT_WRAP([&] { (void)s.to<scalar_t>(); }),
                 AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), c10::kBool, c10::kHalf, c10::kBFloat16);
}

// CPU's index_fill_ refuses a complex value for a self that is not complex, before converting
// it (so before the overflow check above, which would otherwise name the conversion) and for
// bool self too (where the conversion has no overflow check). The Tensor overload takes the
// 0-d value's item(), a complex Scalar exactly when the tensor is complex, so its dtype decides
// without reading it. Left to the other checks: a value tensor of rank > 0 (the Meta kernel's
// error comes first on CPU) and an index that is not int64 (CPU checks the index first).
// index_fill (functional) is index_fill_ on a clone on CPU, so it names index_fill_ too.
void index_fill_complex_check(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const at::Tensor* self = named_tensor(schema, args, "self");
  const at::Tensor* index = named_tensor(schema, args, "index");
  const c10::IValue* value = named_arg(schema, args, "value");
  if (!self || !index || !value || self->is_complex() || index->scalar_type() != at::kLong)
    return;
  bool complex = false;
  if (value->isScalar()) {
    complex = value->toScalar().isComplex();
  } else if (value->isTensor() && value->toTensor().defined()) {
    const at::Tensor& v = value->toTensor();
    complex = v.dim() == 0 && v.is_complex();
  }
  TORCH_CHECK(!complex,
              "index_fill_(): Converting complex Scalar to non-complex type is not supported");
}

// CPU's index_fill_ makes its own overlap checks, in place of TensorIterator's (it turns those
// off), after its index dtype check and before the complex-value check: the index may not
// share memory with self at all (assert_no_overlap: a full overlap is refused too, where
// TensorIterator accepts one), and a self with internal overlap (an expanded tensor) only
// draws a deprecation warning; the fill then writes every element through its one location.
// The functional index_fill fills a fresh clone, so neither applies to it.
void index_fill_overlap_check(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  if (schema.name() != "aten::index_fill_") return;
  const at::Tensor* self = named_tensor(schema, args, "self");
  const at::Tensor* index = named_tensor(schema, args, "index");
  if (!self || !index || index->scalar_type() != at::kLong) return;
  at::assert_no_overlap(*self, *index);
  if (at::has_internal_overlap(*self) == at::MemOverlap::Yes)
    TORCH_WARN("Use of index_fill_ on expanded tensors is deprecated. "
               "Please clone() the tensor before performing this operation. "
               "This also applies to advanced indexing e.g. tensor[mask] = scalar");
}

// CPU's masked_fill_ makes its own overlap checks in place of TensorIterator's (it turns
// those off), after the mask's dtype check (masked_fill_mask_check): a self with internal
// overlap (an expanded tensor) only draws a deprecation warning, the fill then writes every
// element through its one location (view_index_put.cpp, masked_fill_expanded), and the mask
// may not partially overlap self (a full overlap, b.masked_fill_(b, v), is fine). The value
// is read first (a 0-d value tensor's item()), so it may overlap self. A value tensor of rank
// > 0 is the Meta kernel's error, first on CPU: nothing is checked here for it. The functional
// masked_fill fills a fresh clone, so neither applies to it.
void masked_fill_overlap_check(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  if (schema.name() != "aten::masked_fill_" || args.size() < 3) return;
  const size_t first = args.size() - 3;
  const at::Tensor* self = tensor_arg(args, first);
  const at::Tensor* mask = tensor_arg(args, first + 1);
  const c10::IValue& value = args[first + 2];
  if (!self || !mask || mask->scalar_type() != at::kBool) return;
  if (value.isTensor() && value.toTensor().defined() && value.toTensor().dim() != 0) return;
  if (at::has_internal_overlap(*self) == at::MemOverlap::Yes)
    TORCH_WARN("Use of masked_fill_ on expanded tensors is deprecated. "
               "Please clone() the tensor before performing this operation. "
               "This also applies to advanced indexing e.g. tensor[mask] = scalar");
  at::assert_no_partial_overlap(*self, *mask);
}

// CPU's put_(self, index, source, accumulate) checks, in this order, after its nondeterminism
// alert: an int64 index, source of self's dtype, as many source elements as indices (an
// IndexError), no indices into an empty self (IndexError), then self without internal overlap
// and sharing no memory with index or source (assert_no_overlap: a full overlap,
// ind.put_(ind, ind), is refused too, where TensorIterator's check accepts it). The Meta
// kernel checks none of these: the lowering converted another dtype silently and failed to
// compile on a count mismatch. The functional put is put_ on a fresh clone on CPU: the same
// checks and words ("put_():"), the overlap ones aside. The device check between them is
// left to the general path (a CPU 0-d source is taken, as before).
void put_checks(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const bool in_place = schema.name() == "aten::put_";
  if ((!in_place && schema.name() != "aten::put") || args.size() < 4) return;
  const size_t first = args.size() - 4;
  const at::Tensor* self = tensor_arg(args, first);
  const at::Tensor* index = tensor_arg(args, first + 1);
  const at::Tensor* source = tensor_arg(args, first + 2);
  if (!self || !index || !source) return;
  TORCH_CHECK(index->scalar_type() == at::kLong,
              "put_(): Expected a long tensor for index, but got ", index->scalar_type());
  TORCH_CHECK(self->scalar_type() == source->scalar_type(),
              "put_(): self and source expected to have the same dtype, but got self.dtype = ",
              self->scalar_type(), " and source.dtype = ", source->scalar_type());
  TORCH_CHECK_INDEX(source->numel() == index->numel(),
                    "put_(): Expected source and index to have the same number of elements, but "
                    "got source.numel() = ", source->numel(), ", index.numel() = ",
                    index->numel());
  TORCH_CHECK_INDEX(!(self->numel() == 0 && index->numel() != 0),
                    "put_(): Tried to put elements into an empty tensor");
  if (!in_place) return;
  at::assert_no_internal_overlap(*self);
  at::assert_no_overlap(*self, *index);
  at::assert_no_overlap(*self, *source);
}

// CPU's index_fill_ wraps dim after the checks above (a 0-d self counts as rank 1), with
// PyTorch's IndexError; the Meta kernel would raise Python's own list-index error instead.
void index_fill_dim_check(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const at::Tensor* self = named_tensor(schema, args, "self");
  const at::Tensor* index = named_tensor(schema, args, "index");
  const c10::IValue* dim = named_arg(schema, args, "dim");
  if (!self || !index || !dim || !dim->isInt() || index->scalar_type() != at::kLong) return;
  (void)c10::maybe_wrap_dim(dim->toInt(), std::max<int64_t>(self->dim(), 1));
}

// The dtype an argument stands for in type promotion: a tensor's own, or a Scalar's category
// (a Python bool counts as a bool tensor, as CPU's wrapped_scalar_tensor makes it).
std::optional<c10::ScalarType> arg_type(const torch::jit::Stack& args, size_t i) {
  if (i >= args.size()) return std::nullopt;
  const c10::IValue& v = args[i];
  if (v.isTensor()) {
    if (!v.toTensor().defined()) return std::nullopt;
    return v.toTensor().scalar_type();
  }
  if (!v.isScalar()) return std::nullopt;
  const c10::Scalar s = v.toScalar();
  if (s.isBoolean()) return c10::kBool;
  if (s.isComplex()) return c10::kComplexDouble;
  return s.isFloatingPoint() ? c10::kDouble : c10::kLong;
}

// The type CPU's kernel dispatches on: the first two arguments' result type (one, for unary).
std::optional<c10::ScalarType> common_type(const torch::jit::Stack& args, bool binary) {
  const c10::IValue* a = args.size() > 0 ? &args[0] : nullptr;
  const c10::IValue* b = binary && args.size() > 1 ? &args[1] : nullptr;
  if (!a || !(a->isTensor() || a->isScalar())) return std::nullopt;
  if (a->isTensor() && !a->toTensor().defined()) return std::nullopt;
  if (!b || !(b->isTensor() || b->isScalar()) || (b->isTensor() && !b->toTensor().defined()))
    return arg_type(args, 0);
  if (a->isTensor() && b->isTensor()) return at::result_type(a->toTensor(), b->toTensor());
  if (a->isTensor()) return at::result_type(a->toTensor(), b->toScalar());
  if (b->isTensor()) return at::result_type(a->toScalar(), b->toTensor());
  return std::nullopt;
}

// Ops whose CPU kernels refuse complex tensors (no complex instantiation, or an explicit
// check in a C++ meta function that PyTorch's Python Meta kernels lack). Their lowerings
// would otherwise order complex numbers by their real parts (maximum, lt, cummax, clamp),
// compute a formula CPU does not define (hypot, xlogy, logit), fail in XLA's verifier with
// its own message (floor, erf) or crash (remainder). One row per op; its in-place and out=
// forms share the base name and the row.
struct ComplexRefusal {
  const char* base;
  const char* overloads;  // the overloads it covers, space-separated ("" is the default one);
                          // nullptr: all
  bool binary;            // CPU dispatches on the first two arguments' result type, else self's
  bool not_implemented;   // NotImplementedError (an AT_DISPATCH miss), else RuntimeError
  const char* message;    // an AT_DISPATCH miss names its kernel: "\"%s\" not implemented for
                          // '<type>'" then, with the kernel's name here
};

constexpr bool kBinary = true, kUnary = false, kNotImpl = true, kRuntime = false;

const ComplexRefusal kComplexRefusals[] = {
    {"maximum", nullptr, kBinary, kRuntime, "maximum not implemented for complex tensors."},
    {"minimum", nullptr, kBinary, kRuntime, "minimum not implemented for complex tensors."},
    {"fmax", nullptr, kBinary, kRuntime, "fmax not implemented for complex tensors."},
    {"fmin", nullptr, kBinary, kRuntime, "fmin not implemented for complex tensors."},
    {"max", "other out", kBinary, kRuntime, "maximum not implemented for complex tensors."},
    {"min", "other out", kBinary, kRuntime, "minimum not implemented for complex tensors."},
    {"max", "dim dim_max names_dim names_dim_max", kUnary, kRuntime,
     "max(): does not support complex input"},
    {"min", "dim dim_min names_dim names_dim_min", kUnary, kRuntime,
     "min(): does not support complex input"},
    {"max", " unary_out", kUnary, kNotImpl, "max_all"},
    {"min", " unary_out", kUnary, kNotImpl, "min_all"},
    {"argmax", nullptr, kUnary, kRuntime, "argmax(): does not support complex input"},
    {"argmin", nullptr, kUnary, kRuntime, "argmin(): does not support complex input"},
    {"amax", nullptr, kUnary, kNotImpl, "max_values_tpu"},
    {"amin", nullptr, kUnary, kNotImpl, "min_values_tpu"},
    {"aminmax", nullptr, kUnary, kNotImpl, "aminmax_tpu"},
    {"clamp", nullptr, kUnary, kNotImpl, "clamp is not supported for complex types"},
    {"clamp_min", " out", kUnary, kNotImpl, "clamp is not supported for complex types"},
    {"clamp_max", " out", kUnary, kNotImpl, "clamp is not supported for complex types"},
    {"clamp_min", "Tensor Tensor_out", kBinary, kNotImpl, "maximum_tpu"},
    {"clamp_max", "Tensor Tensor_out", kBinary, kNotImpl, "minimum_tpu"},
    {"cummax", nullptr, kUnary, kNotImpl, "cummax_tpu"},
    {"cummin", nullptr, kUnary, kNotImpl, "cummin_tpu"},
    {"_cummax_helper", nullptr, kUnary, kNotImpl, "cummax_tpu"},
    {"_cummin_helper", nullptr, kUnary, kNotImpl, "cummin_tpu"},
    {"lt", nullptr, kBinary, kNotImpl, "lt_tpu"},
    {"le", nullptr, kBinary, kNotImpl, "le_tpu"},
    {"gt", nullptr, kBinary, kNotImpl, "gt_tpu"},
    {"ge", nullptr, kBinary, kNotImpl, "ge_tpu"},
    {"sort", nullptr, kUnary, kRuntime, "Sort does not support complex dtypes on tpu"},
    {"topk", nullptr, kUnary, kRuntime, "topk does not support complex dtypes on tpu"},
    {"median", nullptr, kUnary, kNotImpl, "median_tpu"},
    {"nanmedian", nullptr, kUnary, kNotImpl, "median_tpu"},
    {"mode", nullptr, kUnary, kNotImpl, "mode_tpu"},
    {"searchsorted", nullptr, kBinary, kNotImpl, "searchsorted_out_tpu"},
    {"bucketize", nullptr, kBinary, kNotImpl, "searchsorted_out_tpu"},
    {"floor", nullptr, kUnary, kNotImpl, "floor is not supported for complex inputs"},
    {"ceil", nullptr, kUnary, kNotImpl, "ceil is not supported for complex inputs"},
    {"trunc", nullptr, kUnary, kNotImpl, "trunc is not supported for complex inputs"},
    {"sign", nullptr, kUnary, kNotImpl,
     "Unlike NumPy, torch.sign is not intended to support complex numbers. Please use "
     "torch.sgn instead."},
    {"signbit", nullptr, kUnary, kNotImpl, "signbit is not implemented for complex tensors."},
    {"remainder", nullptr, kBinary, kNotImpl, "remainder_tpu"},
    {"fmod", nullptr, kBinary, kNotImpl, "fmod_tpu"},
    {"floor_divide", nullptr, kBinary, kNotImpl, "div_floor_tpu"},
    {"atan2", nullptr, kBinary, kNotImpl, "atan2_tpu"},
    {"copysign", nullptr, kBinary, kNotImpl, "copysign_tpu"},
    {"hypot", nullptr, kBinary, kNotImpl, "hypot_tpu"},
    {"nextafter", nullptr, kBinary, kNotImpl, "nextafter_tpu"},
    {"xlogy", nullptr, kBinary, kNotImpl, "xlogy_tpu"},
    {"round", nullptr, kUnary, kNotImpl, "round_tpu"},
    {"erf", nullptr, kUnary, kNotImpl, "erf_tpu"},
    {"lgamma", nullptr, kUnary, kNotImpl, "lgamma_tpu"},
    {"digamma", nullptr, kUnary, kNotImpl, "digamma"},
    {"logit", nullptr, kUnary, kNotImpl, "logit_tpu"},
};

bool covers(const char* overloads, const std::string& overload) {
  if (!overloads) return true;
  // tokens separated by single spaces; a leading space stands for the default overload ""
  const std::string list = std::string(" ") + overloads + " ";
  if (overload.empty()) return overloads[0] == ' ';
  return list.find(" " + overload + " ") != std::string::npos;
}

void complex_refusals(const std::string& base, const c10::FunctionSchema& schema,
                      const torch::jit::Stack& args) {
  for (const ComplexRefusal& r : kComplexRefusals) {
    if (base != r.base || !covers(r.overloads, schema.overload_name())) continue;
    // CPU's clamp refuses a call without bounds first (its Meta kernel's error)
    if (base == "clamp" && args.size() > 2 && args[1].isNone() && args[2].isNone()) return;
    const std::optional<c10::ScalarType> t = common_type(args, r.binary);
    if (!t || !c10::isComplexType(*t)) return;
    if (!r.not_implemented) TORCH_CHECK(false, r.message);
    if (std::strstr(r.message, " ")) TORCH_CHECK_NOT_IMPLEMENTED(false, r.message);
    TORCH_CHECK_NOT_IMPLEMENTED(false, "\"", r.message, "\" not implemented for '",
                                c10::toString(*t), "'");
  }
  // div with a rounding mode is floor_divide or a truncating division, which CPU has no
  // complex kernel for either (without one, it is true division, defined for complex).
  if (base == "div") {
    for (size_t a = 0; a < schema.arguments().size() && a < args.size(); a++) {
      if (schema.arguments()[a].name() != "rounding_mode" || !args[a].isString()) continue;
      const std::string mode = args[a].toStringRef();
      const std::optional<c10::ScalarType> t = common_type(args, /*binary=*/true);
      TORCH_CHECK_NOT_IMPLEMENTED(!t || !c10::isComplexType(*t), "\"div_", mode,
                                  "_tpu\" not implemented for '", c10::toString(*t), "'");
    }
  }
}

// CPU's zero_numel_check_dims for the reductions that select an element along `dim` (their
// Python Meta kernels do not check it; the lowerings then built no result, or raised at the
// flush under DeferAndFuse with the op's name prefixed): IndexError
// "median(): Expected reduction dim 0 to have non-zero size." with the dim wrapped. nanmedian
// reports itself as median(), as CPU's shared kernel does.
void nonempty_dim_check(const std::string& base, const c10::FunctionSchema& schema,
                        const torch::jit::Stack& args) {
  static const char* const kNames[][2] = {{"median", "median()"}, {"nanmedian", "median()"},
                                          {"mode", "mode()"},     {"kthvalue", "kthvalue()"},
                                          {"max", "max()"},       {"min", "min()"}};
  const char* fn = nullptr;
  for (const auto& n : kNames)
    if (base == n[0]) fn = n[1];
  if (!fn) return;
  const at::Tensor* self = tensor_arg(args, 0);
  if (!self) return;
  // max() and min() without a dim: CPU's RuntimeError for an empty input
  if ((base == "max" || base == "min") &&
      (schema.overload_name().empty() || schema.overload_name() == "unary_out"))
    TORCH_CHECK(self->numel() != 0, fn,
                ": Expected reduction dim to be specified for input.numel() == 0. Specify the "
                "reduction dim with the 'dim' argument.");
  if (self->dim() == 0) return;  // a 0-d input has its own dim check
  for (size_t a = 0; a < schema.arguments().size() && a < args.size(); a++) {
    if (schema.arguments()[a].name() != "dim" || !args[a].isInt()) continue;
    const int64_t d = args[a].toInt(), n = self->dim();
    if (d < -n || d >= n) return;  // out of range: the Meta kernel's IndexError
    const int64_t w = d < 0 ? d + n : d;
    TORCH_CHECK_INDEX(self->size(w) != 0, fn, ": Expected reduction dim ", w,
                      " to have non-zero size.");
  }
}

// CPU's pow meta function refuses an integral base (bool included) with a negative integral
// Scalar exponent (NumPy's rule); the Python Meta kernel computes 1/x**n in integers instead.
void pow_check(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  for (size_t a = 0; a < schema.arguments().size() && a < args.size(); a++) {
    if (schema.arguments()[a].name() != "exponent" || !args[a].isScalar()) continue;
    const at::Tensor* self = tensor_arg(args, 0);
    const c10::Scalar e = args[a].toScalar();
    TORCH_CHECK(!(self && c10::isIntegralType(self->scalar_type(), /*includeBool=*/true) &&
                  e.isIntegral(/*includeBool=*/true) && e.toLong() < 0),
                "Integers to negative integer powers are not allowed.");
  }
}

// CPU's sub_check for sub and rsub (every overload; a Python bool counts as a bool tensor).
// The Meta kernels of the Scalar overloads do not make it; the lowering does (a backstop for
// captured graphs), but only at the flush under DeferAndFuse and with the op's name prefixed.
void sub_check(const torch::jit::Stack& args) {
  const std::optional<c10::ScalarType> a = arg_type(args, 0), b = arg_type(args, 1);
  if (!a || !b) return;
  TORCH_CHECK(*a != c10::kBool || *b != c10::kBool,
              "Subtraction, the `-` operator, with two bool tensors is not supported. Use the "
              "`^` or `logical_xor()` operator instead.");
  TORCH_CHECK(*a != c10::kBool && *b != c10::kBool,
              "Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
              "trying to invert a mask, use the `~` or `logical_not()` operator instead.");
}

bool is_bitwise(const std::string& base) {
  static const char* const names[] = {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
                                      "bitwise_left_shift", "bitwise_right_shift", "__lshift__",
                                      "__ilshift__", "__rshift__", "__irshift__"};
  for (const char* n : names)
    if (base == n) return true;
  return false;
}

// uniform_(from, to): CPU's checks, in its order, with its messages, before it looks at the
// tensor's size (an empty one is refused too). A complex tensor is drawn as its real view, so
// its part type is the one checked and named; an empty complex one passes every check on CPU
// (torch 2.13: any from and to are accepted), so it is not checked here either. from and to must lie within the dtype's finite
// range (so NaN and the infinities are out of bounds), from <= to, and to - from, computed in
// double, may not exceed the dtype's largest value (the width the kernel scales [0, 1) by).
// Other dtypes: CPU's NotImplementedError, naming the dtype as its dispatch macro does.
void uniform_check(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const auto self_i = schema.argumentIndexWithName("self");
  const auto from_i = schema.argumentIndexWithName("from");
  const auto to_i = schema.argumentIndexWithName("to");
  if (!self_i || !from_i || !to_i) return;
  const at::Tensor* self = tensor_arg(args, *self_i);
  if (!self || !args[*from_i].isDouble() || !args[*to_i].isDouble()) return;
  if (self->is_complex() && self->numel() == 0) return;
  const at::ScalarType st = c10::toRealValueType(self->scalar_type());
  TORCH_CHECK_NOT_IMPLEMENTED(st == c10::kFloat || st == c10::kDouble || st == c10::kHalf ||
                                  st == c10::kBFloat16,
                              "\"check_uniform_bounds\" not implemented for '",
                              c10::toString(st), "'");
  double lo = 0, hi = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(c10::kHalf, c10::kBFloat16, st, "check_uniform_bounds", [&] {
    lo = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
    hi = static_cast<double>(std::numeric_limits<scalar_t>::max());
  });
  const double from = args[*from_i].toDouble(), to = args[*to_i].toDouble();
  const caffe2::TypeMeta dtype = c10::scalarTypeToTypeMeta(st);
  TORCH_CHECK(from >= lo && from <= hi, "from is out of bounds for ", dtype);
  TORCH_CHECK(to >= lo && to <= hi, "to is out of bounds for ", dtype);
  TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from,
              " > to=", to);
  TORCH_CHECK(to - from <= hi, "uniform_ expects to-from <= std::numeric_limits<",
              c10::toString(st), ">::max(), but found to=", to, " and from=", from,
              " which result in to-from to exceed the limit");
}

// random_(from, to) / random_(to) / random_(from, None): CPU's bounds checks, in its order,
// with its messages (naming the C++ element type, as CPU prints the dtype's TypeMeta), and its
// precision warnings for float dtypes beyond +-2^digits. pj_random_bounds (csrc/ops/random.c)
// decides; a warning has to be issued here, on every call, since a lowering runs once per key.
void random_bounds_check(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const at::Tensor* self = tensor_arg(args, 0);
  if (!self) return;
  const auto from_i = schema.argumentIndexWithName("from");
  const auto to_i = schema.argumentIndexWithName("to");
  const size_t n = args.size();
  const bool has_from = from_i && static_cast<size_t>(*from_i) < n && args[*from_i].isInt();
  const bool has_to = to_i && static_cast<size_t>(*to_i) < n && args[*to_i].isInt();
  if (!has_from && !has_to) return;  // random_(): no checks
  pj_random_bounds_t rb;
  pj_random_bounds(to_pj_dtype(self->scalar_type()), has_from,
                   has_from ? args[*from_i].toInt() : 0, has_to, has_to ? args[*to_i].toInt() : 0,
                   &rb);
  const caffe2::TypeMeta dtype = self->dtype();
  switch (rb.check) {
    case PJ_RANDOM_OK:
    case PJ_RANDOM_BAD_DTYPE:  // the lowering's NotImplementedError
      break;
    case PJ_RANDOM_FROM_NOT_LESS:
      TORCH_CHECK(false, "random_ expects 'from' to be less than 'to', but got from=", rb.msg_a,
                  " >= to=", rb.msg_b);
    case PJ_RANDOM_CAST_FROM_NOT_LESS:
      TORCH_CHECK(false, "random_ expects 'from' casted to dtype to be less than 'to' casted to "
                  "dtype, but got from=", rb.msg_a, " >= to=", rb.msg_b);
    case PJ_RANDOM_CAST_FROM_TO_INC:
      TORCH_CHECK(false, "random_ expects 'from' casted to dtype to be less than or equal to "
                  "'to_inc' casted to dtype, but got from=", rb.msg_a, " > to_inc=", rb.msg_b);
    case PJ_RANDOM_FROM_OUT:
      TORCH_CHECK(false, "from is out of bounds for ", dtype);
    case PJ_RANDOM_TO_OUT:
      TORCH_CHECK(false, "to - 1 is out of bounds for ", dtype);
    case PJ_RANDOM_FULL_RANGE_DTYPE:  // raised by CPU's kernel, which an empty tensor skips
      if (self->numel() == 0) break;
      TORCH_CHECK(false, "random_full_64_bits_range_kernel_cpu handles only int64, double, float "
                  "and bfloat16");
    case PJ_RANDOM_FULL_RANGE_NO_KERNEL:
      if (self->numel() == 0) break;
      TORCH_CHECK_NOT_IMPLEMENTED(false, "\"random_full_64_bits_range_kernel_cpu\" not "
                                  "implemented for '", self->scalar_type(), "'");
  }
  const char* names[2] = {"from", "to - 1"};
  const bool warn[2] = {rb.warn_from, rb.warn_to};
  for (int i = 0; i < 2; i++)
    if (warn[i])
      TORCH_WARN(names[i], " is out of bounds [-(2^", rb.digits, "), 2^", rb.digits,
                 "]. Due to precision limitations ", dtype,
                 " can support discrete uniform distribution only within this range. This "
                 "warning will become an error in version 1.7 release, please fix the code in "
                 "advance");
}

// linspace / logspace (out= variants, where the composites end): CPU converts start and end
// to the result type with c10's checked conversion ("value cannot be converted to type int8_t
// without overflow"), and for 2 or more steps dispatches without bool. One step is CPU's
// fill_ of start (logspace: of pow(base, start) in double), checked the same way. Made here
// with c10's own conversions, so the messages and exception types are CPU's.
void range_value_checks(const std::string& base, const c10::FunctionSchema& schema,
                        const torch::jit::Stack& args) {
  const auto out_i = schema.argumentIndexWithName("out");
  const auto steps_i = schema.argumentIndexWithName("steps");
  const auto start_i = schema.argumentIndexWithName("start");
  const auto end_i = schema.argumentIndexWithName("end");
  if (!out_i || !steps_i || !start_i || !end_i) return;
  const at::Tensor* out = tensor_arg(args, *out_i);
  if (!out || !args[*steps_i].isInt() || !args[*start_i].isScalar() || !args[*end_i].isScalar())
    return;
  const int64_t n = args[*steps_i].toInt();
  const c10::Scalar start = args[*start_i].toScalar(), end = args[*end_i].toScalar();
  const at::ScalarType dt = out->scalar_type();
  if (n == 1) {
    c10::Scalar v = start;
    if (base == "logspace") {
      const auto b_i = schema.argumentIndexWithName("base");
      const double b = b_i && args[*b_i].isDouble() ? args[*b_i].toDouble() : 10.0;
      v = start.isComplex() || at::isComplexType(dt)
              ? c10::Scalar(std::pow(c10::complex<double>(b, 0.0),
                                     start.to<c10::complex<double>>()))
              : c10::Scalar(std::pow(b, start.to<double>()));
    }
    AT_DISPATCH_V2(dt, "fill_cpu", AT_WRAP([&] { (void)v.to<scalar_t>(); }),
                   AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kBool);
    return;
  }
  if (n < 2) return;
  auto convert_both = [&](auto tag) {
    using T = decltype(tag);
    (void)start.to<T>();
    (void)end.to<T>();
  };
  if (base == "linspace") {
    AT_DISPATCH_V2(dt, "linspace_cpu", AT_WRAP([&] { convert_both(scalar_t{}); }),
                   AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16);
  } else if (at::isComplexType(dt)) {
    AT_DISPATCH_V2(dt, "logspace_cpu", AT_WRAP([&] { convert_both(scalar_t{}); }),
                   AT_EXPAND(AT_COMPLEX_TYPES));
  } else {
    AT_DISPATCH_V2(dt, "logspace_cpu", AT_WRAP([&] { convert_both(scalar_t{}); }),
                   AT_EXPAND(AT_ALL_TYPES), at::kHalf, at::kBFloat16);
  }
}

}  // namespace

// CPU's arange / range checks, in its order and words: the step, then that both bounds are
// finite ("unsupported range: start -> end", printed in the accumulate type: float for half
// and bfloat16 results), then the step's sign, then (arange) the size. The Meta kernel (a
// Python reference) checks the sign first, which NaN bounds fail with the other message, and
// fails inside prims.iota on an overflowing size.
static void range_checks(const std::string& base, const c10::FunctionSchema& schema,
                         const torch::jit::Stack& args) {
  std::optional<double> start, end, step;
  const at::Tensor* out = nullptr;
  for (size_t i = 0; i < schema.arguments().size() && i < args.size(); i++) {
    const std::string& n = schema.arguments()[i].name();
    if (n == "out") out = tensor_arg(args, i);
    if (!args[i].isScalar()) continue;
    const double v = args[i].toScalar().toDouble();
    if (n == "start") start = v;
    else if (n == "end") end = v;
    else if (n == "step") step = v;
  }
  if (!end) return;
  const double lo = start.value_or(0), hi = *end, st = step.value_or(1);
  TORCH_CHECK(st > 0 || st < 0, "step must be nonzero");
  // range into an integer result takes the step as an integer: a fractional step below 1
  // truncates to 0 and range's size computation divides by it (SIGFPE on CPU, in PyTorch's own
  // code on tpu too): refused here instead of killing the process
  if (base == "range" && out && c10::isIntegralType(out->scalar_type(), /*includeBool=*/true))
    TORCH_CHECK(static_cast<int64_t>(st) != 0, "step must be nonzero");
  if (!std::isfinite(lo) || !std::isfinite(hi)) {
    const bool narrow = out && (out->scalar_type() == at::kHalf ||
                                out->scalar_type() == at::kBFloat16);
    if (narrow)
      TORCH_CHECK(false, "unsupported range: ", static_cast<float>(lo), " -> ",
                  static_cast<float>(hi));
    TORCH_CHECK(false, "unsupported range: ", lo, " -> ", hi);
  }
  TORCH_CHECK((st > 0 && hi >= lo) || (st < 0 && hi <= lo),
              "upper bound and lower bound inconsistent with step sign");
  if (base != "arange") return;  // (range has no size check of its own)
  const double size = std::ceil((hi - lo) / st);
  TORCH_CHECK(size >= 0 && size <= static_cast<double>(std::numeric_limits<int64_t>::max()),
              "invalid size, possible overflow?");
}

// CPU's randperm checks that n - 1 fits the result's dtype (integers: the checked conversion's
// message; float16 / float32 / float64: the largest n whose values are all exact).
static void randperm_checks(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  std::optional<int64_t> n;
  std::optional<at::ScalarType> dt;
  for (size_t i = 0; i < schema.arguments().size() && i < args.size(); i++) {
    const std::string& name = schema.arguments()[i].name();
    if (name == "n" && args[i].isInt()) n = args[i].toInt();
    if (name == "dtype" && args[i].isInt()) dt = static_cast<at::ScalarType>(args[i].toInt());
    if (name == "out" && !dt) {
      if (const at::Tensor* out = tensor_arg(args, i)) dt = out->scalar_type();
    }
  }
  if (!n || !dt || *n <= 0) return;
  const int64_t last = *n - 1;
  switch (*dt) {
    case at::kChar:
      TORCH_CHECK(last <= 127, "value cannot be converted to type int8_t without overflow");
      break;
    case at::kByte:
      TORCH_CHECK(last <= 255, "value cannot be converted to type uint8_t without overflow");
      break;
    case at::kShort:
      TORCH_CHECK(last <= 32767, "value cannot be converted to type int16_t without overflow");
      break;
    case at::kHalf:
      TORCH_CHECK(*n <= 2049, "n cannot be greater than 2049 for Half type.");
      break;
    case at::kFloat:
      TORCH_CHECK(*n <= (int64_t{1} << 24) + 1, "n cannot be greater than 2^24+1 for Float type.");
      break;
    case at::kDouble:
      TORCH_CHECK(*n <= (int64_t{1} << 53) + 1, "n cannot be greater than 2^53+1 for Double type.");
      break;
    default:
      break;
  }
}

// CPU's normal with a std tensor reads it ("normal expects all elements of std >= 0.0"), as
// CUDA's does: a host read of the tensor's minimum, so the check costs a synchronization.
static void normal_std_check(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const at::Tensor* std = nullptr;
  for (size_t i = 0; i < schema.arguments().size() && i < args.size(); i++)
    if (schema.arguments()[i].name() == "std") std = tensor_arg(args, i);
  if (!std || !std->defined() || std->numel() == 0 || std->is_complex()) return;
  TORCH_CHECK(std->min().ge(0).item<bool>(), "normal expects all elements of std >= 0.0");
}

// CPU's roll compares the lengths of shifts and dims before any dim is wrapped (the Meta kernel
// wraps them first and raises IndexError for an out-of-range one).
static void roll_checks(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const auto shifts_i = schema.argumentIndexWithName("shifts");
  const auto dims_i = schema.argumentIndexWithName("dims");
  if (!shifts_i || !dims_i || static_cast<size_t>(*dims_i) >= args.size() ||
      !args[*shifts_i].isIntList() || !args[*dims_i].isIntList())
    return;
  const size_t ns = args[*shifts_i].toIntList().size(), nd = args[*dims_i].toIntList().size();
  TORCH_CHECK(ns > 0, "`shifts` required");
  if (ns == 1 && nd == 0) return;  // a flattened roll
  TORCH_CHECK(ns == nd, "shifts and dimensions must align. shifts: ", ns, ", dims:", nd);
}

// CPU's fractional_max_pool{2,3}d kernels check random_samples against the input (its Meta
// kernel does not): same dtype, [N' >= N, C, nsp], N being 1 for an unbatched input. The
// lowering reads only the first N rows, as CPU's kernel does.
static void fractional_samples_check(const std::string& base, const c10::FunctionSchema& schema,
                                     const torch::jit::Stack& args) {
  const auto self_i = schema.argumentIndexWithName("self");
  const auto rs_i = schema.argumentIndexWithName("random_samples");
  if (!self_i || !rs_i) return;
  const at::Tensor *x = tensor_arg(args, *self_i), *rs = tensor_arg(args, *rs_i);
  if (!x || !rs) return;
  const int64_t nsp = base == "fractional_max_pool2d" ? 2 : 3;
  TORCH_CHECK(x->scalar_type() == rs->scalar_type(),
              "Expect _random_samples to have the same dtype as input");
  TORCH_CHECK(rs->dim() == 3, "Expect _random_samples to have 3 dimensions, got ", rs->dim());
  if (x->dim() < nsp + 1) return;  // the Meta kernel refuses the input's rank
  const bool batched = x->dim() == nsp + 2;
  const int64_t n = batched ? x->size(0) : 1, c = x->size(batched ? 1 : 0);
  TORCH_CHECK(rs->size(0) >= n, "Expect _random_samples.size(0) no less then input batch size.");
  TORCH_CHECK(rs->size(1) == c, "Expect _random_samples.size(1) equals to input channel size.");
  TORCH_CHECK(rs->size(2) == nsp, "Expect _random_samples.size(2) equals to ", nsp, "; got ",
              rs->size(2), ".");
}

void warn_complex_to_real(at::ScalarType src, at::ScalarType dst) {
  if (c10::isComplexType(src) && !c10::isComplexType(dst) && dst != at::kBool) {
    TORCH_WARN_ONCE("Casting complex values to real discards the imaginary part");
  }
}

void cpu_kernel_checks(const std::string& base, const c10::FunctionSchema& schema,
                       const torch::jit::Stack& args) {
  if (base == "arange" || base == "range") range_checks(base, schema, args);
  if (base == "randperm") randperm_checks(schema, args);
  if (base == "roll") roll_checks(schema, args);
  if (base == "normal") normal_std_check(schema, args);
  if (base == "fractional_max_pool2d" || base == "fractional_max_pool3d")
    fractional_samples_check(base, schema, args);
  // CPU's put_ alerts under torch.use_deterministic_algorithms(True) unless it accumulates
  // (which of two values written to one index lands is unspecified; XLA's scatter alike)
  if (base == "put" && args.size() > 3 && args[3].isBool() && !args[3].toBool())
    at::globalContext().alertNotDeterministic("put_");
  if (base == "put") put_checks(schema, args);
  // CPU's check_grid_sampler_common, before the Python Meta kernel unpacks the input's shape
  // (a 5-d input given to grid_sampler_2d raised its ValueError instead)
  if (base == "grid_sampler_2d" || base == "grid_sampler_3d") {
    const at::Tensor *input = tensor_arg(args, 0), *grid = tensor_arg(args, 1);
    if (input && grid && input->dim() > 0 && grid->dim() > 0)
      TORCH_CHECK(input->size(0) == grid->size(0),
                  "grid_sampler(): expected grid and input to have same batch size, but got "
                  "input with sizes ", input->sizes(), " and grid with sizes ", grid->sizes());
  }
  if (base == "_to_copy") {  // (self, *, dtype, ...)
    const at::Tensor* self = tensor_arg(args, 0);
    if (self && args.size() > 1 && args[1].isInt())
      warn_complex_to_real(self->scalar_type(), static_cast<at::ScalarType>(args[1].toInt()));
  }
  complex_refusals(base, schema, args);
  nonempty_dim_check(base, schema, args);
  if (base == "pow") pow_check(schema, args);
  if (base == "random") random_bounds_check(schema, args);
  if (base == "uniform") uniform_check(schema, args);
  if (base == "linspace" || base == "logspace") range_value_checks(base, schema, args);
  if (base == "sub" || base == "rsub") sub_check(args);
  if (is_bitwise(base)) {
    bitwise_dtype_check(base, schema, args);
  } else if (is_fill(base)) {
    if (base == "masked_fill") {
      masked_fill_mask_check(args);
      masked_fill_overlap_check(schema, args);
    }
    if (base == "index_fill") {
      index_fill_overlap_check(schema, args);
      index_fill_complex_check(schema, args);
      index_fill_dim_check(schema, args);
    }
    fill_value_check(schema, args);
  } else if (base == "masked_scatter") {
    // CPU's kernel (not its Meta kernel) refuses a uint8 mask, naming the dtype's enum name
    const at::Tensor* mask = tensor_arg(args, 1);
    if (mask)
      TORCH_CHECK(mask->scalar_type() == at::kBool,
                  "masked_scatter_ only supports boolean masks, but got mask with dtype ",
                  c10::toString(mask->scalar_type()));
  } else if (base == "mm") {
    const at::Tensor *a = tensor_arg(args, 0), *b = tensor_arg(args, 1);
    if (a && b)
      TORCH_CHECK(a->dtype() == b->dtype(), "expected m1 and m2 to have the same dtype, but got: ",
                  a->dtype(), " != ", b->dtype());
  } else if (base == "addmm") {
    // CPU's addmm: self against mat2 first, then mat1 against mat2
    const at::Tensor *self = tensor_arg(args, 0), *m1 = tensor_arg(args, 1),
                     *m2 = tensor_arg(args, 2);
    if (self && m2)
      TORCH_CHECK(self->scalar_type() == m2->scalar_type(),
                  "self and mat2 must have the same dtype, but got ", self->scalar_type(),
                  " and ", m2->scalar_type());
    if (m1 && m2)
      TORCH_CHECK(m1->scalar_type() == m2->scalar_type(),
                  "mat1 and mat2 must have the same dtype, but got ", m1->scalar_type(), " and ",
                  m2->scalar_type());
  } else if (base == "bmm") {
    same_scalar_type(tensor_arg(args, 0), tensor_arg(args, 1));
  } else if (base == "baddbmm" || base == "addbmm") {
    same_scalar_type(tensor_arg(args, 1), tensor_arg(args, 2));
    same_scalar_type(tensor_arg(args, 1), tensor_arg(args, 0));
  } else if (base == "convolution") {
    // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    const at::Tensor *w = tensor_arg(args, 1), *bias = tensor_arg(args, 2);
    if (w && bias && args.size() > 8 && args[6].isBool() && args[8].isInt()) {
      const bool transposed = args[6].toBool();
      const int64_t out = transposed ? w->size(1) * args[8].toInt() : w->size(0);
      TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out, "Given ",
                  transposed ? "transposed=1, " : "", "weight of size ", w->sizes(),
                  ", expected bias to be 1-dimensional with ", out,
                  " elements, but got bias of size ", bias->sizes(), " instead");
    }
  }
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 14
  // Before torch 2.14, CPU's group-norm kernel refuses inputs that are not dense in their
  // suggested layout (aten::group_norm makes its input dense first): same error here, although
  // the lowering could compute them. From 2.14 on CPU's kernel takes any layout and
  // aten::group_norm passes its input as it is, so the lowering reads the strided view.
  if (base == "native_group_norm") {
    if (const at::Tensor* x = tensor_arg(args, 0))
      TORCH_CHECK(x->is_contiguous(x->suggest_memory_format()),
                  "Expected X.is_contiguous(memory_format) to be true, but got false.");
  }
#endif
}

// CPU's advanced indexing (its AdvancedIndex setup, before any element is read or written and
// before index_put's value-shape check) refuses an indexed dim of size 0 when the broadcast
// index shape has no 0 in it: no number is a valid index there, whatever the values are. The
// device-side checks cannot see it when the result is empty (fuzz gap G3: index_put_ with
// accumulate into an empty tensor reported the value's shape instead). Checked here for the
// integer index tensors; with a bool mask among them (its nonzero count is not known without
// a sync) nothing is checked here, and a mask over a dim of size 0 has no true element anyway.
void advanced_index_checks(const std::string& base, const c10::FunctionSchema& schema,
                           const torch::jit::Stack& args) {
  if (base != "index" && base != "index_put" && base != "_index_put_impl" &&
      base != "_unsafe_index" && base != "_unsafe_index_put")
    return;
  const size_t nargs = schema.arguments().size();
  if (args.size() < nargs) return;
  const size_t first = args.size() - nargs;
  const at::Tensor* self = nullptr;
  const c10::IValue* indices = nullptr;
  for (size_t a = 0; a < nargs; a++) {
    const c10::IValue& v = args[first + a];
    if (schema.arguments()[a].name() == "self" && v.isTensor() && v.toTensor().defined())
      self = &v.toTensor();
    if (schema.arguments()[a].name() == "indices" && v.isList()) indices = &v;
  }
  if (!self || !indices) return;
  int64_t dim = 0;
  bool empty_dim = false;
  std::vector<int64_t> shape;  // the index tensors' broadcast shape
  for (const c10::IValue& e : indices->toListRef()) {
    if (!e.isTensor() || !e.toTensor().defined()) {
      dim++;
      continue;
    }
    const at::Tensor& t = e.toTensor();
    if (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte) return;
    if (dim >= self->dim()) return;  // too many indices: the other checks' error
    empty_dim = empty_dim || self->size(dim) == 0;
    dim++;
    const std::vector<int64_t> s = t.sizes().vec();
    if (shape.size() < s.size()) shape.insert(shape.begin(), s.size() - shape.size(), 1);
    for (size_t i = 0; i < s.size(); i++) {
      int64_t& b = shape[shape.size() - s.size() + i];
      if (b == 1) b = s[i];
      else if (s[i] != 1 && s[i] != b) return;  // no broadcast: the other checks' error
    }
  }
  if (!empty_dim) return;
  for (int64_t s : shape)
    if (s == 0) return;
  TORCH_CHECK_INDEX(false, "index is out of bounds for dimension with size 0");
}

}  // namespace torch_pjrt

namespace torch_pjrt {
namespace {

// The functional overload of an out= overload: the same name and the same arguments less the
// out= ones (add.out -> add.Tensor, sum.IntList_out -> sum.dim_IntList). Looked up by scanning
// the dispatcher's op names, so remembered per out= overload; error paths only.
std::optional<c10::OperatorHandle> functional_of(const c10::FunctionSchema& out) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::optional<c10::OperatorHandle>> memo;  // mu
  const std::string key = c10::toString(out.operator_name());
  std::lock_guard<std::mutex> g(mu);
  auto it = memo.find(key);
  if (it != memo.end()) return it->second;
  std::vector<const c10::Argument*> ins;
  for (const c10::Argument& a : out.arguments())
    if (!a.is_out()) ins.push_back(&a);
  std::optional<c10::OperatorHandle> found;
  auto& d = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : d.getAllOpNames()) {
    if (name.name != out.name() || name.overload_name == out.overload_name()) continue;
    auto op = d.findOp(name);
    if (!op || !op->hasSchema()) continue;
    const c10::FunctionSchema& f = op->schema();
    bool same = f.arguments().size() == ins.size();
    for (size_t i = 0; same && i < ins.size(); i++)
      same = f.arguments()[i].name() == ins[i]->name() &&
             *f.arguments()[i].type() == *ins[i]->type() && !f.arguments()[i].alias_info();
    if (same) {
      found = *op;
      break;
    }
  }
  memo.emplace(key, found);
  return found;
}

void collect(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
}

}  // namespace

// CPU's out= check: TensorIterator (and the reductions' out= helpers) refuse an out= tensor
// whose dtype the result type cannot be cast to, "result type Float can't be cast to the
// desired output type Long". PyTorch's Python Meta kernels (the refs' out_wrapper) refuse the
// same calls with their own message, "Attempting to cast from torch.float32 to out tensor ...",
// so when an out= call's Meta kernel has refused, the functional overload's Meta kernel gives
// the result types and, where one does not cast, CPU's message is raised instead. One check for
// every out= overload that has a functional twin; nothing on the path of a call that runs.
void out_dtype_checks(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const size_t nargs = schema.arguments().size();
  if (args.size() < nargs) return;
  const size_t first = args.size() - nargs;
  torch::jit::Stack ins;
  std::vector<at::Tensor> outs;
  for (size_t a = 0; a < nargs; a++) {
    if (schema.arguments()[a].is_out()) collect(args[first + a], outs);
    else ins.push_back(args[first + a]);
  }
  if (outs.empty()) return;
  const std::optional<c10::OperatorHandle> functional = functional_of(schema);
  if (!functional) return;
  std::optional<std::vector<c10::IValue>> rets;
  try {
    rets = meta_returns(*functional, ins);
  } catch (...) {
    return;  // the inputs themselves are refused: the out= call's own error stands
  }
  if (!rets) return;
  std::vector<at::Tensor> results;
  for (const c10::IValue& r : *rets) collect(r, results);
  for (size_t i = 0; i < outs.size() && i < results.size(); i++) {
    if (!outs[i].defined() || !results[i].defined()) continue;
    // CPU's ops with several outputs (max.dim_max, sort.values, ...) take exact dtypes only
    if (outs.size() > 1)
      TORCH_CHECK(results[i].scalar_type() == outs[i].scalar_type(),
                  "Expected out tensor to have dtype ", results[i].dtype().name(), ", but got ",
                  outs[i].dtype().name(), " instead");
    TORCH_CHECK(c10::canCast(results[i].scalar_type(), outs[i].scalar_type()), "result type ",
                results[i].scalar_type(), " can't be cast to the desired output type ",
                outs[i].scalar_type());
  }
}

}  // namespace torch_pjrt
