#include "eager_mode.h"

#include <atomic>

namespace torch_pjrt {
namespace {
std::atomic<int> default_mode{static_cast<int>(EagerMode::kStrict)};
thread_local int thread_mode = -1;  // -1: follow the process default
std::atomic<bool> nan_checks{false};
}  // namespace

bool check_nan() { return nan_checks.load(std::memory_order_relaxed); }
void set_check_nan(bool on) { nan_checks = on; }

EagerMode eager_mode() {
  return static_cast<EagerMode>(thread_mode >= 0 ? thread_mode : default_mode.load());
}
void set_default_eager_mode(EagerMode m) { default_mode = static_cast<int>(m); }
EagerMode default_eager_mode() { return static_cast<EagerMode>(default_mode.load()); }
void set_thread_eager_mode(int m) { thread_mode = m; }
int thread_eager_mode() { return thread_mode; }

}  // namespace torch_pjrt
