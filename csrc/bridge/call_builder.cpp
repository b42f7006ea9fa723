#include "call_builder.h"

#include <cstring>

#include "bridge.h"
#include "eager_mode.h"
#include "torch_pjrt/capture.h"

namespace torch_pjrt {

bool pj_dtype_of(at::ScalarType t, pj_dtype_t* out) {
  switch (t) {
    case at::kBool: *out = PJ_BOOL; return true;
    case at::kByte: *out = PJ_U8; return true;
    case at::kChar: *out = PJ_I8; return true;
    case at::kShort: *out = PJ_I16; return true;
    case at::kInt: *out = PJ_I32; return true;
    case at::kLong: *out = PJ_I64; return true;
    case at::kHalf: *out = PJ_F16; return true;
    case at::kBFloat16: *out = PJ_BF16; return true;
    case at::kFloat: *out = PJ_F32; return true;
    case at::kDouble: *out = PJ_F64; return true;
    case at::kComplexFloat: *out = PJ_C64; return true;
    case at::kComplexDouble: *out = PJ_C128; return true;
    case at::kFloat8_e4m3fn: *out = PJ_F8E4M3FN; return true;
    case at::kFloat8_e5m2: *out = PJ_F8E5M2; return true;
    case at::kFloat8_e4m3fnuz: *out = PJ_F8E4M3FNUZ; return true;
    case at::kFloat8_e5m2fnuz: *out = PJ_F8E5M2FNUZ; return true;
    case at::kFloat8_e8m0fnu: *out = PJ_F8E8M0FNU; return true;
    case at::kFloat4_e2m1fn_x2: *out = PJ_F4E2M1FN_X2; return true;
    case at::kUInt16: *out = PJ_U16; return true;
    case at::kUInt32: *out = PJ_U32; return true;
    case at::kUInt64: *out = PJ_U64; return true;
    default: return false;
  }
}

pj_dtype_t to_pj_dtype(at::ScalarType t) {
  pj_dtype_t d;
  TORCH_CHECK_TYPE(pj_dtype_of(t, &d), "dtype ", t, " is not supported on the tpu device");
  return d;
}

pj_scalar_t scalar_value(const c10::Scalar& s) {
  pj_scalar_t v{};
  if (s.isBoolean()) {
    v.dtype = PJ_BOOL;
    v.i = s.toBool();
  } else if (s.isIntegral(false) && s.isUnsigned() && s.toUInt64() > INT64_MAX) {
    // past int64 (a uint64 value): its bits travel as a uint64 scalar
    v.dtype = PJ_U64;
    const uint64_t u = s.toUInt64();
    std::memcpy(&v.i, &u, sizeof u);
  } else if (s.isIntegral(false)) {
    v.dtype = PJ_I64;
    v.i = s.toLong();
  } else if (s.isComplex()) {
    v.dtype = PJ_C128;
    auto z = s.toComplexDouble();
    v.f = z.real();
    v.imag = z.imag();
  } else {
    v.dtype = PJ_F64;
    v.f = s.toDouble();
  }
  return v;
}

pj_scalar_t scalar_value(const at::Tensor& t) {
  pj_scalar_t s{};
  s.dtype = to_pj_dtype(t.scalar_type());
  if (t.is_complex()) {
    auto v = t.item<c10::complex<double>>();
    s.f = v.real();
    s.imag = v.imag();
  } else if (t.is_floating_point()) {
    s.f = t.item<double>();
    // half and low-precision types have no scalar upload path; they arrive as f32 (which
    // holds each of their values exactly) and convert in-program
    if (s.dtype == PJ_F16 || s.dtype == PJ_BF16 || pj_dtype_is_lowp(s.dtype)) s.dtype = PJ_F32;
  } else if (s.dtype == PJ_U64) {  // item<int64_t> refuses values past int64: the bits travel
    const uint64_t u = t.item().toUInt64();
    std::memcpy(&s.i, &u, sizeof u);
  } else {
    s.i = t.item<int64_t>();
  }
  return s;
}

at::ScalarType from_pj_dtype(pj_dtype_t t) {
  static const at::ScalarType map[PJ_NUM_DTYPES] = {
      at::kBool,  at::kByte,     at::kChar,  at::kShort,  at::kInt,          at::kLong,
      at::kHalf,  at::kBFloat16, at::kFloat, at::kDouble, at::kComplexFloat, at::kComplexDouble,
      at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kFloat8_e4m3fnuz, at::kFloat8_e5m2fnuz,
      at::kFloat8_e8m0fnu, at::kFloat4_e2m1fn_x2, at::kUInt16, at::kUInt32, at::kUInt64};
  return map[t];
}

namespace {

// Buffers of finished calls, kept for the thread's next ones. A malloc/free pair of this size
// per op cost a heap consolidation each time (glibc merges its fast bins before serving a
// large request): a few percent of a cache-hit op in a profile. Calls nest (bridge code may
// build a call while another is alive), hence a small stack rather than one buffer.
struct CallPool {
  std::vector<pj_call_t*> free;
  ~CallPool() {
    for (pj_call_t* p : free) std::free(p);
  }
};
thread_local CallPool call_pool;
constexpr size_t kPoolMax = 4;

pj_call_t* take_call() {
  if (!call_pool.free.empty()) {
    pj_call_t* p = call_pool.free.back();
    call_pool.free.pop_back();
    return p;
  }
  return static_cast<pj_call_t*>(std::malloc(sizeof(pj_call_t)));
}

}  // namespace

void CallBuilder::PoolDeleter::operator()(pj_call_t* p) const {
  if (call_pool.free.size() < kPoolMax) call_pool.free.push_back(p);
  else std::free(p);
}

CallBuilder::CallBuilder(const std::string& op, const std::string& overload, int device)
    : c_(take_call()) {
  // Only the counters are cleared: the arrays are large (for long foreach lists) and every
  // element is fully written before it is counted.
  if (!c_) throw std::bad_alloc();
  c_->nargs = c_->ntensors = c_->nints = c_->nfloats = c_->nscalars = c_->nslots = c_->nout = 0;
  c_->op = keep(op);
  c_->overload = keep(overload);
  c_->device = device;
  c_->where = nullptr;
  c_->display = nullptr;
  c_->checked = pj_checks_enabled();
}

const char* CallBuilder::keep(const std::string& s) {
  strings_.push_back(s);
  return strings_.back().c_str();
}

pj_arg_t& CallBuilder::new_arg(const std::string& name, pj_arg_kind_t kind) {
  TORCH_CHECK(c_->nargs < PJ_CALL_MAX_ARGS, "too many arguments for aten::", c_->op);
  pj_arg_t& a = c_->args[c_->nargs++];
  a = pj_arg_t{};
  a.name = keep(name);
  a.kind = kind;
  return a;
}

int CallBuilder::slot_for(const at::Tensor& t, bool reading) {
  pj_storage_t* s = storage_of(t);
  // A tensor whose storage holds no device data: a fake or meta tensor that reached a kernel
  // (e.g. torch.compile's tracing of code that reads tensor data; CPU fails there too, with
  // "its data is not allocated yet")
  TORCH_CHECK(s != nullptr, "aten::", c_->op, ": a tensor on ", t.device(),
              " has no data on the device (a fake or meta tensor reached the tpu kernel, as "
              "when torch.compile traces code that reads tensor data)");
  auto it = slots_.find(s);
  int idx;
  if (it != slots_.end()) {
    idx = it->second;
  } else {
    TORCH_CHECK(c_->nslots < PJ_CALL_MAX_SLOTS, "too many distinct storages in one op");
    idx = c_->nslots++;
    slots_[s] = idx;
    slot_read_.push_back(false);
    slot_partial_write_.push_back(false);
    pj_slot_t& sl = c_->slots[idx];
    sl.storage = s;
    // a storage with contents (or contents pending in the deferred graph) keeps its element type
    sl.dtype = s->buf || s->pending ? s->dtype : to_pj_dtype(t.scalar_type());
    size_t item = pj_dtype_info(sl.dtype)->itemsize;
    // A padded buffer (bucket.h) is read whole, except by a graph being captured: it sees
    // exact storages, as it is replayed with storages of any history (a padded one is trimmed
    // when the graph runs).
    sl.numel = static_cast<int64_t>(
        (pj_capture_active() ? s->nbytes : pj_storage_next_capacity(s)) / item);
  }
  if (reading) slot_read_[idx] = true;
  return idx;
}

void CallBuilder::describe(const at::Tensor& t, pj_tensor_desc_t* d, bool reading) {
  *d = pj_tensor_desc_t{};
  d->dtype = to_pj_dtype(t.scalar_type());
  d->rank = static_cast<int>(t.dim());
  TORCH_CHECK_NOT_IMPLEMENTED(d->rank <= PJ_MAX_RANK, "tensors of rank ", d->rank,
                              " are not supported on tpu (at most ", PJ_MAX_RANK, ")");
  for (int i = 0; i < d->rank; i++) {
    d->sizes[i] = t.size(i);
    d->strides[i] = t.stride(i);
  }
  if (t.device().type() == c10::DeviceType::CPU) {
    TORCH_CHECK(t.dim() == 0, "Expected all tensors to be on the same device, but found at "
                "least two devices, tpu:", c_->device, " and cpu!");
    // A 0-d CPU tensor (Python number or scalar tensor) travels by value.
    TORCH_CHECK(c_->nscalars < PJ_CALL_MAX_SCALARS, "too many scalar arguments");
    int si = c_->nscalars++;
    c_->scalars[si] = scalar_value(t);
    d->slot = -1;
    d->scalar = si;
    d->wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
    return;
  }
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1,
              "Expected all tensors to be on the same device, but found at least two devices, "
              "tpu:", c_->device, " and ", t.device(), "!");
  TORCH_CHECK(t.device().index() == c_->device || t.device().index() < 0,
              "Expected all tensors to be on the same device, but found at least two devices, "
              "tpu:", c_->device, " and ", t.device(), "!");
  d->offset = t.storage_offset();
  d->slot = slot_for(t, reading);
  keep_alive_.push_back(t);
  // A view at a nonzero offset passes its offset as a runtime scalar, so one program serves
  // every offset (x[i] in a loop compiled a program per i).
  if (d->offset > 0 && t.numel() > 0 && c_->nscalars < PJ_CALL_MAX_SCALARS) {
    d->dyn_offset = true;
    d->offset_scalar = c_->nscalars++;
    c_->scalars[d->offset_scalar] = pj_scalar_t{PJ_I64, 0.0, d->offset, 0.0};
  }
}

void CallBuilder::add_none(const std::string& name) { new_arg(name, PJ_ARG_NONE); }

void CallBuilder::add_tensor(const std::string& name, const at::Tensor& t, bool reading) {
  if (!t.defined()) return add_none(name);
  TORCH_CHECK(c_->ntensors < PJ_CALL_MAX_TENSORS, "too many tensor arguments");
  pj_arg_t& a = new_arg(name, PJ_ARG_TENSOR);
  a.first = c_->ntensors++;
  a.count = 1;
  describe(t, &c_->tensors[a.first], reading);
}

void CallBuilder::add_tensor_list(const std::string& name, const std::vector<at::Tensor>& ts) {
  TORCH_CHECK(c_->ntensors + static_cast<int>(ts.size()) <= PJ_CALL_MAX_TENSORS,
              "too many tensor arguments (", ts.size(), ")");
  pj_arg_t& a = new_arg(name, PJ_ARG_TENSORS);
  a.first = c_->ntensors;
  a.count = static_cast<int>(ts.size());
  c_->ntensors += a.count;
  for (size_t i = 0; i < ts.size(); i++) {
    pj_tensor_desc_t* d = &c_->tensors[a.first + i];
    if (!ts[i].defined()) {
      *d = pj_tensor_desc_t{};
      d->rank = -1;
      d->slot = -1;
    } else {
      describe(ts[i], d, true);
    }
  }
}

int CallBuilder::push_scalar(const c10::Scalar& s) {
  TORCH_CHECK(c_->nscalars < PJ_CALL_MAX_SCALARS, "too many scalar arguments");
  int idx = c_->nscalars++;
  c_->scalars[idx] = scalar_value(s);
  return idx;
}

void CallBuilder::add_scalar(const std::string& name, const c10::Scalar& s) {
  pj_arg_t& a = new_arg(name, PJ_ARG_SCALAR);
  a.first = push_scalar(s);
}

void CallBuilder::add_scalars(const std::string& name, const std::vector<c10::Scalar>& ss) {
  pj_arg_t& a = new_arg(name, PJ_ARG_SCALARS);
  a.first = c_->nscalars;
  a.count = static_cast<int>(ss.size());
  for (const c10::Scalar& s : ss) push_scalar(s);
}

void CallBuilder::add_int(const std::string& name, int64_t v) { new_arg(name, PJ_ARG_INT).i = v; }
void CallBuilder::add_bool(const std::string& name, bool v) { new_arg(name, PJ_ARG_BOOL).i = v; }
void CallBuilder::add_float(const std::string& name, double v) {
  new_arg(name, PJ_ARG_FLOAT).f = v;
}
void CallBuilder::add_ints(const std::string& name, c10::IntArrayRef v) {
  TORCH_CHECK(c_->nints + static_cast<int>(v.size()) <= PJ_CALL_MAX_INTS, "int list too long");
  pj_arg_t& a = new_arg(name, PJ_ARG_INTS);
  a.first = c_->nints;
  a.count = static_cast<int>(v.size());
  for (auto x : v) c_->ints[c_->nints++] = x;
}
void CallBuilder::add_floats(const std::string& name, c10::ArrayRef<double> v) {
  TORCH_CHECK(c_->nfloats + static_cast<int>(v.size()) <= PJ_CALL_MAX_INTS, "list too long");
  pj_arg_t& a = new_arg(name, PJ_ARG_FLOATS);
  a.first = c_->nfloats;
  a.count = static_cast<int>(v.size());
  for (auto x : v) c_->floats[c_->nfloats++] = x;
}
void CallBuilder::add_str(const std::string& name, const std::string& v) {
  new_arg(name, PJ_ARG_STR).s = keep(v);
}

void CallBuilder::add_out(const at::Tensor& dst) {
  TORCH_CHECK(c_->nout < PJ_CALL_MAX_OUTS, "too many outputs");
  TORCH_CHECK(dst.device().type() == c10::DeviceType::PrivateUse1,
              "Expected out tensor to be on tpu, but got ", dst.device());
  pj_tensor_desc_t* d = &c_->outs[c_->nout++];
  describe(dst, d, false);
  // A write that does not cover the whole storage must start from its current contents.
  size_t item = pj_dtype_info(d->dtype)->itemsize;
  bool whole = dst.storage_offset() == 0 && dst.is_non_overlapping_and_dense() &&
               static_cast<size_t>(dst.numel()) * item == dst.storage().nbytes();
  if (!whole) slot_partial_write_[d->slot] = true;
}

namespace {
// The source line a Strict call queued behind a background compile names in its error.
char* queued_call_line() {
  const std::string where = python_line();
  return where.empty() ? nullptr : strdup(where.c_str());
}
}  // namespace

void CallBuilder::run() {
  for (int s = 0; s < c_->nslots; s++) c_->slots[s].read = slot_read_[s] || slot_partial_write_[s];
  // defer_and_fuse records the call; CHECK_NAN needs each op's results, so it runs them now;
  // Strict compiles a new program in the background (Debug is synchronous: it runs the call).
  const EagerMode mode = eager_mode();
  if (mode == EagerMode::kDeferAndFuse && !check_nan())
    check(pj_call_defer(c_.get()));
  else if (mode == EagerMode::kStrict && !check_nan())
    check(pj_call_run_async(c_.get(), queued_call_line));
  else
    check(pj_call_run(c_.get()));
}

}  // namespace torch_pjrt
