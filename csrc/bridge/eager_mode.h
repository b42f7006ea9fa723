// The eager mode of the calling thread (strict, debug, defer_and_fuse): a process-wide default
// that a thread may override (torch.tpu.eager_mode(...) is thread-local).
#pragma once
#include <string>

namespace torch_pjrt {

enum class EagerMode { kStrict = 0, kDebug = 1, kDeferAndFuse = 2 };

EagerMode eager_mode();
void set_default_eager_mode(EagerMode m);
EagerMode default_eager_mode();
// -1 clears the thread's override.
void set_thread_eager_mode(int m);
int thread_eager_mode();
// TORCH_PJRT_CHECK_NAN=1: every lowered op's floating results are checked for NaN/Inf.
bool check_nan();
void set_check_nan(bool on);

}  // namespace torch_pjrt
