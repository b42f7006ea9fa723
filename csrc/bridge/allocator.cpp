// The PrivateUse1 allocator: every tpu StorageImpl's DataPtr comes from here.
//
// Invariants of a DataPtr made here:
//  - context is a pj_storage_t* owning exactly one reference, released by delete_storage;
//  - data is the storage's fake address (storage->addr): unique, disjoint from every other
//    storage's range, never dereferenced. PyTorch compares data pointers for overlap and
//    identity checks, so they must behave like real, distinct addresses;
//  - device is tpu:<storage->device>.
// The deleter may run with or without the GIL held and must never take it: it only drops a
// runtime reference (which may destroy a PJRT buffer).
#include "bridge.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <map>
#include <mutex>

#include "torch_pjrt/memory_info.h"

namespace torch_pjrt {
namespace {

// The storages behind live DataPtrs made here, by fake address. It answers two questions:
// which storage a tpu data pointer that did not come from this allocator names, and which
// storage's byte range holds a pointer into one (storage_containing). DLPack import
// (at::fromDLPack: torch.from_dlpack / torch.asarray of a tpu tensor or of its capsule) wraps
// the exporter's data pointer in a from_blob StorageImpl whose DataPtr holds the capsule's
// deleter; since tpu addresses are fake, such a pointer means something only as the address of
// a live storage, and sharing that storage is what aliasing the original means (as CUDA's
// import shares the memory). The capsule keeps the exported tensor, so the storage, alive as
// long as the imported StorageImpl lives. Guarded by g_live_mu; entries are added when a DataPtr
// is made and removed by its deleter, which may run on any thread (never taking the GIL).
std::mutex g_live_mu;
std::map<uintptr_t, pj_storage_t*> g_live;  // guarded by g_live_mu; ordered for range lookups

void delete_storage(void* ctx) {
  pj_storage_t* s = static_cast<pj_storage_t*>(ctx);
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    auto it = g_live.find(s->addr);
    if (it != g_live.end() && it->second == s) g_live.erase(it);
  }
  pj_storage_release(s);
}

// The deleter of alias_storage's DataPtrs: they hold one more reference to a storage whose own
// DataPtr (delete_storage) keeps its g_live entry, so only the reference is dropped.
void release_alias(void* ctx) { pj_storage_release(static_cast<pj_storage_t*>(ctx)); }

class PjrtAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_storage(current_device(), nbytes);
  }

  // data != context, so the raw_allocate/raw_deallocate interface cannot be offered.
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false,
                "tpu storages are not host-addressable: copy them with tensor.copy_() or "
                "tensor.to(), not through the allocator");
  }

  bool initialized() override { return pj_runtime_ready(); }

  // Nothing is cached: freeing a storage returns its buffer to PJRT at once.
  void emptyCache(c10::MempoolId_t) override {}

  // Buffers are kept alive by PJRT until every execution using them completes, whatever
  // "stream" they were used on, so there is nothing to record.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_stats_device(device);
    // Storages are exact-size device buffers: allocated, reserved, active and requested bytes
    // are all the same number, the runtime's per-device live storage bytes.
    check(pj_defer_flush_queued());  // queued Strict calls hold their storages
    const int64_t in_use = pj_storage_bytes_in_use(device);
    const int64_t peak = pj_storage_peak_bytes(device);
    c10::CachingDeviceAllocator::DeviceStats stats;
    for (auto* arr : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                      &stats.requested_bytes}) {
      auto& agg = (*arr)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      agg.current = in_use;
      agg.peak = peak;
    }
    return stats;
  }

  // torch.accelerator.get_memory_info: (free, total) bytes from the plugin's statistics, or on
  // the CPU plugin from the host (memory_info.c). A plugin that says nothing raises
  // NotImplementedError, as PyTorch's own allocators without the query do.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_stats_device(device);
    int64_t free_bytes = 0, total_bytes = 0;
    check(pj_device_memory_info(device, &free_bytes, &total_bytes));
    return {static_cast<size_t>(free_bytes), static_cast<size_t>(total_bytes)};
  }

  // No accumulated (allocated/freed totals) statistics are kept.
  void resetAccumulatedStats(c10::DeviceIndex device) override { check_stats_device(device); }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_stats_device(device);
    pj_storage_reset_peak(device);
  }

 private:
  // Statistics of a device the client does not have are an error, as with CUDA's allocator
  // (RuntimeError "Invalid device argument"), not zeros that would hide a wrong index. A
  // negative index is the current device's (torch.accelerator passes it through).
  static void check_stats_device(c10::DeviceIndex& device) {
    if (device < 0) device = current_device();
    const int count = device_count();
    TORCH_CHECK(device < count, "Invalid device argument ", int(device), ": the tpu runtime has ",
                count, " device(s)");
  }
};

PjrtAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

}  // namespace

c10::DeviceAllocator* device_allocator() { return &g_allocator; }

c10::DataPtr allocate_storage(int device, size_t nbytes) {
  TORCH_CHECK(device >= 0, "tpu device index ", device, " is negative");
  checked_device(device);
  // Zero-byte storages get a storage object too: every tpu DataPtr then has a context and a
  // distinct address, so no code path needs a "no storage" case.
  pj_storage_t* s = nullptr;
  check(pj_storage_new(device, nbytes, &s));
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    g_live[s->addr] = s;
  }
  return c10::DataPtr(reinterpret_cast<void*>(s->addr), s, &delete_storage,
                      c10::Device(c10::DeviceType::PrivateUse1,
                                  static_cast<c10::DeviceIndex>(device)));
}

pj_storage_t* storage_of(const c10::Storage& s) {
  if (!s) return nullptr;
  const c10::DataPtr& p = s.data_ptr();
  if (p.get_deleter() == &delete_storage || p.get_deleter() == &release_alias)
    return static_cast<pj_storage_t*>(p.get_context());
  // A foreign DataPtr on tpu (DLPack import): the live storage at exactly that address. A
  // pointer inside a storage (an exported view with an offset) names no storage: the bridge
  // describes tensors as (storage, element offset) from the storage's start.
  if (p.device().type() != c10::DeviceType::PrivateUse1 || !p.get()) return nullptr;
  std::lock_guard<std::mutex> g(g_live_mu);
  auto it = g_live.find(reinterpret_cast<uintptr_t>(p.get()));
  return it == g_live.end() ? nullptr : it->second;
}

pj_storage_t* storage_containing(const void* p, size_t* offset) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> g(g_live_mu);
  auto it = g_live.upper_bound(a);  // the first storage starting after p
  if (it == g_live.begin()) return nullptr;
  --it;  // the last storage starting at or before p
  pj_storage_t* s = it->second;
  if (a - s->addr >= s->nbytes) return nullptr;
  *offset = a - s->addr;
  return s;
}

c10::Storage alias_storage(pj_storage_t* s, size_t nbytes) {
  TORCH_CHECK(nbytes <= s->nbytes, "alias of ", nbytes, " bytes of a storage of ", s->nbytes);
  pj_storage_retain(s);
  const c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(s->device));
  c10::DataPtr p(reinterpret_cast<void*>(s->addr), s, &release_alias, device);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(p), &g_allocator,
      /*resizable=*/false));
}

pj_storage_t* storage_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  return storage_of(t.storage());
}

}  // namespace torch_pjrt
