// Builds a pj_call_t from PyTorch values: tensors become views into storage slots, Python
// numbers and 0-d CPU tensors become scalar arguments, destinations become outs.
#pragma once
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "bridge.h"
extern "C" {
#include "torch_pjrt/call.h"
}

namespace torch_pjrt {

pj_dtype_t to_pj_dtype(at::ScalarType t);  // throws TypeError for unsupported dtypes
bool pj_dtype_of(at::ScalarType t, pj_dtype_t* out);  // false for unsupported dtypes
at::ScalarType from_pj_dtype(pj_dtype_t t);
// A Python number as a scalar argument (double, int64, bool or complex: its own type).
pj_scalar_t scalar_value(const c10::Scalar& s);
// A 0-d CPU tensor as a scalar argument (by value, of the tensor's dtype).
pj_scalar_t scalar_value(const at::Tensor& t);

class CallBuilder {
 public:
  CallBuilder(const std::string& op, const std::string& overload, int device);
  pj_call_t& call() { return *c_; }

  void add_none(const std::string& name);
  // undefined -> None. reading=false: the lowering uses only the tensor's type and shape, not
  // its values (fill_'s self), so a never-written storage need not be materialized for it; the
  // storage is still read when another argument reads it or a write does not cover it.
  void add_tensor(const std::string& name, const at::Tensor& t, bool reading = true);
  void add_tensor_list(const std::string& name, const std::vector<at::Tensor>& ts);
  void add_scalar(const std::string& name, const c10::Scalar& s);
  void add_scalars(const std::string& name, const std::vector<c10::Scalar>& ss);
  void add_int(const std::string& name, int64_t v);
  void add_bool(const std::string& name, bool v);
  void add_float(const std::string& name, double v);
  void add_ints(const std::string& name, c10::IntArrayRef v);
  void add_floats(const std::string& name, c10::ArrayRef<double> v);
  void add_str(const std::string& name, const std::string& v);
  // A destination view (written by the program). Must be a tpu tensor.
  void add_out(const at::Tensor& dst);
  // Compiles/executes; throws the matching Python exception on failure.
  void run();

 private:
  const char* keep(const std::string& s);
  pj_arg_t& new_arg(const std::string& name, pj_arg_kind_t kind);
  int push_scalar(const c10::Scalar& s);  // appends to the call's scalars, returns the index
  void describe(const at::Tensor& t, pj_tensor_desc_t* d, bool reading);
  int slot_for(const at::Tensor& t, bool reading);

  // pj_call_t is ~200 KB of fixed arrays: its buffer comes from a per-thread pool and goes
  // back to it (call_builder.cpp), not through malloc/free for every op.
  struct PoolDeleter {
    void operator()(pj_call_t* p) const;
  };
  std::unique_ptr<pj_call_t, PoolDeleter> c_;
  std::deque<std::string> strings_;
  std::unordered_map<pj_storage_t*, int> slots_;
  std::vector<bool> slot_read_;
  std::vector<bool> slot_partial_write_;
  std::vector<at::Tensor> keep_alive_;
};

}  // namespace torch_pjrt
