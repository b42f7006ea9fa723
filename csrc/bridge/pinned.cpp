// Host memory for pin_memory(). PJRT copies from any host memory, so there is no page-locking to
// do; what a pinned allocator must provide is recognizability: is_pinned() is true exactly for
// memory that came from here. Live blocks are kept in an address-ordered map (guarded by
// g_lock) so that an interior pointer of a block (a view's data pointer) is recognized too.
//
// It is also PrivateUse1's at::HostAllocator, which torch.accelerator's host-memory functions
// (empty_host_cache, host_memory_stats, ...) call: nothing is cached (a freed block goes back to
// the C library at once, safe because every host->device transfer has finished reading or has
// copied its source before the call that started it returns), so emptying the cache has
// nothing to release and record_event nothing to delay.
#include "bridge.h"

#include <ATen/core/CachingHostAllocator.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace torch_pjrt {
namespace {

// 64 bytes: cache-line aligned, and enough for any element type's alignment.
constexpr size_t kAlign = 64;

std::mutex g_lock;
std::map<uintptr_t, size_t> g_blocks;  // start -> size, for live pinned blocks
at::HostStats g_stats;                 // guarded by g_lock

void free_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_lock);
    auto it = g_blocks.find(reinterpret_cast<uintptr_t>(p));
    if (it != g_blocks.end()) {
      g_stats.active_requests.decrease(1);
      g_stats.active_bytes.decrease(it->second);
      g_stats.allocations.decrease(1);
      g_stats.allocated_bytes.decrease(it->second);
      g_stats.num_host_free++;
      g_blocks.erase(it);
    }
  }
  std::free(p);
}

class PinnedAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    // Zero-byte requests still get a block, so an empty pinned tensor reports is_pinned().
    const size_t size = nbytes == 0 ? kAlign : (nbytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, size);
    TORCH_CHECK_WITH(OutOfMemoryError, p, "out of host memory allocating ", nbytes,
                     " pinned bytes");
    {
      std::lock_guard<std::mutex> lock(g_lock);
      g_blocks.emplace(reinterpret_cast<uintptr_t>(p), size);
      g_stats.active_requests.increase(1);
      g_stats.active_bytes.increase(size);
      g_stats.allocations.increase(1);
      g_stats.allocated_bytes.increase(size);
      g_stats.num_host_alloc++;
    }
    return c10::DataPtr(p, p, &free_pinned, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }

  void copy_data(void* dst, const void* src, std::size_t n) const override {
    default_copy_data(dst, src, n);
  }

  // True when `ptr` is one of our blocks (as the caching allocators answer); no use to delay.
  bool record_event(void* ptr, void*, c10::Stream) override { return is_pinned_ptr(ptr); }

  void empty_cache() override {}  // nothing cached

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(g_lock);
    return g_stats;
  }

  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(g_lock);
    for (auto* st : {&g_stats.active_requests, &g_stats.active_bytes, &g_stats.allocations,
                     &g_stats.allocated_bytes})
      st->reset_accumulated();
    g_stats.num_host_alloc = g_stats.num_host_free = 0;
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(g_lock);
    for (auto* st : {&g_stats.active_requests, &g_stats.active_bytes, &g_stats.allocations,
                     &g_stats.allocated_bytes})
      st->reset_peak();
  }
};

PinnedAllocator g_pinned;
REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_pinned)

}  // namespace

c10::Allocator* pinned_allocator() { return &g_pinned; }

bool is_pinned_ptr(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_lock);
  auto it = g_blocks.upper_bound(addr);  // first block starting after addr
  if (it == g_blocks.begin()) return false;
  --it;
  return addr < it->first + it->second;
}

}  // namespace torch_pjrt
