// index_put_ into a view as a scatter into the whole storage (view_index_put.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torch_pjrt {

// Runs an in-place index_put_ / _index_put_impl_ whose self is a view of part of its storage
// and returns true; false (stack untouched) for any other call.
bool index_put_into_view(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_pjrt
