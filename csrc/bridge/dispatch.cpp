// The one boxed kernel behind every aten op on tpu: schema-driven translation of the call into
// a pj_call_t (arguments by name), output metadata from PyTorch's Meta kernels (so dtype
// promotion, broadcasting and error checks match CPU), destinations for functional, in-place
// and out= variants, and the CPU fallback for ops without a lowering. No op semantics here.
#include <Python.h>  // first, as Python requires: python_line() names the calling line
#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/Parallel.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "call_builder.h"
#include "eager_mode.h"
#include "ivalue_map.h"
#include "meta_cache.h"
#include "out_strides.h"
#include "call_memo.h"
#include "view_index_put.h"
#include "host_quirks.h"
extern "C" {
#include "../ops/dynamic.h"
#include "torch_pjrt/transfer.h"
#include "torch_pjrt/metrics.h"
}

namespace torch_pjrt {
namespace {

bool cpu_fallback_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("TORCH_PJRT_CPU_FALLBACK");
    return !(v && std::string(v) == "0");
  }();
  return allowed;
}

std::mutex fallback_mu;
std::map<std::string, int64_t> fallback_counts;  // guarded by fallback_mu

void check_one_tpu_device(const torch::jit::Stack& args);  // below

void run_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                      const std::string& why) {
  const std::string name = c10::toString(op.schema().operator_name());
  check_one_tpu_device(torch::jit::last(*stack, op.schema().arguments().size()).vec());
  TORCH_CHECK_NOT_IMPLEMENTED(cpu_fallback_allowed(), "The operator '", name,
                              "' is not implemented for the tpu device (", why,
                              ") and TORCH_PJRT_CPU_FALLBACK=0 forbids running it on the CPU.");
  bool first;
  {
    std::lock_guard<std::mutex> g(fallback_mu);
    first = fallback_counts[name]++ == 0;
  }
  if (first)
    TORCH_WARN("The operator '", name, "' is not lowered for the tpu device (", why,
               "); it runs on the CPU with copies (counted in torch.tpu.fallback_ops()).");
  pj_metric_add(PJ_METRIC_FALLBACKS, 1);
  at::native::cpu_fallback(op, stack);
}

std::string base_name(const c10::FunctionSchema& schema) {
  std::string n = schema.name();
  if (n.rfind("aten::", 0) == 0) n = n.substr(6);
  // in-place variant: trailing single underscore (not dunder names like __and__)
  if (n.size() > 1 && n.back() == '_' && n[n.size() - 2] != '_') n.pop_back();
  return n;
}

bool is_write(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

// CPU's range factories (arange.start_out, range.out, linspace.out, logspace.out) resize their out=
// tensor only when its element count differs from the result's, with a plain resize_ (arange
// warns first, in its own words), and otherwise write the values through the out tensor in
// its own shape, row-major (the lowerings reshape to it). Their Meta kernels resize (and warn
// about) any out= of another shape, so they are asked with an empty out= in its place.
bool is_range_factory(const std::string& base) {
  return base == "arange" || base == "range" || base == "linspace" || base == "logspace";
}

// Resizes out= tensor t of a range factory to CPU's result sizes where CPU would.
void resize_range_out(const std::string& base, at::Tensor& t, c10::IntArrayRef sizes) {
  const int64_t n = c10::multiply_integers(sizes);
  if (t.numel() == n) return;
  if (base == "arange" && t.numel() > 0)
    TORCH_WARN("The number of elements in the out tensor of shape ", t.sizes(), " is ",
               t.numel(), " which does not match the computed number of elements ", n,
               ". Note that this may occur as a result of rounding error. The out tensor will be "
               "resized to a tensor of shape (", n, ",).");
  t.resize_(sizes);
}

std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList())
      out.push_back(e.isTensor() ? e.toTensor() : at::Tensor());
  }
  return out;
}

// The device an op runs on: its first tpu tensor's (CallBuilder refuses tensors of other tpu
// devices); for an op without tpu tensors (a factory such as tril_indices), its tpu device
// argument's; a device without an index, or no device at all, means the current device, as
// "cuda" does.
int call_device(const torch::jit::Stack& args) {
  for (const c10::IValue& v : args)
    for (const at::Tensor& t : tensors_of(v))
      if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1)
        return t.device().index() < 0 ? current_device() : t.device().index();
  for (const c10::IValue& v : args)
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1)
      return v.toDevice().has_index() ? v.toDevice().index() : current_device();
  return current_device();
}

// Tensors of two tpu devices in one op raise CUDA's error, whatever path the op takes (the CPU
// fallback would otherwise compute them together and put every result on the first device).
void check_one_tpu_device(const torch::jit::Stack& args) {
  std::optional<c10::Device> seen;
  for (const c10::IValue& v : args)
    for (const at::Tensor& t : tensors_of(v)) {
      if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) continue;
      if (!seen) seen = t.device();
      TORCH_CHECK(t.device() == *seen,
                  "Expected all tensors to be on the same device, but found at least two "
                  "devices, ", *seen, " and ", t.device(), "!");
    }
}

// Ops that draw random numbers: those with a Generator? argument, and a few without one that
// use the default generator (native_dropout).
bool is_random_op(const c10::FunctionSchema& schema, const std::string& base) {
  if (base == "native_dropout") return true;
  for (const auto& a : schema.arguments())
    if (a.type()->kind() == c10::TypeKind::OptionalType &&
        a.type()->expectRef<c10::OptionalType>().getElementType()->kind() ==
            c10::TypeKind::GeneratorType)
      return true;
  return false;
}

// Philox counter values a random op consumes: one per output element, rounded up to 4 as
// Philox produces 4 words per counter step. Offsets only need to be disjoint between calls.
uint64_t rng_increment(const std::vector<at::Tensor>& outs) {
  uint64_t n = 0;
  for (const at::Tensor& t : outs) n += static_cast<uint64_t>(t.numel());
  return (n + 3) / 4 * 4 + 4;
}

// native_batch_norm updates running_mean/running_var in training mode although its schema does
// not mark them as written (a historical schema); they become destinations like marked ones.
bool mutates_unannotated(const std::string& base, const c10::FunctionSchema& schema, size_t a,
                         const torch::jit::Stack& args) {
  if (base != "native_batch_norm") return false;
  const std::string& n = schema.arguments()[a].name();
  if (n != "running_mean" && n != "running_var") return false;
  for (size_t i = 0; i < schema.arguments().size(); i++)
    if (schema.arguments()[i].name() == "training") return args[i].toBool();
  return false;
}

// The saved statistics of layer / batch norm follow CPU's conventions, where the Meta kernels
// follow CUDA's: they keep the input's dtype unless a reduced-precision input comes with
// float32 parameters (then float32), and batch norm's are empty outside training.
void cpu_norm_stat_returns(const std::string& base, const c10::FunctionSchema& schema,
                           const torch::jit::Stack& args, std::vector<c10::IValue>& meta) {
  const bool ln = base == "native_layer_norm";
  if (!ln && base != "native_batch_norm" && base != "_native_batch_norm_legit" &&
      base != "_native_batch_norm_legit_no_training" && base != "_batch_norm_with_update" &&
      base != "_batch_norm_no_update")
    return;
  at::ScalarType in = at::kFloat;
  bool mixed = false;
  bool training = base != "_native_batch_norm_legit_no_training" && base != "_batch_norm_no_update";
  for (size_t i = 0; i < schema.arguments().size(); i++) {
    const std::string& n = schema.arguments()[i].name();
    if (n == "input" && args[i].isTensor()) in = args[i].toTensor().scalar_type();
    else if (n == "training") training = args[i].toBool();
    else if ((n == "weight" || n == "bias" || n == "running_mean" || n == "running_var") &&
             args[i].isTensor() && args[i].toTensor().defined())
      mixed = mixed || args[i].toTensor().scalar_type() == at::kFloat;
  }
  if (in != at::kBFloat16 && in != at::kHalf) mixed = false;
  for (size_t r = 1; r < 3 && r < meta.size(); r++) {
    if (!meta[r].isTensor() || !meta[r].toTensor().defined()) continue;
    const at::Tensor& m = meta[r].toTensor();
    at::ScalarType dt = mixed ? at::kFloat : in;
    if (ln || training)
      meta[r] = at::empty_strided(m.sizes(), m.strides(), m.options().dtype(dt));
    else
      meta[r] = at::empty({0}, m.options().dtype(dt));
  }
}

// Memory formats CPU's kernels choose where the Meta kernels return contiguous results:
// - reflection / replication padding (2-d and 3-d, and their backward) write in `self`'s
//   suggested memory format;
// - convolution (and convolution_backward's grad_input and grad_weight) is channels-last when
//   the input or the weight is: 4-d always, 5-d where CPU's kernel is oneDNN's (float32,
//   bfloat16); else contiguous (CPU's float64 and float16 3-d kernels, whatever the layouts).
void restride(std::vector<c10::IValue>& meta, size_t r, at::MemoryFormat mf) {
  if (r >= meta.size() || !meta[r].isTensor() || !meta[r].toTensor().defined()) return;
  const at::Tensor& m = meta[r].toTensor();
  if (m.dim() >= 4 && !m.is_contiguous(mf))
    meta[r] = at::empty(m.sizes(), m.options().memory_format(mf));
}

// The argument the schema names `name`, or nullptr when the call has none by that name.
const c10::IValue* named_arg(const c10::FunctionSchema& schema, const torch::jit::Stack& args,
                             const char* name) {
  for (size_t i = 0; i < schema.arguments().size() && i < args.size(); i++)
    if (schema.arguments()[i].name() == name) return &args[i];
  return nullptr;
}

const at::Tensor* named_tensor(const c10::FunctionSchema& schema, const torch::jit::Stack& args,
                               const char* name) {
  const c10::IValue* v = named_arg(schema, args, name);
  return v && v->isTensor() ? &v->toTensor() : nullptr;
}

std::vector<int64_t> named_ints(const c10::FunctionSchema& schema, const torch::jit::Stack& args,
                                const char* name) {
  const c10::IValue* v = named_arg(schema, args, name);
  return v && v->isIntList() ? v->toIntVector() : std::vector<int64_t>{};
}

// Whether CPU runs a 3-d convolution in oneDNN (which keeps channels-last; CPU's own 3-d kernel
// returns contiguous results). PyTorch's choice, as its convolution code states it: reduced
// precision by the host's ISA (cpu_onednn_takes, host_quirks.cpp); float32 unless a transposed
// convolution's output padding reaches its stride, and only when the call is big enough that
// oneDNN is the faster one (a batch above 1, groups, a kernel above 3x3 in its last two dims,
// or N*C*D*H above 20480; for a 1x1 last-two-dims kernel, unit stride and dilation and a batch
// below 16, only with more than one intra-op thread); never float64.
bool cpu_conv3d_in_onednn(const c10::FunctionSchema& schema, const torch::jit::Stack& args,
                          const at::Tensor& input, const at::Tensor& weight) {
  const at::ScalarType dt = input.scalar_type();
  if (!at::globalContext().userEnabledMkldnn()) return false;
  const auto stride = named_ints(schema, args, "stride");
  const auto dilation = named_ints(schema, args, "dilation");
  const auto output_padding = named_ints(schema, args, "output_padding");
  const c10::IValue* transposed = named_arg(schema, args, "transposed");
  const c10::IValue* groups_arg = named_arg(schema, args, "groups");
  const int64_t groups = groups_arg && groups_arg->isInt() ? groups_arg->toInt() : 1;
  if (transposed && transposed->isBool() && transposed->toBool())
    for (size_t i = 0; i < output_padding.size() && i < stride.size(); i++)
      if (output_padding[i] >= stride[i]) return false;
  if (dt == at::kBFloat16 || dt == at::kHalf) return cpu_onednn_takes(dt);
  if (dt != at::kFloat) return false;
  auto any_not_one = [](const std::vector<int64_t>& v) {
    return std::any_of(v.begin(), v.end(), [](int64_t x) { return x != 1; });
  };
  const int64_t kw = weight.size(-1), kh = weight.size(-2);
  const bool first = any_not_one(stride) || any_not_one(dilation) || input.size(0) >= 16 ||
                     kw != 1 || kh != 1 || at::get_num_threads() > 1;
  const bool second = groups > 1 || (kw > 3 && kh > 3) || input.size(0) > 1 ||
                      input.size(0) * input.size(1) * input.size(2) * input.size(3) > 20480;
  return first && second;
}

void cpu_memory_format_returns(const std::string& base, const c10::FunctionSchema& schema,
                               const torch::jit::Stack& args, std::vector<c10::IValue>& meta) {
  static const std::unordered_set<std::string> pads = {
      "reflection_pad2d",          "reflection_pad3d",          "replication_pad2d",
      "replication_pad3d",         "reflection_pad2d_backward", "reflection_pad3d_backward",
      "replication_pad2d_backward", "replication_pad3d_backward"};
  if (pads.count(base)) {
    if (const at::Tensor* self = named_tensor(schema, args, "self")) {
      const at::MemoryFormat mf = self->suggest_memory_format();
      if (mf != at::MemoryFormat::Contiguous) restride(meta, 0, mf);
    }
    return;
  }
  if (base != "convolution" && base != "convolution_backward") return;
  const at::Tensor* input = named_tensor(schema, args, "input");
  const at::Tensor* weight = named_tensor(schema, args, "weight");
  if (!input || !weight || input->dim() != weight->dim()) return;
  const at::ScalarType dt = input->scalar_type();
  if ((input->dim() != 4 && input->dim() != 5) || !at::isFloatingType(dt)) return;
  const at::MemoryFormat cl =
      input->dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
  const bool takes_cl =
      input->dim() == 4 || cpu_conv3d_in_onednn(schema, args, *input, *weight);
  const bool asked = input->suggest_memory_format() == cl || weight->suggest_memory_format() == cl;
  const at::MemoryFormat mf = takes_cl && asked ? cl : at::MemoryFormat::Contiguous;
  restride(meta, 0, mf);
  if (base == "convolution_backward") restride(meta, 1, mf);
}

// A few non-view ops (mm, bmm, addmm, dot, vdot, ...) let conjugate / negative views through
// PyTorch's Conjugate and Negative fallbacks, expecting the kernel to honor the bits; lowerings
// read stored values, so such inputs are resolved first (a copy only when a bit is set).
at::Tensor resolve_bits(const at::Tensor& t) {
  return t.defined() && (t.is_conj() || t.is_neg()) ? t.resolve_conj().resolve_neg() : t;
}

std::vector<at::Tensor> resolve_bits(std::vector<at::Tensor> ts) {
  for (at::Tensor& t : ts) t = resolve_bits(t);
  return ts;
}

// index_add / index_reduce (out= forms, which the in-place forms reach) with a source empty
// along `dim`: their C++ Meta kernel selects element 0 of the source along dim (a Meta-only
// check CPU's kernel skips) and raises IndexError. The result is self's shape, so it is taken
// from self.
bool empty_index_source(const std::string& base, const c10::FunctionSchema& schema,
                        const torch::jit::Stack& args) {
  if (base != "index_reduce" && base != "index_add") return false;
  const at::Tensor* source = nullptr;
  std::optional<int64_t> dim;
  for (size_t i = 0; i < schema.arguments().size() && i < args.size(); i++) {
    const std::string& n = schema.arguments()[i].name();
    if (n == "source" && args[i].isTensor()) source = &args[i].toTensor();
    if (n == "dim" && args[i].isInt()) dim = args[i].toInt();
  }
  if (!source || !dim || source->dim() == 0) return false;
  const int64_t d = *dim < 0 ? *dim + source->dim() : *dim;
  return d >= 0 && d < source->dim() && source->size(d) == 0;
}

// Ops without a Meta kernel whose one result has the shape and dtype of `self` (input
// gradients; log_probs for CTC); their output metadata is that of that argument.
std::optional<std::vector<c10::IValue>> returns_like_self(const std::string& base,
                                                          const c10::FunctionSchema& schema,
                                                          const torch::jit::Stack& args) {
  if (base != "multi_margin_loss_backward" && base != "multilabel_margin_loss_backward" &&
      base != "fractional_max_pool3d_backward" && base != "_ctc_loss_backward" &&
      !empty_index_source(base, schema, args))
    return std::nullopt;
  const char* like = base == "_ctc_loss_backward" ? "log_probs" : "self";
  for (size_t i = 0; i < schema.arguments().size(); i++)
    if (schema.arguments()[i].name() == like && args[i].isTensor()) {
      const at::Tensor& t = args[i].toTensor();
      std::vector<c10::IValue> r;
      r.emplace_back(at::empty(t.sizes(), t.options().device(c10::kMeta)));
      return r;
    }
  return std::nullopt;
}

void add_argument(CallBuilder& b, const c10::Argument& arg, const c10::IValue& v) {
  const std::string& name = arg.name();
  // out= tensors are destinations only (added as outs after they are resized: describing them
  // here would capture a storage that resize_ may replace).
  if (v.isNone() || arg.is_out()) return b.add_none(name);
  c10::TypePtr type = arg.real_type();
  if (type->kind() == c10::TypeKind::OptionalType)
    type = type->expectRef<c10::OptionalType>().getElementType();
  switch (type->kind()) {
    case c10::TypeKind::TensorType: return b.add_tensor(name, resolve_bits(v.toTensor()));
    case c10::TypeKind::NumberType: return b.add_scalar(name, v.toScalar());
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return b.add_int(name, v.isSymInt() ? v.toSymInt().guard_int(__FILE__, __LINE__)
                                          : v.toInt());
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType: return b.add_float(name, v.toDouble());
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType: return b.add_bool(name, v.toBool());
    case c10::TypeKind::StringType: return b.add_str(name, v.toStringRef());
    case c10::TypeKind::ScalarTypeType:
      return b.add_int(name, to_pj_dtype(static_cast<at::ScalarType>(v.toInt())));
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::DeviceObjType:
    case c10::TypeKind::MemoryFormatType:
    case c10::TypeKind::GeneratorType: return b.add_none(name);
    case c10::TypeKind::ListType: {
      auto elem = type->expectRef<c10::ListType>().getElementType();
      auto ek = elem->kind();
      if (ek == c10::TypeKind::OptionalType)
        ek = elem->expectRef<c10::OptionalType>().getElementType()->kind();
      if (ek == c10::TypeKind::TensorType)
        return b.add_tensor_list(name, resolve_bits(tensors_of(v)));
      if (ek == c10::TypeKind::IntType || ek == c10::TypeKind::SymIntType) {
        std::vector<int64_t> ints;
        if (v.isIntList()) {
          ints = v.toIntVector();
        } else {
          for (const c10::IValue& e : v.toList())
            ints.push_back(e.isSymInt() ? e.toSymInt().guard_int(__FILE__, __LINE__) : e.toInt());
        }
        return b.add_ints(name, ints);
      }
      if (ek == c10::TypeKind::FloatType) return b.add_floats(name, v.toDoubleVector());
      if (ek == c10::TypeKind::BoolType) {
        std::vector<int64_t> ints;
        for (bool x : v.toBoolList()) ints.push_back(x);
        return b.add_ints(name, ints);
      }
      if (ek == c10::TypeKind::NumberType) {
        // Scalar[] (e.g. _foreach_addcdiv_.ScalarList's per-step sizes): runtime values, so
        // changing them does not recompile
        std::vector<c10::Scalar> ss;
        for (const c10::IValue& e : v.toList()) ss.push_back(e.toScalar());
        return b.add_scalars(name, ss);
      }
      TORCH_CHECK_NOT_IMPLEMENTED(false, "argument type ", type->str(), " of ", name);
      return;
    }
    default:
      if (v.isTensor()) return b.add_tensor(name, resolve_bits(v.toTensor()));
      if (v.isScalar()) return b.add_scalar(name, v.toScalar());
      TORCH_CHECK_NOT_IMPLEMENTED(false, "argument type ", type->str(), " of ", name);
  }
}

}  // namespace

// Float arguments that training code changes from step to step (an LR scheduler's lr): passed
// as runtime scalars, so a new value reuses the program. As compile-time constants they made
// every step of a scheduled run compile the fused optimizer again (torchtitan's warmup and
// decay: one 0.5-1.1 s compile per step). Hyperparameters the lowering branches on (betas,
// momentum, weight decay) stay constants.
bool runtime_float_arg(const c10::FunctionSchema& schema, const std::string& name) {
  static const std::pair<const char*, const char*> kRows[] = {
      {"_fused_adam", "lr"}, {"_fused_adamw", "lr"}, {"_fused_sgd", "lr"}};
  // the call memo asks this of every float argument it sees: no allocation unless a row's
  // prefix matches
  if (schema.name().rfind("aten::_fused_", 0) != 0) return false;
  const std::string base = base_name(schema);
  for (const auto& row : kRows)
    if (base == row.first && name == row.second) return true;
  return false;
}

ExecLabel::ExecLabel(const char* op) : on_(pj_exec_profile_enabled()) {
  if (on_) enter(op);
}
ExecLabel::ExecLabel(const c10::FunctionSchema& schema) : on_(pj_exec_profile_enabled()) {
  if (on_) enter(base_name(schema));
}
void ExecLabel::enter(const std::string& op) {
  std::strncpy(prev_, pj_exec_profile_current_label(), sizeof prev_ - 1);
  pj_exec_profile_label(("eager:" + op).c_str());
}
ExecLabel::~ExecLabel() {
  if (on_) pj_exec_profile_label(std::strcmp(prev_, "eager") == 0 ? "" : prev_);
}

// CPU's TensorIterator refuses, before anything else it checks (shapes, dtypes, the kernel's
// dtype support), a destination with internal overlap (two elements through one location)
// and one partially overlapping an input (a full overlap, x.add_(x), is fine). The fake device
// addresses of storages make PyTorch's own checks work on tpu tensors. Inputs on another
// device (a CPU scalar tensor) cannot overlap a tpu destination and are not compared.
void iterator_overlap_checks(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const size_t nargs = schema.arguments().size();
  if (args.size() < nargs) return;
  const size_t first = args.size() - nargs;
  for (size_t a = 0; a < nargs; a++)
    if (is_write(schema.arguments()[a]))
      for (const at::Tensor& d : tensors_of(args[first + a])) {
        if (!d.defined()) continue;
        at::assert_no_internal_overlap(d);
        for (size_t i = 0; i < nargs; i++)
          if (!is_write(schema.arguments()[i]))
            for (const at::Tensor& in : tensors_of(args[first + i]))
              if (in.defined() && in.device() == d.device()) at::assert_no_partial_overlap(d, in);
      }
}

// " at file:line" of the innermost Python frame outside torch's own package on the calling
// thread, or "" (no Python frame: e.g. autograd's worker thread). Only used on error paths:
// torch's bindings release the GIL around ops, so it is taken back here.
// Compiled graphs (torch_pjrt/compile/graph_runner.py): line of a graph's generated code ->
// the user's source line of the node on it, per generated file ("<eval_with_key>.N").
std::mutex g_source_mu;
std::unordered_map<std::string, std::unordered_map<int, std::string>> g_source_lines;

void set_source_lines(const std::string& file, std::unordered_map<int, std::string> lines) {
  std::lock_guard<std::mutex> g(g_source_mu);
  g_source_lines[file] = std::move(lines);
}

std::string python_line() {
  if (!Py_IsInitialized()) return "";
  PyGILState_STATE gil = PyGILState_Ensure();
  std::string where;
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  if (f) Py_INCREF(f);
  while (f && where.empty()) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    if (!file) PyErr_Clear();
    if (file && !std::strstr(file, "/torch/"))
      where = std::string(" at ") + file + ":" + std::to_string(PyFrame_GetLineNumber(f));
    if (file && std::strncmp(file, "<eval_with_key>", 15) == 0) {  // a compiled graph's code
      std::lock_guard<std::mutex> g(g_source_mu);
      auto it = g_source_lines.find(file);
      if (it != g_source_lines.end()) {
        auto line = it->second.find(PyFrame_GetLineNumber(f));
        if (line != it->second.end()) where = " at " + line->second + " (in a compiled graph)";
      }
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  PyGILState_Release(gil);
  return where;
}

namespace {


std::string describe_inputs(const torch::jit::Stack& args) {
  std::ostringstream o;
  o << "(";
  for (size_t i = 0; i < args.size(); i++) {
    if (i) o << ", ";
    if (args[i].isTensor() && args[i].toTensor().defined()) {
      const at::Tensor& t = args[i].toTensor();
      o << c10::toString(t.scalar_type()) << t.sizes();
    } else if (args[i].isTensorList()) {
      o << "[" << args[i].toTensorList().size() << " tensors]";
    } else {
      o << args[i];
    }
  }
  o << ")";
  return o.str();
}

// Ops whose index arguments CPU bounds-checks. XLA clamps or drops out-of-range indices
// silently. In Debug mode the op first runs on host copies of its inputs so that bad indices
// raise exactly the exception CPU raises, at once; in the other modes their lowerings check on
// the device and the error comes at the next synchronization (index_checks.h), naming the
// Python line recorded here.
bool checks_indices(const std::string& base) {
  static const std::set<std::string> ops = {
      "index_select", "gather", "scatter", "scatter_add", "scatter_reduce", "index",
      "_unsafe_index", "index_put", "_index_put_impl", "_unsafe_index_put", "take", "put",
      "index_add", "index_copy", "index_fill", "index_reduce", "embedding",
      "embedding_dense_backward", "_embedding_bag", "_embedding_bag_forward_only",
      "nll_loss_forward", "nll_loss2d_forward", "nll_loss_backward", "nll_loss2d_backward"};
  return ops.count(base) > 0;
}

// Set when a Meta kernel refused an op's arguments (the error is then the Meta kernel's).
thread_local bool meta_refused = false;

// A Python-side warning handler that drops what it is given.
struct DropWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

bool takes_cpu_indices(const std::string& base);

// drop_warnings: the call gives CPU's warnings itself (advanced indexing's uint8 deprecation,
// index_tensor_checks), so the replay's are dropped.
void check_like_cpu(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                    bool drop_warnings) {
  auto host = [](const at::Tensor& t) {
    return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 ? t.cpu() : t;
  };
  torch::jit::Stack cpu;
  for (const c10::IValue& v : args) cpu.push_back(map_tensors(v, host, c10::Device(c10::kCPU)));
  DropWarnings drop;
  std::optional<c10::WarningUtils::WarningHandlerGuard> guard;
  if (drop_warnings) guard.emplace(&drop);
  op.callBoxed(&cpu);  // CPU's checks; the results are discarded
}

// TORCH_PJRT_CHECK_NAN=1: names the first op whose floating results hold NaN or Inf. The
// check runs ops itself (isfinite, all, item): the guard keeps it from checking those.
thread_local bool in_nan_check = false;

void check_finite(const c10::FunctionSchema& schema, const torch::jit::Stack& args,
                  const std::vector<at::Tensor>& dests) {
  if (in_nan_check) return;
  in_nan_check = true;
  bool bad = false;
  try {
    for (const at::Tensor& d : dests)
      if (d.numel() > 0 && (d.is_floating_point() || d.is_complex()) &&
          !at::isfinite(d).all().item<bool>())
        bad = true;
  } catch (...) {
    in_nan_check = false;
    throw;
  }
  in_nan_check = false;
  TORCH_CHECK(!bad, "TORCH_PJRT_CHECK_NAN: ", schema.operator_name(),
              " produced NaN or Inf from inputs ", describe_inputs(args), python_line());
}

// Raises `message` as an error of e's own type (an IndexError stays an IndexError), so that a
// message added on the way keeps the Python exception CPU raises.
[[noreturn]] void rethrow_as(const c10::Error& e, const std::string& message) {
  if (dynamic_cast<const c10::IndexError*>(&e)) TORCH_CHECK_INDEX(false, message);
  if (dynamic_cast<const c10::ValueError*>(&e)) TORCH_CHECK_VALUE(false, message);
  if (dynamic_cast<const c10::TypeError*>(&e)) TORCH_CHECK_TYPE(false, message);
  if (dynamic_cast<const c10::NotImplementedError*>(&e)) TORCH_CHECK_NOT_IMPLEMENTED(false, message);
  if (dynamic_cast<const c10::LinAlgError*>(&e)) TORCH_CHECK_LINALG(false, message);
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e))
    TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  TORCH_CHECK(false, message);
}

// Vector norms: which order the runtime Scalar holds, as the compile-time "__ord_kind" the
// lowering (reduce.c, lower_norm) specializes on: 0, 1, 2, +inf (3), -inf (4), any other (5).
// An absent order (norm.ScalarOpt_dim's None) is 2.
void add_norm_order_kind(CallBuilder& b, const c10::FunctionSchema& schema,
                         const torch::jit::Stack& args) {
  for (size_t a = 0; a < schema.arguments().size(); a++) {
    const std::string& name = schema.arguments()[a].name();
    if (name != "ord" && name != "p") continue;
    if (!args[a].isNone() && (!args[a].isScalar() || args[a].toScalar().isComplex())) return;
    const double p = args[a].isNone() ? 2.0 : args[a].toScalar().toDouble();
    const int64_t kind = p == 0 ? 0 : p == 1 ? 1 : p == 2 ? 2
                       : std::isinf(p) ? (p > 0 ? 3 : 4) : 5;
    return b.add_int("__ord_kind", kind);
  }
}

void lowered_call(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  const std::string& base) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  torch::jit::Stack args(stack->end() - nargs, stack->end());
  const bool debug = eager_mode() == EagerMode::kDebug;
  if (debug && checks_indices(base)) check_like_cpu(op, args, takes_cpu_indices(base));
  cpu_kernel_checks(base, schema, args);  // CPU kernels' checks their Meta kernels lack
  const int device = call_device(args);
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));

  // A call of a kind the call memo can repeat (call_memo.h) keeps a memo once it ran: not
  // Debug or NaN-checked calls (checked one by one), random ops (a new seed each), ops that
  // index_put_into_view may take instead (its choice is not this path's), nor any call under
  // torch.use_deterministic_algorithms (an op without a deterministic implementation raises,
  // or warns, on every call: cpu_kernel_checks above, which a memoized call skips).
  CallSignature sig;
  const bool memoizable = !debug && !check_nan() && !is_random_op(schema, base) &&
                          !view_put_candidate(base) &&
                          !at::globalContext().deterministicAlgorithms() &&
                          call_signature(op, args, sig);
  CallBuilder b(base, schema.overload_name(), device);
  for (size_t a = 0; a < nargs; a++) {
    // fill_ and zero_ overwrite self without reading it: torch.zeros/full/ones (empty, then
    // fill_) then never upload zeros for the fresh storage first.
    const std::string& name = schema.arguments()[a].name();
    if (a == 0 && (base == "fill" || base == "zero") && args[a].isTensor())
      b.add_tensor(name, resolve_bits(args[a].toTensor()), false);
    else if (args[a].isDouble() && runtime_float_arg(schema, name))
      b.add_scalar(name, c10::Scalar(args[a].toDouble()));
    else
      add_argument(b, schema.arguments()[a], args[a]);
  }
  if (base == "linalg_vector_norm" || base == "norm") add_norm_order_kind(b, schema, args);
  // The source line a device-side index check names (one frame walk per indexing op).
  std::string where;
  if (!debug && pj_checks_enabled() && checks_indices(base)) {
    where = python_line();
    b.call().where = where.c_str();
  }

  // Data-dependent result shapes (nonzero, masked_select, boolean-mask indexing): count on the
  // device first (a host sync), then run with the known size. See csrc/ops/dynamic.h.
  if (pj_call_dynamic(&b.call())) {
    int64_t count = 0;
    check(pj_dynamic_count(&b.call(), &count));
    pj_type_t ts[PJ_DYNAMIC_MAX_OUTS];
    int nt = 0;
    check(pj_dynamic_out_types(&b.call(), count, ts, PJ_DYNAMIC_MAX_OUTS, &nt));
    b.add_int("__count", count);
    // destinations: the out= arguments in schema order, else fresh tensors
    std::vector<at::Tensor> results;
    size_t next_write = 0;
    bool any = false;
    for (int i = 0; i < nt; i++) {
      std::vector<int64_t> sizes(ts[i].dims, ts[i].dims + ts[i].rank);
      at::Tensor r;
      while (next_write < nargs && !is_write(schema.arguments()[next_write])) next_write++;
      if (next_write < nargs) {
        r = args[next_write++].toTensor();
        at::native::resize_output(r, sizes);
      } else {
        r = at::empty(sizes, at::TensorOptions()
                                 .dtype(from_pj_dtype(ts[i].dtype))
                                 .device(c10::DeviceType::PrivateUse1, device));
      }
      any = any || r.numel() > 0;
      results.push_back(r);
    }
    if (any) {
      for (const at::Tensor& r : results) b.add_out(r);
      b.run();
    }
    torch::jit::drop(*stack, nargs);
    const auto& rets = schema.returns();
    if (rets.size() == 1 && rets[0].type()->kind() == c10::TypeKind::ListType) {
      stack->push_back(c10::List<at::Tensor>(results));
    } else {
      for (size_t i = 0; i < rets.size() && i < results.size(); i++) stack->push_back(results[i]);
    }
    return;
  }

  // Ops returning a bool computed from values (equal): the lowering writes a 0-d bool, read
  // back here (a host sync).
  if (schema.returns().size() == 1 &&
      schema.returns()[0].type()->kind() == c10::TypeKind::BoolType) {
    at::Tensor r = at::empty(
        {}, at::TensorOptions().dtype(at::kBool).device(c10::DeviceType::PrivateUse1, device));
    b.add_out(r);
    b.run();
    const bool value = r.cpu().item<bool>();
    torch::jit::drop(*stack, nargs);
    stack->push_back(value);
    return;
  }

  // 1. Output metadata from the Meta kernel (also raises CPU's errors for bad input).
  bool fresh_returns = false;
  for (const c10::Argument& r : schema.returns()) fresh_returns = fresh_returns || !is_write(r);
  std::optional<std::vector<c10::IValue>> meta;
  try {
    meta = lowp_meta_returns(base, args);
    if (!meta && empty_index_source(base, schema, args))
      meta = returns_like_self(base, schema, args);
    if (!meta && is_range_factory(base)) {
      torch::jit::Stack meta_args(args);
      for (size_t a = 0; a < nargs; a++)
        if (is_write(schema.arguments()[a]) && meta_args[a].isTensor())
          meta_args[a] = at::empty({0}, meta_args[a].toTensor().options().device(c10::kMeta));
      meta = meta_returns(op, meta_args);
    }
    if (!meta) meta = meta_returns(op, args);
  } catch (...) {  // c10::Error, or a Python Meta kernel's exception (python_error)
    meta_refused = true;  // see structured_kernel
    out_dtype_checks(schema, args);  // CPU's message for an out= dtype the Meta kernel refused
    throw;
  }
  if (!meta) meta = returns_like_self(base, schema, args);
  if (!meta) {
    // No Meta kernel. Data-dependent output shapes (nonzero, masked_select, ...) cannot be
    // known without running: those take the CPU path. Ops whose only outputs are their mutated
    // arguments (fused optimizer steps) need no metadata and run lowered without it.
    if (fresh_returns) return run_cpu_fallback(op, stack, "no Meta kernel for its output shapes");
    meta.emplace(schema.returns().size(), c10::IValue());  // returns alias the arguments
  }
  cpu_norm_stat_returns(base, schema, args, *meta);
  cpu_memory_format_returns(base, schema, args, *meta);
  const std::vector<c10::IValue>& meta_returns_ = *meta;

  // 2. Destinations: returns first (fresh tensors, or the mutated arguments they alias), then
  //    mutated arguments no return aliases (e.g. batch-norm running stats, foreach in-place).
  std::vector<at::Tensor> dests;
  std::vector<c10::IValue> returns;
  std::set<size_t> covered_args;
  const auto& rets = schema.returns();
  for (size_t r = 0; r < rets.size(); r++) {
    const c10::Argument& ret = rets[r];
    int aliased = -1;
    if (ret.alias_info() && ret.alias_info()->isWrite()) {
      for (size_t a = 0; a < nargs; a++)
        if (schema.arguments()[a].alias_info() &&
            schema.arguments()[a].alias_info()->beforeSets() == ret.alias_info()->beforeSets())
          aliased = static_cast<int>(a);
    }
    if (aliased >= 0) {
      covered_args.insert(aliased);
      std::vector<at::Tensor> ts = tensors_of(args[aliased]);
      std::vector<at::Tensor> ms = tensors_of(meta_returns_[r]);
      for (size_t i = 0; i < ts.size(); i++) {
        // out= tensors of the wrong shape are resized as CPU does, unless the out= tensor is
        // also an input: CPU (TensorIterator) refuses that, and here the call has already
        // described the input's storage, which a resize would free under it.
        if (i < ms.size() && ms[i].defined() && !ts[i].sizes().equals(ms[i].sizes()) &&
            is_range_factory(base)) {
          resize_range_out(base, ts[i], ms[i].sizes());
        } else if (i < ms.size() && ms[i].defined() && !ts[i].sizes().equals(ms[i].sizes())) {
          for (size_t a = 0; a < nargs; a++) {
            if (static_cast<int>(a) == aliased || is_write(schema.arguments()[a])) continue;
            for (const at::Tensor& in : tensors_of(args[a]))
              TORCH_CHECK(!in.defined() || !in.is_alias_of(ts[i]), "output with shape ",
                          ts[i].sizes(), " doesn't match the broadcast shape ", ms[i].sizes());
          }
          // CPU's TensorIterator gives a resized out= of an elementwise op the inputs' layout
          if (at::native::resize_output(ts[i], ms[i].sizes())) {
            auto strides = resized_out_strides(base.c_str(), schema, args, ms[i].sizes());
            if (strides && !ts[i].strides().equals(*strides))
              ts[i].as_strided_(ms[i].sizes(), *strides);
          }
        }
        dests.push_back(ts[i]);
      }
      returns.push_back(args[aliased]);
    } else {
      const c10::IValue& m = meta_returns_[r];
      if (m.isTensor() && !m.toTensor().defined()) {
        returns.push_back(at::Tensor());  // e.g. a gradient output_mask turned off: no destination
      } else if (m.isTensor()) {
        const at::Tensor& mt = m.toTensor();
        at::Tensor t = at::empty_strided(
            mt.sizes(), mt.strides(),
            mt.options().device(c10::Device(c10::DeviceType::PrivateUse1, device)));
        dests.push_back(t);
        returns.push_back(t);
      } else if (m.isTensorList()) {
        c10::List<at::Tensor> l;
        for (const at::Tensor& mt : m.toTensorList()) {
          at::Tensor t = at::empty_strided(
              mt.sizes(), mt.strides(),
              mt.options().device(c10::Device(c10::DeviceType::PrivateUse1, device)));
          dests.push_back(t);
          l.push_back(t);
        }
        returns.push_back(l);
      } else {
        returns.push_back(m);  // non-tensor returns (rare for lowered ops) come from meta
      }
    }
  }
  for (size_t a = 0; a < nargs; a++)
    if ((is_write(schema.arguments()[a]) || mutates_unannotated(base, schema, a, args)) &&
        !covered_args.count(a))
      for (const at::Tensor& t : tensors_of(args[a]))
        if (t.defined()) dests.push_back(t);

  // Writes into existing tensors get CPU's overlap checks (TensorIterator's, see
  // iterator_overlap_checks). CPU's fill_ and zero_ make none (their TensorIterator turns the
  // check off: one value written to several elements through one location is still that
  // value), and empty_strided((10,), (0,)).fill_(0) is how PyTorch's tests initialize a tensor
  // with overlapping strides. CPU's index_fill_, masked_fill_, index_put_ (_index_put_impl_)
  // turn them off too and make their own, stricter for an index (kernel_checks.cpp,
  // view_index_put.cpp), and write through an expanded self with a deprecation warning.
  const std::string& name = schema.name();
  const bool overlap_checked = base != "fill" && base != "zero" && base != "index_fill" &&
                               name != "aten::masked_fill_" && name != "aten::index_put_" &&
                               name != "aten::_index_put_impl_";
  if (overlap_checked) iterator_overlap_checks(schema, args);

  // 3. The call.
  if (is_random_op(schema, base)) {
    std::optional<at::Generator> gen;
    for (size_t a = 0; a < nargs; a++)
      if (args[a].isGenerator()) gen = args[a].toGenerator();
    auto [seed, offset] = rng_next(gen, device, rng_increment(dests));
    b.add_scalar("__seed", c10::Scalar(static_cast<int64_t>(seed)));
    b.add_scalar("__offset", c10::Scalar(static_cast<int64_t>(offset)));
  }
  // Every destination is passed, empty ones included, so lowerings can address results by
  // position (an empty one is simply not written).
  // A destination with the conjugate / negative bit (addmm_ on a conj view) is computed into
  // a plain tensor and copied in through copy_, which applies the bits.
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back;
  for (at::Tensor& d : dests)
    if (d.is_conj() || d.is_neg()) {
      write_back.emplace_back(d, at::empty(d.sizes(), d.options()));
      d = write_back.back().second;
    }
  for (const at::Tensor& d : dests) b.add_out(d);
  // A fill of an empty view writes nothing: no program runs (vLLM fills the padding tail of
  // its buffers every step, empty when nothing is padded). Only fills: other lowerings raise
  // CPU's errors while they build their program, also for empty tensors (topk of bool, ...).
  bool writes_nothing = base == "fill" || base == "zero";
  for (const at::Tensor& d : dests) writes_nothing = writes_nothing && d.numel() == 0;
  if (b.call().nout > 0 && !writes_nothing) {
    if (debug) {
      // Debug mode: run synchronously and name the op in any device error.
      try {
        b.run();
        for (const at::Tensor& d : dests)
          if (pj_storage_t* s = storage_of(d); s && s->buf) check(pj_buffer_await(s->buf));
        // A ready output buffer does not mean the execution's completion event has been
        // delivered (its callback runs on a plugin thread): wait for the device's tracked
        // executions too, so nothing is in flight when the op returns.
        for (const at::Tensor& d : dests) check(pj_stream_synchronize(d.device().index()));
      } catch (const c10::Error& e) {
        rethrow_as(e, c10::str("tpu debug mode: ", schema.operator_name(), " failed on inputs ",
                               describe_inputs(args), python_line(), ": ",
                               e.what_without_backtrace()));
      }
    } else {
      b.run();
      if (memoizable && write_back.empty())
        store_memo(op, sig, b.call(), args, dests, returns, checks_indices(base));
    }
    if (check_nan()) check_finite(schema, args, dests);
  }
  for (auto& [dst, tmp] : write_back) dst.copy_(tmp);

  torch::jit::drop(*stack, nargs);
  for (auto& r : returns) stack->push_back(std::move(r));
}

// One lowered call holds at most PJ_CALL_MAX_TENSORS tensors (inputs and outputs). Calls over
// longer lists run in parts: list-elementwise ops (_foreach_*, _amp_foreach_*, _fused_*) over
// chunks of their full-length lists taken in lockstep (other arguments as given), cat and stack
// (and their out= forms, which functional cat reaches as) as a cat of the parts' results.
// Returns false when the call fits (or is of another kind).
bool run_in_parts(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  const std::string& base) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  size_t longest = 0, tensors = 0;
  for (const c10::IValue& v : torch::jit::last(*stack, nargs)) {
    if (v.isList()) {  // Tensor[] (or Tensor?[]) arrives as a generic list when boxed
      const auto& l = v.toListRef();
      if (std::any_of(l.begin(), l.end(), [](const c10::IValue& e) { return e.isTensor(); })) {
        longest = std::max(longest, l.size());
        tensors += l.size();
      }
    } else if (v.isTensor()) {
      tensors++;
    }
  }
  size_t list_returns = 0;
  for (const auto& r : schema.returns())
    list_returns += r.type()->kind() == c10::TypeKind::ListType;
  if (tensors + longest * list_returns <= PJ_CALL_MAX_TENSORS) return false;
  const std::string& overload = schema.overload_name();
  if ((base == "cat" || base == "stack") && (overload.empty() || overload == "out")) {
    const std::vector<at::Tensor> ts = tensors_of((*stack)[stack->size() - nargs]);
    const int64_t dim = (*stack)[stack->size() - nargs + 1].toInt();
    constexpr size_t kPart = PJ_CALL_MAX_TENSORS / 2;
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < ts.size(); i += kPart) {
      std::vector<at::Tensor> part(ts.begin() + static_cast<std::ptrdiff_t>(i),
                                   ts.begin() + static_cast<std::ptrdiff_t>(
                                                    std::min(ts.size(), i + kPart)));
      parts.push_back(base == "cat" ? at::cat(part, dim) : at::stack(part, dim));
    }
    // stack's dim indexes the parts' rank too
    at::Tensor result = overload.empty()
                            ? at::cat(parts, dim)
                            : at::cat_out((*stack)[stack->size() - 1].toTensor(), parts, dim);
    torch::jit::drop(*stack, nargs);
    stack->push_back(std::move(result));
    return true;
  }
  const bool elementwise = base.rfind("_foreach_", 0) == 0 ||
                           base.rfind("_amp_foreach_", 0) == 0 || base.rfind("_fused_", 0) == 0;
  if (!elementwise) return false;
  size_t long_lists = list_returns;
  for (const c10::IValue& v : torch::jit::last(*stack, nargs))
    long_lists += v.isList() && v.toListRef().size() == longest;
  const size_t chunk = std::max<size_t>(1, (PJ_CALL_MAX_TENSORS / 2) / long_lists);
  const std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(nargs),
                                      stack->end());
  torch::jit::drop(*stack, nargs);
  std::vector<c10::IValue> returns;
  for (size_t i = 0; i < longest; i += chunk) {
    const size_t end = std::min(longest, i + chunk);
    torch::jit::Stack part;
    for (const c10::IValue& v : args) {
      if (v.isList() && v.toListRef().size() == longest) {
        const c10::impl::GenericList whole = v.toList();
        c10::impl::GenericList piece(whole.elementType());
        for (size_t j = i; j < end; j++) piece.push_back(whole.get(j));
        part.emplace_back(std::move(piece));
      } else {
        part.push_back(v);
      }
    }
    lowered_call(op, &part, base);
    if (returns.empty()) {
      returns = std::move(part);
      continue;
    }
    for (size_t r = 0; r < returns.size(); r++)  // list returns: the parts' lists, in order
      if (returns[r].isList()) {
        c10::impl::GenericList acc = returns[r].toList();
        for (const c10::IValue& x : part[r].toListRef()) acc.push_back(x);
      }
  }
  for (auto& r : returns) stack->push_back(std::move(r));
  return true;
}

// _foreach_* over lists whose tensors live on several devices: CUDA runs such lists element by
// element (its slow path); here each device's elements run as one call on that device. The
// first tensor list fixes each position's device; every list of its length is taken at those
// positions in lockstep (other arguments as given, so a mismatch inside a position still raises
// the device error), and list results go back to their positions. Returns false when all
// positions share a device (or the op is of another kind).
bool run_per_device(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                    const std::string& base) {
  if (base.rfind("_foreach_", 0) != 0) return false;
  const size_t nargs = op.schema().arguments().size();
  const std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(nargs),
                                      stack->end());
  const c10::IValue* lead = nullptr;
  for (const c10::IValue& v : args)
    if (v.isList()) {
      const auto& l = v.toListRef();
      if (std::any_of(l.begin(), l.end(), [](const c10::IValue& e) { return e.isTensor(); })) {
        lead = &v;
        break;
      }
    }
  if (!lead) return false;
  const size_t n = lead->toListRef().size();
  std::vector<c10::Device> devices;             // in order of first appearance
  std::vector<std::vector<size_t>> positions;   // positions[k]: the elements on devices[k]
  for (size_t i = 0; i < n; i++) {
    const c10::IValue& e = lead->toListRef()[i];
    const c10::Device d = e.isTensor() ? e.toTensor().device() : c10::Device(c10::kCPU);
    auto it = std::find(devices.begin(), devices.end(), d);
    if (it == devices.end()) {
      devices.push_back(d);
      positions.emplace_back();
      it = devices.end() - 1;
    }
    positions[static_cast<size_t>(it - devices.begin())].push_back(i);
  }
  if (devices.size() < 2) return false;
  torch::jit::drop(*stack, nargs);
  std::vector<c10::IValue> returns;
  std::vector<std::vector<c10::IValue>> list_items;  // per return: results by position
  for (const std::vector<size_t>& at : positions) {
    torch::jit::Stack part;
    for (const c10::IValue& v : args) {
      if (v.isList() && v.toListRef().size() == n) {
        const c10::impl::GenericList whole = v.toList();
        c10::impl::GenericList piece(whole.elementType());
        for (size_t i : at) piece.push_back(whole.get(i));
        part.emplace_back(std::move(piece));
      } else {
        part.push_back(v);
      }
    }
    if (!run_in_parts(op, &part, base)) lowered_call(op, &part, base);
    if (returns.empty()) {
      returns = part;
      list_items.assign(part.size(), std::vector<c10::IValue>(n));
    }
    for (size_t r = 0; r < part.size(); r++)
      if (part[r].isList())
        for (size_t k = 0; k < at.size(); k++) list_items[r][at[k]] = part[r].toListRef()[k];
  }
  for (size_t r = 0; r < returns.size(); r++) {
    if (!returns[r].isList()) {
      stack->push_back(std::move(returns[r]));
      continue;
    }
    c10::impl::GenericList whole(returns[r].toList().elementType());
    for (c10::IValue& x : list_items[r]) whole.push_back(std::move(x));
    stack->emplace_back(std::move(whole));
  }
  return true;
}

// Advanced indexing takes index tensors on the CPU, as CUDA does: PyTorch's index and
// index_put kernels (make_info / expandTensors, IndexingUtils.h) move every index to self's
// device, and their schemas skip the generated device check. That holds for index (also its
// out= form), index_put(_), _index_put_impl_ and the composites over them (_unsafe_index,
// _unsafe_index_put); every other op with an index argument (index_select, gather, scatter,
// take, put_, index_add_, index_copy_, index_fill_, masked_select, masked_fill_,
// masked_scatter_) is device-checked on CUDA and raises here too (CallBuilder's same-device
// error). The indices move once, here, before any lowering runs: a bool mask becomes its
// nonzero columns on the CPU and those go over (what expandTensors does; no device-side count,
// so no host sync, and the call sees plain integer indices); other index tensors are copied
// as they are. Tensors of another tpu device are left alone (they raise the same-device error).
// A tpu bool mask beside other index tensors is split the same way.
bool takes_cpu_indices(const std::string& base) {
  return base == "index" || base == "index_put" || base == "_index_put_impl" ||
         base == "_unsafe_index" || base == "_unsafe_index_put";
}

// An index_put form (self, indices, values, ...) with one defined index tensor, a mask of
// rank k > 0 after n None entries: its indexing result has self's dims with dims n..n+k-1
// replaced by one dim of the mask's count, at position n. Whether values (right-aligned to
// that result) have a size other than 1 at that position.
bool rows_per_mask_element(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack.size() - nargs;
  at::Tensor self, values, mask;
  int64_t before = 0;  // None entries before the mask
  for (size_t a = 0; a < nargs; a++) {
    const std::string& name = schema.arguments()[a].name();
    const c10::IValue& v = stack[first + a];
    if (name == "self" && v.isTensor()) self = v.toTensor();
    if (name == "values" && v.isTensor()) values = v.toTensor();
    if (name != "indices" || !v.isList()) continue;
    for (const c10::IValue& e : v.toListRef()) {
      if (!e.isTensor() || !e.toTensor().defined()) {
        if (!mask.defined()) before++;
        continue;
      }
      if (mask.defined()) return false;
      mask = e.toTensor();
    }
  }
  if (!self.defined() || !values.defined() || !mask.defined() || mask.dim() == 0 ||
      before + mask.dim() > self.dim())
    return false;
  const int64_t result_rank = self.dim() - mask.dim() + 1;
  const int64_t at = before - (result_rank - values.dim());
  return at >= 0 && at < values.dim() && values.size(at) != 1;
}

void indices_to_device(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       const std::string& base) {
  if (!takes_cpu_indices(base)) return;
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  at::Tensor self;
  std::optional<size_t> at_indices;
  for (size_t a = 0; a < nargs; a++) {
    const c10::IValue& v = (*stack)[first + a];
    if (schema.arguments()[a].name() == "self" && v.isTensor()) self = v.toTensor();
    if (schema.arguments()[a].name() == "indices" && v.isList()) at_indices = a;
  }
  if (!at_indices || !self.defined() || self.device().type() != c10::DeviceType::PrivateUse1)
    return;
  c10::IValue& v = (*stack)[first + *at_indices];
  const c10::impl::GenericList given = v.toList();
  auto defined_tensor = [](const c10::IValue& e) { return e.isTensor() && e.toTensor().defined(); };
  // (uint8 masks too: CPU treats them as bool masks, deprecation warning aside)
  auto tpu_bool_mask = [&](const c10::IValue& e) {
    if (!defined_tensor(e) || e.toTensor().is_cpu() || e.toTensor().dim() == 0) return false;
    const at::ScalarType st = e.toTensor().scalar_type();
    return st == at::kBool || st == at::kByte;
  };
  bool any_cpu = false, tpu_mask = false;
  int defined = 0;
  for (const c10::IValue& e : given) {
    if (!defined_tensor(e)) continue;
    defined++;
    any_cpu = any_cpu || e.toTensor().is_cpu();
    tpu_mask = tpu_mask || tpu_bool_mask(e);
  }
  // The lowerings take one mask alone (index_put writes through it without a host sync); a
  // mask beside other index tensors becomes its nonzero columns here (one host read for the
  // count, which the result's shape needs anyway), as CPU's expandTensors does. So does a
  // lone mask of an index_put whose values do not broadcast along the mask's count dim (a size
  // other than 1 there): they must have exactly count rows, which only the count can tell (the
  // integer path then checks values' shape against the result's and raises CPU's error).
  const bool split_tpu_mask = tpu_mask && (defined > 1 || rows_per_mask_element(op, *stack));
  if (!any_cpu && !split_tpu_mask) return;
  // A lone CPU bool mask of an index_put whose values are on the device and broadcast along
  // the mask's count dim goes over as a mask, not as its nonzero columns: the lone-mask
  // lowering writes through it without a count, so its program depends on the mask's shape
  // only, where the columns' length (the count) would key a new program for every mask
  // (`x[cpu_mask] = v` in a loop compiled one per count). The result is the same; CPU's checks
  // of the mask (index_tensor_checks) have run. Values on the CPU keep the split: with a
  // device mask a one-element CPU value would take CPU's masked_fill_ path, which a CPU mask
  // does not take on CPU or CUDA (it skips the dtype check).
  const bool keep_cpu_mask = [&]() {
    if (defined != 1 || tpu_mask || (base != "index_put" && base != "_index_put_impl" &&
                                     base != "_unsafe_index_put"))
      return false;
    for (const c10::IValue& e : given)
      if (defined_tensor(e) &&
          (e.toTensor().scalar_type() != at::kBool || e.toTensor().dim() == 0))
        return false;
    for (size_t a = 0; a < nargs; a++) {
      const c10::IValue& val = (*stack)[first + a];
      if (schema.arguments()[a].name() == "values" &&
          (!val.isTensor() || !val.toTensor().defined() || val.toTensor().is_cpu()))
        return false;
    }
    return !rows_per_mask_element(op, *stack);
  }();
  c10::impl::GenericList moved(given.elementType());  // a new list: the caller's stays as it is
  for (const c10::IValue& e : given) {
    const bool cpu = defined_tensor(e) && e.toTensor().is_cpu();
    if (!cpu && !(split_tpu_mask && tpu_bool_mask(e))) {
      moved.push_back(e);
      continue;
    }
    const at::Tensor& index = e.toTensor();
    const bool mask = index.scalar_type() == at::kBool || index.scalar_type() == at::kByte;
    if (!mask || index.dim() == 0 || (index.scalar_type() == at::kByte && !split_tpu_mask) ||
        keep_cpu_mask) {
      // a lone uint8 mask keeps its path (the lowerings take one mask); 0-d masks too; a lone
      // bool mask kept whole (keep_cpu_mask) goes over as it is
      moved.push_back(index.to(self.device()));
      continue;
    }
    // The mask covers self's dims from here on; its sizes must match them (CPU's IndexError;
    // a dim past self's end raises self.size()'s own IndexError, as it does on CPU).
    const int64_t at_dim = static_cast<int64_t>(moved.size());
    for (const auto j : c10::irange(index.dim()))
      TORCH_CHECK_INDEX(index.size(j) == self.size(at_dim + j), "The shape of the mask ",
                        index.sizes(), " at index ", j,
                        " does not match the shape of the indexed tensor ", self.sizes(),
                        " at index ", at_dim + j);
    const at::Tensor nz = index.nonzero().to(self.device());  // [count, mask dims]
    // (a uint8 mask's nonzero elements are its true ones, whatever their value)
    // (a tpu mask's nonzero runs on the device; .to is then a no-op)
    for (const auto j : c10::irange(index.dim())) moved.push_back(nz.select(1, j));
  }
  if (split_tpu_mask) {  // CPU's broadcast error, at the call in every eager mode
    std::vector<at::Tensor> idx;
    for (const c10::IValue& e : moved)
      if (defined_tensor(e)) idx.push_back(e.toTensor());
    std::vector<int64_t> shape = idx[0].sizes().vec();
    std::string shapes;
    bool ok = true;
    for (const at::Tensor& t : idx) {
      shapes += (shapes.empty() ? "" : ", ") + c10::str(t.sizes());
      if (ok) {
        try {
          shape = at::infer_size(shape, t.sizes());
        } catch (const c10::Error&) {
          ok = false;
        }
      }
    }
    TORCH_CHECK_INDEX(ok, "shape mismatch: indexing tensors could not be broadcast together "
                      "with shapes ", shapes);
  }
  v = c10::IValue(std::move(moved));
}

// CPU's first checks of advanced indexing's index tensors, in its order (checkIndexTensorTypes,
// then expandTensors, IndexingUtils.h), at the call in every eager mode: every index tensor
// must be of an index dtype; then, one index tensor after another, a uint8 one gives a
// deprecation warning (each call) and a mask's sizes must match the self dims it covers
// (IndexError; a mask reaching past self's rank raises self.size()'s IndexError, as on CPU).
// The lowerings would raise the mask error from the count program, with its name before the
// message. index_put's masked_fill_ path (view_index_put.h) checks its mask's shape with the
// same message and gives no warning. Debug mode's replay on CPU (check_like_cpu) drops its
// warnings, so the call warns once in every mode.
void index_tensor_checks(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                         const std::string& base) {
  if (!takes_cpu_indices(base)) return;
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t first = stack.size() - nargs;
  at::Tensor self;
  const c10::IValue* indices = nullptr;
  for (size_t a = 0; a < nargs; a++) {
    const c10::IValue& v = stack[first + a];
    if (schema.arguments()[a].name() == "self" && v.isTensor()) self = v.toTensor();
    if (schema.arguments()[a].name() == "indices" && v.isList()) indices = &v;
  }
  if (!indices || !self.defined()) return;
  auto defined = [](const c10::IValue& e) { return e.isTensor() && e.toTensor().defined(); };
  for (const c10::IValue& e : indices->toListRef()) {
    if (!defined(e)) continue;
    const at::ScalarType st = e.toTensor().scalar_type();
    TORCH_CHECK_INDEX(st == at::kLong || st == at::kInt || st == at::kByte || st == at::kBool,
                      "tensors used as indices must be long, int, byte or bool tensors");
  }
  const bool masked_fill = index_put_takes_masked_fill(schema, stack);
  int64_t dim = 0;  // self dims covered by the entries so far
  for (const c10::IValue& e : indices->toListRef()) {
    if (!defined(e)) {
      dim++;
      continue;
    }
    const at::Tensor& index = e.toTensor();
    const at::ScalarType st = index.scalar_type();
    if (st != at::kByte && st != at::kBool) {
      dim++;
      continue;
    }
    if (st == at::kByte && !masked_fill)
      TORCH_WARN("indexing with dtype torch.uint8 is now deprecated, please use a dtype "
                 "torch.bool instead.");
    for (int64_t j = 0; j < index.dim(); j++)
      TORCH_CHECK_INDEX(index.size(j) == self.size(dim + j), "The shape of the mask ",
                        index.sizes(), " at index ", j,
                        " does not match the shape of the indexed tensor ", self.sizes(),
                        " at index ", dim + j);
    dim += index.dim();
  }
}

void boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// A call with a tensor of rank above PJ_MAX_RANK (which no lowered call describes): an
// elementwise op runs over views without the result's size-1 dims (high_rank.cpp); any other
// op goes to CPU. CPU refuses some by dim bitsets ("only tensors with up to 64 dims are
// supported") with no rule to predict which (sum(dim=0) and all() raise, std(dim=None) and
// cumsum run), and PyTorch's Python Meta kernels refuse some that CPU runs (sum(), cumsum:
// "Received a tensor with 65 dimensions"), so CPU itself decides: the fallback runs it, or,
// with the fallback off, a replay on host copies raises CPU's error where CPU refuses (a rare
// error path; the result is discarded) before the fallback's refusal. False when every
// tensor fits.
bool high_rank_call(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                    const std::string& base) {
  const auto args = torch::jit::last(*stack, op.schema().arguments().size());
  int64_t rank = 0;
  if (!exceeds_max_rank(args, &rank)) return false;
  if (elementwise_op(op, base) && run_without_unit_dims(op, stack, &boxed_fallback)) return true;
  if (!cpu_fallback_allowed()) check_like_cpu(op, args.vec(), false);
  run_cpu_fallback(op, stack, c10::str("tensors of rank ", rank, " are not lowered (at most ",
                                       PJ_MAX_RANK, ")"));
  return true;
}

void boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ExecLabel label(op.schema());
  sync_product_precision();  // before the memo: its signature holds the precision
  if (run_memoized(op, stack)) return;
  const std::string base = base_name(op.schema());
  switch (complex32_call(op, stack, base)) {  // before lookups: complex32 is never lowered as is
    case Complex32Call::kDone: return;
    case Complex32Call::kToCpu: return run_cpu_fallback(op, stack, "no lowering for complex32");
    case Complex32Call::kNotInvolved: break;
  }
  if (high_rank_call(op, stack, base)) return;
  if (!pj_lowering_find(base.c_str()))
    return run_cpu_fallback(op, stack, "no lowering");
  {
    const auto args = torch::jit::last(*stack, op.schema().arguments().size());
    if (lowp_goes_to_cpu(base, op.schema(), args))
      return run_cpu_fallback(op, stack, "no lowering for its low-precision dtype");
    if (unsigned_goes_to_cpu(base, op.schema(), args))
      return run_cpu_fallback(op, stack, "no lowering for its unsigned dtype");
  }
  index_tensor_checks(op, *stack, base);
  indices_to_device(op, stack, base);
  advanced_index_checks(base, op.schema(), *stack);  // before any path below runs the op
  if (index_put_into_view(op, stack)) return;
  if (run_per_device(op, stack, base)) return;
  if (run_in_parts(op, stack, base)) return;
  lowered_call(op, stack, base);
}

}  // namespace

// The boxed kernel, registered explicitly for ops whose CompositeExplicitAutograd kernel would
// otherwise win over the fallback (convolution would go to convolution_overrideable).
void lowered_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  boxed_fallback(op, stack);
}

// The kernel of the structured ops registered below (DirectStructuredKernels). Where the Meta
// kernel (PyTorch's Python refs, for many) refuses the arguments, its message and type can
// differ from CPU's ("Promotion of int.add/sub_(float) ..." against CPU's "result type Float
// can't be cast to ..."): the call then goes to the composite kernel it replaced, whose C++
// meta function raises CPU's error (or, where it accepts, runs the op through its out= form).
// Only refusals by the Meta kernel take that path: nothing has run yet.
void structured_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ExecLabel label(op.schema());
  sync_product_precision();
  if (run_memoized(op, stack)) return;
  const auto n = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  torch::jit::Stack call(stack->end() - n, stack->end());
  meta_refused = false;
  try {
    boxed_fallback(op, &call);
  } catch (...) {
    if (!meta_refused) throw;
    meta_refused = false;
    // The composite kernel is not reachable through PrivateUse1 any more; PrivateUse3's slot
    // (a backend nobody registers kernels for) still holds it, from the alias key. It creates
    // its outputs and calls the out= form by the tensors' own (tpu) dispatch key.
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse3), stack);
    return;
  }
  torch::jit::drop(*stack, static_cast<size_t>(n));
  for (c10::IValue& r : call) stack->push_back(std::move(r));
}

void complex32_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_cpu_fallback(op, stack, "no lowering for complex32");
}

std::map<std::string, int64_t> fallback_ops() {
  std::lock_guard<std::mutex> g(fallback_mu);
  return fallback_counts;
}

}  // namespace torch_pjrt

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_pjrt::boxed_fallback>());
}


namespace {
// _foreach_* overloads with a one-program lowering (csrc/ops/foreach.c): their composite
// kernels would otherwise run one program per list element.
const char* const kForeachOverloads[] = {
    "_foreach_add.Scalar", "_foreach_add.Scalar_out", "_foreach_add.List",
    "_foreach_add.List_out", "_foreach_add.ScalarList", "_foreach_add.ScalarList_out",
    "_foreach_add.Tensor", "_foreach_add.Tensor_out", "_foreach_add_.Scalar",
    "_foreach_add_.List", "_foreach_add_.ScalarList", "_foreach_add_.Tensor",
    "_foreach_sub.Scalar", "_foreach_sub.Scalar_out", "_foreach_sub.List",
    "_foreach_sub.List_out", "_foreach_sub.ScalarList", "_foreach_sub.ScalarList_out",
    "_foreach_sub_.Scalar", "_foreach_sub_.List", "_foreach_sub_.ScalarList",
    "_foreach_mul.Scalar", "_foreach_mul.Scalar_out", "_foreach_mul.List",
    "_foreach_mul.List_out", "_foreach_mul.ScalarList", "_foreach_mul.ScalarList_out",
    "_foreach_mul.Tensor", "_foreach_mul.Tensor_out", "_foreach_mul_.Scalar",
    "_foreach_mul_.List", "_foreach_mul_.ScalarList", "_foreach_mul_.Tensor",
    "_foreach_div.Scalar", "_foreach_div.Scalar_out", "_foreach_div.List",
    "_foreach_div.List_out", "_foreach_div.ScalarList", "_foreach_div.ScalarList_out",
    "_foreach_div.Tensor", "_foreach_div.Tensor_out", "_foreach_div_.Scalar",
    "_foreach_div_.List", "_foreach_div_.ScalarList", "_foreach_div_.Tensor",
    "_foreach_maximum.Scalar", "_foreach_maximum.Scalar_out", "_foreach_maximum.List",
    "_foreach_maximum.List_out", "_foreach_maximum.ScalarList",
    "_foreach_maximum.ScalarList_out", "_foreach_maximum_.Scalar", "_foreach_maximum_.List",
    "_foreach_maximum_.ScalarList", "_foreach_minimum.Scalar", "_foreach_minimum.Scalar_out",
    "_foreach_minimum.List", "_foreach_minimum.List_out", "_foreach_minimum.ScalarList",
    "_foreach_minimum.ScalarList_out", "_foreach_minimum_.Scalar", "_foreach_minimum_.List",
    "_foreach_minimum_.ScalarList", "_foreach_clamp_min.Scalar", "_foreach_clamp_min.Scalar_out",
    "_foreach_clamp_min.List", "_foreach_clamp_min.List_out", "_foreach_clamp_min.ScalarList",
    "_foreach_clamp_min.ScalarList_out", "_foreach_clamp_min_.Scalar",
    "_foreach_clamp_min_.List", "_foreach_clamp_min_.ScalarList", "_foreach_clamp_max.Scalar",
    "_foreach_clamp_max.Scalar_out", "_foreach_clamp_max.List", "_foreach_clamp_max.List_out",
    "_foreach_clamp_max.ScalarList", "_foreach_clamp_max.ScalarList_out",
    "_foreach_clamp_max_.Scalar", "_foreach_clamp_max_.List", "_foreach_clamp_max_.ScalarList",
    "_foreach_addcmul.Scalar", "_foreach_addcmul.Scalar_out", "_foreach_addcmul.ScalarList",
    "_foreach_addcmul.ScalarList_out", "_foreach_addcmul_.Scalar",
    "_foreach_addcmul_.ScalarList", "_foreach_addcdiv.Scalar", "_foreach_addcdiv.Scalar_out",
    "_foreach_addcdiv.ScalarList", "_foreach_addcdiv.ScalarList_out", "_foreach_addcdiv_.Scalar",
    "_foreach_addcdiv_.ScalarList", "_foreach_lerp.List", "_foreach_lerp.List_out",
    "_foreach_lerp.Scalar", "_foreach_lerp.Scalar_out", "_foreach_lerp.ScalarList",
    "_foreach_lerp.ScalarList_out", "_foreach_lerp_.List", "_foreach_lerp_.Scalar",
    "_foreach_lerp_.ScalarList", "_foreach_pow.List", "_foreach_pow.List_out",
    "_foreach_pow.Scalar", "_foreach_pow.Scalar_out", "_foreach_pow.ScalarList",
    "_foreach_pow.ScalarList_out", "_foreach_pow.ScalarAndTensor", "_foreach_pow_.List",
    "_foreach_pow_.Scalar", "_foreach_pow_.ScalarList", "_foreach_copy", "_foreach_copy.out",
    "_foreach_copy_", "_foreach_zero", "_foreach_zero.out", "_foreach_zero_", "_foreach_sqrt",
    "_foreach_sqrt.out", "_foreach_sqrt_", "_foreach_neg", "_foreach_neg.out", "_foreach_neg_",
    "_foreach_abs", "_foreach_abs.out", "_foreach_abs_", "_foreach_exp", "_foreach_exp.out",
    "_foreach_exp_", "_foreach_log", "_foreach_log.out", "_foreach_log_", "_foreach_reciprocal",
    "_foreach_reciprocal.out", "_foreach_reciprocal_", "_foreach_sign", "_foreach_sign.out",
    "_foreach_sign_", "_foreach_sigmoid", "_foreach_sigmoid.out", "_foreach_sigmoid_",
    "_foreach_tanh", "_foreach_tanh.out", "_foreach_tanh_"
};
}  // namespace

// Ops with a lowering whose CompositeExplicitAutograd kernel would otherwise run instead of it:
// convolution (which would reach convolution_overrideable), conj_physical_ (whose kernel calls a
// CPU/CUDA-only DispatchStub), mode.values (whose kernel accepts only CPU/CUDA/XPU tensors), and
// ops whose composite kernel takes several programs where the lowering takes one, and
// functional ops whose composite kernel calls their out= form with an empty tensor (abs,
// logical_*): resized there row-major, where CPU's TensorIterator keeps the input's layout (the
// functional Meta kernel gives that layout: fuzz F2).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"convolution", "convolution_backward", "native_layer_norm",
                           "native_group_norm", "logsumexp", "any.dims", "all.dims",
                           "conj_physical_", "mode.values", "abs", "logical_not",
                           "logical_and", "logical_or", "logical_xor"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&torch_pjrt::lowered_kernel>());
  for (const char* name : kForeachOverloads)
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&torch_pjrt::lowered_kernel>());
}

namespace {

// Structured ops (add.Tensor, mul_.Tensor, sin, ...) have CompositeExplicitAutogradNonFunctional
// kernels for their functional and in-place forms, which a backend without its own kernel
// gets instead of the fallback: they compute the output metadata with a TensorIterator and
// call the out= form, so every such op took two dispatches, that metadata computation and the
// out= form's Meta lookup. Where a lowering exists, the functional forms go to the boxed kernel
// directly: one dispatch, metadata from the cached Meta result (meta_cache.cpp). Registered
// when the library loads (after libtorch registered every aten op, and after this file's
// explicit registrations above, which it skips: it is the last static object here).
struct DirectStructuredKernels {
  DirectStructuredKernels() {
    auto& d = c10::Dispatcher::singleton();
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                              __FILE__, __LINE__);
    for (const c10::OperatorName& name : d.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = d.findOp(name);
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse3) ||
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
        continue;
      // In-place forms keep the composite kernel: its C++ meta function checks that the
      // result type casts to self's (mul_ of a float tensor by a complex one raises on CPU),
      // which the Python Meta kernels of some of them do not.
      const std::string base = torch_pjrt::base_name(op->schema());
      if (base != name.name.substr(6) || !pj_lowering_find(base.c_str())) continue;
      const std::string full = name.name.substr(6) +
                               (name.overload_name.empty() ? "" : "." + name.overload_name);
      lib.impl(full.c_str(),
               torch::CppFunction::makeFromBoxedFunction<&torch_pjrt::structured_kernel>());
    }
  }
} direct_structured_kernels;

}  // namespace
