// The call memo (call_memo.h).
//
// Why a memo is exact: everything the full path derives from a call is a function of its
// signature. The Meta result depends on dtypes, sizes, strides and non-tensor values (scalar
// values included, as meta_cache.cpp keys them); CPU's argument checks and the overlap checks
// on the same (all passed when the memo was made); the call's key on the tensors' views, the
// slots' element types and sizes, which tensors share a storage, the eager mode, the float32
// product precision (torch.set_float32_matmul_precision), the index-check setting and the
// default dtype (torch.set_default_dtype: the result type of an integer tensor with a Python
// float). Storage identities and scalar values are the only things that vary, and those are
// exactly what a prepared call takes (with, for ops whose index checks name it, the Python
// line, taken again on each run). Ops whose full path draws random numbers or may
// take another route for the same signature are not memoized (dispatch.cpp decides, as
// store_memo's caller); calls the signature cannot describe never get that far. What a memo
// skips besides the work: warnings a Meta kernel would give on every call (none of the
// lowered ops' Meta kernels warns per call for arguments that pass; resizing out= tensors,
// which does, changes the signature and is never memoized).
//
// Memos are per thread (no locks on the hot path) and bounded: a thread that sees more than
// kMaxMemos signatures starts over.
#include "call_memo.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "bridge.h"
#include "call_builder.h"
#include "eager_mode.h"
extern "C" {
#include "torch_pjrt/hlo.h"  // pj_hlo_f32_product_precision: part of the signature
#include "torch_pjrt/metrics.h"
}

namespace torch_pjrt {
namespace {

constexpr size_t kMaxMemos = 8192;

void put(std::string& k, const void* p, size_t n) { k.append(static_cast<const char*>(p), n); }
void put_i(std::string& k, int64_t v) { put(k, &v, sizeof v); }
void put_tag(std::string& k, char t) { k.push_back(t); }

// The element type a call's slot gets for this tensor's storage: the storage's own once it
// holds (or will hold) contents, else the tensor's (CallBuilder::slot_for).
pj_dtype_t slot_dtype(const pj_storage_t* s, pj_dtype_t tensor_dtype) {
  return s->buf || s->pending ? s->dtype : tensor_dtype;
}

// scalar_value(t) without a dispatch of item(): the value read from the host tensor itself
// (a Python number arrives as such a tensor on every call of `x * 0.5`).
pj_scalar_t cpu_scalar_value(const at::Tensor& t, pj_dtype_t dt) {
  pj_scalar_t s{};
  s.dtype = dt;
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kDouble: s.f = *static_cast<const double*>(p); return s;
    case at::kFloat: s.f = *static_cast<const float*>(p); return s;
    case at::kLong: s.i = *static_cast<const int64_t*>(p); return s;
    case at::kInt: s.i = *static_cast<const int32_t*>(p); return s;
    case at::kBool: s.i = *static_cast<const bool*>(p); return s;
    default: return scalar_value(t);  // the other types as the full path converts them
  }
}

bool put_tensor(CallSignature& sig, const at::Tensor& t) {
  std::string& k = sig.bytes;
  if (!t.defined()) return put_tag(k, 'u'), true;
  if (t.is_conj() || t.is_neg()) return false;  // resolved into copies by the full path
  pj_dtype_t dt;
  if (!pj_dtype_of(t.scalar_type(), &dt)) return false;  // the full path raises its error
  // low-precision dtypes: the full path decides per call whether CPU's kernel runs it and
  // makes CPU's value checks (lowp_ops.cpp), which a repeat must not skip
  if (pj_dtype_is_lowp(dt)) return false;
  const c10::DeviceType type = t.device().type();
  if (type == c10::DeviceType::CPU) {
    // a 0-d CPU tensor travels by value (CallBuilder::describe); anything else is an error
    if (t.dim() != 0) return false;
    put_tag(k, 'c');
    put_i(k, dt);
    put_i(k, t.unsafeGetTensorImpl()->is_wrapped_number());
    sig.scalars.push_back(cpu_scalar_value(t, dt));
    return true;
  }
  if (type != c10::DeviceType::PrivateUse1) return false;
  pj_storage_t* s = storage_of(t);
  if (!s) return false;
  int64_t alias = -1;  // the first earlier tensor of the same storage: one slot for both
  for (size_t i = 0; i < sig.tensors.size() && alias < 0; i++)
    if (storage_of(*sig.tensors[i]) == s) alias = static_cast<int64_t>(i);
  put_tag(k, 't');
  const int64_t dim = t.dim();
  const int64_t head[8] = {t.device().index(), dt, dim, t.storage_offset(),
                           static_cast<int64_t>(s->nbytes),
                           static_cast<int64_t>(pj_storage_next_capacity(s)), slot_dtype(s, dt),
                           alias};
  put(k, head, sizeof head);
  put(k, t.sizes().data(), sizeof(int64_t) * static_cast<size_t>(dim));
  put(k, t.strides().data(), sizeof(int64_t) * static_cast<size_t>(dim));
  sig.tensors.push_back(&t);
  return true;
}

// A Scalar argument: its value is part of the signature (the Meta result may depend on it, as
// meta_cache.cpp keys it) and also a runtime value of the call.
void put_scalar(CallSignature& sig, const c10::Scalar& s) {
  pj_scalar_t v = scalar_value(s);
  put_tag(sig.bytes, 's');
  put(sig.bytes, &v, sizeof v);
  sig.scalars.push_back(v);
}

bool put_int_list(std::string& k, const c10::IValue& v) {
  if (!v.isIntList()) return false;  // a list with symbolic elements
  const auto l = v.toIntList();
  put_tag(k, 'L');
  put_i(k, static_cast<int64_t>(l.size()));
  for (int64_t x : l) put_i(k, x);
  return true;
}

// Mirrors add_argument (dispatch.cpp): what CallBuilder makes of each value, by schema type.
// foreach: a _foreach_* op, whose Scalar[] values (AdamW's step sizes, new every step) are
// runtime values of the call that shape nothing (meta_cache.cpp leaves them out too).
bool put_argument(CallSignature& sig, const c10::Argument& arg, const c10::IValue& v,
                  bool foreach, bool runtime_float) {
  std::string& k = sig.bytes;
  if (v.isNone()) return put_tag(k, 'n'), true;
  c10::TypePtr type = arg.real_type();
  if (type->kind() == c10::TypeKind::OptionalType)
    type = type->expectRef<c10::OptionalType>().getElementType();
  switch (type->kind()) {
    case c10::TypeKind::TensorType: return v.isTensor() && put_tensor(sig, v.toTensor());
    case c10::TypeKind::NumberType:
      if (!v.isScalar()) return false;
      if (foreach) {  // as for Scalar[]: a runtime value (CallBuilder passes it as a scalar)
        pj_scalar_t x = scalar_value(v.toScalar());
        put_tag(k, 's');
        put_i(k, x.dtype);
        sig.scalars.push_back(x);
        return true;
      }
      return put_scalar(sig, v.toScalar()), true;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:  // a concrete value arrives as an int (else: not memoized)
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
      if (!v.isInt()) return false;
      put_tag(k, 'i');
      return put_i(k, v.toInt()), true;
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType: {
      if (!v.isDouble()) return false;
      const double d = v.toDouble();
      if (runtime_float) {  // as CallBuilder passes it: a runtime value of the call
        put_tag(k, 'r');
        sig.scalars.push_back(scalar_value(c10::Scalar(d)));
        return true;
      }
      put_tag(k, 'f');
      return put(k, &d, sizeof d), true;
    }
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      if (!v.isBool()) return false;
      put_tag(k, 'b');
      return put_i(k, v.toBool()), true;
    case c10::TypeKind::StringType: {
      const std::string& s = v.toStringRef();
      put_tag(k, 'S');
      put_i(k, static_cast<int64_t>(s.size()));
      return k.append(s), true;
    }
    case c10::TypeKind::DeviceObjType:
      if (!v.isDevice()) return false;
      put_tag(k, 'd');
      put_i(k, static_cast<int64_t>(v.toDevice().type()));
      return put_i(k, v.toDevice().index()), true;
    case c10::TypeKind::ListType: {
      auto elem = type->expectRef<c10::ListType>().getElementType()->kind();
      if (elem == c10::TypeKind::IntType || elem == c10::TypeKind::SymIntType)
        return put_int_list(k, v);
      if (elem == c10::TypeKind::FloatType && v.isDoubleList()) {
        const auto l = v.toDoubleList();
        put_tag(k, 'F');
        put_i(k, static_cast<int64_t>(l.size()));
        for (double x : l) put(k, &x, sizeof x);
        return true;
      }
      const bool optional = elem == c10::TypeKind::OptionalType;
      if (optional)
        elem = type->expectRef<c10::ListType>().getElementType()
                   ->expectRef<c10::OptionalType>().getElementType()->kind();
      if (elem == c10::TypeKind::TensorType && v.isList()) {
        const auto& l = v.toListRef();
        put_tag(k, 'T');
        put_i(k, static_cast<int64_t>(l.size()));
        for (const c10::IValue& e : l) {
          if (e.isNone()) put_tag(k, 'u');
          else if (!e.isTensor() || !put_tensor(sig, e.toTensor())) return false;
        }
        return true;
      }
      if (elem == c10::TypeKind::NumberType && foreach && v.isList()) {
        const auto& l = v.toListRef();
        put_tag(k, 'N');
        put_i(k, static_cast<int64_t>(l.size()));
        for (const c10::IValue& e : l) {
          if (!e.isScalar()) return false;
          pj_scalar_t x = scalar_value(e.toScalar());
          put_i(k, x.dtype);  // the type shapes the program; the value is the call's
          sig.scalars.push_back(x);
        }
        return true;
      }
      if (optional) return false;
      if (elem == c10::TypeKind::BoolType && v.isBoolList()) {
        const auto l = v.toBoolList();
        put_tag(k, 'B');
        put_i(k, static_cast<int64_t>(l.size()));
        for (bool x : l) put_i(k, x);
        return true;
      }
      return false;
    }
    default: return false;  // symbolic values, generators, anything else
  }
}

// Where a result comes from on a memo's run.
struct ReturnSource {
  enum Kind { kUndefined, kOutput, kArgument, kOutputList } kind;
  int index;  // the output (kOutput) or the argument (kArgument)
  std::vector<int> list;  // kOutputList: the outputs of a Tensor[] return
};

struct OutputSpec {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};

struct Memo {
  struct PreparedFree {
    void operator()(pj_prepared_t* p) const { pj_prepared_free(p); }
  };
  std::unique_ptr<pj_prepared_t, PreparedFree> prepared;
  int device = 0;
  // slot s's storage: tensors[src] of the signature when src >= 0, else output -src - 1
  c10::SmallVector<int, 8> slot_source;
  std::vector<OutputSpec> outputs;  // the fresh destinations, in CallBuilder's order
  c10::SmallVector<ReturnSource, 4> returns;
  bool names_line = false;  // take python_line() for each run (index checks name it)
  // Views at a runtime offset (pj_tensor_desc_t.dyn_offset) add scalars the signature does not
  // hold: the call's scalars, with offset[i] saying which are such offsets. The signature holds
  // every tensor's storage offset, so on a hit the kept offset values are still the call's;
  // the other scalars come from the signature, in order. Empty: the signature's scalars are
  // the call's.
  std::vector<pj_scalar_t> scalars;
  std::vector<bool> offset;
};

struct ThreadMemos {
  std::unordered_map<std::string, Memo> memos;
  // ops with at least one memo: a call of any other op skips the signature
  std::unordered_map<const c10::FunctionSchema*, bool> memoized_ops;
  CallSignature sig;  // reused by run_memoized: no allocation per call once warm
  std::vector<pj_scalar_t> scalars;  // a memo's scalars with its kept offsets (Memo::offset)
};
thread_local ThreadMemos tls;
std::atomic<bool> enabled{true};

}  // namespace

void set_call_memo_enabled(bool on) { enabled = on; }
bool call_memo_enabled() { return enabled.load(std::memory_order_relaxed); }

bool call_signature(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                    CallSignature& sig) {
  sig.bytes.clear();
  sig.tensors.clear();
  sig.scalars.clear();
  const c10::FunctionSchema& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t nargs = arguments.size();
  const void* id = &schema;
  put(sig.bytes, &id, sizeof id);
  // the default dtype: the result type of an integer tensor and a Python float (x * 1.5)
  // follows torch.set_default_dtype, so a memo made under another one gives the wrong dtype
  const auto default_dtype = static_cast<int64_t>(c10::typeMetaToScalarType(at::get_default_dtype()));
  // torch.use_deterministic_algorithms: the full path's checks raise (or warn) for the ops
  // that have no deterministic implementation (put_ without accumulate), a memo would not
  const auto& ctx = at::globalContext();
  const int64_t deterministic =
      int64_t{ctx.deterministicAlgorithms()} | int64_t{ctx.deterministicAlgorithmsWarnOnly()} << 1;
  put_i(sig.bytes, static_cast<int64_t>(eager_mode()) | int64_t{pj_checks_enabled()} << 8 |
                       int64_t{pj_hlo_f32_product_precision()} << 16 | default_dtype << 24 |
                       deterministic << 40);
  const c10::IValue* args = stack.data() + (stack.size() - nargs);
  const bool foreach = schema.name().rfind("aten::_foreach_", 0) == 0;
  for (size_t a = 0; a < nargs; a++)
    if (!put_argument(sig, arguments[a], args[a], foreach,
                      args[a].isDouble() && runtime_float_arg(schema, arguments[a].name())))
      return false;
  return !sig.tensors.empty();  // the device is the first tpu tensor's
}

bool run_memoized(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (tls.memoized_ops.find(&op.schema()) == tls.memoized_ops.end() || !call_memo_enabled())
    return false;
  if (eager_mode() == EagerMode::kDebug || check_nan()) return false;
  CallSignature& sig = tls.sig;
  if (!call_signature(op, *stack, sig)) return false;
  auto it = tls.memos.find(sig.bytes);
  if (it == tls.memos.end()) return false;
  const Memo& memo = it->second;

  // Results are made as the empty_strided kernel (kernels.cpp) makes them, without its
  // dispatch: the allocator takes the current device.
  c10::SmallVector<at::Tensor, 4> outputs;
  {
    std::optional<c10::DeviceGuard> guard;
    if (current_device() != memo.device)
      guard.emplace(c10::Device(c10::DeviceType::PrivateUse1, memo.device));
    for (const OutputSpec& o : memo.outputs)
      outputs.push_back(at::detail::empty_strided_generic(
          o.sizes, o.strides, device_allocator(),
          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), o.dtype));
  }
  pj_storage_t* storages[PJ_PREPARED_MAX_SLOTS];
  for (size_t s = 0; s < memo.slot_source.size(); s++) {
    const int src = memo.slot_source[s];
    storages[s] = storage_of(src >= 0 ? *sig.tensors[static_cast<size_t>(src)]
                                      : outputs[static_cast<size_t>(-src - 1)]);
  }
  std::string where;
  if (memo.names_line) where = python_line();
  const pj_scalar_t* scalars = sig.scalars.data();
  if (!memo.offset.empty()) {
    tls.scalars = memo.scalars;
    for (size_t i = 0, j = 0; i < memo.offset.size(); i++)
      if (!memo.offset[i]) tls.scalars[i] = sig.scalars[j++];
    scalars = tls.scalars.data();
  }
  bool missed = false;
  check(pj_prepared_run(memo.prepared.get(), storages, scalars,
                        memo.names_line ? where.c_str() : nullptr, &missed));
  if (missed) {  // its program left the memory cache: the full path makes a new memo
    tls.memos.erase(it);
    return false;
  }
  const size_t nargs = op.schema().arguments().size();
  c10::SmallVector<c10::IValue, 4> results;
  for (const ReturnSource& r : memo.returns) {
    if (r.kind == ReturnSource::kOutputList) {
      c10::List<at::Tensor> l;
      for (int j : r.list) l.push_back(outputs[static_cast<size_t>(j)]);
      results.emplace_back(std::move(l));
    } else if (r.kind == ReturnSource::kOutput)
      results.emplace_back(outputs[static_cast<size_t>(r.index)]);
    else if (r.kind == ReturnSource::kArgument)
      results.push_back((*stack)[stack->size() - nargs + static_cast<size_t>(r.index)]);
    else results.emplace_back(at::Tensor());
  }
  torch::jit::drop(*stack, nargs);
  for (c10::IValue& r : results) stack->push_back(std::move(r));
  pj_metric_add(PJ_METRIC_MEMO_HITS, 1);
  return true;
}

void store_memo(const c10::OperatorHandle& op, const CallSignature& sig, const pj_call_t& call,
                const torch::jit::Stack& args, const std::vector<at::Tensor>& dests,
                const std::vector<c10::IValue>& returns, bool names_line) {
  if (!call_memo_enabled() || call.nout == 0 || call.nslots > PJ_PREPARED_MAX_SLOTS) return;
  // Views at a runtime offset: their offset scalars are kept (Memo::offset).
  std::vector<bool> offset(static_cast<size_t>(call.nscalars), false);
  size_t noffsets = 0;
  auto mark = [&](const pj_tensor_desc_t& d) {
    if (d.rank >= 0 && d.dyn_offset && !offset[static_cast<size_t>(d.offset_scalar)])
      offset[static_cast<size_t>(d.offset_scalar)] = true, noffsets++;
  };
  for (int i = 0; i < call.ntensors; i++) mark(call.tensors[i]);
  for (int o = 0; o < call.nout; o++) mark(call.outs[o]);
  if (sig.scalars.size() + noffsets != static_cast<size_t>(call.nscalars)) return;
  // The arguments must still have the signature they had (an in-place destination that the
  // full path resized would not).
  CallSignature after;
  if (!call_signature(op, args, after) || after.bytes != sig.bytes) return;
  auto same = [](const at::Tensor& a, const at::Tensor& b) {
    return a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl();
  };
  Memo memo;
  memo.device = call.device;
  memo.names_line = names_line && call.where != nullptr;
  // destinations that are not arguments are the memo's outputs
  std::vector<const at::Tensor*> outputs;
  for (const at::Tensor& d : dests) {
    bool argument = false;
    for (const at::Tensor* t : sig.tensors) argument = argument || same(*t, d);
    if (argument) continue;
    outputs.push_back(&d);
    memo.outputs.push_back({d.sizes().vec(), d.strides().vec(), d.scalar_type()});
  }
  for (int s = 0; s < call.nslots; s++) {
    const pj_storage_t* st = call.slots[s].storage;
    int src = 0;
    bool found = false;
    for (size_t i = 0; i < sig.tensors.size() && !found; i++)
      if (storage_of(*sig.tensors[i]) == st) src = static_cast<int>(i), found = true;
    for (size_t j = 0; j < outputs.size() && !found; j++)
      if (storage_of(*outputs[j]) == st) src = -static_cast<int>(j) - 1, found = true;
    if (!found) return;
    memo.slot_source.push_back(src);
  }
  auto output_index = [&](const at::Tensor& t) {
    for (size_t j = 0; j < outputs.size(); j++)
      if (same(*outputs[j], t)) return static_cast<int>(j);
    return -1;
  };
  for (const c10::IValue& r : returns) {
    if (r.isTensorList()) {
      ReturnSource src{ReturnSource::kOutputList, 0, {}};
      for (const at::Tensor& t : r.toTensorList()) {
        const int j = t.defined() ? output_index(t) : -1;
        if (j < 0) return;
        src.list.push_back(j);
      }
      memo.returns.push_back(std::move(src));
      continue;
    }
    if (!r.isTensor()) return;
    const at::Tensor& t = r.toTensor();
    if (!t.defined()) {
      memo.returns.push_back({ReturnSource::kUndefined, 0, {}});
      continue;
    }
    int index = output_index(t);
    if (index >= 0) {
      memo.returns.push_back({ReturnSource::kOutput, index, {}});
      continue;
    }
    for (size_t a = 0; a < args.size() && index < 0; a++)
      if (args[a].isTensor() && same(args[a].toTensor(), t)) index = static_cast<int>(a);
    if (index < 0) return;
    memo.returns.push_back({ReturnSource::kArgument, index, {}});
  }
  if (noffsets > 0) {
    memo.scalars.assign(call.scalars, call.scalars + call.nscalars);
    memo.offset = std::move(offset);
  }
  memo.prepared.reset(pj_prepared_new(&call, eager_mode() == EagerMode::kDeferAndFuse));
  if (!memo.prepared) return;
  if (tls.memos.size() >= kMaxMemos) tls.memos.clear();
  tls.memos.insert_or_assign(sig.bytes, std::move(memo));
  tls.memoized_ops[&op.schema()] = true;
}

}  // namespace torch_pjrt
