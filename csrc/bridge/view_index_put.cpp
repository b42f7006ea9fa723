// Indexed writes into a view in O(written elements), and index_put's dtype check.
//
// The general path writes a view by reading the whole view, computing its new value and writing
// the whole view back (view_io.c: a scatter of every view element for a strided view), so an
// indexed write of two rows into half of a KV cache costs the half. An in-place indexed write
// into a view is instead the same write into the 1-D whole storage at composed linear indices:
//
//   element (i_0, ..., i_{n-1}) of the view is storage element offset + sum_d i_d * stride_d,
//
// one op, "_pj_view_put" (csrc/ops/index.c), given the whole storage as a flat tensor (the
// call's destination too, so its buffer is donated), the view's sizes and strides (ints: part of
// the program's key) and storage offset (a scalar argument: one program serves every view of
// the same geometry), the index tensors and the values. Inside the one program it composes the
// storage positions of exactly the written elements, checks each index tensor against its own
// view dimension (CPU's error at the next synchronization: index_checks.h; one bad index drops
// every update, as CPU raises before writing) and scatters the values there.
//
// Handled: index_put_ / _index_put_impl_ (x[i, :, j] = v, accumulate or not, integer index
// tensors), index_copy_, index_add_, index_fill_, scatter_ (src or value, no reduce) and
// scatter_add_; x[mask] = v with a CPU bool mask too (it arrives as integer indices:
// dispatch.cpp's indices_to_device). Only the plain case is rewritten; anything else (values of
// another dtype or device, shapes that do not match exactly, overlapping or conjugate views,
// whole-storage tensors that the general path already writes in place, Debug mode, which
// replays indexing ops on CPU for its synchronous errors) keeps the general path and its errors.
// So do masked writes with a tpu mask (x[mask] = v, masked_fill_, masked_scatter_): a mask has
// as many elements as the view, so they cost O(view) either way (measured: a masked_fill_ into a
// [16, 8, 64] view of a 256 MB storage costs what it costs on a tensor of the view's size).
//
// Also here: CPU's dtype check of every index_put form, which the lowering (converting the
// values) would not make, CPU's overlap checks of index_put_, and index_fill_, index_put_ and
// masked_fill_ into an expanded self (fill_expanded, index_put_expanded, masked_fill_expanded).
#include "view_index_put.h"

#include "bridge.h"
#include "call_builder.h"
#include "eager_mode.h"

#include <ATen/MemoryOverlap.h>

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

// A tpu view of part of its storage, none of whose elements alias another (a write through it
// is a scatter of distinct positions), of a rank the lowering takes (PJ_MAX_RANK).
bool partial_view(const at::Tensor& self) {
  return storage_of(self) && self.numel() > 0 && self.dim() >= 1 && self.dim() <= PJ_MAX_RANK &&
         !covers_whole_storage(self) && !self.is_conj() && !self.is_neg() &&
         non_overlapping(self);
}

// The same device, and a value dtype the write takes without conversion (CPU requires equal
// dtypes for every op here; a mismatch goes to the general path, which raises CPU's error).
bool same_kind(const at::Tensor& self, const at::Tensor& t) {
  return t.device() == self.device() && t.scalar_type() == self.scalar_type() && !t.is_conj() &&
         !t.is_neg();
}

// The arguments of one "_pj_view_put" call besides self (see its lowering in csrc/ops/index.c).
struct ViewPut {
  const char* form;
  std::vector<at::Tensor> idx;
  std::vector<int64_t> dims;  // the view dim of each index tensor
  at::Tensor values;          // undefined: the scalar `value`
  c10::Scalar value;
  std::optional<c10::Scalar> alpha;
  bool accumulate;
  bool negative_ok;
  pj_check_kind_t kind;
};

void run_view_put(const c10::FunctionSchema& schema, const at::Tensor& self, const ViewPut& p) {
  const int device = self.device().index() < 0 ? 0 : self.device().index();
  const int64_t storage_numel =
      static_cast<int64_t>(self.storage().nbytes() / static_cast<size_t>(self.element_size()));
  at::Tensor flat = self.as_strided({storage_numel}, {1}, 0);
  CallBuilder b("_pj_view_put", "", device);
  b.add_str("form", p.form);
  b.add_tensor("self", flat);
  b.add_ints("sizes", self.sizes());
  b.add_ints("strides", self.strides());
  b.add_scalar("offset", c10::Scalar(static_cast<int64_t>(self.storage_offset())));
  b.add_tensor_list("indices", p.idx);
  b.add_ints("dims", p.dims);
  if (p.values.defined()) b.add_tensor("values", p.values);
  else b.add_scalar("value", p.value);
  if (p.alpha) b.add_scalar("alpha", *p.alpha);
  b.add_bool("accumulate", p.accumulate);
  b.add_bool("negative_ok", p.negative_ok);
  b.add_int("kind", p.kind);
  std::string where;  // the source line a failed index check names
  // and the op it names: the user's (index_copy_ -> "index_copy"), as the general path does
  std::string display = schema.name().substr(schema.name().rfind("::") + 2);
  if (display.size() > 1 && display.back() == '_' && display[display.size() - 2] != '_')
    display.pop_back();
  if (pj_checks_enabled()) {
    where = python_line();
    b.call().where = where.c_str();
    b.call().display = display.c_str();
  }
  b.add_out(flat);
  b.run();
}

// The arguments of an index_put form (index_put_, _index_put_impl_, index_put,
// _unsafe_index_put: self, indices, values, accumulate), or nullopt for any other call.
struct IndexPutArgs {
  bool in_place;
  size_t nargs;
  at::Tensor self, values;
  c10::List<std::optional<at::Tensor>> indices;
  bool accumulate;
};

std::optional<IndexPutArgs> index_put_args(const c10::FunctionSchema& schema,
                                           const torch::jit::Stack& stack) {
  const std::string& name = schema.name();
  const bool in_place = name == "aten::index_put_" || name == "aten::_index_put_impl_";
  if (!in_place && name != "aten::index_put" && name != "aten::_unsafe_index_put")
    return std::nullopt;
  const size_t nargs = schema.arguments().size();
  if (nargs < 3 || stack.size() < nargs) return std::nullopt;
  const size_t first = stack.size() - nargs;
  const c10::IValue& self_v = stack[first];
  const c10::IValue& indices_v = stack[first + 1];
  const c10::IValue& values_v = stack[first + 2];
  if (!self_v.isTensor() || !indices_v.isList() || !values_v.isTensor()) return std::nullopt;
  const bool accumulate = nargs > 3 && stack[first + 3].isBool() && stack[first + 3].toBool();
  // element by element: TorchScript passes the list as a generic one
  c10::List<std::optional<at::Tensor>> indices;
  for (const c10::IValue& e : indices_v.toListRef()) {
    if (e.isTensor()) indices.push_back(e.toTensor());
    else if (e.isNone()) indices.push_back(std::nullopt);
    else return std::nullopt;
  }
  return IndexPutArgs{in_place, nargs, self_v.toTensor(), values_v.toTensor(),
                      std::move(indices), accumulate};
}

// CPU's index_put writes a one-element value held on the CPU through a lone bool or uint8 mask
// on self's device as self.masked_fill_(mask, value) (no accumulate, no other index tensor;
// None entries before the mask shift it, the mask is widened over self's trailing dims). That
// path converts the value to self's dtype (no dtype check), skips the shape check of values
// against the indexing result, gives no uint8 deprecation warning, and masked_fill_ refuses a
// uint8 mask with its own error. Returns the mask to fill through, or an undefined tensor where
// CPU takes its general path. Raises CPU's IndexError for a mask whose shape does not match
// self's dims.
at::Tensor masked_fill_mask(const IndexPutArgs& a) {
  if (a.accumulate || a.values.numel() != 1 || !a.values.is_cpu()) return {};
  at::Tensor mask;
  int64_t covered = 0;  // self dims before the mask, then through it
  for (const std::optional<at::Tensor>& t : a.indices) {
    if (!t.has_value() || !t->defined()) {
      if (!mask.defined()) covered++;
      continue;
    }
    const at::ScalarType st = t->scalar_type();
    if ((st != at::kBool && st != at::kByte) || t->device() != a.self.device() || mask.defined())
      return {};
    mask = *t;
  }
  if (!mask.defined()) return {};
  for (int64_t j = 0; j < mask.dim(); j++)  // self.size raises CPU's IndexError past self's rank
    TORCH_CHECK_INDEX(mask.size(j) == a.self.size(covered + j), "The shape of the mask ",
                      mask.sizes(), " at index ", j,
                      " does not match the shape of the indexed tensor ", a.self.sizes(),
                      " at index ", covered + j);
  covered += mask.dim();
  at::Tensor widened = mask;
  for (int64_t d = covered; d < a.self.dim(); d++) widened = widened.unsqueeze(-1);
  return widened;
}

// A Python-side warning handler that drops what it is given.
struct DropWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

// values' dtype differs from self's, so CPU raises; but before its dtype check it checks the
// index tensors (types, mask shapes, that they broadcast together, an indexed dim of size 0)
// and that values broadcast to the indexing result, and the first of these to fail is its
// error. That error is found by CPU's own kernel on host stand-ins: the index tensors copied
// (their values decide a mask's count, so the result's shape) and uninitialized tensors of
// self's and values' shapes and dtypes; nothing is written, as the dtype check comes before
// any write. accumulate=true keeps CPU off its masked_fill_ path, which masked_fill_mask has
// already decided against with the real devices. The stand-in call's warnings are dropped
// (the call itself gives its own).
[[noreturn]] void raise_index_put_dtype_error(const IndexPutArgs& a) {
  {
    c10::List<std::optional<at::Tensor>> host;
    for (const std::optional<at::Tensor>& t : a.indices)
      host.push_back(t.has_value() && t->defined() ? std::optional<at::Tensor>(t->cpu())
                                                   : std::nullopt);
    DropWarnings drop;
    c10::WarningUtils::WarningHandlerGuard guard(&drop);
    at::Tensor self = at::empty(a.self.sizes(), at::TensorOptions().dtype(a.self.scalar_type()));
    at::Tensor values =
        at::empty(a.values.sizes(), at::TensorOptions().dtype(a.values.scalar_type()));
    self.index_put_(host, values, /*accumulate=*/true);
  }
  TORCH_CHECK(false, "Index put requires the source and destination dtypes match, got ",
              a.self.scalar_type(), " for the destination and ", a.values.scalar_type(),
              " for the source.");
}

// CPU checks that an index_put's values broadcast to its indexing result (after its checks of
// the index tensors, before the dtype check and any write), which the lowerings can only make
// at build time, with the op's name before the message, or, through a lone mask, not at all
// where values broadcast along the mask's count dim. So it is made here, where the index
// tensors are integer tensors, or one mask (dispatch.cpp's indices_to_device has split a mask
// beside others, or with values not of size 1 along its count dim). Index tensors CPU refuses
// (dtype, too many, not broadcasting together) are left to the lowering's errors, which come
// first on CPU. The count of a mask is read (a host sync) only to name the result's shape in
// the error.
void values_shape_check(const IndexPutArgs& a) {
  const int64_t rank = a.self.dim();
  std::vector<int64_t> bshape;  // the index tensors' broadcast shape
  std::vector<bool> indexed(static_cast<size_t>(rank), false);
  at::Tensor mask;
  int64_t dim = 0, first = -1, last = -1, n = 0, given = 0;  // n: indexed dims
  for (const std::optional<at::Tensor>& t : a.indices) {
    if (!t.has_value() || !t->defined()) {
      dim++;
      continue;
    }
    const at::ScalarType st = t->scalar_type();
    const bool is_mask = st == at::kBool || st == at::kByte;
    if (!is_mask && st != at::kLong && st != at::kInt) return;
    if (is_mask && (mask.defined() || t->dim() == 0)) return;
    const int64_t covers = is_mask ? t->dim() : 1;
    if (dim + covers > rank) return;
    if (is_mask) {
      mask = *t;
      for (int64_t j = 0; j < covers; j++)
        if (t->size(j) != a.self.size(dim + j)) return;
    }
    // a mask's count stands as size 1 until it is known
    const std::vector<int64_t> s = is_mask ? std::vector<int64_t>{1} : t->sizes().vec();
    if (given++ == 0) {
      bshape = s;
    } else {
      try {
        bshape = at::infer_size(bshape, s);
      } catch (const c10::Error&) {
        return;
      }
    }
    for (int64_t j = 0; j < covers; j++) indexed[static_cast<size_t>(dim + j)] = true;
    if (first < 0) first = dim;
    last = dim + covers - 1;
    n += covers;
    dim += covers;
  }
  if (given == 0 || (mask.defined() && given != 1)) return;
  // the result: the broadcast dims in place of the indexed dims when those are adjacent, else
  // first; the other dims of self in order
  const bool adjacent = last - first + 1 == n;
  auto result_shape = [&]() {
    std::vector<int64_t> r;
    if (!adjacent) r.insert(r.end(), bshape.begin(), bshape.end());
    for (int64_t d = 0; d < rank; d++) {
      if (adjacent && d == first) r.insert(r.end(), bshape.begin(), bshape.end());
      if (!indexed[static_cast<size_t>(d)]) r.push_back(a.self.size(d));
    }
    return r;
  };
  std::vector<int64_t> result = result_shape();
  auto fits = [&]() {  // right-aligned, each dim equal or 1
    const at::IntArrayRef v = a.values.sizes();
    if (v.size() > result.size()) return false;
    for (size_t i = 1; i <= v.size(); i++)
      if (v[v.size() - i] != 1 && v[v.size() - i] != result[result.size() - i]) return false;
    return true;
  };
  if (fits()) return;  // with a mask: values of size 1 at its count dim fit any count
  if (mask.defined()) {
    bshape = {(mask != 0).sum().item<int64_t>()};
    result = result_shape();
  }
  TORCH_CHECK(false, "shape mismatch: value tensor of shape ", a.values.sizes(),
              " cannot be broadcast to indexing result of shape ", at::IntArrayRef(result));
}

// The row-major position in `base` (self with its expanded dims at size 1: see
// expanded_base) of each element of self, as an int64 tensor of self's shape on its device:
// the elements that share one memory location share one position.
at::Tensor base_positions(const at::Tensor& self, const at::Tensor& base) {
  return at::arange(base.numel(), self.options().dtype(at::kLong))
      .view(base.sizes())
      .expand(self.sizes());
}

// Self with each dim of stride 0 and size > 1 (the ones has_internal_overlap answers Yes
// for) at size 1: one element per memory location self writes through, itself free of
// internal overlap, so the general path writes it as any view.
at::Tensor expanded_base(const at::Tensor& self) {
  std::vector<int64_t> sizes = self.sizes().vec();
  for (int64_t d = 0; d < self.dim(); d++)
    if (self.stride(d) == 0) sizes[static_cast<size_t>(d)] = std::min<int64_t>(sizes[d], 1);
  return self.as_strided(sizes, self.strides(), self.storage_offset());
}

// index_put_ into a self with internal overlap (an expanded tensor), which CPU allows with a
// deprecation warning (index_put below): CPU's loop writes the values in the indexing
// result's row-major order, each through its one memory location, so a location written
// several times keeps the last value written to it (accumulate: the sum of all of them).
// The same is computed on the dense `base` (expanded_base): the written elements' positions
// are read through the indices from base_positions (the same index checks as the write's),
// and without accumulate every write to a position takes the value of the last one there
// (scatter_reduce amax of the write order), so duplicate positions carry one value and the
// order the device applies them in does not matter. CPU's order for an index of several dims
// run in parallel (more than 32768 elements) is unspecified there too.
void index_put_expanded(const IndexPutArgs& a) {
  const at::Tensor& self = a.self;
  const at::Tensor base = expanded_base(self);
  const at::Tensor where = at::index(base_positions(self, base), a.indices);
  TORCH_CHECK(at::is_expandable_to(a.values.sizes(), where.sizes()),
              "shape mismatch: value tensor of shape ", a.values.sizes(),
              " cannot be broadcast to indexing result of shape ", where.sizes());
  if (where.numel() == 0) return;
  const at::Tensor pos = where.reshape({-1});
  at::Tensor vals = a.values.to(self.device()).expand(where.sizes()).reshape({-1});
  at::Tensor dense = base.clone(at::MemoryFormat::Contiguous).view({-1});
  if (!a.accumulate) {
    const at::Tensor order = at::arange(pos.numel(), pos.options());
    const at::Tensor last = at::full({base.numel()}, -1, pos.options())
                                .scatter_reduce_(0, pos, order, "amax", /*include_self=*/true);
    vals = vals.index_select(0, last.index_select(0, pos));
  }
  dense.index_put_({pos}, vals, a.accumulate);
  base.copy_(dense.view(base.sizes()));
}

bool index_put(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const std::optional<IndexPutArgs> args = index_put_args(schema, *stack);
  if (!args) return false;
  const bool in_place = args->in_place;
  const size_t nargs = args->nargs;
  const at::Tensor& self = args->self;
  const at::Tensor& values = args->values;
  // CPU's _index_put_impl_ (which index_put_ calls) warns for a self with internal overlap
  // (writing through it, see index_put_expanded) before anything but its count of indices
  // (advanced_index_checks, dispatch.cpp), and, past its masked_fill_ path, refuses any
  // overlap of self with values or an index tensor (assert_no_overlap: a full one too, where
  // TensorIterator's check, which lowered_call leaves out for it, would accept it). Then its
  // checks of the index tensors and the values follow. The functional forms write a clone.
  const bool expanded = in_place && at::has_internal_overlap(self) == at::MemOverlap::Yes;
  if (expanded)
    TORCH_WARN("Use of index_put_ on expanded tensors is deprecated. "
               "Please clone() the tensor before performing this operation. "
               "This also applies to advanced indexing e.g. tensor[indices] = tensor");
  if (const at::Tensor mask = masked_fill_mask(*args); mask.defined()) {
    const c10::Scalar value = values.item();
    at::Tensor out = in_place ? self : self.clone(at::MemoryFormat::Preserve);
    out.masked_fill_(mask, value);
    torch::jit::drop(*stack, nargs);
    stack->push_back(out);
    return true;
  }
  if (in_place) {
    at::assert_no_overlap(self, values);
    for (const std::optional<at::Tensor>& t : args->indices)
      if (t.has_value() && t->defined()) at::assert_no_overlap(self, *t);
  }
  // CPU's check (the lowering would convert silently), for every index_put form.
  if (values.scalar_type() != self.scalar_type()) raise_index_put_dtype_error(*args);
  values_shape_check(*args);
  if (expanded && storage_of(self)) {  // every eager mode: the ops it runs record as usual
    index_put_expanded(*args);
    torch::jit::drop(*stack, nargs);
    stack->push_back(self);
    return true;
  }
  if (!in_place || eager_mode() == EagerMode::kDebug) return false;
  const bool accumulate = args->accumulate;
  if (!partial_view(self) || !same_kind(self, values)) return false;

  const int64_t ndim = self.dim();
  const c10::List<std::optional<at::Tensor>>& list = args->indices;
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
  // The result layout (the lowering builds the same): the broadcast index dims at `bpos`, the
  // other dims around them in order.
  const int64_t bpos = adjacent ? indexed.front() : 0;
  std::vector<int64_t> result;
  if (!adjacent) result.insert(result.end(), bshape.begin(), bshape.end());
  for (int64_t d = 0; d < ndim; d++) {
    if (adjacent && d == bpos) result.insert(result.end(), bshape.begin(), bshape.end());
    if (std::find(indexed.begin(), indexed.end(), d) == indexed.end()) result.push_back(self.size(d));
  }
  if (result.size() > PJ_MAX_RANK) return false;  // the lowering's rank limit
  // values must broadcast to the result exactly (not the other way round): else the general
  // path raises PyTorch's shape-mismatch error.
  {
    auto b = broadcast(values.sizes(), result);
    if (!b || *b != result) return false;
  }
  run_view_put(schema, self, {"index_put", idx, indexed, values, {}, {}, accumulate, true, PJ_CHECK_DIM});
  torch::jit::drop(*stack, nargs);
  stack->push_back(self);
  return true;
}

// The in-place ops below reach the fallback as their out= forms (structured_delegate: an
// in-place call is the out= kernel with out = self). The out= tensor is the one written; the
// call is in place when it is self itself, else it goes to the general path.
bool out_is_self(const torch::jit::Stack& stack, size_t first, size_t nargs) {
  const c10::IValue& self = stack[first];
  const c10::IValue& out = stack[first + nargs - 1];
  return self.isTensor() && out.isTensor() && self.toTensor().is_same(out.toTensor());
}

// index_copy_(self, dim, index, source) (index_copy.out with out = self), index_add_(self, dim,
// index, source, alpha) (index_add.out with out = self) and index_fill_(self, dim, index, value):
// the slices of self at a 1-D index along `dim`. source must have self's shape with `dim`
// replaced by the index's length, exactly; the index is int64 (index_add_: or int32); CPU's
// checks, anything else goes to the general path.
bool slices(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const std::string& name = schema.name();
  const std::string& overload = schema.overload_name();
  const bool copy = name == "aten::index_copy" && overload == "out";
  const bool add = name == "aten::index_add" && overload == "out";
  const bool fill = name == "aten::index_fill_" && (overload == "int_Scalar" || overload == "int_Tensor");
  if (!copy && !add && !fill) return false;
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  if (nargs != (copy ? 5u : add ? 6u : 4u) || (!fill && !out_is_self(*stack, first, nargs)) ||
      !(*stack)[first].isTensor() || !(*stack)[first + 1].isInt() || !(*stack)[first + 2].isTensor())
    return false;
  const at::Tensor self = (*stack)[first].toTensor();
  const at::Tensor index = (*stack)[first + 2].toTensor();
  if (eager_mode() == EagerMode::kDebug || !partial_view(self)) return false;
  int64_t dim = (*stack)[first + 1].toInt();
  if (dim < -self.dim() || dim >= self.dim()) return false;
  if (dim < 0) dim += self.dim();
  const at::ScalarType it = index.scalar_type();
  if (index.device() != self.device() || index.dim() != 1 ||
      !(it == at::kLong || (add && it == at::kInt)))
    return false;
  ViewPut p{"slices", {index}, {dim}, {}, {}, {}, add, fill, PJ_CHECK_INDEX_COPY};
  const c10::IValue& v = (*stack)[first + 3];
  if (fill) {
    // the checks lowered_call makes (a complex value into a real self, a value self's dtype
    // cannot hold): this path returns before it
    cpu_kernel_checks("index_fill", schema, torch::jit::Stack(stack->end() - nargs, stack->end()));
    p.kind = PJ_CHECK_DIM;
    if (v.isScalar()) {
      p.value = v.toScalar();
    } else if (v.isTensor() && v.toTensor().dim() == 0 && !v.toTensor().is_conj() &&
               !v.toTensor().is_neg()) {
      const at::Tensor t = v.toTensor();
      if (t.device() == self.device()) p.values = t;  // converted in the program, as CPU does
      else if (t.device().is_cpu()) p.value = t.item();
      else return false;
    } else {
      return false;
    }
  } else {
    if (!v.isTensor()) return false;
    const at::Tensor source = v.toTensor();
    if (!same_kind(self, source) || source.dim() != self.dim()) return false;
    for (int64_t d = 0; d < self.dim(); d++)
      if (source.size(d) != (d == dim ? index.numel() : self.size(d))) return false;
    p.values = source;
    if (add) {
      const c10::IValue& alpha = (*stack)[first + 4];
      if (!alpha.isScalar() || self.scalar_type() == at::kBool) return false;
      if (!(alpha.toScalar().equal(1))) p.alpha = alpha.toScalar();
      // CPU's index_add into a tensor of rank > 1 returns before any check when it is empty
      // (the general path does the same), and takes scatter_add's path, whose error names the
      // dim and size (RuntimeError), when dim is the first or the last one, the index int64
      // and alpha 1; otherwise, and into rank 1, "index out of range in self" (IndexError).
      if (self.dim() > 1 && self.numel() == 0) return false;
      const bool scatter_path = self.dim() > 1 && (dim == 0 || dim == self.dim() - 1) &&
                                it == at::kLong && alpha.toScalar().equal(1.0) &&
                                self.scalar_type() != at::kComplexHalf;
      p.kind = scatter_path ? PJ_CHECK_DIM_RUNTIME : PJ_CHECK_SELF;
    }
  }
  run_view_put(schema, self, p);
  torch::jit::drop(*stack, nargs);
  stack->push_back(self);
  return true;
}

// scatter_(self, dim, index, src | value) and scatter_add_(self, dim, index, src) (scatter.src_out
// / scatter.value_out / scatter_add.out with out = self), without a reduce argument: index of
// self's rank (int64), no larger than self off `dim` and than src everywhere (CPU's checks).
bool scatter(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const std::string& name = schema.name();
  const std::string& overload = schema.overload_name();
  const bool add = name == "aten::scatter_add" && overload == "out";
  if (!add && !(name == "aten::scatter" && (overload == "src_out" || overload == "value_out")))
    return false;
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  if (nargs != 5 || !out_is_self(*stack, first, nargs) || !(*stack)[first + 1].isInt() ||
      !(*stack)[first + 2].isTensor())
    return false;
  const at::Tensor self = (*stack)[first].toTensor();
  const at::Tensor index = (*stack)[first + 2].toTensor();
  const c10::IValue& src_v = (*stack)[first + 3];
  at::Tensor src;
  c10::Scalar value;
  if (src_v.isTensor()) src = src_v.toTensor();
  else if (src_v.isScalar()) value = src_v.toScalar();
  else return false;
  if (eager_mode() == EagerMode::kDebug || !partial_view(self)) return false;
  if (src.defined() && (!same_kind(self, src) || src.dim() != self.dim())) return false;
  int64_t dim = (*stack)[first + 1].toInt();
  if (dim < -self.dim() || dim >= self.dim()) return false;
  if (dim < 0) dim += self.dim();
  if (index.device() != self.device() || index.scalar_type() != at::kLong ||
      index.dim() != self.dim() || index.numel() == 0)
    return false;
  for (int64_t d = 0; d < self.dim(); d++) {
    if (d != dim && index.size(d) > self.size(d)) return false;
    if (src.defined() && index.size(d) > src.size(d)) return false;
  }
  run_view_put(schema, self, {"scatter", {index}, {dim}, src, value, {}, add, false, PJ_CHECK_DIM_RUNTIME});
  torch::jit::drop(*stack, nargs);
  stack->push_back(self);
  return true;
}

// index_fill_ into a self with internal overlap (a dim of stride 0 and size > 1: an expanded
// tensor), which CPU allows with a deprecation warning (kernel_checks.cpp): it writes every
// indexed position through its one memory location, so a storage element is filled when any
// position it stands for is indexed. The general path's write-back of such a destination
// would keep one position's result per element instead, often an unfilled one. So the fill is
// made on a dense copy (the index checked and the value converted as usual), and each
// expanded dim is then reduced to one position: along `dim`, a filled one (index[0]: when the
// index is empty nothing changes), elsewhere any one (all are equal), and written into self
// with its expanded dims at size 1.
bool fill_expanded(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const std::string& overload = schema.overload_name();
  if (schema.name() != "aten::index_fill_" ||
      (overload != "int_Scalar" && overload != "int_Tensor"))
    return false;
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  if (nargs != 4 || !(*stack)[first].isTensor() || !(*stack)[first + 1].isInt() ||
      !(*stack)[first + 2].isTensor())
    return false;
  const at::Tensor self = (*stack)[first].toTensor();
  const at::Tensor index = (*stack)[first + 2].toTensor();
  const c10::IValue value = (*stack)[first + 3];
  // an index of another dtype goes to the general path, which raises CPU's error for it first
  if (!storage_of(self) || index.scalar_type() != at::kLong ||
      at::has_internal_overlap(self) != at::MemOverlap::Yes)
    return false;
  // the warning, then CPU's refusals (index overlapping self, a complex value)
  cpu_kernel_checks("index_fill", schema, torch::jit::Stack(stack->end() - nargs, stack->end()));
  const int64_t raw_dim = (*stack)[first + 1].toInt();
  at::Tensor dense = self.clone(at::MemoryFormat::Contiguous);
  if (value.isTensor())
    dense.index_fill_(raw_dim, index, value.toTensor());
  else
    dense.index_fill_(raw_dim, index, value.toScalar());
  const int64_t dim = c10::maybe_wrap_dim(raw_dim, self.dim());  // valid: the fill took it
  at::Tensor src = dense;  // cut down to expanded_base(self)'s shape
  bool changed = true;
  for (int64_t d = 0; d < self.dim(); d++) {
    if (self.stride(d) != 0 || self.size(d) <= 1) continue;
    if (d == dim) {
      changed = index.numel() > 0;
      if (changed) src = src.index_select(d, index.reshape({-1}).narrow(0, 0, 1));
    } else {
      src = src.narrow(d, 0, 1);
    }
  }
  if (changed) expanded_base(self).copy_(src);
  torch::jit::drop(*stack, nargs);
  stack->push_back(self);
  return true;
}

// masked_fill_ into a self with internal overlap (an expanded tensor), which CPU allows with
// a deprecation warning (kernel_checks.cpp): it writes every masked position through its one
// memory location, so a location is filled when any position it stands for is masked; the
// general path's write-back would keep one position's result per location instead. So the
// mask (broadcast to self) is reduced with any() over each expanded dim and the fill made on
// expanded_base through it. A mask that does not broadcast to self, of another device or
// dtype, or a value tensor of rank > 0 go to the general path and its errors.
bool masked_fill_expanded(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  if (schema.name() != "aten::masked_fill_") return false;
  const size_t nargs = schema.arguments().size();
  const size_t first = stack->size() - nargs;
  if (nargs != 3 || !(*stack)[first].isTensor() || !(*stack)[first + 1].isTensor()) return false;
  const at::Tensor self = (*stack)[first].toTensor();
  const at::Tensor mask = (*stack)[first + 1].toTensor();
  const c10::IValue value = (*stack)[first + 2];
  if (!storage_of(self) || at::has_internal_overlap(self) != at::MemOverlap::Yes ||
      !mask.defined() || mask.device() != self.device() || mask.scalar_type() != at::kBool ||
      !at::is_expandable_to(mask.sizes(), self.sizes()) ||
      (value.isTensor() && value.toTensor().dim() != 0))
    return false;
  // the warning, then CPU's refusals (the mask partially overlapping self, the value's range)
  cpu_kernel_checks("masked_fill", schema, torch::jit::Stack(stack->end() - nargs, stack->end()));
  at::Tensor any = mask.expand(self.sizes());
  for (int64_t d = 0; d < self.dim(); d++)
    if (self.stride(d) == 0 && self.size(d) > 1) any = any.any(d, /*keepdim=*/true);
  const at::Tensor base = expanded_base(self);
  if (value.isTensor()) base.masked_fill_(any, value.toTensor());
  else base.masked_fill_(any, value.toScalar());
  torch::jit::drop(*stack, nargs);
  stack->push_back(self);
  return true;
}

}  // namespace

bool view_put_candidate(const std::string& base) {
  return base == "index_put" || base == "_index_put_impl" || base == "_unsafe_index_put" ||
         base == "index_copy" || base == "index_add" || base == "index_fill" ||
         base == "scatter" || base == "scatter_add";
}

bool index_put_takes_masked_fill(const c10::FunctionSchema& schema,
                                 const torch::jit::Stack& stack) {
  const std::optional<IndexPutArgs> args = index_put_args(schema, stack);
  if (!args || args->accumulate || args->values.numel() != 1 || !args->values.is_cpu())
    return false;
  try {
    return masked_fill_mask(*args).defined();
  } catch (const c10::Error&) {
    return true;  // its mask-shape error, raised when the call takes that path
  }
}

bool index_put_into_view(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  return index_put(schema, stack) || slices(schema, stack) || scatter(schema, stack) ||
         fill_expanded(schema, stack) || masked_fill_expanded(schema, stack);
}

}  // namespace torch_pjrt
