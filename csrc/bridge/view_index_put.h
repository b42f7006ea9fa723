// Indexed writes into a view as one scatter into the whole storage (view_index_put.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>

namespace torch_pjrt {

// Runs an in-place index_put_ / _index_put_impl_ / index_copy_ / index_add_ / index_fill_ /
// scatter_ / scatter_add_ whose self is a view of part of its storage and returns true; false
// (stack untouched) for any other call. Every index_put form also takes CPU's masked_fill_
// path here where CPU does (returning true), and raises CPU's first error where values' dtype
// differs from self's. index_fill_, index_put_ and masked_fill_ into an expanded self
// (internal overlap) are taken here too, with CPU's results: each memory location written
// through any of its positions (index_put_: the last value written there, or their sum).
bool index_put_into_view(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Whether an index_put form takes CPU's masked_fill_ path (a one-element CPU value through a
// lone mask on self's device), which index_put_into_view then runs: that path gives no uint8
// deprecation warning.
bool index_put_takes_masked_fill(const c10::FunctionSchema& schema,
                                 const torch::jit::Stack& stack);
// Whether index_put_into_view may take calls of this base op name (e.g. "index_copy").
bool view_put_candidate(const std::string& base);

}  // namespace torch_pjrt
