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

#include "torch_pjrt/memory_info.h"

namespace torch_pjrt {
namespace {

void delete_storage(void* ctx) { pj_storage_release(static_cast<pj_storage_t*>(ctx)); }

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
  return c10::DataPtr(reinterpret_cast<void*>(s->addr), s, &delete_storage,
                      c10::Device(c10::DeviceType::PrivateUse1,
                                  static_cast<c10::DeviceIndex>(device)));
}

pj_storage_t* storage_of(const c10::Storage& s) {
  if (!s) return nullptr;
  const c10::DataPtr& p = s.data_ptr();
  if (p.get_deleter() != &delete_storage) return nullptr;
  return static_cast<pj_storage_t*>(p.get_context());
}

pj_storage_t* storage_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  return storage_of(t.storage());
}

}  // namespace torch_pjrt
