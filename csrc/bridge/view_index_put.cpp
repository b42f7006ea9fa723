// index_put_ into a view in O(written elements), and index_put's dtype check.
//
// The general path writes a view by reading the whole view, computing its new value and writing
// the whole view back (view_io.c: a scatter of every view element for a strided view), so an
// indexed write of two rows into half of a KV cache costs the half. An in-place index_put_ on a
// view is instead the same write into the 1-D whole storage at composed linear indices:
//
//   element (i_0, ..., i_{n-1}) of the view is storage element offset + sum_d i_d * stride_d,
//
// so with index tensors I_j on some dims and full slices on the others, the written elements
// are offset + sum_j wrap(I_j) * stride_j (broadcast together, shape B) + sum over the other dims
// of arange(size_d) * stride_d, laid out in PyTorch's advanced-indexing result order (B in place
// of the indexed dims when they are adjacent, else first). That index tensor has exactly as many
// elements as are written, and index_put_ on the whole storage is a scatter into the donated
// buffer. An index out of its dimension's range must not land on another element of the storage
// (the general path drops it, as XLA's scatter does): it is sent past the storage's end, where
// the scatter drops it too. So the write is "_pj_index_put_unchecked" (the index_put lowering
// without its device-side bounds check, which would blame the storage's end), and each given
// index tensor is checked against its own dimension instead ("_pj_check_index", CPU's error
// at the next synchronization: index_checks.h).
//
// Also here: CPU's dtype check of every index_put form, which the lowering (converting the
// values) would not make.
//
// Only the plain case is rewritten; anything else (bool masks, values of another dtype or
// device, shapes that do not broadcast, overlapping or conjugate views, whole-storage tensors
// that the general path already writes in place) keeps the general path and its errors.
#include "view_index_put.h"

#include "bridge.h"
#include "call_builder.h"
#include "eager_mode.h"


#include <algorithm>
#include <optional>
#include <vector>

namespace torch_pjrt {
namespace {

// PyTorch's broadcast of two shapes, or nullopt where they do not broadcast (no exception: the
// caller then leaves the call to the general path, which raises PyTorch's own error).
std::optional<std::vector<int64_t>> broadcast(at::IntArrayRef a, at::IntArrayRef b) {
  const size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; i++) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[i] = x == 1 ? y : x;
  }
  return out;
}

// No two elements of `t` share a storage element: with the dims of size > 1 ordered by
// stride, each stride is at least the extent of the dims below it (a sufficient test; PyTorch's
// has_internal_overlap answers "too hard" for every non-dense view).
bool non_overlapping(const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); d++)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;  // elements spanned by the dims so far
  for (const auto& [stride, size] : dims) {
    if (stride < extent) return false;
    extent = stride * (size - 1) + extent;
  }
  return true;
}

bool covers_whole_storage(const at::Tensor& t) {
  return t.storage_offset() == 0 && t.is_contiguous() &&
         static_cast<size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
}

}  // namespace

bool index_put_into_view(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const std::string& name = schema.name();
  const bool in_place = name == "aten::index_put_" || name == "aten::_index_put_impl_";
  if (!in_place && name != "aten::index_put" && name != "aten::_unsafe_index_put") return false;
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  const c10::IValue& self_v = (*stack)[first];
  const c10::IValue& indices_v = (*stack)[first + 1];
  const c10::IValue& values_v = (*stack)[first + 2];
  if (!self_v.isTensor() || !indices_v.isList() || !values_v.isTensor()) return false;
  const at::Tensor self = self_v.toTensor();
  const at::Tensor values = values_v.toTensor();
  // CPU's check (the lowering would convert silently), for every index_put form.
  TORCH_CHECK(values.scalar_type() == self.scalar_type(),
              "Index put requires the source and destination dtypes match, got ",
              self.scalar_type(), " for the destination and ", values.scalar_type(),
              " for the source.");
  if (!in_place) return false;
  const bool accumulate = nargs > 3 && (*stack)[first + 3].isBool() && (*stack)[first + 3].toBool();

  if (!storage_of(self) || self.numel() == 0 || covers_whole_storage(self)) return false;
  if (self.is_conj() || self.is_neg() || values.is_conj() || values.is_neg()) return false;
  if (values.device() != self.device() || values.scalar_type() != self.scalar_type()) return false;
  if (!non_overlapping(self)) return false;

  const int64_t ndim = self.dim();
  const c10::List<std::optional<at::Tensor>> list = indices_v.toOptionalTensorList();
  if (list.size() == 0 || static_cast<int64_t>(list.size()) > ndim) return false;
  std::vector<int64_t> indexed;  // dims with an index tensor
  std::vector<at::Tensor> idx;
  for (size_t d = 0; d < list.size(); d++) {
    const std::optional<at::Tensor> t = list.get(d);
    if (!t.has_value() || !t->defined()) continue;
    if (t->device() != self.device()) return false;
    const at::ScalarType st = t->scalar_type();
    if (st != at::kLong && st != at::kInt) return false;  // bool / uint8 masks: general path
    indexed.push_back(static_cast<int64_t>(d));
    idx.push_back(*t);
  }
  if (indexed.empty()) return false;
  std::vector<int64_t> bshape = idx[0].sizes().vec();
  for (size_t k = 1; k < idx.size(); k++) {
    auto b = broadcast(bshape, idx[k].sizes());
    if (!b) return false;
    bshape = std::move(*b);
  }
  const bool adjacent = indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());

  // Result layout: the broadcast index dims at `bpos`, the other dims around them in order.
  const int64_t nb = static_cast<int64_t>(bshape.size());
  const int64_t bpos = adjacent ? indexed.front() : 0;
  std::vector<int64_t> result;
  std::vector<int64_t> pos_of_dim(static_cast<size_t>(ndim), -1);  // result position of a dim
  {
    auto is_indexed = [&](int64_t d) {
      return std::find(indexed.begin(), indexed.end(), d) != indexed.end();
    };
    if (!adjacent) result.insert(result.end(), bshape.begin(), bshape.end());
    for (int64_t d = 0; d < ndim; d++) {
      if (adjacent && d == indexed.front()) result.insert(result.end(), bshape.begin(), bshape.end());
      if (is_indexed(d)) continue;
      pos_of_dim[static_cast<size_t>(d)] = static_cast<int64_t>(result.size());
      result.push_back(self.size(d));
    }
  }
  const int64_t rank = static_cast<int64_t>(result.size());
  // values must broadcast to the result exactly (not the other way round): else the general
  // path raises PyTorch's shape-mismatch error.
  {
    auto b = broadcast(values.sizes(), result);
    if (!b || *b != result) return false;
  }

  // In Strict mode the index arithmetic below would be a dozen tiny programs; recorded in
  // defer_and_fuse mode and flushed at the end, it and the scatter are one program (cached by
  // the graph's structure like any fused run), still asynchronous. Debug mode keeps running op
  // by op; defer_and_fuse mode simply records.
  const bool fuse = eager_mode() == EagerMode::kStrict;
  const int thread_mode = thread_eager_mode();
  if (fuse) set_thread_eager_mode(static_cast<int>(EagerMode::kDeferAndFuse));
  struct Restore {
    bool on;
    int mode;
    ~Restore() {
      if (on) set_thread_eager_mode(mode);
    }
  } restore{fuse, thread_mode};

  const auto i64 = self.options().dtype(at::kLong);
  const int64_t storage_numel =
      static_cast<int64_t>(self.storage().nbytes() / static_cast<size_t>(self.element_size()));
  // the indexed dims' contribution, and whether every index is in range
  at::Tensor lin, valid;
  for (size_t k = 0; k < indexed.size(); k++) {
    const int64_t size = self.size(indexed[k]);
    at::Tensor i = idx[k].to(at::kLong);
    at::Tensor ok = i.ge(-size).logical_and(i.lt(size));
    i = at::where(i.lt(0), i + size, i).mul(self.stride(indexed[k]));
    lin = lin.defined() ? lin + i : i;
    valid = valid.defined() ? valid.logical_and(ok) : ok;
  }
  std::vector<int64_t> bview(static_cast<size_t>(rank), 1);
  for (int64_t j = 0; j < nb; j++) bview[static_cast<size_t>(bpos + j)] = bshape[static_cast<size_t>(j)];
  lin = lin.expand(bshape).reshape(bview);
  valid = valid.expand(bshape).reshape(bview);
  lin = lin + self.storage_offset();
  for (int64_t d = 0; d < ndim; d++) {
    const int64_t p = pos_of_dim[static_cast<size_t>(d)];
    if (p < 0 || self.size(d) == 1) continue;
    std::vector<int64_t> shape(static_cast<size_t>(rank), 1);
    shape[static_cast<size_t>(p)] = self.size(d);
    lin = lin + at::arange(self.size(d), i64).mul(self.stride(d)).reshape(shape);
  }
  // With the index checks on, one bad index drops every update (CPU raises before writing
  // anything); without them each bad one is dropped, as XLA's scatter does.
  lin = at::where(pj_checks_enabled() ? valid.all() : valid, lin, c10::Scalar(storage_numel))
            .expand(result)
            .reshape({-1});

  const int device = self.device().index() < 0 ? 0 : self.device().index();
  if (pj_checks_enabled()) {
    const std::string where = python_line();
    for (size_t k = 0; k < indexed.size(); k++) {
      CallBuilder b("_pj_check_index", "", device);
      b.add_tensor("index", idx[k]);
      b.add_int("size", self.size(indexed[k]));
      b.add_int("dim", static_cast<int64_t>(k));  // CPU names the index tensor's position
      b.call().where = where.c_str();
      b.run();
    }
  }
  at::Tensor flat = self.as_strided({storage_numel}, {1}, 0);
  CallBuilder b("_pj_index_put_unchecked", "", device);
  b.add_tensor("self", flat);
  b.add_tensor_list("indices", {lin});
  b.add_tensor("values", values.expand(result).reshape({-1}));
  b.add_bool("accumulate", accumulate);
  b.add_out(flat);
  b.run();
  if (fuse) check(pj_defer_flush());
  torch::jit::drop(*stack, nargs);
  stack->push_back(self);
  return true;
}

}  // namespace torch_pjrt
