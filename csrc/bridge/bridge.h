// Shared declarations of the C++ bridge (the only code that includes PyTorch headers).
// Each function is defined in the file named beside it.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>
#include <string>
#include <optional>
#include <unordered_map>
#include <vector>
#include <c10/core/Allocator.h>

extern "C" {
#include "torch_pjrt/defer.h"
#include "torch_pjrt/exec_profile.h"
#include "torch_pjrt/index_checks.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/status.h"
#include "torch_pjrt/storage.h"
#include "torch_pjrt/stream.h"
}

namespace torch_pjrt {

// errors.cpp: throws the c10 exception matching the status code (ValueError, TypeError,
// IndexError, NotImplementedError, OutOfMemoryError, else RuntimeError) and frees the status.
// Does nothing for NULL.
void check(pj_status_t* st);
// Brings the float32 product precision of the programs built next in step with
// torch.get_float32_matmul_precision() (product_precision.cpp); called before each lowered op.
void sync_product_precision();
// " at file:line" of the innermost Python frame outside torch's own package on the calling
// thread, or "" (dispatch.cpp). Takes the GIL: error paths and index-check sites only.
std::string python_line();
// Where python_line() finds a compiled graph's generated code (file "<eval_with_key>.N"), it
// names the user's line of the node instead: lines[generated line] (dispatch.cpp).
void set_source_lines(const std::string& file, std::unordered_map<int, std::string> lines);
// kernel_checks.cpp: CPU's errors for arguments its kernels reject but the Meta kernels accept
// (mm/bmm dtypes, convolution's bias shape, ...), raised before the op runs or is recorded.
void cpu_kernel_checks(const std::string& base, const c10::FunctionSchema& schema,
                       const torch::jit::Stack& args);
// dispatch.cpp: CPU's TensorIterator overlap checks of a call's destinations (its written
// arguments): no internal overlap, no partial overlap with an input.
void iterator_overlap_checks(const c10::FunctionSchema& schema, const torch::jit::Stack& args);
// Whether an argument is a ScalarType (dtype=), which a stack holds as an int.
inline bool is_scalar_type_arg(const c10::Argument& a) {
  const c10::TypePtr& ty = a.real_type();
  return ty->kind() == c10::TypeKind::ScalarTypeType ||
         (ty->kind() == c10::TypeKind::OptionalType &&
          ty->containedType(0)->kind() == c10::TypeKind::ScalarTypeType);
}

// Whether a call's tensor (alone or in a Tensor[] / Tensor?[] list) has a dtype `of_tensor`
// accepts, or one of its ScalarType arguments is a dtype `of_dtype` accepts.
template <typename TensorPred, typename DtypePred>
bool any_arg_dtype(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                   TensorPred of_tensor, DtypePred of_dtype) {
  auto tensor_ok = [&](const c10::IValue& v) {
    return v.isTensor() && v.toTensor().defined() && of_tensor(v.toTensor().scalar_type());
  };
  for (size_t i = 0; i < args.size(); i++) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      if (tensor_ok(v)) return true;
    } else if (v.isList()) {  // (no copy of the list)
      for (const c10::IValue& e : v.toListRef())
        if (tensor_ok(e)) return true;
    } else if (v.isInt() && i < schema.arguments().size() &&
               is_scalar_type_arg(schema.arguments()[i]) &&
               of_dtype(static_cast<at::ScalarType>(v.toInt()))) {
      return true;
    }
  }
  return false;
}

// kernel_checks.cpp: CPU's warning (once per process, as CPU warns) for a copy that drops the
// imaginary part: complex source, destination neither complex nor bool.
void warn_complex_to_real(at::ScalarType src, at::ScalarType dst);
// kernel_checks.cpp: CPU's shape-only refusal of advanced indexing (index, index_put and
// their variants) through an indexed dim of size 0, raised before any path runs the op.
void advanced_index_checks(const std::string& base, const c10::FunctionSchema& schema,
                           const torch::jit::Stack& args);
// kernel_checks.cpp: where an out= call's Meta kernel refused it, raises CPU's message when an
// out= tensor's dtype cannot hold the result type (the functional form's); else returns.
void out_dtype_checks(const c10::FunctionSchema& schema, const torch::jit::Stack& args);
// lowp_ops.cpp: true when a call involving a low-precision dtype (float8, e8m0, float4) must
// go to CPU's kernel (the fallback) because its lowering would treat their bytes as numbers;
// For a call it keeps lowered, it raises CPU's errors that CPU's kernels give and the Meta
// kernels do not (a fill value the dtype cannot hold, _scaled_mm's scale shapes and dtypes).
bool lowp_goes_to_cpu(const std::string& base, const c10::FunctionSchema& schema,
                      c10::ArrayRef<c10::IValue> args);
// unsigned_ops.cpp: true when a call involving uint16, uint32 or uint64 must go to CPU's kernel
// (the fallback): CPU has kernels for few ops on them, and tpu raises where CPU raises.
bool unsigned_goes_to_cpu(const std::string& base, const c10::FunctionSchema& schema,
                          c10::ArrayRef<c10::IValue> args);
// complex32_ops.cpp: torch.complex32 (ComplexHalf), which the runtime has no element type for.
// Its storage holds float16 (real, imag) pairs. complex_parts_view(t) is a complex tensor's
// stored parts as a view of its part dtype with a trailing dim of 2 (t's conjugate and negative
// bits are not applied); complex32_widen copies a tpu complex32 tensor to complex64 (bits
// applied); complex32_device_copy copies between tpu tensors of one device of which one or both
// are complex32 (src broadcast to dst). complex32_call runs an op involving complex32 (kDone),
// or says it is none of its business (kNotInvolved) or must go to CPU's kernel (kToCpu: CPU
// has no complex32 kernel for most ops, and tpu raises where CPU raises).
at::Tensor complex_parts_view(const at::Tensor& t);
at::Tensor complex32_widen(const at::Tensor& t);
void complex32_device_copy(const at::Tensor& src, const at::Tensor& dst);
enum class Complex32Call { kNotInvolved, kDone, kToCpu };
Complex32Call complex32_call(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                             const std::string& base);
// lowp_ops.cpp: output metadata of ops whose PyTorch Meta kernel does not apply to tpu tensors
// (_scaled_mm's applies CUDA's rules), else nullopt.
std::optional<std::vector<c10::IValue>> lowp_meta_returns(const std::string& base,
                                                          c10::ArrayRef<c10::IValue> args);
// errors.cpp: the runtime, initialized on first use; throws on failure.
pj_runtime_t* runtime();

// allocator.cpp: the PrivateUse1 allocator. A DataPtr's context is the pj_storage_t (owning one
// reference); its data pointer is a fake address unique to the storage (disjoint ranges, never
// dereferenced) so PyTorch's overlap and identity checks work on device tensors.
c10::DeviceAllocator* device_allocator();
pj_storage_t* storage_of(const at::Tensor& t);  // nullptr if not a tpu tensor
pj_storage_t* storage_of(const c10::Storage& s);
// A DataPtr owning a new storage of `nbytes` on `device` (used by allocate() and by resize_,
// which swaps it into the StorageImpl). Initializes the runtime; checks the device index.
c10::DataPtr allocate_storage(int device, size_t nbytes);
// The live storage whose byte range [addr, addr + nbytes) holds the tpu address p, with p's
// byte offset from its start in *offset; nullptr (offset untouched) if none does. A pointer
// into a storage comes from PyTorch's storage slicing (UntypedStorage[a:b]), which wraps
// `data + a` in a DataPtr of its own.
pj_storage_t* storage_containing(const void* p, size_t* offset);
// A new, non-resizable StorageImpl of `nbytes` (at most s->nbytes) sharing s (one more
// reference): storage_of finds s in it, its data pointer is s's address, so it aliases s.
c10::Storage alias_storage(pj_storage_t* s, size_t nbytes);

// guard.cpp: the calling thread's current device (tpu:current; starts at 0), the bounds-checked
// setter, and the number of devices (0 when the runtime cannot start: never throws).
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
c10::DeviceIndex device_count() noexcept;
// `index` (< 0: the current device) after checking it names a device: throws the runtime's
// failure when there are no devices, IndexError when it is out of range.
int checked_device(int index);
// Milliseconds between two recorded markers' completions (waits for both; throws if either
// is NULL, i.e. an event that was never recorded).
double elapsed_ms(pj_marker_t* start, pj_marker_t* end);

// pinned.cpp: the host allocator behind pin_memory() (plain aligned host memory; PJRT copies
// from any host memory, so "pinned" only promises is_pinned() and recognizes its own blocks).
c10::Allocator* pinned_allocator();
bool is_pinned_ptr(const void* p);

// generator.cpp: the per-device default generator (Philox-style seed + offset counter).
// Returns (seed, offset) for a random op consuming `increment` counter values and advances it.
std::pair<uint64_t, uint64_t> rng_next(const std::optional<at::Generator>& gen, int device,
                                       uint64_t increment);
const at::Generator& default_generator(int device);
// A new generator for `device` (< 0: the current device), as torch.Generator("tpu") makes.
at::Generator make_generator(int device);

// dispatch.cpp: registers the boxed fallback and the required kernels (TORCH_LIBRARY_IMPL).
// copy.cpp: host<->device and device<->device copies (used by _copy_from).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);
// The value of a one-element tpu tensor (Tensor.item(), bool(t), the elements of `for v in t`).
c10::Scalar local_scalar(const at::Tensor& self);
// copy.cpp: grows (never shrinks) a tpu storage to nbytes, keeping its contents. Used by resize_
// and by the hooks' resizePrivateUse1Bytes.
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);

// high_rank.cpp: tensors of rank above PJ_MAX_RANK (64), which PyTorch takes wherever no dim
// bitset is involved. Whether a call's tensors (alone or in lists) exceed it; *rank: the
// highest rank seen.
bool exceeds_max_rank(c10::ArrayRef<c10::IValue> args, int64_t* rank);
// The dims of shape whose size is not 1.
std::vector<int64_t> non_unit_dims(c10::IntArrayRef shape);
// t viewed without the dims of a result of rank `rank` that `keep` (non_unit_dims of that
// result's shape) leaves out; t broadcasts to that result (its dims align with the last ones).
at::Tensor without_unit_dims(const at::Tensor& t, int64_t rank, const std::vector<int64_t>& keep);
// Whether op (base: its name without "aten::" and the in-place "_") is elementwise: its values
// do not depend on the result's size-1 dims.
bool elementwise_op(const c10::OperatorHandle& op, const std::string& base);
// Runs an elementwise op through run over views of its tensors without the result's size-1
// dims, and returns the results at the full shape (in-place and out= forms: the caller's own
// tensors). False, with nothing run, where that does not apply (tensor lists, a written tensor
// not of the result's shape).
bool run_without_unit_dims(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           void (*run)(const c10::OperatorHandle&, torch::jit::Stack*));

// Whether a float argument of op travels as a runtime scalar rather than a constant of the
// program (dispatch.cpp's table: the fused optimizers' lr); the call memo mirrors it.
bool runtime_float_arg(const c10::FunctionSchema& schema, const std::string& name);

// While the execution timeline records (exec_profile.h: torch.tpu.step_profile, the exit
// report), names the programs an eager op issues "eager:<op>" (a nested op names its own and
// restores the outer name), so device time is attributed per op rather than to one "eager"
// row. Off the timeline it costs one relaxed atomic load.
class ExecLabel {
 public:
  explicit ExecLabel(const char* op);
  explicit ExecLabel(const c10::FunctionSchema& schema);
  ~ExecLabel();
  ExecLabel(const ExecLabel&) = delete;
  ExecLabel& operator=(const ExecLabel&) = delete;

 private:
  void enter(const std::string& op);
  bool on_;
  char prev_[PJ_EXEC_PROFILE_LABEL] = {};
};

}  // namespace torch_pjrt
