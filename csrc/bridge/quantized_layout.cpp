// Per-tensor affine quantized tensors on tpu (the QuantizedPrivateUse1 dispatch key), as CUDA
// has them: a QTensorImpl over an ordinary tpu storage holding the integer representation
// (uint8 / int8 / int32 for quint8 / qint8 / qint32), plus its quantizer (scale, zero point).
//
// Most of what a quantized tensor needs is PyTorch's own device-independent code, registered
// here for the tpu keys: creation (new_qtensor takes the PrivateUse1 allocator), the metadata
// views (view, as_strided, _reshape_alias: QTensorImpl aliases keeping the quantizer), clone,
// fill_, q_scale / q_zero_point / qscheme, quantize_per_tensor / dequantize (through the
// quantizer, which calls the two DispatchStubs this file registers for PrivateUse1).
// What is ours: the stubs' arithmetic (tpu ops on the integer view), int_repr, _copy_from and
// equal (copies and comparisons of the integer view), and making a quantized tensor from an
// integer one. Per-channel affine tensors have the same pieces (their stubs too). Only the
// byte-sized and int32 quantized dtypes are supported; the sub-byte ones (quint4x2, quint2x4)
// and per-channel float zero points are refused with a NotImplementedError.
#include <ATen/native/DispatchStub.h>
#include <ATen/native/quantized/AffineQuantizer.h>
#include <ATen/ops/_empty_affine_quantized_native.h>
#include <ATen/ops/_empty_per_channel_affine_quantized_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/dequantize_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/empty_quantized_native.h>
#include <ATen/ops/empty_strided_native.h>
#include <ATen/ops/fill_native.h>
#include <ATen/ops/q_per_channel_axis_native.h>
#include <ATen/ops/q_per_channel_scales_native.h>
#include <ATen/ops/q_per_channel_zero_points_native.h>
#include <ATen/ops/q_scale_native.h>
#include <ATen/ops/q_zero_point_native.h>
#include <ATen/ops/qscheme_native.h>
#include <ATen/ops/quantize_per_channel_native.h>
#include <ATen/ops/quantize_per_tensor_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <torch/library.h>

#include "bridge.h"

#include <limits>

namespace torch_pjrt {
namespace {

bool supported_qtype(at::ScalarType t) {
  return t == at::kQUInt8 || t == at::kQInt8 || t == at::kQInt32;
}

void check_qtype(at::ScalarType t) {
  TORCH_CHECK_NOT_IMPLEMENTED(supported_qtype(t), "quantized tensors of dtype ", t,
                              " are not supported on tpu (only quint8, qint8 and qint32)");
}

// Per-tensor or per-channel affine (the schemes whose integers this file reads and writes);
// per-channel with float zero points is refused.
void check_affine(const at::Tensor& q, const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      q.qscheme() == at::kPerTensorAffine || q.qscheme() == at::kPerChannelAffine, op,
      ": only per-tensor and per-channel affine quantized tensors are supported on tpu, got ",
      c10::toString(q.qscheme()));
}

void check_per_tensor(const at::Tensor& q, const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(q.qscheme() == at::kPerTensorAffine, op, ": only per-tensor affine ",
                              "quantized tensors are supported on tpu, got ",
                              c10::toString(q.qscheme()));
}

// The integer representation of quantized `q` as a plain tensor of its underlying type on the
// same storage, sizes, strides and offset: reads and writes through it are ordinary tpu (or CPU)
// ops, and every alias of q sees what is written through it.
at::Tensor int_view(const at::Tensor& q) {
  check_qtype(q.scalar_type());
  const auto key = q.device().type() == c10::DeviceType::PrivateUse1 ? c10::DispatchKey::PrivateUse1
                                                                      : c10::DispatchKey::CPU;
  TORCH_CHECK(q.device().type() == c10::DeviceType::PrivateUse1 || q.is_cpu(),
              "quantized tensor on ", q.device(), " cannot be copied to or from tpu");
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(q.storage()), c10::DispatchKeySet(key),
      c10::scalarTypeToTypeMeta(c10::toUnderlying(q.scalar_type())));
  out.unsafeGetTensorImpl()->set_sizes_and_strides(q.sizes(), q.strides(), q.storage_offset());
  return out;
}

std::pair<int64_t, int64_t> qrange(at::ScalarType t) {
  switch (t) {
    case at::kQUInt8: return {0, 255};
    case at::kQInt8: return {-128, 127};
    default: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  }
}

// Writes y (float32: r / scale + zero_point, rounded) into qtensor's integers, clamped to the
// dtype's range on the int64 value (CPU clamps after converting the float sum to an integer).
void store_quantized(at::Tensor& qtensor, const at::Tensor& y) {
  const auto [lo, hi] = qrange(qtensor.scalar_type());
  int_view(qtensor).copy_(y.to(at::kLong).clamp_(lo, hi));
}

// q = clamp(round_half_even(zero_point + r * (1 / scale)), qmin, qmax), with CPU's rounding
// steps: the reciprocal, the product and the sum with the zero point in float32, rounded after
// the zero point is added (so a tie rounds to an even q, not to an even q - zero_point), the
// clamp on the integer.
void quantize_per_tensor_tpu(const at::Tensor& rtensor, at::Tensor& qtensor, double scale,
                             int64_t zero_point) {
  check_qtype(qtensor.scalar_type());
  const float inv_scale = 1.0f / static_cast<float>(scale);
  at::Tensor r = rtensor.to(qtensor.device(), at::kFloat);
  store_quantized(qtensor, r.mul(static_cast<double>(inv_scale))
                               .add_(static_cast<double>(static_cast<float>(zero_point)))
                               .round_());
}

// r = (q - zero_point) * scale, in float32.
void dequantize_per_tensor_tpu(const at::Tensor& qtensor, at::Tensor& rtensor, double scale,
                               int64_t zero_point) {
  at::Tensor q = int_view(qtensor).to(at::kFloat);
  at::Tensor r = q.sub(static_cast<double>(static_cast<float>(zero_point)))
                     .mul_(static_cast<double>(static_cast<float>(scale)));
  rtensor.copy_(r);
}

// A per-channel parameter (one value per index of `axis`) as a float32 tensor on `like`'s
// device shaped to broadcast against it.
at::Tensor per_channel(const at::Tensor& param, const at::Tensor& like, int64_t axis) {
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[static_cast<size_t>(axis)] = param.numel();
  return param.to(like.device(), at::kFloat).reshape(shape);
}

// The per-tensor formulas with a scale and zero point per index of `axis`.
void quantize_per_channel_tpu(const at::Tensor& rtensor, at::Tensor& qtensor,
                              const at::Tensor& scales, const at::Tensor& zero_points,
                              int64_t axis) {
  check_qtype(qtensor.scalar_type());
  at::Tensor r = rtensor.to(qtensor.device(), at::kFloat);
  at::Tensor scale = per_channel(scales, r, axis);
  at::Tensor inv_scale = at::ones_like(scale).div_(scale);
  store_quantized(qtensor, r.mul(inv_scale).add_(per_channel(zero_points, r, axis)).round_());
}

void dequantize_per_channel_tpu(const at::Tensor& qtensor, at::Tensor& rtensor,
                                const at::Tensor& scales, const at::Tensor& zero_points,
                                int64_t axis) {
  at::Tensor q = int_view(qtensor).to(at::kFloat);
  rtensor.copy_(q.sub(per_channel(zero_points, q, axis)).mul_(per_channel(scales, q, axis)));
}

at::Tensor empty_affine_quantized(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                  std::optional<at::Layout> layout,
                                  std::optional<at::Device> device,
                                  std::optional<bool> pin_memory, double scale, int64_t zero_point,
                                  std::optional<at::MemoryFormat> memory_format) {
  check_qtype(c10::dtype_or_default(dtype));
  return at::native::empty_affine_quantized(size, dtype, layout, device, pin_memory, scale,
                                            zero_point, memory_format);
}

at::Tensor empty_quantized(c10::IntArrayRef size, const at::Tensor& qtensor,
                           std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                           std::optional<at::Device> device, std::optional<bool> pin_memory,
                           std::optional<at::MemoryFormat> memory_format) {
  check_affine(qtensor, "empty_quantized");
  return at::native::empty_quantized(size, qtensor, dtype, layout, device, pin_memory,
                                     memory_format);
}

// A new tensor (not a view) in the input's memory format, as CUDA's int_repr gives.
at::Tensor int_repr(const at::Tensor& self) {
  at::Tensor ints = int_view(self);
  at::Tensor out = at::empty(self.sizes(), ints.options(), self.suggest_memory_format());
  out.copy_(ints);
  return out;
}

// Copies whose destination or source is a tpu quantized tensor (PyTorch's copy_ sends every copy
// involving a tpu tensor here). Between quantized tensors: the integer representation is copied
// and the destination takes the source's quantizer, as copy_ does on CPU and CUDA. Into a
// quantized tensor from a float one: quantized with the destination's parameters.
at::Tensor quantized_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const at::Tensor& src = self;
  if (dst.is_quantized() && src.is_quantized()) {
    TORCH_CHECK(dst.qscheme() == src.qscheme(), "Quantized Copy only works with same qscheme");
    TORCH_CHECK(dst.scalar_type() == src.scalar_type(),
                "Quantized Copy only works with same dtype");
    check_affine(src, "copy_");
    at::set_quantizer_(dst, src.quantizer());
    int_view(dst).copy_(int_view(src), non_blocking);
    return dst;
  }
  TORCH_CHECK(dst.is_quantized(), "Copying from quantized Tensor to non-quantized Tensor is not ",
              "allowed, please use dequantize to get a float Tensor from a quantized Tensor");
  check_per_tensor(dst, "copy_");
  TORCH_CHECK(src.scalar_type() == at::kFloat,
              "Quantized copy only works with kFloat as source Tensor");
  TORCH_CHECK(dst.sizes().equals(src.sizes()),
              "Quantized copy only works with Tensors with the same shape");
  TORCH_CHECK((dst.is_contiguous() && src.is_contiguous()) ||
                  (dst.is_contiguous(at::MemoryFormat::ChannelsLast) &&
                   src.is_contiguous(at::MemoryFormat::ChannelsLast)),
              "Quantized copy only works with contiguous and NHWC Tensors");
  at::Tensor target = dst;
  if (dst.device().type() != c10::DeviceType::PrivateUse1) {
    // a CPU quantized destination: quantize on tpu, then copy the integers down
    at::Tensor staged = at::_empty_affine_quantized(
        dst.sizes(), dst.options().device(src.device()), dst.q_scale(), dst.q_zero_point());
    quantize_per_tensor_tpu(src, staged, dst.q_scale(), dst.q_zero_point());
    int_view(dst).copy_(int_view(staged), non_blocking);
    return dst;
  }
  quantize_per_tensor_tpu(src, target, dst.q_scale(), dst.q_zero_point());
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  TORCH_CHECK(dst.sizes().equals(self.sizes()), "_copy_from_and_resize: a quantized tpu ",
              "tensor cannot be resized from ", dst.sizes(), " to ", self.sizes());
  return quantized_copy_from(self, dst, false);
}

// CPU's rule: equal when both have the same scheme, parameters, dtype and sizes, and the same
// integer representation.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  if (!other.is_quantized() || !self.is_quantized()) return false;
  if (self.qscheme() != other.qscheme()) return false;
  check_affine(self, "equal");
  if (self.qscheme() == at::kPerTensorAffine) {
    if (self.q_scale() != other.q_scale() || self.q_zero_point() != other.q_zero_point())
      return false;
  } else {
    if (self.q_per_channel_axis() != other.q_per_channel_axis()) return false;
    const at::Tensor sa = self.q_per_channel_scales(), sb = other.q_per_channel_scales();
    const at::Tensor za = self.q_per_channel_zero_points(), zb = other.q_per_channel_zero_points();
    if (!sa.sizes().equals(sb.sizes()) || !at::equal(sa, sb.to(sa.device())) ||
        !at::equal(za, zb.to(za.device())))
      return false;
  }
  if (self.scalar_type() != other.scalar_type() || !self.sizes().equals(other.sizes()))
    return false;
  at::Tensor a = int_view(self), b = int_view(other);
  if (b.device() != a.device()) b = b.to(a.device());
  return at::equal(a, b);
}

// _make_per_tensor_quantized_tensor(int tensor, scale, zero_point): the integers as the
// quantized tensor's representation (uint8 -> quint8, int8 -> qint8, int32 -> qint32).
at::Tensor make_per_tensor_quantized_tensor(const at::Tensor& self, double scale,
                                            int64_t zero_point) {
  const at::ScalarType t = self.scalar_type();
  TORCH_CHECK(t == at::kByte || t == at::kChar || t == at::kInt,
              "Could not find the quantized type for ", t,
              " (_make_per_tensor_quantized_tensor takes uint8, int8 or int32)");
  at::Tensor dst = at::_empty_affine_quantized(self.sizes(),
                                               self.options().dtype(c10::toQIntType(t)), scale,
                                               zero_point, self.suggest_memory_format());
  int_view(dst).copy_(self);
  return dst;
}

// resize_ of a quantized tpu tensor: the sizes become contiguous (or the memory format asked
// for); the storage grows when it must, keeping its bytes (the dense resize_'s rules).
const at::Tensor& resize_quantized(const at::Tensor& self, c10::IntArrayRef size,
                                   std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (!self.sizes().equals(size)) impl->set_sizes_contiguous(size);
  if (memory_format && *memory_format != at::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memory_format);
  if (self.numel() > 0) {
    const size_t needed = static_cast<size_t>(
        (impl->storage_offset() +
         at::detail::computeStorageNbytes(self.sizes(), self.strides(), 1)) *
        self.element_size());
    if (needed > self.storage().nbytes())
      resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
  }
  return self;
}

at::Tensor quantize_per_tensor(const at::Tensor& self, double scale, int64_t zero_point,
                               at::ScalarType dtype) {
  check_qtype(dtype);
  return at::native::quantize_per_tensor(self, scale, zero_point, dtype);
}

at::Tensor quantize_per_tensor_qparams(const at::Tensor& self, const at::Tensor& scale,
                                       const at::Tensor& zero_point, at::ScalarType dtype) {
  check_qtype(dtype);
  return at::native::quantize_per_tensor_tensor_qparams(self, scale, zero_point, dtype);
}

at::Tensor quantize_per_channel(const at::Tensor& self, const at::Tensor& scales,
                                const at::Tensor& zero_points, int64_t axis,
                                at::ScalarType dtype) {
  check_qtype(dtype);
  return at::native::quantize_per_channel(self, scales, zero_points, axis, dtype);
}

at::Tensor empty_per_channel_affine_quantized(
    c10::IntArrayRef size, const at::Tensor& scales, const at::Tensor& zero_points, int64_t axis,
    std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
    std::optional<at::Device> device, std::optional<bool> pin_memory,
    std::optional<at::MemoryFormat> memory_format) {
  check_qtype(c10::dtype_or_default(dtype));
  return at::native::empty_per_channel_affine_quantized(size, scales, zero_points, axis, dtype,
                                                        layout, device, pin_memory,
                                                        memory_format);
}

at::Tensor dequantize(const at::Tensor& self) {
  check_affine(self, "dequantize");
  return at::native::dequantize_quantized(self);
}

}  // namespace
}  // namespace torch_pjrt

// (the macro names the stub's own type: it must be spelled inside the stub's namespace)
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(quantize_tensor_per_tensor_affine_stub,
                              &torch_pjrt::quantize_per_tensor_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(dequantize_tensor_per_tensor_affine_stub,
                              &torch_pjrt::dequantize_per_tensor_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(quantize_tensor_per_channel_affine_stub,
                              &torch_pjrt::quantize_per_channel_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(dequantize_tensor_per_channel_affine_stub,
                              &torch_pjrt::dequantize_per_channel_tpu)
}  // namespace at::native

TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  using namespace torch_pjrt;
  m.impl("_empty_affine_quantized", TORCH_FN(empty_affine_quantized));
  m.impl("empty_quantized", TORCH_FN(empty_quantized));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_quantized));
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_unknown_quantized));
  m.impl("empty_strided", TORCH_FN(at::native::empty_strided_unknown_quantized));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_qtensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(at::native::set_storage_quantized_));
  m.impl("resize_", TORCH_FN(resize_quantized));
  m.impl("clone", TORCH_FN(at::native::quantized_clone));
  m.impl("fill_.Scalar", TORCH_FN(static_cast<at::Tensor& (*)(at::Tensor&, const c10::Scalar&)>(
                             at::native::fill_quantized_)));
  m.impl("fill_.Tensor", TORCH_FN(static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&)>(
                             at::native::fill_quantized_)));
  m.impl("q_scale", TORCH_FN(at::native::q_scale_quant));
  m.impl("q_zero_point", TORCH_FN(at::native::q_zero_point_quant));
  m.impl("qscheme", TORCH_FN(at::native::qscheme_quant));
  m.impl("_empty_per_channel_affine_quantized", TORCH_FN(empty_per_channel_affine_quantized));
  m.impl("q_per_channel_scales", TORCH_FN(at::native::q_per_channel_scales));
  m.impl("q_per_channel_zero_points", TORCH_FN(at::native::q_per_channel_zero_points));
  m.impl("q_per_channel_axis", TORCH_FN(at::native::q_per_channel_axis));
  m.impl("dequantize.self", TORCH_FN(dequantize));
  m.impl("int_repr", TORCH_FN(int_repr));
  m.impl("_copy_from", TORCH_FN(quantized_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("equal", TORCH_FN(equal));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace torch_pjrt;
  m.impl("quantize_per_tensor", TORCH_FN(quantize_per_tensor));
  m.impl("quantize_per_tensor.tensor_qparams", TORCH_FN(quantize_per_tensor_qparams));
  m.impl("quantize_per_channel", TORCH_FN(quantize_per_channel));
  m.impl("dequantize.self", TORCH_FN(at::native::dequantize_cpu_or_cuda));
  m.impl("_make_per_tensor_quantized_tensor", TORCH_FN(make_per_tensor_quantized_tensor));
}
