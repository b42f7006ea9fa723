// The tpu random generator: a seed and a Philox-style counter offset. Random lowerings get
// (seed, offset) from rng_next() and advance the offset by the number of counter values they
// consume, so the same seed and call sequence always give the same numbers, and a saved state
// (seed, offset) replays them exactly.
//
// State tensor layout (get_state/set_state): 16 bytes, uint8, on the CPU: the seed then the
// offset, each a little-endian uint64.
#include "bridge.h"

extern "C" {
#include "torch_pjrt/capture.h"
}

#include <array>
#include <cstring>
#include <mutex>

namespace torch_pjrt {
namespace {

constexpr size_t kStateBytes = 16;
constexpr int kMaxDevices = 64;

void put_u64(uint8_t* dst, uint64_t v) {
  for (int i = 0; i < 8; i++) dst[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* src) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= static_cast<uint64_t>(src[i]) << (8 * i);
  return v;
}

// Callers that read or advance the state hold mutex_ (see Note [Acquire lock when using
// random generators]); the setters are called by PyTorch with the lock already held.
class PjrtGenerator final : public c10::GeneratorImpl {
 public:
  explicit PjrtGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // A new seed starts a new stream of numbers from its beginning.
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    const uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }

  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK_TYPE(state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                     "tpu RNG state must be a torch.uint8 tensor, got ", state.dtype());
    TORCH_CHECK_VALUE(state.device().is_cpu(), "tpu RNG state must be a CPU tensor");
    TORCH_CHECK_VALUE(state.numel() == static_cast<int64_t>(kStateBytes) &&
                          state.is_contiguous(),
                      "tpu RNG state must be a contiguous tensor of ", kStateBytes,
                      " bytes (seed, offset), got ", state.numel());
    const auto* p = static_cast<const uint8_t*>(state.data());
    seed_ = get_u64(p);
    offset_ = get_u64(p + 8);
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor t = at::empty({static_cast<int64_t>(kStateBytes)}, at::kByte);
    auto* p = t.data_ptr<uint8_t>();
    put_u64(p, seed_);
    put_u64(p + 8, offset_);
    return t.getIntrusivePtr();
  }

  // Reserves `n` counter values; the caller holds mutex_.
  std::pair<uint64_t, uint64_t> take(uint64_t n) {
    const uint64_t at = offset_;
    offset_ += n;
    return {seed_, at};
  }

 private:
  PjrtGenerator* clone_impl() const override {
    auto* g = new PjrtGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }

  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;
};

c10::DeviceIndex checked_index(int device) {
  const int index = checked_device(device);
  TORCH_CHECK_INDEX(index < kMaxDevices, "tpu generators support ", kMaxDevices,
                    " devices; index ", index, " is beyond");
  return static_cast<c10::DeviceIndex>(index);
}

// Default generators, created on first use; they live for the whole process (PyTorch and
// Python wrappers keep references to them), guarded by one once_flag each.
std::array<std::once_flag, kMaxDevices> g_default_once;
std::array<at::Generator, kMaxDevices> g_default;

}  // namespace

at::Generator make_generator(int device) {
  return at::make_generator<PjrtGenerator>(checked_index(device));
}

const at::Generator& default_generator(int device) {
  const c10::DeviceIndex index = checked_index(device);
  std::call_once(g_default_once[index],
                 [index] { g_default[index] = at::make_generator<PjrtGenerator>(index); });
  return g_default[index];
}

std::pair<uint64_t, uint64_t> rng_next(const std::optional<at::Generator>& gen, int device,
                                       uint64_t increment) {
  const at::Generator& g =
      gen.has_value() && gen->defined() ? *gen : default_generator(device);
  auto* impl = at::check_generator<PjrtGenerator>(g);
  std::pair<uint64_t, uint64_t> drawn;
  {
    std::lock_guard<std::mutex> lock(impl->mutex_);
    drawn = impl->take(increment);
  }
  // A capture (capture.h) learns every draw, so that its plan draws anew on each run; it can
  // replay draws from a device's default generator only, so it is told which generator it was.
  if (pj_capture_active()) {
    const int index = impl->device().index();
    const bool is_default = default_generator(index).unsafeGetGeneratorImpl() == impl;
    pj_capture_note_draw(is_default ? index : PJ_GENERATOR_OTHER, drawn.first, drawn.second,
                         increment);
  }
  return drawn;
}

}  // namespace torch_pjrt
