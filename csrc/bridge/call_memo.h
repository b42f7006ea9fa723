// The call memo: a repeated op in one pass over its arguments.
//
// The full path of a lowered op (dispatch.cpp) describes every argument into a pj_call_t,
// looks up the Meta result, allocates destinations, builds and hashes the program key, and
// looks the program up: about 5 us of host work per op, most of it the same every time an op
// sees arguments of the same kind. A memo is what the full path found out, kept under the
// call's signature: one flat byte string of everything that decides the program and the
// results' metadata (the op, the eager mode, each tensor's dtype, sizes, strides, offset, its
// storage's size and element type and which earlier argument shares it, every non-tensor
// value). A later call with the same signature allocates its results from the memo's specs and
// runs (or records) the prepared call (torch_pjrt/call.h) on its own storages and scalar
// values. Anything the signature cannot express (tensor lists, symbolic sizes, tensors on other
// devices, conjugate bits, generators) is never memoized and takes the full path.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <string>
#include <vector>

extern "C" {
#include "torch_pjrt/call.h"
}

namespace torch_pjrt {

// What a call looks like to the call memo: the signature bytes, the tpu tensors in argument
// order (slots are taken from their storages) and the scalar values in the order CallBuilder
// passes them.
struct CallSignature {
  std::string bytes;
  c10::SmallVector<const at::Tensor*, 8> tensors;
  c10::SmallVector<pj_scalar_t, 4> scalars;
};

// Fills sig for the op's arguments (the last schema-arguments-count values of the stack);
// false when the call cannot be memoized.
bool call_signature(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                    CallSignature& sig);

// On by default; off, every call takes the full path (tests compare the two).
void set_call_memo_enabled(bool on);
bool call_memo_enabled();

// Runs the call through its memo, leaving the results on the stack as the full path does;
// false (nothing done) when there is none.
bool run_memoized(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// After the full path ran `call` for the arguments `args` (whose signature, taken before the
// call, is `sig`): keeps a memo if the call is one (dests: the destinations in CallBuilder's
// order; returns: what went on the stack). names_line: the op's index checks name the Python
// line of each call (python_line(), taken again on each of the memo's runs).
void store_memo(const c10::OperatorHandle& op, const CallSignature& sig, const pj_call_t& call,
                const torch::jit::Stack& args, const std::vector<at::Tensor>& dests,
                const std::vector<c10::IValue>& returns, bool names_line);

}  // namespace torch_pjrt
