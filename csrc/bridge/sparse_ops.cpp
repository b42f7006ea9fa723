// Arithmetic on sparse COO tpu tensors (SparsePrivateUse1): the common cases, written over the
// layout's indices and values with dense tpu ops (sparse_layout.cpp holds the layout itself).
//   zero-preserving unary ops (abs, neg, sin, sqrt, ...): PyTorch's generic kernels, which
//       coalesce and apply the dense op to the values;
//   add: dense + sparse -> dense; sparse + sparse -> sparse (entries concatenated, coalesced
//       when both inputs were, as CPU's result is);
//   mul / div by a scalar (0-dim tensor): the values scaled (div: PyTorch's generic kernel);
//   mm / addmm of a 2-D sparse matrix with a dense one: each entry's value times its dense row,
//       summed into its output row with index_add.
// Anything else (sparse * sparse, sparse + dense, hybrid matmuls) raises NotImplementedError.
#include <ATen/SparseTensorImpl.h>
#include <ATen/ops/abs_native.h>
#include <ATen/ops/asin_native.h>
#include <ATen/ops/asinh_native.h>
#include <ATen/ops/atan_native.h>
#include <ATen/ops/atanh_native.h>
#include <ATen/ops/ceil_native.h>
#include <ATen/ops/deg2rad_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/erf_native.h>
#include <ATen/ops/erfinv_native.h>
#include <ATen/ops/expm1_native.h>
#include <ATen/ops/floor_native.h>
#include <ATen/ops/frac_native.h>
#include <ATen/ops/log1p_native.h>
#include <ATen/ops/mm_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/rad2deg_native.h>
#include <ATen/ops/round_native.h>
#include <ATen/ops/sgn_native.h>
#include <ATen/ops/sign_native.h>
#include <ATen/ops/sin_native.h>
#include <ATen/ops/sinh_native.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/tan_native.h>
#include <ATen/ops/tanh_native.h>
#include <ATen/ops/trunc_native.h>
#include <torch/library.h>

#include "bridge.h"

namespace torch_pjrt {
namespace {

// Makes `out` (a sparse tensor) hold sizes, indices and values, marked coalesced or not.
void assign_sparse(at::Tensor& out, c10::IntArrayRef sizes, int64_t sparse_dim, int64_t dense_dim,
                   const at::Tensor& indices, const at::Tensor& values, bool coalesced) {
  TORCH_CHECK(out.is_sparse(), "expected a sparse result tensor, got a ", out.layout(), " one");
  auto* impl = static_cast<at::SparseTensorImpl*>(out.unsafeGetTensorImpl());
  impl->raw_resize_(sparse_dim, dense_dim, sizes);
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(coalesced);
}

at::Tensor& add_out(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha,
                    at::Tensor& out) {
  if (!self.is_sparse()) {
    TORCH_CHECK(other.is_sparse() && !out.is_sparse(),
                "add: expected a dense result for dense + sparse");
    TORCH_CHECK(self.sizes().equals(other.sizes()),
                "add: expected 'self' and 'other' to have same size, but self has size ",
                self.sizes(), " while other has size ", other.sizes(),
                " (FYI: dense-sparse addition does not currently support broadcasting)");
    return at::add_out(out, self, other.to_dense(), alpha);
  }
  TORCH_CHECK(other.is_sparse(), "add(sparse, dense) is not supported. Use add(dense, sparse) ",
              "instead.");
  TORCH_CHECK(out.is_sparse(), "add: expected a sparse result for sparse + sparse");
  TORCH_CHECK(self.sizes().equals(other.sizes()), "add: expected sizes of 'self' and 'other' ",
              "to match, but ", self.sizes(), " != ", other.sizes());
  TORCH_CHECK(self.sparse_dim() == other.sparse_dim() && self.dense_dim() == other.dense_dim(),
              "add: expected 'self' and 'other' to have the same sparse and dense dimensions, ",
              "but got (", self.sparse_dim(), ", ", self.dense_dim(), ") and (",
              other.sparse_dim(), ", ", other.dense_dim(), ")");
  const at::ScalarType common = at::result_type(self, other);
  TORCH_CHECK(c10::canCast(common, out.scalar_type()), "Can't convert result type ", common,
              " to output ", out.scalar_type(), " in add operation");
  at::Tensor scaled = other._values().to(common);
  if (!(alpha.isIntegral(true) && alpha.toLong() == 1)) scaled = scaled.mul(alpha);
  at::Tensor indices = at::cat({self._indices(), other._indices()}, 1);
  at::Tensor values = at::cat({self._values().to(common), scaled}, 0).to(out.scalar_type());
  const bool merge = self.is_coalesced() && other.is_coalesced();
  const auto sizes = self.sizes().vec();
  const int64_t sd = self.sparse_dim(), dd = self.dense_dim();
  if (!merge) {
    assign_sparse(out, sizes, sd, dd, indices, values, false);
    return out;
  }
  at::Tensor joined = at::_sparse_coo_tensor_with_dims_and_tensors(
      sd, dd, sizes, indices, values, out.options(), /*is_coalesced=*/false);
  at::Tensor c = joined.coalesce();
  assign_sparse(out, sizes, sd, dd, c._indices(), c._values(), true);
  return out;
}

// sparse * scalar: the values scaled, the indices (copied unless in place) and the coalesced
// flag kept; the result type is the promoted one, cast to out's dtype.
at::Tensor& mul_by_scalar(const at::Tensor& sparse, const at::Tensor& scalar, at::Tensor& out) {
  TORCH_CHECK(out.is_sparse(), "mul: expected a sparse result for sparse * scalar");
  const at::ScalarType common = at::result_type(sparse, scalar);
  TORCH_CHECK(c10::canCast(common, out.scalar_type()), "result type ", common,
              " can't be cast to the desired output type ", out.scalar_type());
  at::Tensor values = at::mul(sparse._values(), scalar).to(out.scalar_type());
  at::Tensor indices = out.is_same(sparse) ? sparse._indices() : sparse._indices().clone();
  assign_sparse(out, sparse.sizes(), sparse.sparse_dim(), sparse.dense_dim(), indices, values,
                sparse.is_coalesced());
  return out;
}

at::Tensor& mul_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  if (self.is_sparse() && !other.is_sparse() && other.dim() == 0)
    return mul_by_scalar(self, other, out);
  if (other.is_sparse() && !self.is_sparse() && self.dim() == 0)
    return mul_by_scalar(other, self, out);
  TORCH_CHECK_NOT_IMPLEMENTED(false, "mul: for sparse tpu tensors only a sparse tensor times a ",
                              "scalar (0-dim tensor) is supported");
}

// self (dense, broadcast to n x k) * beta + (mat1 (sparse n x m) @ mat2 (dense m x k)) * alpha.
at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                      const c10::Scalar& beta, const c10::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK_NOT_IMPLEMENTED(mat1.is_sparse() && !mat2.is_sparse() && !self.is_sparse() &&
                                  !out.is_sparse(),
                              "addmm: for sparse tpu tensors only dense + sparse @ dense is "
                              "supported");
  TORCH_CHECK(mat1.sparse_dim() == 2 && mat1.dense_dim() == 0,
              "addmm: matrices expected, got ", mat1.sparse_dim(), "D tensor");
  TORCH_CHECK(mat2.dim() == 2, "addmm: matrices expected, got ", mat2.dim(), "D tensor");
  TORCH_CHECK(mat1.size(1) == mat2.size(0), "mat1 and mat2 shapes cannot be multiplied (",
              mat1.size(0), "x", mat1.size(1), " and ", mat2.size(0), "x", mat2.size(1), ")");
  TORCH_CHECK(mat1.scalar_type() == mat2.scalar_type() && self.scalar_type() == mat2.scalar_type(),
              "addmm: expected self, mat1 and mat2 to have the same dtype, but got ",
              self.scalar_type(), ", ", mat1.scalar_type(), " and ", mat2.scalar_type());
  const int64_t n = mat1.size(0), k = mat2.size(1);
  at::Tensor prod = at::zeros({n, k}, mat2.options());
  if (mat1._nnz() > 0) {
    const at::Tensor idx = mat1._indices();
    at::Tensor rows = mat2.index_select(0, idx.select(0, 1)).mul(mat1._values().unsqueeze(1));
    prod.index_add_(0, idx.select(0, 0), rows);
  }
  at::Tensor result;
  if (beta.toComplexDouble() == 0.0)
    result = prod.mul(alpha);  // beta == 0: self is not read (NaN in it does not propagate)
  else
    result = self.expand({n, k}).mul(beta).add(prod, alpha);
  out.resize_({n, k});
  out.copy_(result);
  return out;
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                 const c10::Scalar& beta, const c10::Scalar& alpha) {
  at::Tensor out = at::empty({0}, mat2.options());
  addmm_out(self, mat1, mat2, beta, alpha, out);
  return out;
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  TORCH_CHECK_NOT_IMPLEMENTED(self.is_sparse() && !mat2.is_sparse(),
                              "mm: for sparse tpu tensors only sparse @ dense is supported");
  TORCH_CHECK(mat2.dim() == 2, "mm: matrices expected, got ", mat2.dim(), "D tensor");
  at::Tensor zeros = at::zeros({self.size(0), mat2.size(1)}, mat2.options());
  return torch_pjrt::addmm(zeros, self, mat2, 0, 1);
}

}  // namespace
}  // namespace torch_pjrt

// A zero-preserving unary op: functional, in-place and out= forms, PyTorch's generic kernels.
#define TPU_SPARSE_UNARY(op)                                        \
  m.impl(#op, TORCH_FN(at::native::op##_sparse));                   \
  m.impl(#op "_", TORCH_FN(at::native::op##_sparse_));              \
  m.impl(#op ".out", TORCH_FN(at::native::op##_sparse_out));

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  using namespace torch_pjrt;
  TPU_SPARSE_UNARY(abs)
  TPU_SPARSE_UNARY(asin)
  TPU_SPARSE_UNARY(asinh)
  TPU_SPARSE_UNARY(atan)
  TPU_SPARSE_UNARY(atanh)
  TPU_SPARSE_UNARY(ceil)
  TPU_SPARSE_UNARY(deg2rad)
  TPU_SPARSE_UNARY(erf)
  TPU_SPARSE_UNARY(erfinv)
  TPU_SPARSE_UNARY(expm1)
  TPU_SPARSE_UNARY(floor)
  TPU_SPARSE_UNARY(frac)
  TPU_SPARSE_UNARY(log1p)
  TPU_SPARSE_UNARY(rad2deg)
  TPU_SPARSE_UNARY(round)
  TPU_SPARSE_UNARY(sgn)
  TPU_SPARSE_UNARY(sign)
  TPU_SPARSE_UNARY(sin)
  TPU_SPARSE_UNARY(sinh)
  TPU_SPARSE_UNARY(sqrt)
  TPU_SPARSE_UNARY(tan)
  TPU_SPARSE_UNARY(tanh)
  TPU_SPARSE_UNARY(trunc)
  m.impl("neg", TORCH_FN(at::native::neg_sparse));
  m.impl("neg_", TORCH_FN(at::native::neg_sparse_));
  m.impl("neg.out", TORCH_FN(at::native::neg_out_sparse));
  m.impl("add.Tensor", TORCH_FN(at::native::add_sparse));
  m.impl("add_.Tensor", TORCH_FN(at::native::add_sparse_));
  m.impl("add.out", TORCH_FN(add_out));
  m.impl("mul.Tensor", TORCH_FN(at::native::mul_sparse));
  m.impl("mul_.Tensor", TORCH_FN(at::native::mul_sparse_));
  m.impl("mul.out", TORCH_FN(mul_out));
  m.impl("div.Tensor", TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&, const at::Tensor&)>(
                           at::native::div_sparse)));
  m.impl("div_.Tensor", TORCH_FN(static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&)>(
                            at::native::div_sparse_)));
  m.impl("div.out",
         TORCH_FN(static_cast<at::Tensor& (*)(const at::Tensor&, const at::Tensor&, at::Tensor&)>(
             at::native::div_out_sparse_zerodim)));
  m.impl("div.Tensor_mode",
         TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&, const at::Tensor&,
                                             std::optional<c10::string_view>)>(
             at::native::div_sparse)));
  m.impl("div_.Tensor_mode",
         TORCH_FN(static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&,
                                              std::optional<c10::string_view>)>(
             at::native::div_sparse_)));
  m.impl("div.out_mode",
         TORCH_FN(static_cast<at::Tensor& (*)(const at::Tensor&, const at::Tensor&,
                                              std::optional<c10::string_view>, at::Tensor&)>(
             at::native::div_out_sparse_zerodim)));
  m.impl("addmm", TORCH_FN(addmm));
  m.impl("addmm.out", TORCH_FN(addmm_out));
  m.impl("mm", TORCH_FN(mm));
}
