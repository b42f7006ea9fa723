// Indexed writes into a view as one scatter into the whole storage (view_index_put.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>

namespace torch_pjrt {

// Runs an in-place index_put_ / _index_put_impl_ / index_copy_ / index_add_ / index_fill_ /
// scatter_ / scatter_add_ whose self is a view of part of its storage and returns true; false
// (stack untouched) for any other call. Raises CPU's dtype error for every index_put form.
bool index_put_into_view(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Whether index_put_into_view may take calls of this base op name (e.g. "index_copy").
bool view_put_candidate(const std::string& base);

}  // namespace torch_pjrt
