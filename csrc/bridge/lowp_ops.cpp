// Which ops run lowered when a low-precision dtype (float8 variants, e8m0, packed float4) takes
// part. On the device these dtypes are bytes (csrc/include/torch_pjrt/dtype.h), so only
// lowerings that move bytes or convert through csrc/hlo/float8.c may see them; any other op
// involving them goes to CPU's own kernel through the fallback, which computes what CPU computes
// or raises CPU's error (CPU has no kernel for most arithmetic on them). The table says, per op,
// for which formats CPU 2.13 has a kernel (tests/test_float8.py checks each row against CPU).
#include "bridge.h"

#include <ATen/core/function_schema.h>

namespace torch_pjrt {
namespace {

enum Formats : unsigned {
  kF8 = 1u,    // float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz
  kE8M0 = 2u,  // float8_e8m0fnu
  kF4 = 4u,    // float4_e2m1fn_x2
  kAll = kF8 | kE8M0 | kF4,
};

unsigned format_bit(at::ScalarType t) {
  switch (t) {
    case at::kFloat8_e4m3fn:
    case at::kFloat8_e5m2:
    case at::kFloat8_e4m3fnuz:
    case at::kFloat8_e5m2fnuz: return kF8;
    case at::kFloat8_e8m0fnu: return kE8M0;
    case at::kFloat4_e2m1fn_x2: return kF4;
    default: return 0;
  }
}

struct Row {
  const char* base;  // base_name of the op (in-place and out= forms share it)
  unsigned formats;  // the formats CPU has a kernel for, among those the lowering handles
};

// Byte movement (any format CPU handles), conversions (float4 only to itself: only_float4),
// fills: "zero" is float4's only one (CPU's fill_ refuses float4, its zero_ does not), and
// "fill" with a value CPU cannot hold raises CPU's overflow error first (fill_check).
// _scaled_mm is not a row: its own checks decide (scaled_mm_check).
const Row kRows[] = {
    {"clone", kAll},          {"cat", kAll},           {"index_select", kAll},
    {"flip", kAll},           {"roll", kAll},          {"repeat", kAll},
    {"where", kAll},          {"zero", kAll},          {"_to_copy", kAll},
    {"_pj_copy", kAll},       {"fill", kF8 | kE8M0},   {"index", kF8 | kE8M0},
    {"masked_select", kF8 | kE8M0}, {"index_put", kF8}, {"constant_pad_nd", kF8},
    // custom kernels take and return float8 as bytes and bitcast inside (torch_pjrt/kernels/)
    {"tpu::kernel_call", kF8 | kE8M0},
};

// The low-precision formats among the call's tensors and dtype arguments.
unsigned formats_of(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  unsigned f = 0;
  auto of_tensor = [&](const at::Tensor& t) {
    if (t.defined()) f |= format_bit(t.scalar_type());
  };
  for (size_t i = 0; i < args.size(); i++) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      of_tensor(v.toTensor());
    } else if (v.isList()) {  // Tensor[] and Tensor?[] (no copy of the list)
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor()) of_tensor(e.toTensor());
    } else if (v.isInt() && i < schema.arguments().size()) {
      // a ScalarType argument (dtype=, out_dtype=) arrives as an int
      const c10::TypePtr& ty = schema.arguments()[i].real_type();
      const bool scalar_type = ty->kind() == c10::TypeKind::ScalarTypeType ||
                               (ty->kind() == c10::TypeKind::OptionalType &&
                                ty->containedType(0)->kind() == c10::TypeKind::ScalarTypeType);
      if (scalar_type) f |= format_bit(static_cast<at::ScalarType>(v.toInt()));
    }
  }
  return f;
}

// Conversions between float4 and another dtype have no CPU kernel; float4 to itself (a copy
// across devices or layouts) is byte movement.
bool only_float4(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  for (size_t i = 0; i < args.size(); i++) {
    const c10::IValue& v = args[i];
    if (v.isTensor() && v.toTensor().defined() &&
        v.toTensor().scalar_type() != at::kFloat4_e2m1fn_x2)
      return false;
    if (v.isInt() && i < schema.arguments().size() &&
        schema.arguments()[i].name() == "dtype" &&
        static_cast<at::ScalarType>(v.toInt()) != at::kFloat4_e2m1fn_x2)
      return false;
  }
  return true;
}

// CPU's fill_ converts its value with an overflow check ("value cannot be converted to type
// Float8_e4m3fn without overflow"), except on a one-element tensor (a fast path that converts
// as a cast does, as the lowering does). The check is CPU's own, run on a two-element CPU
// tensor of the dtype (cheap, and only for these dtypes).
void fill_check(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensor()) return;
  const at::Tensor& self = args[0].toTensor();
  if (!format_bit(self.scalar_type()) || self.numel() == 1) return;
  const c10::Scalar v = args[1].isScalar() ? args[1].toScalar()
                        : args[1].isTensor() ? args[1].toTensor().item()
                                             : c10::Scalar(0);
  at::empty({2}, at::TensorOptions().dtype(self.scalar_type())).fill_(v);
}

std::string sizes_text(const at::Tensor& t) { return c10::str(t.sizes()); }

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

// The block-scaled forms, which CPU lacks and tpu has (csrc/ops/scaled_mm.c), with the checks
// and words of PyTorch's Meta kernel for them (CUDA's rules): MX (float8 or float4 operands,
// float8_e8m0fnu scales per 32 elements of K) and NVFP4 (float4 operands, float8_e4m3fn scales
// per 16), scales in cuBLAS's blocked layout (128 x 4 tiles), contiguous. False when the
// scales are not of a block-scaled form's dtypes (the caller's checks apply).
bool blocked_scales_check(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                          const at::Tensor& sb) {
  const at::ScalarType st = sa.scalar_type();
  if (st != sb.scalar_type() || (st != at::kFloat8_e8m0fnu && st != at::kFloat8_e4m3fn))
    return false;
  auto ocp_f8 = [](at::ScalarType t) {  // the OCP float8 types (not the fnuz ones)
    return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
  };
  const bool f4 =
      a.scalar_type() == at::kFloat4_e2m1fn_x2 && b.scalar_type() == at::kFloat4_e2m1fn_x2;
  const bool f8 = ocp_f8(a.scalar_type()) && ocp_f8(b.scalar_type());
  TORCH_CHECK_VALUE(st == at::kFloat8_e8m0fnu ? (f4 || f8) : f4,
                    "Invalid scaling configuration: ", st, " block scales take ",
                    st == at::kFloat8_e8m0fnu ? "float8_e4m3fn/float8_e5m2 or float4_e2m1fn_x2"
                                              : "float4_e2m1fn_x2",
                    " operands, got ", a.scalar_type(), " and ", b.scalar_type());
  const int64_t k = a.size(1) * (f4 ? 2 : 1), block = st == at::kFloat8_e8m0fnu ? 32 : 16;
  const int64_t kblocks = ceil_div(ceil_div(k, block), 4) * 4;
  const int64_t want_a = 128 * ceil_div(a.size(0), 128) * kblocks;
  const int64_t want_b = 128 * ceil_div(b.size(1), 128) * kblocks;
  TORCH_CHECK(sa.numel() == want_a && sb.numel() == want_b,
              "Invalid blockwise scaling configuration. For blockwise scaling, scale_a should "
              "have ", want_a, " elements, got ", sa.numel(), ", scale_b should have ", want_b,
              " elements, got ", sb.numel(), ".");
  TORCH_CHECK(sa.is_contiguous(), "scale_a must be contiguous");
  TORCH_CHECK(sb.is_contiguous(), "scale_b must be contiguous");
  return true;
}

// Tensor-wise and row-wise scales (CPU's two forms).
void scalewise_check(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                     const at::Tensor& sb) {
  const int64_t m = a.size(0), n = b.size(1);
  const bool f32 = (format_bit(a.scalar_type()) & (kF8 | kE8M0)) &&
                   (format_bit(b.scalar_type()) & (kF8 | kE8M0)) &&
                   sa.scalar_type() == at::kFloat && sb.scalar_type() == at::kFloat;
  const bool tensorwise = f32 && sa.numel() == 1 && sb.numel() == 1;
  const bool rowwise = f32 && sa.dim() == 2 && sb.dim() == 2 && sa.size(0) == m &&
                       sa.size(1) == 1 && sb.size(0) == 1 && sb.size(1) == n;
  // float32 scales per block of 128 (CUDA's forms, which CPU lacks): [m or m/128, K/128] and
  // [K/128, n/128 or n], not both 128 x 128 (sizes rounded up)
  const int64_t kb = ceil_div(a.size(1), 128);
  const bool blocks128 =
      f32 && !tensorwise && !rowwise && sa.dim() == 2 && sb.dim() == 2 && sa.size(1) == kb &&
      sb.size(0) == kb && (sa.size(0) == m || sa.size(0) == ceil_div(m, 128)) &&
      (sb.size(1) == n || sb.size(1) == ceil_div(n, 128)) &&
      !(sa.size(0) != m && sb.size(1) != n);
  if (blocks128) return;
  TORCH_CHECK_VALUE(
      tensorwise || rowwise, "Invalid scaling configuration.\n- For TensorWise scaling, a and b "
      "should be float8, scales should be float and singletons.\n- For RowWise scaling, a and b "
      "should be float8, scales should be float, scale_a should be (", m, ", 1) and scale_b "
      "should be (1, ", n, "), and both should be contiguous.\nGot mat_a.dtype()=",
      a.scalar_type(), ", scale_a.dtype()=", sa.scalar_type(), ", scale_a.size()=",
      sizes_text(sa), ", scale_a.stride()=", c10::str(sa.strides()), ", mat_b.dtype()=",
      b.scalar_type(), ", scale_b.dtype()=", sb.scalar_type(), ", scale_b.size()=",
      sizes_text(sb), " and scale_b.stride()=", c10::str(sb.strides()));
  if (!tensorwise) {
    TORCH_CHECK_VALUE(sa.stride(1) == 1, "expected scale_a.stride(1) to be 1, but got ",
                      sa.stride(1));
    TORCH_CHECK_VALUE(sb.stride(1) == 1, "expected scale_b.stride(1) to be 1, but got ",
                      sb.stride(1));
  }
}

// CPU's _scaled_mm accepts two scalings, which its kernel checks: tensor-wise (float32 scales
// of one element each) and row-wise (float32 scales of shapes [m, 1] and [1, n], unit stride
// along dim 1). Its bias has n elements and its scale_result is a float32 scalar. Same
// exception types and words. The block-scaled forms are checked as above.
// (PyTorch's Meta kernel cannot serve: it applies CUDA's layout and size rules to any tensor
// not on CPU/CUDA/XPU; lowp_meta_returns gives the output metadata instead.)
// Arguments: (self, mat2, scale_a, scale_b, bias?, scale_result?, out_dtype?, use_fast_accum).
void scaled_mm_check(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 6 || !args[0].isTensor() || !args[1].isTensor() || !args[2].isTensor() ||
      !args[3].isTensor())
    return;
  const at::Tensor &a = args[0].toTensor(), &b = args[1].toTensor();
  const at::Tensor &sa = args[2].toTensor(), &sb = args[3].toTensor();
  TORCH_CHECK(a.dim() == 2, "mat1 must be a matrix");
  TORCH_CHECK(b.dim() == 2, "mat2 must be a matrix");
  TORCH_CHECK(a.size(1) == b.size(0), "mat_a and mat_b shapes cannot be multiplied (", a.size(0),
              "x", a.size(1), " and ", b.size(0), "x", b.size(1), ")");
  const int64_t n = b.size(1);
  if (!blocked_scales_check(a, b, sa, sb)) scalewise_check(a, b, sa, sb);
  if (args[4].isTensor() && args[4].toTensor().defined())
    TORCH_CHECK(args[4].toTensor().numel() == n, "Bias must be size ", n, " but got ",
                args[4].toTensor().numel());
  if (args[5].isTensor() && args[5].toTensor().defined()) {
    const at::Tensor& sr = args[5].toTensor();
    TORCH_CHECK(sr.numel() == 1 && sr.scalar_type() == at::kFloat,
                "scale_result must be a float scalar");
  }
}

}  // namespace

std::optional<std::vector<c10::IValue>> lowp_meta_returns(const std::string& base,
                                                          c10::ArrayRef<c10::IValue> args) {
  if (base != "_scaled_mm" || args.size() < 7 || !args[0].isTensor() || !args[1].isTensor())
    return std::nullopt;
  // (self, mat2, ..., out_dtype): [m, n] row-major, of out_dtype or self's dtype, as on CPU
  const at::Tensor &a = args[0].toTensor(), &b = args[1].toTensor();
  const at::ScalarType dt =
      args[6].isInt() ? static_cast<at::ScalarType>(args[6].toInt()) : a.scalar_type();
  std::vector<c10::IValue> r;
  r.emplace_back(
      at::empty({a.size(0), b.size(1)}, at::TensorOptions().dtype(dt).device(c10::kMeta)));
  return r;
}

bool lowp_goes_to_cpu(const std::string& base, const c10::FunctionSchema& schema,
                      c10::ArrayRef<c10::IValue> args) {
  const unsigned f = formats_of(schema, args);
  if (base == "_scaled_mm") {
    scaled_mm_check(args);  // also where no operand is float8; float4 for block scaling
    return false;
  }
  if (!f) return false;
  const bool copy = base == "_to_copy" || base == "_pj_copy";
  if (copy && (f & kF4)) return !only_float4(schema, args);
  for (const Row& r : kRows) {
    if (base != r.base) continue;
    if (f & ~r.formats) return true;
    if (base == "fill") fill_check(args);
    return false;
  }
  return true;
}

}  // namespace torch_pjrt
