// The kernels PyTorch requires a backend to provide itself (tensor creation, metadata-only
// views, resize/set_, copies, item()). Everything else goes through dispatch.cpp's fallback.
#include <ATen/ops/is_nonzero_native.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/conj_physical.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <torch/library.h>

#include "call_builder.h"

#include <limits>

namespace torch_pjrt {
namespace {

c10::Device tpu_device(std::optional<c10::Device> d) {
  int idx = d && d->has_index() ? d->index() : c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index();
  return c10::Device(c10::DeviceType::PrivateUse1, idx);
}

// With torch.use_deterministic_algorithms(True) and
// torch.utils.deterministic.fill_uninitialized_memory (both read from ATen's global context, as
// CPU's kernels read them), new memory holds NaN (floating and complex types), the largest
// value (integer types) or true (bool) instead of whatever the allocator returned.
bool fill_uninitialized() {
  const at::Context& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

// The fill value for elements of type t (see fill_uninitialized).
c10::Scalar uninitialized_value(at::ScalarType t) {
  if (c10::isFloatingType(t) || c10::isComplexType(t))
    return c10::Scalar(std::numeric_limits<double>::quiet_NaN());
  if (t == at::kBool) return c10::Scalar(true);
  c10::Scalar max;
  AT_DISPATCH_V2(t, "uninitialized_value",
                 AT_WRAP([&] { max = c10::Scalar(std::numeric_limits<scalar_t>::max()); }),
                 AT_EXPAND(AT_INTEGRAL_TYPES), AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES));
  return max;
}

// Fills elements [begin, end) of `storage` read as a flat array of t (its first byte is element
// 0, whatever the offset of the tensors that use it). Filling the storage rather than a tensor
// covers every element of a tensor with gaps or overlapping strides (empty_strided) with one
// dense write: the bytes outside the tensor are uninitialized memory as well. The fill itself
// is a tpu op, whose own allocations (its 0-d value) are internal and are not filled again:
// `filling` stops that recursion.
void fill_storage(const c10::Storage& storage, at::ScalarType t, int64_t begin, int64_t end) {
  static thread_local bool filling = false;
  if (filling || end <= begin) return;
  auto flat = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(t));
  const int64_t n = end - begin, one = 1;
  flat.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(n), c10::IntArrayRef(one),
                                                    begin);
  filling = true;
  try {
    flat.fill_(uninitialized_value(t));
  } catch (...) {
    filling = false;
    throw;
  }
  filling = false;
}

void fill_new_tensor(const at::Tensor& t) {
  if (!fill_uninitialized()) return;
  fill_storage(t.storage(), t.scalar_type(), 0,
               static_cast<int64_t>(t.storage().nbytes() / t.element_size()));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard g(tpu_device(device));
  auto dt = c10::dtype_or_default(dtype);
  // unsupported dtypes fail here, with a TypeError (complex32 is float16 pairs: complex32_ops.cpp)
  if (dt != at::kComplexHalf) to_pj_dtype(dt);
  at::Tensor t = at::detail::empty_generic(size, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           dt, memory_format);
  fill_new_tensor(t);
  return t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  c10::DeviceGuard g(tpu_device(device));
  auto dt = c10::dtype_or_default(dtype);
  if (dt != at::kComplexHalf) to_pj_dtype(dt);
  at::Tensor t = at::detail::empty_strided_generic(
      size, stride, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dt);
  fill_new_tensor(t);
  return t;
}

// Grows the storage if the new shape needs more bytes; sizes/strides become contiguous (or the
// requested memory format), as CPU's resize_ does. With the deterministic fill on
// (fill_uninitialized), the elements the storage gained are filled, those it had keep theirs.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  // CPU keeps the strides when the sizes do not change (a resize_ to the same sizes is a
  // no-op, unless a memory format is asked for): an expanded or strided tensor stays so
  if (!self.sizes().equals(size)) impl->set_sizes_contiguous(size);
  if (memory_format && *memory_format != at::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memory_format);
  if (self.numel() > 0) {
    size_t needed = static_cast<size_t>(
        (impl->storage_offset() + at::detail::computeStorageNbytes(self.sizes(), self.strides(), 1)) *
        self.element_size());
    const size_t old_nbytes = self.storage().nbytes();
    if (needed > old_nbytes) {
      resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
      if (fill_uninitialized()) {
        // whole elements only: an element the old size held in part is counted as kept
        const auto item = static_cast<size_t>(self.element_size());
        fill_storage(self.storage(), self.scalar_type(),
                     static_cast<int64_t>((old_nbytes + item - 1) / item),
                     static_cast<int64_t>(self.storage().nbytes() / item));
      }
    }
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, c10::SymInt storage_offset,
                        c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  auto off = storage_offset.guard_int(__FILE__, __LINE__);
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  auto strides = C10_AS_INTARRAYREF_SLOW(stride);
  auto* impl = self.unsafeGetTensorImpl();
  // PyTorch's own checks (CPU and CUDA run them too): sizes/strides of one length, offset >= 0
  // and in bounds, and both storages on one device. A cross-device set_ reaches this kernel when
  // either side is tpu (e.g. cpu_tensor.set_(tpu_tensor)); it must raise, never give a CPU
  // tensor a device storage.
  //
  // A slice of a tpu storage (UntypedStorage[a:b]; PyTorch's storage element access, storage_get
  // and storage_set, set_ a byte tensor to one) is a StorageImpl whose DataPtr points `a` bytes
  // into a live storage. The bridge describes tensors as (storage, element offset from its
  // start), so self gets an alias of the whole storage (alias_storage) with the slice's start
  // added to its offset: the same elements, data_ptr() and overlap answers as CPU; only
  // storage_offset() and untyped_storage() name the whole storage rather than the slice.
  size_t slice_start = 0;
  pj_storage_t* sliced = nullptr;
  if (source.device().type() == c10::DeviceType::PrivateUse1 && source.nbytes() > 0 &&
      storage_of(source) == nullptr)
    sliced = storage_containing(source.data_ptr().get(), &slice_start);
  TORCH_CHECK(source.device().type() != c10::DeviceType::PrivateUse1 ||
                  storage_of(source) != nullptr || sliced != nullptr || source.nbytes() == 0,
              "set_: the storage on ", source.device(), " was not allocated by torch_pjrt");
  const size_t item = static_cast<size_t>(self.element_size());
  TORCH_CHECK(sliced == nullptr || slice_start % item == 0, "set_: the storage slice starts ",
              slice_start, " bytes into a tpu storage, not at a whole element of ", self.dtype(),
              " (", item, " bytes)");
  // PyTorch's checks run against the slice itself (its bounds, its device); set it when all pass
  at::native::checkSetStorage(self, source, off, sizes, strides);
  if (sliced) {
    impl->set_storage_keep_dtype(alias_storage(sliced, slice_start + source.nbytes()));
    off += static_cast<int64_t>(slice_start / item);
  }
  impl->set_storage_offset(off);
  if (strides.empty())
    impl->set_sizes_contiguous(sizes);
  else
    impl->set_sizes_and_strides(sizes, strides);
  if (self.numel() > 0) {
    size_t needed = static_cast<size_t>(
        (off + at::detail::computeStorageNbytes(self.sizes(), self.strides(), 1)) * self.element_size());
    if (needed > self.storage().nbytes())
      resize_storage_bytes(self.storage().unsafeGetStorageImpl(), needed);
  }
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  size_t item = self.element_size();
  int64_t n = static_cast<int64_t>(source.nbytes() / item);
  std::vector<c10::SymInt> size{c10::SymInt(n)};
  return set_storage(self, std::move(source), 0, size, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.is_same(src)) return self;
  return set_storage(self, src.storage(), src.sym_storage_offset(), src.sym_sizes(),
                     src.sym_strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  at::Tensor fresh = at::empty({0}, self.options());
  return set_storage(self, fresh.storage(), 0, std::vector<c10::SymInt>{c10::SymInt(0)}, {});
}

at::Tensor copy_from_kernel(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  ExecLabel label("copy");
  return copy_from(self, dst, non_blocking);
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) { return local_scalar(self); }

// view(dtype): PyTorch's own metadata rules (sizes, strides and offset rescaled by the element
// size ratio, its checks and messages), on the same storage. Reading or writing a view whose
// element type differs from the storage buffer's is a bitcast in the program's view prologue /
// epilogue (view_io.c, pj_view_bitcast), for any pair of element sizes.
at::Tensor view_dtype(const at::Tensor& self, at::ScalarType dtype) {
  return at::native::view_dtype(self, dtype);
}

// _efficientzerotensor (autograd's zero gradients, e.g. sgn's backward): a zero-filled tensor.
// CPU marks it with the ZeroTensor key so later arithmetic can skip it; plain zeros give the
// same values.
at::Tensor efficient_zero_tensor(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                                 std::optional<at::Layout> layout,
                                 std::optional<at::Device> device, std::optional<bool> pin_memory) {
  return at::zeros(C10_AS_INTARRAYREF_SLOW(size),
                   at::TensorOptions().dtype(c10::dtype_or_default(dtype)).device(tpu_device(device)));
}

// t's stored values: the same storage, sizes and strides without the conjugate and negative
// bits (those only say how PyTorch reads the values).
at::Tensor stored_values(const at::Tensor& t) {
  auto keys = t.key_set().remove(c10::DispatchKey::Conjugate).remove(c10::DispatchKey::Negative);
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), keys, t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return out;
}

// copy_ with PyTorch's lazy conjugation and negation. Copies to or from tpu reach _copy_from,
// which moves stored values; the Conjugate/Negative fallbacks in front of it would resolve a
// lazy input by clone, i.e. by copy_ again, and recurse forever. So the bits are settled here:
// the stored values are copied, then conjugated / negated in place where the two sides differ.
at::Tensor& copy_kernel(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (!self.is_conj() && !self.is_neg() && !src.is_conj() && !src.is_neg())
    return at::native::copy_(self, src, non_blocking);
  const bool conj = self.is_conj() != src.is_conj();
  const bool neg = self.is_neg() != src.is_neg();
  at::Tensor dst = stored_values(self);
  at::native::copy_(dst, stored_values(src), non_blocking);
  // (conj_physical_'s composite kernel calls a CPU/CUDA stub: go to the .out overload instead)
  if (conj && dst.is_complex()) at::conj_physical_out(dst, dst);
  if (neg) dst.neg_();
  return self;
}

// Whether `self` may take over `from`'s tensor data in place (`param.data = t`, Module._apply's
// `.to()`, VariableHooks::set_data). PyTorch's own answer counts only its in-tree dense
// backends as interchangeable, so for tpu it is false and `Module.to("tpu")` would replace every
// Parameter, untying shared weights and stranding optimizers built before the move. CUDA's dense
// tensors are interchangeable with every in-tree dense backend's; tpu's are the same, plus tpu
// itself. Anything else (sparse, meta, equal key sets) keeps PyTorch's answer. The dispatcher
// sends a call here whenever either argument is a tpu tensor and neither is meta (the PrivateUse1
// backend bit outranks every dense in-tree backend's, Meta outranks it).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto is_dense = [](c10::DispatchKeySet ks) {
    constexpr auto dense_backends = c10::DispatchKeySet(
        {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit,
         c10::BackendComponent::MPSBit, c10::BackendComponent::HIPBit,
         c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
         c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
    return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(dense_backends);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (is_dense(self.key_set()) && is_dense(from.key_set()));
}

// Tensor.record_stream (nn.DataParallel's scatter calls it): on CUDA it keeps the caching
// allocator from reusing the memory before the stream's queued work is done. Here nothing needs
// recording: a storage's PJRT buffer stays alive, whatever replaces it, until every program
// that uses it has completed (PJRT holds its usage). The stream must be a tpu stream, as
// CUDA's must be a CUDA one.
// torch._assert_async (torch.compile emits it for torch._check and Transformers' tensor
// assertions): CPU's check and message. Synchronous: the value is read to the host here, where
// CUDA raises at the next synchronization (a device-side assert); in a compiled graph the read
// ends the capture, and the graph runs through the recorder.
void assert_async(const at::Tensor& self) {
  TORCH_CHECK(at::native::is_nonzero(self), "Expected Tensor with single nonzero value, but got zero");
}

void assert_async_msg(const at::Tensor& self, c10::string_view assert_msg) {
  TORCH_CHECK(at::native::is_nonzero(self),
              assert_msg.empty() ? std::string("Assertion is failed") : std::string(assert_msg));
}

void record_stream(at::Tensor& self, c10::Stream s) {
  TORCH_CHECK(s.device_type() == c10::DeviceType::PrivateUse1,
              "record_stream: expected a tpu stream for a tpu tensor, got a stream of ",
              s.device());
}

}  // namespace
}  // namespace torch_pjrt

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace torch_pjrt;
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view.dtype", TORCH_FN(view_dtype));
  // metadata-only reinterpretations of the storage (complex <-> pairs of reals); reads and
  // writes through them convert the storage's elements in-program (csrc/graph/view_io.c)
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("_assert_async", TORCH_FN(assert_async));
  m.impl("_assert_async.msg", TORCH_FN(assert_async_msg));
  // metadata only, as on CPU (PyTorch's device-generic kernel): the same StorageImpl, storage
  // offset, sizes and strides. A storage slice's alias (alias_storage) is a StorageImpl of its
  // own, as a CPU storage slice is.
  m.impl("is_set_to", TORCH_FN(at::native::is_set_to));
  m.impl("copy_", TORCH_FN(copy_kernel));
  m.impl("_efficientzerotensor", TORCH_FN(efficient_zero_tensor));
  m.impl("_copy_from", TORCH_FN(copy_from_kernel));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}
