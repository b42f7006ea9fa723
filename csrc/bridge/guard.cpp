// DeviceGuardImplInterface for PrivateUse1: current device, streams and events.
//
// Device: a thread-local index, like CUDA's current device; it starts at 0 in every thread.
// Streams: one per device, the default (id 0). Work on a device is ordered by PJRT's data
// dependencies, not by a queue, so extra streams would add nothing but bookkeeping; every
// stream request answers the default stream.
// Events: an event is a pj_marker_t* (stream.h): a snapshot of the executions in flight when it
// was recorded. Waiting on it waits for exactly that work; its time is when that work finished.
#include "bridge.h"

#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace torch_pjrt {
namespace {

thread_local c10::DeviceIndex t_current_device = 0;

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

c10::DeviceIndex index_or_current(c10::DeviceIndex index) {
  return index < 0 ? t_current_device : index;
}

c10::Stream default_stream(c10::DeviceIndex index) {
  return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, index_or_current(index)));
}

pj_marker_t* as_marker(void* event) { return static_cast<pj_marker_t*>(event); }

class GuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected a tpu device, got ", d);
    const c10::Device old(kType, t_current_device);
    if (d.index() != old.index()) setDevice(d);
    return old;
  }

  c10::Device getDevice() const override { return c10::Device(kType, t_current_device); }

  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected a tpu device, got ", d);
    set_device(d.index());
  }

  // Used by guards restoring a device they saw as current, which was valid then.
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) t_current_device = d.index();
  }

  c10::Stream getStream(c10::Device d) const override { return default_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(d.index()); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return default_stream(d.index());
  }
  c10::Stream getNewStream(c10::Device d, int) const override { return default_stream(d.index()); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return default_stream(s.device_index());
  }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  c10::DeviceCapability getDeviceCapability(c10::Device) const override {
    // Only the element types the runtime can hold (dtype.h) are advertised.
    c10::DeviceCapability cap;
    cap.capability_data.capability_bits = 0;
    auto& t = cap.capability_data.supported_scalar_types;
    t.has_Bool = t.has_Byte = t.has_Char = t.has_Short = t.has_Int = t.has_Long = 1;
    t.has_Half = t.has_BFloat16 = t.has_Float = t.has_Double = 1;
    t.has_ComplexFloat = t.has_ComplexDouble = 1;
    return cap;
  }

  // Re-recording replaces the snapshot: an event always refers to its latest record().
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    TORCH_CHECK(stream.device_type() == kType, "expected a tpu stream, got ", stream);
    pj_marker_t* m = nullptr;
    check(pj_defer_flush());  // an event covers the ops recorded before it
    check(pj_marker_record(checked_device(stream.device_index()), &m));
    pj_marker_free(as_marker(*event));
    *event = m;
  }

  // Nothing to enqueue: every program PJRT runs waits for its input buffers, and every write
  // installs a new buffer that later readers pick up, so work submitted after this call is
  // already ordered after the recorded work it depends on (on any device: cross-device data
  // goes through the copy path, which awaits its source). Work it does not depend on may
  // overlap, as on a CUDA stream that waits on another. The host is not blocked.
  void block(void*, const c10::Stream&) const override {}

  bool queryEvent(void* event) const override {
    return !event || pj_marker_query(as_marker(event));
  }

  // Synchronizing points report a failed device-side index check (index_checks.h), as CUDA
  // reports a device-side assert at its next synchronization.
  void synchronizeEvent(void* event) const override {
    if (!event) return;
    check(pj_marker_wait(as_marker(event)));
    check(pj_checks_report(-1));
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    return elapsed_ms(as_marker(start), as_marker(end));
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    pj_marker_free(as_marker(event));
  }

  bool queryStream(const c10::Stream& s) const override {
    return pj_defer_pending_ops() == 0 &&
           pj_stream_pending(index_or_current(s.device_index())) == 0;
  }

  // A device the runtime lacks raises (checked_device), as CUDA's device guard does here.
  void synchronizeStream(const c10::Stream& s) const override {
    const int index = checked_device(s.device_index());
    check(pj_defer_flush());
    check(pj_stream_synchronize(index));
    check(pj_checks_report(index));
  }

  void synchronizeDevice(const c10::DeviceIndex index) const override {
    const int checked = checked_device(index);
    check(pj_defer_flush());
    check(pj_stream_synchronize(checked));
    check(pj_checks_report(checked));
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl)

}  // namespace

c10::DeviceIndex current_device() { return t_current_device; }

void set_device(c10::DeviceIndex index) {
  // As c10::cuda::SetDevice: a negative index here is a caller's bug (Python's set_device(-1)
  // is a no-op before it gets here).
  TORCH_CHECK(index >= 0, "tpu device index ", int(index), " is negative");
  t_current_device = static_cast<c10::DeviceIndex>(checked_device(index));
}

int checked_device(int index) {
  if (index < 0) index = t_current_device;
  const int count = device_count();
  if (count == 0) runtime();  // throws the reason there are no devices
  // CUDA reports an index it does not have as torch.AcceleratorError ("invalid device
  // ordinal"), a RuntimeError: code written for CUDA catches that, so it is raised here too.
  // The error code is not a CUDA one; 0 says "no backend code".
  if (index >= count)
    throw c10::AcceleratorError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, 0,
        c10::str("invalid device ordinal: tpu device index ", index, " out of range (", count,
                 " device(s))"));
  return index;
}

double elapsed_ms(pj_marker_t* start, pj_marker_t* end) {
  TORCH_CHECK(start && end, "both events must be recorded before calling elapsed_time()");
  int64_t t0 = 0, t1 = 0;
  check(pj_marker_time_ns(start, &t0));
  check(pj_marker_time_ns(end, &t1));
  return static_cast<double>(t1 - t0) / 1e6;
}

c10::DeviceIndex device_count() noexcept {
  pj_runtime_t* rt = nullptr;
  pj_status_t* st = pj_runtime_get(&rt);
  if (st) {
    pj_status_free(st);  // the reason is re-reported by whoever needs a device
    return 0;
  }
  return static_cast<c10::DeviceIndex>(pj_runtime_device_count(rt));
}

}  // namespace torch_pjrt
