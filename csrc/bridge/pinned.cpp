// Host memory for pin_memory(). PJRT copies from any host memory, so there is no page-locking to
// do; what a pinned allocator must provide is recognizability: is_pinned() is true exactly for
// memory that came from here. Live blocks are kept in an address-ordered map (guarded by
// g_lock) so that an interior pointer of a block (a view's data pointer) is recognized too.
#include "bridge.h"

#include <cstdlib>
#include <map>
#include <mutex>

namespace torch_pjrt {
namespace {

// 64 bytes: cache-line aligned, and enough for any element type's alignment.
constexpr size_t kAlign = 64;

std::mutex g_lock;
std::map<uintptr_t, size_t> g_blocks;  // start -> size, for live pinned blocks

void free_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_lock);
    g_blocks.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}

class PinnedAllocator final : public c10::Allocator {
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
    }
    return c10::DataPtr(p, p, &free_pinned, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }

  void copy_data(void* dst, const void* src, std::size_t n) const override {
    default_copy_data(dst, src, n);
  }
};

PinnedAllocator g_pinned;

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
