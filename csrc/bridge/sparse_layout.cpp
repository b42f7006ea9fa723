// Sparse COO tensors on tpu (the SparsePrivateUse1 dispatch key), as CUDA has them: a
// SparseTensorImpl whose indices (int64, sparse_dim x nnz) and values (nnz x dense sizes) are
// ordinary tpu tensors.
//
// The layout's bookkeeping is PyTorch's own device-independent code, registered here for the
// tpu keys: construction from indices and values, empty / empty_like / resize, the accessors
// (_indices, _values, _nnz, sparse_dim, dense_dim, is_coalesced), clone, copy_, zero_, and
// dense -> sparse conversion (which runs nonzero and indexing as tpu ops). CPU's and CUDA's
// coalesce and to_dense are device kernels; the versions here are built from tpu ops:
//   coalesce: each entry's row-major linear index over the sparse dims, unique (sorted) with the
//             inverse map, values summed into their unique slot with index_add, the linear
//             indices unravelled back into rows;
//   to_dense: zeros, then index_put_ with accumulate (duplicates add up, as CPU's does).
// Bool values are summed as integers and read back as "any" (CPU's + on bool is an or).
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_dimI_native.h>
#include <ATen/ops/_dimV_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_to_sparse_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/narrow_copy_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_mask_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <torch/library.h>

#include "bridge.h"

namespace torch_pjrt {
namespace {

// The type values are summed in: bool is summed as int64 and turned back into bool by != 0.
at::ScalarType sum_type(at::ScalarType t) { return t == at::kBool ? at::kLong : t; }

at::Tensor from_sum(const at::Tensor& sum, at::ScalarType t) {
  return t == at::kBool ? sum.ne(0) : sum;
}

at::Tensor coalesce(const at::Tensor& self) {
  const int64_t nnz = self._nnz();
  if (nnz < 2) {
    // nothing to merge or sort: CPU's answer is a copy marked coalesced
    at::Tensor dst = self.clone();
    dst._coalesced_(true);
    return dst;
  }
  const int64_t sparse_dim = self.sparse_dim(), dense_dim = self.dense_dim();
  const at::Tensor indices = self._indices();
  const at::Tensor values = self._values();
  const c10::IntArrayRef sizes = self.sizes();

  at::Tensor linear = at::zeros({nnz}, indices.options());
  int64_t mult = 1;
  for (int64_t d = sparse_dim - 1; d >= 0; --d) {
    linear.add_(indices.select(0, d), mult);
    mult *= sizes[d];
  }
  at::Tensor uniq, inverse;
  std::tie(uniq, inverse, std::ignore) =
      at::_unique2(linear, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
  const int64_t n = uniq.size(0);

  std::vector<int64_t> vsizes = values.sizes().vec();
  vsizes[0] = n;
  const at::ScalarType vt = values.scalar_type();
  at::Tensor summed = at::zeros(vsizes, values.options().dtype(sum_type(vt)))
                          .index_add_(0, inverse, values.to(sum_type(vt)));
  at::Tensor new_values = from_sum(summed, vt);

  std::vector<at::Tensor> rows(static_cast<size_t>(sparse_dim));
  at::Tensor rest = uniq;
  for (int64_t d = sparse_dim - 1; d >= 0; --d) {
    rows[static_cast<size_t>(d)] = at::remainder(rest, sizes[d]);
    rest = at::div(rest, sizes[d], "floor");
  }
  at::Tensor new_indices =
      sparse_dim > 0 ? at::stack(rows, 0) : at::empty({0, n}, indices.options());
  return at::_sparse_coo_tensor_with_dims_and_tensors(
      sparse_dim, dense_dim, sizes, new_indices, new_values, self.options(),
      /*is_coalesced=*/true);
}

at::Tensor to_dense(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                    std::optional<bool> masked_grad) {
  TORCH_CHECK(!dtype.has_value(), "dtype argument is not supported by sparse_to_dense");
  const at::ScalarType vt = self.scalar_type();
  at::Tensor dst =
      at::zeros(self.sizes(), self.options().layout(at::kStrided).dtype(sum_type(vt)));
  if (self._nnz() == 0) return from_sum(dst, vt);
  const at::Tensor indices = self._indices();
  const at::Tensor values = self._values().to(sum_type(vt));
  const int64_t sparse_dim = self.sparse_dim();
  if (sparse_dim == 0) {
    dst.add_(values.sum(0, /*keepdim=*/false, sum_type(vt)));
  } else {
    c10::List<std::optional<at::Tensor>> idx;
    for (int64_t d = 0; d < sparse_dim; ++d) idx.push_back(indices.select(0, d));
    dst.index_put_(idx, values, /*accumulate=*/true);
  }
  return from_sum(dst, vt);
}

at::Tensor dense_to_sparse(const at::Tensor& self, std::optional<at::Layout> layout,
                           at::OptionalIntArrayRef blocksize, std::optional<int64_t> dense_dim) {
  const at::Layout to = layout.value_or(at::kSparse);
  TORCH_CHECK_NOT_IMPLEMENTED(to == at::kSparse, "to_sparse: only the sparse COO layout is ",
                              "supported on tpu, got ", to);
  return at::native::dense_to_sparse(self, layout, blocksize, dense_dim);
}

// With dense dims (sparse_dim < dim), an entry is a sparse position where any element of its
// dense slice is nonzero; CPU finds those with unique_dim over nonzero's rows, here nonzero of
// the "any nonzero" mask over the sparse dims gives the same sorted positions directly.
at::Tensor dense_to_sparse_dim(const at::Tensor& self, int64_t sparse_dim) {
  const int64_t dims = self.dim();
  if (sparse_dim <= 0 || sparse_dim >= dims) return at::native::dense_to_sparse(self, sparse_dim);
  at::Tensor mask = self.flatten(sparse_dim).ne(0).any(-1);
  at::Tensor indices = mask.nonzero().t().contiguous();
  const int64_t nnz = indices.size(1);
  at::Tensor values;
  if (nnz == 0) {
    std::vector<int64_t> vsizes{0};
    for (int64_t d = sparse_dim; d < dims; ++d) vsizes.push_back(self.size(d));
    values = at::empty(vsizes, self.options());
  } else {
    c10::List<std::optional<at::Tensor>> idx;
    for (int64_t d = 0; d < sparse_dim; ++d) idx.push_back(indices.select(0, d));
    values = self.index(idx);
  }
  at::Tensor out = at::_sparse_coo_tensor_with_dims_and_tensors(
      sparse_dim, dims - sparse_dim, self.sizes(), indices, values,
      self.options().layout(at::kSparse), /*is_coalesced=*/true);
  return out;
}

// sparse_mask(dense t, sparse mask): t's elements (or dense slices) at the mask's entries, with
// the mask's indices, order, duplicates and coalesced flag (what to_dense's backward needs).
at::Tensor sparse_mask(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.sizes().equals(self.sizes()), "sparse_mask(): operands have incompatible ",
              "sizes; self has size ", self.sizes(), " but mask has size ", mask.sizes());
  TORCH_CHECK_NOT_IMPLEMENTED(self.layout() == at::kStrided, "sparse_mask: a ", self.layout(),
                              " self is not supported on tpu (only a strided one)");
  const int64_t sparse_dim = mask.sparse_dim(), nnz = mask._nnz();
  const at::Tensor indices = mask._indices();
  at::Tensor values;
  if (nnz == 0) {
    std::vector<int64_t> vsizes{0};
    for (int64_t d = sparse_dim; d < self.dim(); ++d) vsizes.push_back(self.size(d));
    values = at::empty(vsizes, self.options());
  } else if (sparse_dim == 0) {
    values = self.unsqueeze(0).expand(mask._values().sizes()).clone();
  } else {
    c10::List<std::optional<at::Tensor>> idx;
    for (int64_t d = 0; d < sparse_dim; ++d) idx.push_back(indices.select(0, d));
    values = self.index(idx);
  }
  return at::_sparse_coo_tensor_with_dims_and_tensors(
      sparse_dim, mask.dense_dim(), self.sizes(), indices.clone(), values,
      self.options().layout(at::kSparse), mask.is_coalesced());
}

}  // namespace
}  // namespace torch_pjrt

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  using namespace torch_pjrt;
  m.impl("_sparse_coo_tensor_with_dims_and_tensors",
         TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_sparse_coo));
  m.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("_coalesce", TORCH_FN(coalesce));
  m.impl("_to_dense", TORCH_FN(to_dense));
  m.impl("clone", TORCH_FN(at::native::clone_sparse));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
  m.impl("copy_sparse_to_sparse_", TORCH_FN(at::native::copy_sparse_));
  m.impl("sparse_mask", TORCH_FN(sparse_mask));
  m.impl("narrow_copy", TORCH_FN(at::native::narrow_copy_sparse));
  m.impl("zero_", TORCH_FN(at::native::zero_sparse_));
  m.impl("_to_sparse", TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&,
                                                           std::optional<at::Layout>,
                                                           at::OptionalIntArrayRef,
                                                           std::optional<int64_t>)>(
                           at::native::sparse_coo_to_sparse)));
  m.impl("_to_sparse.sparse_dim",
         TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&, int64_t)>(
             at::native::sparse_coo_to_sparse)));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace torch_pjrt;
  m.impl("_to_sparse", TORCH_FN(dense_to_sparse));
  m.impl("_to_sparse.sparse_dim", TORCH_FN(dense_to_sparse_dim));
}
