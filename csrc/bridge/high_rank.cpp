// Tensors of rank above PJ_MAX_RANK (64, a lowered call's descriptor limit). PyTorch itself
// takes them wherever no dim bitset is involved: CPU's elementwise ops, copies and random fills
// work at any rank, while reductions (dim bitsets) refuse them with "only tensors with up to 64
// dims are supported". Here an elementwise op runs over views without the result's size-1 dims:
// its values do not depend on those dims, and a tensor of rank above 64 has at most 63 dims of
// another size (more would make at least 2^64 elements, or none), so the views always fit.
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>

#include <set>

#include "bridge.h"
extern "C" {
#include "torch_pjrt/hlo.h"
}

namespace torch_pjrt {
namespace {

bool is_write(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

// Elementwise ops PyTorch does not tag pointwise: random fills, fills, masked fills and the
// where overloads with a Scalar operand. (Pointwise-tagged ops take no dim argument: their
// only int arguments are mvlgamma's p, polygamma's n and round's decimals.)
bool untagged_elementwise(const std::string& base) {
  static const std::set<std::string> ops = {
      "uniform", "normal", "bernoulli", "random", "exponential", "geometric", "log_normal",
      "cauchy", "fill", "zero", "masked_fill", "where"};
  return ops.count(base) > 0;
}

}  // namespace

bool exceeds_max_rank(c10::ArrayRef<c10::IValue> args, int64_t* rank) {
  int64_t most = 0;
  auto see = [&](const c10::IValue& v) {
    if (v.isTensor() && v.toTensor().defined()) most = std::max(most, v.toTensor().dim());
  };
  for (const c10::IValue& v : args) {
    if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) see(e);
    } else {
      see(v);
    }
  }
  if (rank) *rank = most;
  return most > PJ_MAX_RANK;
}

std::vector<int64_t> non_unit_dims(c10::IntArrayRef shape) {
  std::vector<int64_t> keep;
  for (size_t i = 0; i < shape.size(); i++)
    if (shape[i] != 1) keep.push_back(static_cast<int64_t>(i));
  return keep;
}

at::Tensor without_unit_dims(const at::Tensor& t, int64_t rank,
                             const std::vector<int64_t>& keep) {
  // t's dims align with the last t.dim() of the result's (broadcasting); a result dim of size
  // 1 is one of t's of size 1 too, or absent from t, so dropping it leaves t's elements as
  // they were, each at the same place in the (smaller) result.
  const int64_t lead = rank - t.dim();
  std::vector<int64_t> sizes, strides;
  for (int64_t d : keep) {
    if (d < lead) continue;
    sizes.push_back(t.size(d - lead));
    strides.push_back(t.stride(d - lead));
  }
  return t.as_strided(sizes, strides, t.storage_offset());
}

bool elementwise_op(const c10::OperatorHandle& op, const std::string& base) {
  return op.hasTag(at::Tag::pointwise) || untagged_elementwise(base);
}

bool run_without_unit_dims(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           void (*run)(const c10::OperatorHandle&, torch::jit::Stack*)) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  torch::jit::Stack args(stack->end() - static_cast<std::ptrdiff_t>(nargs), stack->end());

  // The result's shape: every input tensor's and in-place self's, broadcast (infer_size raises
  // CPU's message for shapes that do not broadcast). Tensor lists are no elementwise op's.
  std::vector<int64_t> shape;
  for (size_t a = 0; a < nargs; a++) {
    const c10::IValue& v = args[a];
    if (v.isList()) return false;
    if (v.isTensor() && v.toTensor().defined() && !schema.arguments()[a].is_out())
      shape = at::infer_size(shape, v.toTensor().sizes());
  }
  // out= tensors of another shape are resized, as CPU's TensorIterator does (with its warning
  // for a nonempty one), unless one is also an input (CPU refuses that: the caller's case).
  // Written tensors must then have the result's shape: in-place self of a smaller shape is
  // CPU's "doesn't match the broadcast shape" refusal, the caller's too.
  for (size_t a = 0; a < nargs; a++) {
    if (!is_write(schema.arguments()[a])) continue;
    if (!args[a].isTensor() || !args[a].toTensor().defined()) return false;
    at::Tensor w = args[a].toTensor();
    if (w.sizes().equals(shape)) continue;
    if (!schema.arguments()[a].is_out()) return false;
    for (size_t i = 0; i < nargs; i++)
      if (i != a && args[i].isTensor() && args[i].toTensor().defined() &&
          args[i].toTensor().is_alias_of(w))
        return false;
    at::native::resize_output(w, shape);
  }
  const std::vector<int64_t> keep = non_unit_dims(shape);
  if (keep.size() > PJ_MAX_RANK) return false;  // only with a dim of size 0: no elements

  torch::jit::Stack call(args);
  const int64_t rank = static_cast<int64_t>(shape.size());
  for (c10::IValue& v : call)
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().dim() > 0)
      v = without_unit_dims(v.toTensor(), rank, keep);
  run(op, &call);

  // Returns: the caller's own tensor where a return aliases a written argument (self of an
  // in-place form, out=), else the result viewed at the full shape (inserting size-1 dims is a
  // view of any tensor).
  const auto& rets = schema.returns();
  TORCH_INTERNAL_ASSERT(call.size() == rets.size());
  std::vector<c10::IValue> returns;
  for (size_t r = 0; r < rets.size(); r++) {
    int aliased = -1;
    if (rets[r].alias_info() && rets[r].alias_info()->isWrite())
      for (size_t a = 0; a < nargs; a++)
        if (schema.arguments()[a].alias_info() &&
            schema.arguments()[a].alias_info()->beforeSets() ==
                rets[r].alias_info()->beforeSets())
          aliased = static_cast<int>(a);
    if (aliased >= 0) {
      returns.push_back(args[static_cast<size_t>(aliased)]);
    } else if (call[r].isTensor() && call[r].toTensor().defined()) {
      returns.push_back(call[r].toTensor().view(shape));
    } else {
      returns.push_back(std::move(call[r]));
    }
  }
  torch::jit::drop(*stack, nargs);
  for (c10::IValue& r : returns) stack->push_back(std::move(r));
  return true;
}

}  // namespace torch_pjrt
