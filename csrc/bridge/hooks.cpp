// PrivateUse1HooksInterface: what PyTorch's device-generic code asks the tpu backend
// (availability, generators, pinned memory, storage resize, lazy init).
#include "bridge.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/StorageImpl.h>

namespace torch_pjrt {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

class Hooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }

  // Starts the runtime (a PJRT client) to count devices; never throws. The client is cheap on
  // the CPU plugin and needed for anything else anyway.
  bool isAvailable() const override { return device_count() > 0; }

  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    return pj_runtime_ready() && index >= 0 && index < device_count();
  }

  // Called from lazyInitDevice: surfaces the reason the runtime cannot start.
  void init() const override { runtime(); }

  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_device(index); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const c10::DeviceIndex old = current_device();
    if (index != old) set_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return make_generator(index);
  }

  // tpu data pointers are fake addresses that do not record their device; the current device
  // is the best answer (it is where from_blob-style callers would have allocated).
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kType, current_device()); }

  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }

  // Growing keeps the contents (copy.cpp copies them into a new, larger storage). Shrinking
  // keeps the device buffer and only lowers the StorageImpl's byte count, as the bytes beyond
  // it can no longer be reached; a storage without contents is simply replaced.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "trying to resize a tpu storage that is not resizable");
    pj_storage_t* old = storage_of(storage);
    TORCH_CHECK(old, "resizePrivateUse1Bytes called on a storage that is not a tpu storage");
    check(pj_defer_flush());  // contents pending in the deferred graph are contents
    if (newsize > impl->nbytes()) {
      resize_storage_bytes(impl, newsize);
    } else if (!old->buf) {
      impl->set_data_ptr_noswap(allocate_storage(old->device, newsize));
    }
    impl->set_nbytes(newsize);
  }
};

// Registered when the extension loads, before any Python code can reach the device.
[[maybe_unused]] const bool g_registered = [] {
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

}  // namespace
}  // namespace torch_pjrt
