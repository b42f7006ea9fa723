// tpu_dist: the c10d backend of the tpu device, staged through host memory over Gloo.
//
// Every collective on tpu tensors runs as the same collective of an internal Gloo backend
// (ProcessGroupGloo from the torch wheel, created by torch_pjrt/distributed) on host copies of
// the tensors: device->host copy, Gloo, host->device copy. The results are therefore exactly
// Gloo's on CPU tensors. docs/distributed.md has the design and the native path on TPU/GPU.
//
// Why a C++ c10d::Backend: c10d's ops (c10d::allreduce_ and the rest, which DDP, FSDP2, the
// functional collectives and torch.distributed's Python API all call) have PrivateUse1 kernels
// that call the Backend registered on the process group for the tpu device type. Only a C++
// Backend can be registered there (Python may subclass ProcessGroup, which replaces the whole
// group and breaks "cpu:gloo,tpu:tpu_dist", but not Backend).
//
// Checks before data moves: Gloo aborts the process (an exception in its I/O thread) when a
// message is longer than the buffer posted for it, i.e. when ranks call collectives of
// different sizes or a send is longer than its recv. So no data goes to Gloo unchecked:
//  - every collective first exchanges a fixed-size fingerprint (call number, op, dtype, root,
//    reduce op, a hash of the sizes that must agree; per-peer counts for all-to-all) with an
//    allgather on a second Gloo backend, `check`; the data collective is issued only when all
//    ranks' fingerprints agree, else every rank raises naming each rank's call. Fingerprints
//    are all the same size, so a mismatch can never abort; on their own backend they can be
//    issued early without reordering the data collectives.
//  - every send first sends a fixed-size header (dtype, element count) on `check` with the
//    same tag; the receiver posts the data recv only after the header matched, and in the
//    order the recvs were called on that (source, tag) channel.
//
// Threads (each backend has its own; they take the GIL only to run Python callbacks a caller
// attached to a Work's future, as Gloo's threads do):
//  - The calling thread checks arguments (so mistakes raise at the call, as with Gloo),
//    snapshots inputs that are views into fresh tensors (a device copy, asynchronous), flushes
//    recorded (defer_and_fuse) ops, and for a collective takes its call number, sends its
//    fingerprint and starts the device-to-host copies of its inputs into pooled host blocks
//    (PJRT copies asynchronously; a small input whose buffer is ready on the CPU plugin is
//    copied right away). An asynchronous call never waits for the device or for peers.
//  - One collective thread takes collectives in call order: waits for the copies and the
//    fingerprints, calls Gloo, waits for it and writes the results back. A synchronous call
//    (async_op=False) with no collective ahead of it does the same on the calling thread, which
//    waits anyway. Gloo gives each collective its tag at the Gloo call, so an issue gate makes
//    those calls in call order on every rank, which keeps the ranks' collectives matched.
//  - One issuer thread takes sends and recvs in call order (the send header, the copy, the
//    Gloo call), so a collective waiting for its peers never holds up a send or recv called
//    after it (Gloo allows that pattern; so must we), and runner threads (a pool that grows
//    with the sends and recvs in flight) wait for each one and write its result back.
//    Completions do not wait for each other: waiting in call order could deadlock send/recv
//    patterns that Gloo allows.
//
// Write-back is all or nothing: outputs are first uploaded to fresh device buffers (nothing
// visible changes), then, holding pj_run_lock (which program runs hold while they read and
// replace storage buffers), the storages of view outputs get a full new image (their current
// contents with the views' new values) and every written storage gets its new buffer. A failure
// before that last step leaves every caller tensor as it was.
//
// Failures: Gloo bounds every wait by the group timeout and reports a dead peer as an error, so
// every Work completes (successfully or with that error) within the timeout. Any failure once
// this rank has started a collective or a send/recv may leave the ranks out of step: the
// backend is then marked broken and every later call raises at once, naming the first failure.
#include "bridge.h"
#include "future_work.h"
#include "call_builder.h"
#include "eager_mode.h"

#include <c10/core/InferenceMode.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/headeronly/version.h>  // TORCH_VERSION_MINOR

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pjrt_c_api.h"
extern "C" {
#include "torch_pjrt/host_pool.h"
#include "torch_pjrt/staged_transfer.h"
#include "torch_pjrt/transfer.h"

// The lock graph/call.c holds around every program run: it reads slot storages' buffers and
// installs the results under it (csrc/graph/call_internal.h declares it for the graph core).
extern pthread_mutex_t pj_run_lock;
}

// Names c10d gave later: torch 2.11's headers (the release on the CUDA machine this bridge was
// also built on) call the PREMUL_SUM factor NCCLPreMulSumSupplement and have no OpType of its
// own for a coalesced reduce_scatter_tensor (COALESCED stands for it there).
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13
using PreMulSumFactor = c10d::NCCLPreMulSumSupplement;
constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::COALESCED;
#else
using PreMulSumFactor = c10d::PreMulSumSupplement;
constexpr c10d::OpType kReduceScatterTensorCoalesced =
    c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#endif

namespace py = pybind11;

namespace torch_pjrt {
namespace {

constexpr const char* kName = "tpu_dist";

// Host blocks come from the runtime's pool (torch_pjrt/host_pool.h): page-aligned, reused, in
// power-of-two size classes. They leave the pool for Gloo and come back after the write-back,
// or, when a block became a device buffer (zero-copy upload), when PJRT releases that buffer.

// One block owned by a job; goes back to the pool unless released to PJRT.
class Block {
 public:
  Block() = default;
  explicit Block(size_t nbytes) {
    pj_status_t* st = pj_host_pool_take(nbytes, &p_, &cap_);
    if (st) {
      const std::string msg = std::string("tpu_dist: ") + pj_status_message(st);
      pj_status_free(st);
      TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    }
  }
  Block(Block&& o) noexcept : p_(o.p_), cap_(o.cap_) { o.p_ = nullptr; }
  Block& operator=(Block&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      cap_ = o.cap_;
      o.p_ = nullptr;
    }
    return *this;
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  ~Block() { reset(); }
  void* data() const { return p_; }
  size_t capacity() const { return cap_; }
  void* release() {
    void* p = p_;
    p_ = nullptr;
    return p;
  }
  void reset() {
    if (p_) pj_host_pool_give(p_, cap_);
    p_ = nullptr;
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

std::atomic<int64_t> g_uploads{0}, g_zero_copy_uploads{0}, g_downloads{0}, g_collectives{0};

// ---------------------------------------------------------------------------------------------
// PJRT transfers into and out of host blocks: the runtime's (torch_pjrt/staged_transfer.h),
// counted here for _dist_stats.
// ---------------------------------------------------------------------------------------------

// A 1-D buffer of n elements of type dt on `device` holding the block's first bytes; the block
// passes to the runtime, which returns it to the pool once PJRT is done with it.
PJRT_Buffer* upload(int device, Block block, pj_dtype_t dt, int64_t n) {
  PJRT_Buffer* buf = nullptr;
  bool zero_copy = false;
  check(pj_staged_upload(device, block.data(), block.capacity(), dt, n, &buf, &zero_copy));
  block.release();  // the runtime's now (on failure above, the destructor gave it back)
  g_uploads++;
  if (zero_copy) g_zero_copy_uploads++;  // confirmed aliases only
  return buf;
}

// RAII for pj_run_lock.
class RunLock {
 public:
  RunLock() { pthread_mutex_lock(&pj_run_lock); }
  ~RunLock() { pthread_mutex_unlock(&pj_run_lock); }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
};

// Starts copying storage s's whole buffer into dst; the event fires when the bytes are on the
// host. The caller holds pj_run_lock (pj_staged_download_start_locked says why).
PJRT_Event* start_download_locked(pj_storage_t* s, pj_dtype_t dt, void* dst, size_t nbytes) {
  PJRT_Event* ev = nullptr;
  check(pj_staged_download_start_locked(s, dt, dst, nbytes, &ev));
  g_downloads++;
  return ev;
}

// Copies up to this many bytes of a computed buffer on the calling thread where the plugin
// allows it (pj_staged_copy_ready_locked), instead of handing them to PJRT's copy threads.
constexpr size_t kCopyHereBytes = size_t(1) << 20;

bool copy_ready_buffer_locked(pj_storage_t* s, void* dst, size_t nbytes) {
  if (!pj_staged_copy_ready_locked(s, dst, nbytes)) return false;
  g_downloads++;
  return true;
}

// The element type a new buffer of storage s gets: the one it holds (other tensors may view it
// in that type), or t's when it holds nothing yet.
pj_dtype_t storage_dtype(const pj_storage_t* s, at::ScalarType t) {
  return s->buf || s->pending ? s->dtype : to_pj_dtype(t);
}

// ---------------------------------------------------------------------------------------------
// Jobs: one call. A slot is one tensor argument in the order the issue function expects them;
// `host` is what Gloo sees.
// ---------------------------------------------------------------------------------------------

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

bool is_tpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

// True when t covers its whole storage, row-major: the storage's bytes are then t's data,
// downloaded or replaced as a whole (in the storage's own element type, see storage_dtype).
bool is_whole_storage(const at::Tensor& t) {
  pj_storage_t* s = storage_of(t);
  return s && t.storage_offset() == 0 && t.is_contiguous() &&
         static_cast<size_t>(t.numel()) * t.element_size() == s->nbytes;
}

// Gloo has no int16 kernels; int16 travels as int32 (reductions wrap modulo 2^16 either way,
// so narrowing the int32 result gives int16 arithmetic's answer).
at::ScalarType wire_dtype(at::ScalarType t) { return t == at::kShort ? at::kInt : t; }

struct Slot {
  at::Tensor user;   // the caller's tensor
  bool read = false;
  bool write = false;
  bool whole = false;  // tpu: user is its whole storage
  at::Tensor src;    // tpu read: the whole-storage tensor to download (user or a snapshot)
  Block block;       // tpu: host memory of the staged values
  at::Tensor staged;  // tpu: CPU tensor over block, user's dtype and sizes, contiguous
  at::Tensor host;   // what Gloo reads and writes: user (cpu), staged, or its int32 widening
};

using IssueFn = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&,
                                                              std::vector<at::Tensor>&)>;

// What must agree across ranks for one collective (see the fingerprint layout below).
struct Signature {
  explicit Signature(std::vector<int64_t> items_ = {}, int64_t reduce_op_ = -1,
                     int64_t root_ = -1)
      : items(std::move(items_)), reduce_op(reduce_op_), root(root_) {}
  std::vector<int64_t> items;  // hashed: dtypes, sizes, anything every rank must share
  int64_t reduce_op;
  int64_t root;
  std::vector<int64_t> sends, recvs;  // all-to-all only: elements to / from each rank
};

enum class P2P { kNone, kSend, kRecv, kRecvAny };

class StagedWork;

struct Job {
  c10::intrusive_ptr<StagedWork> work;
  std::vector<Slot> slots;
  IssueFn issue;
  // After the Gloo work succeeded, before the write-back: moves results from Gloo's buffers
  // into the slots' host tensors (when the issue function gave Gloo buffers of its own).
  std::function<void(std::vector<at::Tensor>&)> after;
  std::vector<at::Tensor> wire;  // the host tensors the issue function was given
  c10d::ReduceOp premul;  // PREMUL_SUM: read slots are scaled by its factor before a SUM
  bool has_premul = false;
  c10::intrusive_ptr<c10d::Work> gloo_work;
  std::vector<PJRT_Event*> downloads;  // device-to-host copies in flight into slot blocks
  bool async_op = true;  // false: the caller waits for the Work right after the call
  // collectives: the fingerprint exchange
  Signature sig;
  int64_t seq = 0;  // this collective's number in the group (calls made before it)
  at::Tensor fp_in, fp_out;
  c10::intrusive_ptr<c10d::Work> fp_work;
  // sends and recvs: the header exchange
  P2P p2p = P2P::kNone;
  int peer = -1;
  int tag = 0;
  at::Tensor header;
  c10::intrusive_ptr<c10d::Work> header_work;
  uint64_t ticket = 0;  // recv: its place among the recvs of its (source, tag) channel
  bool any_pending = false;  // a recv from any source whose header has not arrived yet
};

// The staged transport's Work: a FutureWork (future_work.h) that also knows the source of a
// recv from any source.
class StagedWork : public FutureWork {
 public:
  using FutureWork::FutureWork;

  int sourceRank() const override {
    std::lock_guard<std::mutex> g(mutex_);
    TORCH_CHECK(source_rank_ >= 0, "tpu_dist: sourceRank() is known only for a completed "
                                   "recv from any source");
    return source_rank_;
  }

  void succeed(int source_rank) {
    {
      std::lock_guard<std::mutex> g(mutex_);
      source_rank_ = source_rank;
    }
    finish();
  }

  void fail(std::exception_ptr e) { finish(e); }

 private:
  int source_rank_ = -1;
};

// ---------------------------------------------------------------------------------------------
// Fingerprints: int64[kFpFixed + 2 * world] per rank, allgathered on the check backend.
// ---------------------------------------------------------------------------------------------

constexpr int64_t kMagic = 0x7470755f64697374;  // "tpu_dist"
enum FpField : int64_t {
  kFpMagic = 0,
  kFpSeq,
  kFpOp,
  kFpDtype,
  kFpReduceOp,
  kFpRoot,
  kFpNumel,    // elements of the first tensor (for messages)
  kFpTensors,  // tensors in the call (for messages)
  kFpHash,
  kFpFixed
};

int64_t fnv1a(const std::vector<int64_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t x : v) {
    for (int i = 0; i < 8; i++) {
      h ^= (static_cast<uint64_t>(x) >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>(h);
}

// torch.distributed's names for the collectives, as users call them.
const char* op_name(int64_t op) {
  switch (static_cast<c10d::OpType>(op)) {
    case c10d::OpType::BROADCAST: return "broadcast";
    case c10d::OpType::ALLREDUCE: return "all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "all_reduce_coalesced";
    case c10d::OpType::REDUCE: return "reduce";
    case c10d::OpType::ALLGATHER: return "all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "all_gather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED: return "all_gather_coalesced";
    case c10d::OpType::COALESCED: return "all_gather_into_tensor (coalesced)";
    case c10d::OpType::GATHER: return "gather";
    case c10d::OpType::SCATTER: return "scatter";
    case c10d::OpType::REDUCE_SCATTER: return "reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "reduce_scatter_tensor";
#if !(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13)
    case c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED: return "reduce_scatter_tensor (coalesced)";
#endif
    case c10d::OpType::ALLTOALL_BASE: return "all_to_all_single";
    case c10d::OpType::ALLTOALL: return "all_to_all";
    case c10d::OpType::BARRIER: return "barrier";
    default: return "collective";
  }
}

const char* reduce_op_name(int64_t op) {
  static const char* names[] = {"sum", "avg", "product", "min", "max", "band", "bor", "bxor",
                                "premul_sum"};
  return op >= 0 && op < 9 ? names[op] : "?";
}

std::string describe(const int64_t* f) {
  if (f[kFpMagic] != kMagic) return "(not a tpu_dist collective)";
  std::string s = op_name(f[kFpOp]);
  s += ", call #" + std::to_string(f[kFpSeq]) + " of the group (";
  if (f[kFpDtype] >= 0) s += c10::toString(static_cast<at::ScalarType>(f[kFpDtype]));
  s += ", " + std::to_string(f[kFpTensors]) + " tensor(s), first of " +
       std::to_string(f[kFpNumel]) + " elements";
  if (f[kFpReduceOp] >= 0) s += std::string(", ") + reduce_op_name(f[kFpReduceOp]);
  if (f[kFpRoot] >= 0) s += ", root " + std::to_string(f[kFpRoot]);
  return s + ")";
}

// Header of one send: magic, dtype, elements, tensors.
constexpr int64_t kHeaderLen = 4;

// ---------------------------------------------------------------------------------------------
// Runner pool: runs each task on an idle thread, starting a thread when none is idle, so that
// every task (one blocking wait on a Gloo work, then the write-back) runs at once.
// ---------------------------------------------------------------------------------------------

class Runners {
 public:
  void submit(std::function<void()> task) {
    std::lock_guard<std::mutex> g(mu_);
    tasks_.push_back(std::move(task));
    if (idle_ < tasks_.size()) threads_.emplace_back([this] { loop(); });
    cv_.notify_one();
  }
  // Runs what is queued, then ends the threads.
  void join() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    set_thread_eager_mode(static_cast<int>(EagerMode::kStrict));
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      idle_++;
      cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
      idle_--;
      if (tasks_.empty()) return;  // stop_ and nothing left
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lk.unlock();
      task();
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

// A FIFO of jobs served by one thread.
class JobQueue {
 public:
  void push(std::shared_ptr<Job> job) {
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  // nullptr once stopped and empty.
  std::shared_ptr<Job> pop() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
    if (q_.empty()) return nullptr;
    auto job = std::move(q_.front());
    q_.pop_front();
    return job;
  }
  std::deque<std::shared_ptr<Job>> stop() {
    std::deque<std::shared_ptr<Job>> left;
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
      left.swap(q_);
    }
    cv_.notify_all();
    return left;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> q_;
  bool stop_ = false;
};

std::vector<int64_t> sizes_of(const std::vector<at::Tensor>& ts) {
  std::vector<int64_t> v;
  for (const auto& t : ts) {
    v.push_back(static_cast<int64_t>(t.scalar_type()));
    v.push_back(t.numel());
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// The backend.
// ---------------------------------------------------------------------------------------------

class StagedBackend final : public c10d::Backend {
 public:
  StagedBackend(c10::intrusive_ptr<c10d::Backend> gloo, c10::intrusive_ptr<c10d::Backend> check,
                int rank, int size)
      : Backend(rank, size), gloo_(std::move(gloo)), check_(std::move(check)) {
    issuer_ = std::thread([this] { issue_loop(); });
    collector_ = std::thread([this] { collective_loop(); });
  }

  ~StagedBackend() override { stop(); }

  const std::string getBackendName() const override { return kName; }
  bool supportsSplitting() const override { return false; }
  bool supportsCoalescing() const override { return false; }
  void setTimeout(std::chrono::milliseconds timeout) override {
    gloo_->setTimeout(timeout);
    check_->setTimeout(timeout);
  }
  c10::intrusive_ptr<Options> getBackendOptions() override { return gloo_->getBackendOptions(); }
  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }
  void shutdown() override { stop(); }
  void abort() override { stop(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    check_root(opts.rootRank);
    check_nonempty(tensors, "broadcast");
    const bool root = opts.rootRank == getRank();
    // The root's tensors are read and keep their values; the others' are only written.
    std::vector<Slot> slots;
    for (auto& t : tensors) slots.push_back(make_slot(t, root, !root));
    Signature sig{sizes_of(tensors), -1, opts.rootRank};
    sig.items.push_back(opts.rootTensor);
    return enqueue(opts.asyncOp, c10d::OpType::BROADCAST, std::move(slots), tensors, std::move(sig),
                   [opts](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     return g.broadcast(h, opts);
                   });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    check_nonempty(tensors, "allreduce");
    TORCH_CHECK_VALUE(!opts.sparseIndices.has_value(),
                      "tpu_dist: sparse allreduce is not supported");
    check_reduce_op(opts.reduceOp, tensors);
    c10d::AllreduceOptions o = opts;
    auto premul = take_premul(o.reduceOp);
    Signature sig{sizes_of(tensors), opts.reduceOp.op_, -1};
    return enqueue(opts.asyncOp, c10d::OpType::ALLREDUCE, inout_slots(tensors), tensors, std::move(sig),
                   [o](c10d::Backend& g, std::vector<at::Tensor>& h) { return g.allreduce(h, o); },
                   premul);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    check_nonempty(tensors, "allreduce_coalesced");
    check_reduce_op(opts.reduceOp, tensors);
    c10d::AllreduceCoalescedOptions o = opts;
    auto premul = take_premul(o.reduceOp);
    Signature sig{sizes_of(tensors), opts.reduceOp.op_, -1};
    return enqueue(opts.asyncOp, c10d::OpType::ALLREDUCE_COALESCED, inout_slots(tensors), tensors,
                   std::move(sig),
                   [o](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     return g.allreduce_coalesced(h, o);
                   },
                   premul);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    check_root(opts.rootRank);
    check_nonempty(tensors, "reduce");
    check_reduce_op(opts.reduceOp, tensors);
    c10d::ReduceOptions o = opts;
    auto premul = take_premul(o.reduceOp);
    Signature sig{sizes_of(tensors), opts.reduceOp.op_, opts.rootRank};
    // Every rank's tensor is written back: Gloo may leave partial results in non-root
    // tensors, and the results must be what Gloo leaves in CPU tensors.
    return enqueue(opts.asyncOp, c10d::OpType::REDUCE, inout_slots(tensors), tensors, std::move(sig),
                   [o](c10d::Backend& g, std::vector<at::Tensor>& h) { return g.reduce(h, o); },
                   premul);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1,
                      "tpu_dist: allgather takes one input tensor and one output list");
    check_list(outputs[0], getSize(), inputs[0], "allgather output");
    std::vector<Slot> slots;
    slots.push_back(make_slot(inputs[0], true, false));
    for (auto& t : outputs[0]) slots.push_back(make_slot(t, false, true));
    const size_t n = outputs[0].size();
    return enqueue(opts.asyncOp, c10d::OpType::ALLGATHER, std::move(slots), outputs[0],
                   Signature{sizes_of(inputs), -1, -1},
                   [opts, n](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     std::vector<at::Tensor> in{h[0]};
                     std::vector<std::vector<at::Tensor>> out(1);
                     out[0].assign(h.begin() + 1, h.begin() + 1 + n);
                     return g.allgather(out, in, opts);
                   });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    check_flat_pair(output, input, input.numel() * getSize(), "all_gather_into_tensor");
    std::vector<Slot> slots;
    slots.push_back(make_slot(input, true, false));
    slots.push_back(make_slot(output, false, true));
    return enqueue(opts.asyncOp, c10d::OpType::_ALLGATHER_BASE, std::move(slots), {output},
                   Signature{sizes_of({input}), -1, -1},
                   [opts](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     return g._allgather_base(h[1], h[0], opts);
                   });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(getSize()),
                      "tpu_dist: allgather_coalesced needs one output list per rank, got ",
                      outputs.size());
    std::vector<Slot> slots;
    std::vector<at::Tensor> flat_out;
    for (auto& t : inputs) slots.push_back(make_slot(t, true, false));
    std::vector<size_t> sizes;
    for (auto& list : outputs) {
      TORCH_CHECK_VALUE(list.size() == inputs.size(), "tpu_dist: allgather_coalesced output "
                        "lists must hold one tensor per input");
      for (size_t i = 0; i < list.size(); i++) {
        check_like(list[i], inputs[i], "allgather_coalesced output");
        slots.push_back(make_slot(list[i], false, true));
        flat_out.push_back(list[i]);
      }
      sizes.push_back(list.size());
    }
    const size_t ni = inputs.size();
    return enqueue(opts.asyncOp, c10d::OpType::ALLGATHER_COALESCED, std::move(slots), flat_out,
                   Signature{sizes_of(inputs), -1, -1},
                   [opts, ni, sizes](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     std::vector<at::Tensor> in(h.begin(), h.begin() + ni);
                     std::vector<std::vector<at::Tensor>> out;
                     size_t k = ni;
                     for (size_t n : sizes) {
                       out.emplace_back(h.begin() + k, h.begin() + k + n);
                       k += n;
                     }
                     return g.allgather_coalesced(out, in, opts);
                   });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "tpu_dist: "
                      "allgather_into_tensor_coalesced needs as many outputs as inputs");
    check_nonempty(inputs, "allgather_into_tensor_coalesced");
    std::vector<Slot> slots;
    for (size_t i = 0; i < inputs.size(); i++) {
      check_flat_pair(outputs[i], inputs[i], inputs[i].numel() * getSize(),
                      "all_gather_into_tensor");
      slots.push_back(make_slot(inputs[i], true, false));
    }
    for (auto& t : outputs) slots.push_back(make_slot(t, false, true));
    const size_t n = inputs.size();
    return enqueue(opts.asyncOp, c10d::OpType::COALESCED, std::move(slots), outputs,
                   Signature{sizes_of(inputs), -1, -1},
                   [opts, n](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     std::vector<at::Tensor> in(h.begin(), h.begin() + n);
                     std::vector<at::Tensor> out(h.begin() + n, h.end());
                     return g.allgather_into_tensor_coalesced(out, in, opts);
                   });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    check_root(opts.rootRank);
    TORCH_CHECK_VALUE(inputs.size() == 1, "tpu_dist: gather takes one input tensor");
    const bool root = opts.rootRank == getRank();
    std::vector<Slot> slots;
    slots.push_back(make_slot(inputs[0], true, false));
    std::vector<at::Tensor> outs;
    if (root) {
      TORCH_CHECK_VALUE(outputs.size() == 1, "tpu_dist: gather takes one output list on the "
                        "root");
      check_list(outputs[0], getSize(), inputs[0], "gather output");
      outs = outputs[0];
    } else {
      TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                        "tpu_dist: gather takes no output tensors on ranks other than the root");
    }
    for (auto& t : outs) slots.push_back(make_slot(t, false, true));
    const size_t n = outs.size();
    const bool nested = !outputs.empty();
    return enqueue(opts.asyncOp, c10d::OpType::GATHER, std::move(slots), outs,
                   Signature{sizes_of(inputs), -1, opts.rootRank},
                   [opts, n, nested](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     std::vector<at::Tensor> in{h[0]};
                     std::vector<std::vector<at::Tensor>> out;
                     if (nested) out.emplace_back(h.begin() + 1, h.begin() + 1 + n);
                     return g.gather(out, in, opts);
                   });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    check_root(opts.rootRank);
    TORCH_CHECK_VALUE(outputs.size() == 1, "tpu_dist: scatter takes one output tensor");
    const bool root = opts.rootRank == getRank();
    std::vector<at::Tensor> ins;
    if (root) {
      TORCH_CHECK_VALUE(inputs.size() == 1, "tpu_dist: scatter takes one input list on the "
                        "root");
      check_list(inputs[0], getSize(), outputs[0], "scatter input");
      ins = inputs[0];
    } else {
      TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                        "tpu_dist: scatter takes no input tensors on ranks other than the root");
    }
    std::vector<Slot> slots;
    slots.push_back(make_slot(outputs[0], false, true));
    for (auto& t : ins) slots.push_back(make_slot(t, true, false));
    const size_t n = ins.size();
    const bool nested = !inputs.empty();
    return enqueue(opts.asyncOp, c10d::OpType::SCATTER, std::move(slots), outputs,
                   Signature{sizes_of(outputs), -1, opts.rootRank},
                   [opts, n, nested](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     std::vector<at::Tensor> out{h[0]};
                     std::vector<std::vector<at::Tensor>> in;
                     if (nested) in.emplace_back(h.begin() + 1, h.begin() + 1 + n);
                     return g.scatter(out, in, opts);
                   });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1,
                      "tpu_dist: reduce_scatter takes one output tensor and one input list");
    check_list(inputs[0], getSize(), outputs[0], "reduce_scatter input");
    check_reduce_op(opts.reduceOp, outputs);
    c10d::ReduceScatterOptions o = opts;
    auto premul = take_premul(o.reduceOp);
    std::vector<Slot> slots;
    slots.push_back(make_slot(outputs[0], false, true));
    for (auto& t : inputs[0]) slots.push_back(make_slot(t, true, false));
    return enqueue(opts.asyncOp, c10d::OpType::REDUCE_SCATTER, std::move(slots), outputs,
                   Signature{sizes_of(outputs), opts.reduceOp.op_, -1},
                   [o](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     std::vector<at::Tensor> out{h[0]};
                     std::vector<std::vector<at::Tensor>> in(1);
                     in[0].assign(h.begin() + 1, h.end());
                     return g.reduce_scatter(out, in, o);
                   },
                   premul);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    check_flat_pair(input, output, output.numel() * getSize(), "reduce_scatter_tensor");
    check_reduce_op(opts.reduceOp, {output});
    c10d::ReduceScatterOptions o = opts;
    auto premul = take_premul(o.reduceOp);
    std::vector<Slot> slots;
    slots.push_back(make_slot(output, false, true));
    slots.push_back(make_slot(input, true, false));
    return enqueue(opts.asyncOp, c10d::OpType::_REDUCE_SCATTER_BASE, std::move(slots), {output},
                   Signature{sizes_of({output}), opts.reduceOp.op_, -1},
                   [o](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     return g._reduce_scatter_base(h[0], h[1], o);
                   },
                   premul);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "tpu_dist: "
                      "reduce_scatter_tensor_coalesced needs as many outputs as inputs");
    check_nonempty(outputs, "reduce_scatter_tensor_coalesced");
    for (size_t i = 0; i < inputs.size(); i++)
      check_flat_pair(inputs[i], outputs[i], outputs[i].numel() * getSize(),
                      "reduce_scatter_tensor");
    check_reduce_op(opts.reduceOp, outputs);
    c10d::ReduceScatterOptions o = opts;
    auto premul = take_premul(o.reduceOp);
    std::vector<Slot> slots;
    for (auto& t : outputs) slots.push_back(make_slot(t, false, true));
    for (auto& t : inputs) slots.push_back(make_slot(t, true, false));
    const size_t n = outputs.size();
    return enqueue(opts.asyncOp, kReduceScatterTensorCoalesced, std::move(slots), outputs,
                   Signature{sizes_of(outputs), opts.reduceOp.op_, -1},
                   [o, n](c10d::Backend& g, std::vector<at::Tensor>& h) {
                     std::vector<at::Tensor> out(h.begin(), h.begin() + n);
                     std::vector<at::Tensor> in(h.begin() + n, h.end());
                     return g.reduce_scatter_tensor_coalesced(out, in, o);
                   },
                   premul);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    check_splits(output, output_splits, "output");
    check_splits(input, input_splits, "input");
    TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(),
                      "tpu_dist: all_to_all_single needs input and output of one dtype");
    std::vector<Slot> slots;
    slots.push_back(make_slot(output, false, true));
    slots.push_back(make_slot(input, true, false));
    Signature sig{{static_cast<int64_t>(input.scalar_type())}, -1, -1};
    sig.sends = element_counts(input, input_splits);
    sig.recvs = element_counts(output, output_splits);
    return enqueue(opts.asyncOp, c10d::OpType::ALLTOALL_BASE, std::move(slots), {output}, std::move(sig),
                   [opts, output_splits, input_splits](c10d::Backend& g,
                                                       std::vector<at::Tensor>& h) {
                     auto os = output_splits;
                     auto is = input_splits;
                     return g.alltoall_base(h[0], h[1], os, is, opts);
                   });
  }

  // As one all_to_all_single over flat host buffers (the list's tensors concatenated, the
  // counts as splits): Gloo's own list all_to_all needs tensors of one size, NCCL's does not.
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(getSize()) &&
                          inputs.size() == static_cast<size_t>(getSize()),
                      "tpu_dist: all_to_all needs one input and one output tensor per rank");
    Signature sig{{static_cast<int64_t>(inputs[0].scalar_type())}, -1, -1};
    for (size_t i = 0; i < inputs.size(); i++) {
      TORCH_CHECK_VALUE(outputs[i].scalar_type() == inputs[0].scalar_type() &&
                            inputs[i].scalar_type() == inputs[0].scalar_type(),
                        "tpu_dist: all_to_all needs tensors of one dtype");
      sig.sends.push_back(inputs[i].numel());
      sig.recvs.push_back(outputs[i].numel());
    }
    std::vector<Slot> slots;
    for (auto& t : outputs) slots.push_back(make_slot(t, false, true));
    for (auto& t : inputs) slots.push_back(make_slot(t, true, false));
    const size_t n = outputs.size();
    const std::vector<int64_t> out_counts = sig.recvs, in_counts = sig.sends;
    auto flat_out = std::make_shared<at::Tensor>();
    auto job = new_job(c10d::OpType::ALLTOALL, std::move(slots), outputs,
                       [opts, n, flat_out, out_counts, in_counts](c10d::Backend& g,
                                                                   std::vector<at::Tensor>& h) {
                         std::vector<at::Tensor> ins;
                         for (size_t i = n; i < 2 * n; i++) ins.push_back(h[i].reshape({-1}));
                         at::Tensor in = at::cat(ins);
                         int64_t total = 0;
                         for (int64_t c : out_counts) total += c;
                         *flat_out = at::empty({total}, in.options());
                         auto os = out_counts;
                         auto is = in_counts;
                         return g.alltoall_base(*flat_out, in, os, is, opts);
                       });
    job->after = [n, flat_out, out_counts](std::vector<at::Tensor>& h) {
      int64_t off = 0;
      for (size_t i = 0; i < n; i++) {
        h[i].copy_(flat_out->narrow(0, off, out_counts[i]).view(h[i].sizes()));
        off += out_counts[i];
      }
    };
    job->sig = std::move(sig);
    job->async_op = opts.asyncOp;
    return submit(std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override {
    check_peer(dst);
    check_p2p(tensors, "send");
    std::vector<Slot> slots;
    for (auto& t : tensors) slots.push_back(make_slot(t, true, false));
    return enqueue_p2p(c10d::OpType::SEND, P2P::kSend, dst, tag, std::move(slots), tensors,
                       [dst, tag](c10d::Backend& g, std::vector<at::Tensor>& h) {
                         return g.send(h, dst, tag);
                       });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override {
    check_peer(src);
    check_p2p(tensors, "recv");
    std::vector<Slot> slots;
    for (auto& t : tensors) slots.push_back(make_slot(t, false, true));
    return enqueue_p2p(c10d::OpType::RECV, P2P::kRecv, src, tag, std::move(slots), tensors,
                       [src, tag](c10d::Backend& g, std::vector<at::Tensor>& h) {
                         return g.recv(h, src, tag);
                       });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override {
    check_p2p(tensors, "recv");
    std::vector<Slot> slots;
    for (auto& t : tensors) slots.push_back(make_slot(t, false, true));
    // The data recv names the source the header came from (see complete_recv).
    return enqueue_p2p(c10d::OpType::RECVANYSOURCE, P2P::kRecvAny, -1, tag, std::move(slots),
                       tensors, nullptr);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    // Gloo's barrier also waits for the Gloo work issued before it, and collectives are
    // issued in call order, so it orders after every earlier collective of this group.
    c10d::BarrierOptions o = opts;
    o.device = std::nullopt;  // Gloo's barrier is a host barrier
    return enqueue(opts.asyncOp, c10d::OpType::BARRIER, {}, {}, Signature{},
                   [o](c10d::Backend& g, std::vector<at::Tensor>&) { return g.barrier(o); });
  }

 private:
  // ----- call-time argument checks (raise at the call, leaving the group usable) -----

  void check_root(int64_t root) const {
    TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "tpu_dist: invalid root rank ", root,
                      " for a group of ", getSize());
  }
  void check_peer(int peer) const {
    TORCH_CHECK_VALUE(peer >= 0 && peer < getSize(), "tpu_dist: invalid peer rank ", peer,
                      " for a group of ", getSize());
  }
  static void check_nonempty(const std::vector<at::Tensor>& ts, const char* what) {
    TORCH_CHECK_VALUE(!ts.empty(), "tpu_dist: ", what, " needs at least one tensor");
  }
  static void check_p2p(const std::vector<at::Tensor>& ts, const char* what) {
    TORCH_CHECK_VALUE(ts.size() == 1, "tpu_dist: ", what, " takes exactly one tensor");
  }
  static void check_like(const at::Tensor& t, const at::Tensor& ref, const char* what) {
    TORCH_CHECK_VALUE(t.scalar_type() == ref.scalar_type(), "tpu_dist: ", what, " has dtype ",
                      t.scalar_type(), ", expected ", ref.scalar_type());
    TORCH_CHECK_VALUE(t.numel() == ref.numel(), "tpu_dist: ", what, " has ", t.numel(),
                      " elements, expected ", ref.numel());
  }
  static void check_list(const std::vector<at::Tensor>& list, int size, const at::Tensor& ref,
                         const char* what) {
    TORCH_CHECK_VALUE(list.size() == static_cast<size_t>(size), "tpu_dist: ", what,
                      " list has ", list.size(), " tensors, expected one per rank (", size, ")");
    for (const auto& t : list) check_like(t, ref, what);
  }
  static void check_flat_pair(const at::Tensor& big, const at::Tensor& small, int64_t numel,
                              const char* what) {
    TORCH_CHECK_VALUE(big.scalar_type() == small.scalar_type(), "tpu_dist: ", what,
                      " needs input and output of one dtype, got ", small.scalar_type(), " and ",
                      big.scalar_type());
    TORCH_CHECK_VALUE(big.numel() == numel, "tpu_dist: ", what, ": the larger tensor has ",
                      big.numel(), " elements, expected ", numel, " (the other's times the "
                      "group size)");
  }
  void check_splits(const at::Tensor& t, const std::vector<int64_t>& splits,
                    const char* what) const {
    TORCH_CHECK_VALUE(t.dim() > 0, "tpu_dist: all_to_all_single needs tensors with a dim 0");
    if (splits.empty()) {
      TORCH_CHECK_VALUE(t.size(0) % getSize() == 0, "tpu_dist: all_to_all_single ", what,
                        " dim 0 must divide by the group size when no splits are given");
      return;
    }
    TORCH_CHECK_VALUE(splits.size() == static_cast<size_t>(getSize()),
                      "tpu_dist: all_to_all_single ", what, " splits need one entry per rank");
    int64_t sum = 0;
    for (int64_t s : splits) {
      TORCH_CHECK_VALUE(s >= 0, "tpu_dist: all_to_all_single ", what,
                        " split sizes must be >= 0");
      sum += s;
    }
    TORCH_CHECK_VALUE(sum == t.size(0), "tpu_dist: all_to_all_single ", what, " splits sum to ",
                      sum, " but dim 0 is ", t.size(0));
  }
  // Elements going to (input) or coming from (output) each rank in all_to_all_single.
  std::vector<int64_t> element_counts(const at::Tensor& t, const std::vector<int64_t>& splits) {
    const int64_t row = t.size(0) ? t.numel() / t.size(0) : 0;
    std::vector<int64_t> v;
    for (int r = 0; r < getSize(); r++)
      v.push_back(row * (splits.empty() ? t.size(0) / getSize() : splits[r]));
    return v;
  }
  static void check_reduce_op(const c10d::ReduceOp& op, const std::vector<at::Tensor>& ts) {
    for (const auto& t : ts) {
      const bool integral = at::isIntegralType(t.scalar_type(), /*includeBool=*/true);
      const bool floating = at::isFloatingType(t.scalar_type()) ||
                            at::isComplexType(t.scalar_type());
      if (op.op_ == c10d::ReduceOp::BAND || op.op_ == c10d::ReduceOp::BOR ||
          op.op_ == c10d::ReduceOp::BXOR)
        TORCH_CHECK_VALUE(integral, "tpu_dist: bitwise reductions need integer tensors, got ",
                          t.scalar_type());
      // Gloo fails these only once the collective runs (an AVG of integers cannot be divided
      // in place), which would put the ranks out of step; refusing them here keeps the group.
      if (op.op_ == c10d::ReduceOp::AVG)
        TORCH_CHECK_VALUE(floating, "tpu_dist: ReduceOp.AVG needs floating-point tensors, got ",
                          t.scalar_type());
      if (op.op_ == c10d::ReduceOp::PREMUL_SUM)
        TORCH_CHECK_VALUE(floating, "tpu_dist: PREMUL_SUM needs floating-point tensors, got ",
                          t.scalar_type());
      TORCH_CHECK_VALUE(op.op_ != c10d::ReduceOp::UNUSED, "tpu_dist: invalid reduce op");
    }
  }
  // PREMUL_SUM (Gloo has none) becomes a SUM of inputs scaled on the host first, as NCCL does.
  static std::optional<c10d::ReduceOp> take_premul(c10d::ReduceOp& op) {
    if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return std::nullopt;
    TORCH_CHECK_VALUE(dynamic_cast<PreMulSumFactor*>(op.supplement_.get()),
                      "tpu_dist: PREMUL_SUM without a factor");
    c10d::ReduceOp factor = op;
    op = c10d::ReduceOp(c10d::ReduceOp::SUM);
    return factor;
  }

  // ----- slots and jobs -----

  Slot make_slot(const at::Tensor& t, bool read, bool write) {
    TORCH_CHECK_VALUE(t.defined(), "tpu_dist: undefined tensor");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided, "tpu_dist: only dense tensors are supported, "
                      "got layout ", t.layout());
    TORCH_CHECK_VALUE(is_tpu(t) || t.device().is_cpu(), "tpu_dist: tensors must be on tpu (or "
                      "cpu), got one on ", t.device());
    Slot s;
    s.user = t;
    s.read = read;
    s.write = write;
    if (!is_tpu(t)) return s;  // a CPU tensor goes to Gloo as it is
    to_pj_dtype(t.scalar_type());  // raises TypeError for a dtype the device cannot hold
    s.whole = is_whole_storage(t);
    if (read && t.numel() > 0) {
      if (s.whole) {
        s.src = t;
      } else {
        // A view (offset, strides, part of a storage): snapshot it now into a fresh tensor, an
        // asynchronous device copy ordered before any later write of the caller's.
        s.src = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
        s.src.copy_(t);
      }
    }
    return s;
  }

  std::vector<Slot> inout_slots(std::vector<at::Tensor>& ts) {
    std::vector<Slot> slots;
    for (auto& t : ts) slots.push_back(make_slot(t, true, true));
    return slots;
  }

  std::shared_ptr<Job> new_job(c10d::OpType op, std::vector<Slot> slots,
                               std::vector<at::Tensor> outputs, IssueFn issue) {
    free_dead_jobs();
    throw_if_broken();
    // Recorded (defer_and_fuse) ops, the snapshots above among them, run before the issuer
    // reads any storage: the call sees every op the caller made before it.
    check(pj_defer_flush());
    auto job = std::make_shared<Job>();
    job->work = c10::make_intrusive<StagedWork>(getRank(), op, std::move(outputs));
    job->slots = std::move(slots);
    job->issue = std::move(issue);
    return job;
  }

  // Starts the call. Everything whose order every rank must share is done under order_mu_,
  // in call order even when several threads call at once: a collective's number, its
  // fingerprint exchange (Gloo tags it at this call) and its place in the collective queue; a
  // recv's ticket on its channel. A collective's device-to-host copies start here too, so they
  // read the inputs as they are at the call and run while earlier collectives are on the wire.
  c10::intrusive_ptr<c10d::Work> submit(std::shared_ptr<Job> job) {
    c10::intrusive_ptr<c10d::Work> w = job->work;
    std::unique_lock<std::mutex> order(order_mu_);
    {
      std::lock_guard<std::mutex> g(mu_);
      TORCH_CHECK(!stopping_, "tpu_dist: the process group was shut down");
      if (job->p2p == P2P::kRecv) {
        // A recv from any source takes its place on the sender's channel only when its header
        // arrives; a recv from one source called meanwhile could take the message meant for it.
        TORCH_CHECK_VALUE(pending_any_[job->tag] == 0, "tpu_dist: a recv from rank ",
                          job->peer, " with tag ", job->tag, " while a recv from any source "
                          "with that tag is pending is not supported; wait for that one first");
        job->ticket = channels_[{job->peer, job->tag}].tickets++;
      } else if (job->p2p == P2P::kRecvAny) {
        pending_any_[job->tag]++;
        job->any_pending = true;
      }
    }
    g_collectives++;
    if (job->p2p != P2P::kNone) {
      issue_queue_.push(std::move(job));
      return w;
    }
    job->seq = next_seq_++;
    job->fp_in = fingerprint(*job, w->retrieveOpType());
    job->fp_out = at::empty({getSize() * job->fp_in.numel()}, at::kLong);
    try {
      job->fp_work = call_gloo([&] { return check_->_allgather_base(job->fp_out, job->fp_in); });
      start_downloads(*job);
    } catch (...) {
      // The fingerprint may have gone out: the peers may go on to this collective.
      mark_broken(std::current_exception());
      throw;
    }
    bool run_here;
    {
      std::lock_guard<std::mutex> g(mu_);
      // A synchronous call with no collective ahead of it runs on the caller's thread, which
      // waits for it anyway: two thread hand-offs fewer (they cost more than the staging on a
      // loaded machine). Later calls queue behind it; the issue gate keeps Gloo's order.
      run_here = !job->async_op && collectives_in_flight_ == 0;
      collectives_in_flight_++;
    }
    if (!run_here) {
      collective_queue_.push(std::move(job));
      return w;
    }
    order.unlock();
    run_collective(*job);
    collective_done();
    retire(std::move(job));
    return w;
  }

  void collective_done() {
    std::lock_guard<std::mutex> g(mu_);
    collectives_in_flight_--;
  }

  // Both enqueues run the call's side of a job (new_job, submit and, for a synchronous call
  // with nothing ahead of it, the whole collective) with inference mode off: every tensor the
  // backend makes here (host staging, fingerprints, p2p headers, Gloo's host operands) is then
  // a normal tensor even when the caller runs under torch.inference_mode (vLLM's steps do).
  // Gloo's threads and ours write into those tensors in place, and in-place writes into an
  // inference tensor are refused outside inference mode, which is per thread: an all_gather
  // of vLLM's logits failed that way ("Inplace update to inference tensor outside
  // InferenceMode"). The user's own tensors are only read, or replaced by storage swaps.
  c10::intrusive_ptr<c10d::Work> enqueue(bool async_op, c10d::OpType op,
                                         std::vector<Slot> slots,
                                         std::vector<at::Tensor> outputs, Signature sig,
                                         IssueFn issue,
                                         std::optional<c10d::ReduceOp> premul = std::nullopt) {
    c10::InferenceMode not_inference(false);
    auto job = new_job(op, std::move(slots), std::move(outputs), std::move(issue));
    if (premul) {
      job->premul = *premul;
      job->has_premul = true;
    }
    job->sig = std::move(sig);
    job->async_op = async_op;
    return submit(std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> enqueue_p2p(c10d::OpType op, P2P kind, int peer, int tag,
                                             std::vector<Slot> slots,
                                             std::vector<at::Tensor> outputs, IssueFn issue) {
    c10::InferenceMode not_inference(false);  // see enqueue
    auto job = new_job(op, std::move(slots), std::move(outputs), std::move(issue));
    job->p2p = kind;
    job->peer = peer;
    job->tag = tag;
    const at::Tensor& t = job->slots[0].user;
    job->header = at::tensor({kMagic, static_cast<int64_t>(t.scalar_type()), t.numel(),
                              static_cast<int64_t>(job->slots.size())},
                             at::kLong);
    return submit(std::move(job));
  }

  at::Tensor fingerprint(const Job& job, c10d::OpType op) {
    const int world = getSize();
    at::Tensor fp = at::zeros({kFpFixed + 2 * world}, at::kLong);
    int64_t* f = fp.data_ptr<int64_t>();
    f[kFpMagic] = kMagic;
    f[kFpSeq] = job.seq;
    f[kFpOp] = static_cast<int64_t>(op);
    f[kFpDtype] = job.slots.empty() ? -1 : static_cast<int64_t>(job.slots[0].user.scalar_type());
    f[kFpReduceOp] = job.sig.reduce_op;
    f[kFpRoot] = job.sig.root;
    f[kFpNumel] = job.slots.empty() ? 0 : job.slots[0].user.numel();
    f[kFpTensors] = static_cast<int64_t>(job.slots.size());
    f[kFpHash] = fnv1a(job.sig.items);
    for (size_t r = 0; r < job.sig.sends.size(); r++) f[kFpFixed + r] = job.sig.sends[r];
    for (size_t r = 0; r < job.sig.recvs.size(); r++) f[kFpFixed + world + r] = job.sig.recvs[r];
    return fp;
  }

  // Throws DistBackendError naming every rank's call unless all fingerprints agree.
  void verify_fingerprints(const Job& job) {
    const int world = getSize();
    const int64_t width = kFpFixed + 2 * world;
    const int64_t* all = job.fp_out.data_ptr<int64_t>();
    const int64_t* mine = all + getRank() * width;
    bool ok = true;
    for (int r = 0; r < world && ok; r++) {
      const int64_t* f = all + r * width;
      for (int64_t k : {kFpMagic, kFpSeq, kFpOp, kFpReduceOp, kFpRoot, kFpHash})
        ok = ok && f[k] == mine[k];
    }
    // all-to-all: what rank i sends to rank r is what rank r expects from rank i.
    for (int i = 0; i < world && ok; i++)
      for (int r = 0; r < world && ok; r++)
        ok = all[i * width + kFpFixed + r] == all[r * width + kFpFixed + world + i];
    if (ok) return;
    std::string msg = "tpu_dist: the ranks of this process group called different collectives "
                      "(or the same one with sizes that do not fit together):";
    for (int r = 0; r < world; r++) msg += "\n  rank " + std::to_string(r) + ": " +
                                           describe(all + r * width);
    C10_THROW_ERROR(DistBackendError, msg);
  }

  void free_dead_jobs() {
    std::vector<std::shared_ptr<Job>> dead;
    {
      std::lock_guard<std::mutex> g(mu_);
      dead.swap(dead_);
    }
  }

  void throw_if_broken() {
    std::lock_guard<std::mutex> g(mu_);
    if (!broken_.empty())
      C10_THROW_ERROR(DistBackendError,
                      "tpu_dist: an earlier collective or send/recv of this process group failed, "
                      "so its ranks may be out of step and it cannot be used any more. First "
                      "failure: " + broken_);
  }

  void mark_broken(std::exception_ptr e) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(e);
    } catch (const c10::Error& err) {
      what = err.what_without_backtrace();
    } catch (const std::exception& err) {
      what = err.what();
    } catch (...) {
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      if (broken_.empty()) broken_ = what;
    }
    // Recvs and collectives waiting for their turn must not wait for a turn that never comes.
    channel_cv_.notify_all();
    gate_cv_.notify_all();
  }

  bool broken() {
    std::lock_guard<std::mutex> g(mu_);
    return !broken_.empty();
  }

  // Fails the job (and breaks the group when `breaks`) with the current exception.
  void fail(Job& job, bool breaks) {
    auto e = std::current_exception();
    if (breaks) mark_broken(e);
    job.work->fail(e);
  }

  // Our threads never drop the last reference to a caller's tensor or Work: that may run
  // Python code (a tensor whose Python object outlived its last Python reference is freed
  // through the interpreter) and needs the GIL, which an exiting interpreter never gives back
  // (the thread is then killed in a destructor: std::terminate). Finished jobs go here and are
  // freed by the next caller of this backend (or with the backend).
  void bury(std::shared_ptr<Job> job) {
    std::lock_guard<std::mutex> g(mu_);
    dead_.push_back(std::move(job));
  }

  // The end of every job whose Work was returned: its future, if one was asked for, settled on
  // a runner (see StagedWork), and the job buried.
  void retire(std::shared_ptr<Job> job) {
    if (!job->work->future_requested()) return bury(std::move(job));
    runners_.submit([this, job] {
      job->work->settle_future();
      bury(job);
    });
  }

  // Calls into the Gloo backends: they are made from three threads, and a Gloo backend is not
  // promised to take concurrent calls. Each call only queues work, so the lock is brief.
  template <typename F>
  c10::intrusive_ptr<c10d::Work> call_gloo(F&& f) {
    std::lock_guard<std::mutex> g(gloo_mu_);
    return f();
  }

  // ----- host staging -----

  // Allocates every tpu slot's host block and starts the device-to-host copies of the read
  // slots (all in flight at once). On failure the copies already started are awaited (they
  // write into the blocks) before the error is rethrown.
  void start_downloads(Job& job) {
    pj_staged_reap();
    for (auto& s : job.slots) {
      if (!is_tpu(s.user)) continue;
      s.block = Block(static_cast<size_t>(s.user.numel()) * s.user.element_size());
      s.staged = at::from_blob(s.block.data(), s.user.sizes(), [](void*) {},
                               s.user.options().device(c10::kCPU));
    }
    std::exception_ptr error;
    {
      RunLock lock;
      for (auto& s : job.slots) {
        const size_t nbytes = static_cast<size_t>(s.user.numel()) * s.user.element_size();
        if (!is_tpu(s.user) || !s.read || nbytes == 0) continue;
        try {
          pj_storage_t* st = storage_of(s.src);
          const bool here = nbytes <= kCopyHereBytes || !job.async_op;
          if (!(here && copy_ready_buffer_locked(st, s.block.data(), nbytes)))
            job.downloads.push_back(start_download_locked(
                st, to_pj_dtype(s.src.scalar_type()), s.block.data(), nbytes));
        } catch (...) {
          error = std::current_exception();
          break;
        }
      }
    }
    if (error) {
      await_downloads(job);
      std::rethrow_exception(error);
    }
  }

  // Waits for the job's device-to-host copies; returns the first error (the device's).
  std::exception_ptr await_downloads(Job& job) {
    std::exception_ptr error;
    if (job.downloads.empty()) return error;
    for (PJRT_Event* ev : job.downloads) {
      pj_status_t* st = pj_event_await(ev, "tpu_dist device-to-host copy");
      if (st && !error) {
        try {
          check(st);
        } catch (...) {
          error = std::current_exception();
        }
      } else {
        pj_status_free(st);
      }
    }
    job.downloads.clear();
    return error;
  }

  // After the copies: the host tensors Gloo will use (int16 widened, PREMUL_SUM's factor
  // applied to the inputs).
  void prepare_host(Job& job) {
    for (auto& s : job.slots) {
      if (!is_tpu(s.user)) {
        s.host = s.user;
        continue;
      }
      s.src = at::Tensor();  // the snapshot is on the host now
      const auto wire = wire_dtype(s.user.scalar_type());
      if (wire == s.user.scalar_type())
        s.host = s.staged;
      else
        s.host = s.read ? s.staged.to(wire)
                        : at::empty(s.user.sizes(), s.staged.options().dtype(wire));
    }
    if (job.has_premul) {
      auto* sup = static_cast<PreMulSumFactor*>(job.premul.supplement_.get());
      for (auto& s : job.slots) {
        if (!s.read) continue;
        if (sup->tensor_factor.defined())
          s.host.mul_(sup->tensor_factor.to(c10::kCPU));
        else
          s.host.mul_(sup->double_factor);
      }
    }
  }

  // ----- collective thread: one collective at a time, in call order -----

  // Each collective is checked, issued, waited for and written back before the next is
  // issued: collectives complete in call order on every rank anyway, and the next ones'
  // fingerprints and device-to-host copies are already under way meanwhile (started by their
  // callers). Sends and recvs never wait here.
  void collective_loop() {
    set_thread_eager_mode(static_cast<int>(EagerMode::kStrict));
    while (auto job = collective_queue_.pop()) {
      run_collective(*job);
      collective_done();
      retire(std::move(job));
    }
  }

  void run_collective(Job& job) {
    std::exception_ptr device_error = await_downloads(job);
    if (broken()) {
      // A failure since this job was called: its fingerprint may still be answered by the
      // peers, but no data may follow it.
      try {
        throw_if_broken();
      } catch (...) {
        fail(job, false);
      }
      return;
    }
    IssueTurn turn(*this, job.seq);
    try {
      if (device_error) std::rethrow_exception(device_error);
      prepare_host(job);
      job.fp_work->wait();  // the peers' fingerprints: bounded by the group timeout
      verify_fingerprints(job);
      job.wire.reserve(job.slots.size());
      for (auto& s : job.slots) job.wire.push_back(s.host);
      turn.wait();
      job.gloo_work = call_gloo([&] { return job.issue(*gloo_, job.wire); });
      turn.done();
    } catch (...) {
      fail(job, true);
      return;
    }
    complete(job);
  }

  // The issue gate: data collectives reach Gloo in call order (collective numbers), whichever
  // thread runs them (the collective thread, or a caller running its synchronous call). A job
  // that fails before its turn breaks the group, which opens the gate for everyone after it.
  class IssueTurn {
   public:
    IssueTurn(StagedBackend& b, int64_t seq) : b_(b), seq_(seq) {}
    ~IssueTurn() { done(); }
    void wait() {
      std::unique_lock<std::mutex> lk(b_.mu_);
      b_.gate_cv_.wait(lk, [&] { return b_.issued_ == seq_ || !b_.broken_.empty(); });
      if (!b_.broken_.empty()) {
        lk.unlock();
        b_.throw_if_broken();
      }
    }
    void done() {
      if (done_) return;
      done_ = true;
      {
        std::lock_guard<std::mutex> g(b_.mu_);
        if (b_.issued_ == seq_) b_.issued_++;
      }
      b_.gate_cv_.notify_all();
    }

   private:
    StagedBackend& b_;
    int64_t seq_;
    bool done_ = false;
  };

  // ----- issuer thread: sends and recvs, in call order -----

  void issue_loop() {
    set_thread_eager_mode(static_cast<int>(EagerMode::kStrict));
    while (auto job = issue_queue_.pop()) {
      if (broken()) {
        try {
          throw_if_broken();
        } catch (...) {
          fail(*job, false);
        }
        retire(std::move(job));
        continue;
      }
      issue_p2p(job);
    }
  }

  void issue_p2p(const std::shared_ptr<Job>& job) {
    try {
      start_downloads(*job);  // a recv only gets its host block
      if (auto e = await_downloads(*job)) std::rethrow_exception(e);
      prepare_host(*job);
      if (job->p2p == P2P::kSend) {
        std::vector<at::Tensor> header{job->header};
        job->header_work = call_gloo([&] { return check_->send(header, job->peer, job->tag); });
        std::vector<at::Tensor> host{job->slots[0].host};
        job->gloo_work = call_gloo([&] { return job->issue(*gloo_, host); });
        runners_.submit([this, job] {
          complete(*job);
          job->work->settle_future();
          bury(job);
        });
        return;
      }
      // A recv: the header recv goes out now, in call order; a runner checks the header and
      // posts the data recv.
      job->fp_out = at::empty({kHeaderLen}, at::kLong);
      std::vector<at::Tensor> header{job->fp_out};
      job->header_work = call_gloo([&] {
        return job->p2p == P2P::kRecv ? check_->recv(header, job->peer, job->tag)
                                      : check_->recvAnysource(header, job->tag);
      });
    } catch (...) {
      {
        std::lock_guard<std::mutex> g(mu_);
        resolve_any_locked(*job);
      }
      fail(*job, true);
      retire(job);
      return;
    }
    runners_.submit([this, job] {
      complete_recv(*job);
      job->work->settle_future();
      bury(job);
    });
  }

  // ----- completion (collective thread for collectives, runners for sends and recvs) -----

  void complete(Job& job) {
    try {
      if (job.header_work) job.header_work->wait();
      job.gloo_work->wait();
    } catch (...) {
      // Started on this rank and failed (a timeout, a dead or mismatched peer): Gloo may not be
      // done with the host blocks of a failed transfer, so they are never reused (a leak on
      // failure only).
      for (auto& s : job.slots) s.block.release();
      fail(job, true);
      return;
    }
    if (job.after) {
      try {
        job.after(job.wire);
      } catch (...) {
        fail(job, false);
        return;
      }
    }
    finish_job(job, -1);
  }

  void complete_recv(Job& job) {
    int src = job.peer;
    try {
      job.header_work->wait();
      if (job.p2p == P2P::kRecvAny) src = job.header_work->sourceRank();
      const int64_t* h = job.fp_out.data_ptr<int64_t>();
      const at::Tensor& t = job.slots[0].user;
      if (h[0] != kMagic || h[1] != static_cast<int64_t>(t.scalar_type()) || h[2] != t.numel())
        C10_THROW_ERROR(DistBackendError,
                        "tpu_dist: recv from rank " + std::to_string(src) + " (tag " +
                            std::to_string(job.tag) + ") of " + std::to_string(t.numel()) + " " +
                            c10::toString(t.scalar_type()) + " elements, but the matching send " +
                            (h[0] == kMagic ? "has " + std::to_string(h[2]) + " " +
                                                  c10::toString(static_cast<at::ScalarType>(h[1])) +
                                                  " elements"
                                            : "is not a tpu_dist send"));
      Channel& ch = channel(src, job.tag);
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (job.p2p == P2P::kRecvAny) {
          job.ticket = ch.tickets++;
          resolve_any_locked(job);
        }
        channel_cv_.wait(lk, [&] { return ch.posted == job.ticket || !broken_.empty(); });
        if (!broken_.empty()) {
          lk.unlock();
          throw_if_broken();
        }
      }
      try {
        std::vector<at::Tensor> host{job.slots[0].host};
        const int tag = job.tag;
        job.gloo_work = call_gloo([&] { return gloo_->recv(host, src, tag); });
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        ch.posted++;
        channel_cv_.notify_all();
        throw;
      }
      {
        std::lock_guard<std::mutex> g(mu_);
        ch.posted++;
      }
      channel_cv_.notify_all();
      job.gloo_work->wait();
    } catch (...) {
      {
        std::lock_guard<std::mutex> g(mu_);
        resolve_any_locked(job);
      }
      for (auto& s : job.slots) s.block.release();
      fail(job, true);
      return;
    }
    finish_job(job, src);
  }

  void resolve_any_locked(Job& job) {
    if (!job.any_pending) return;
    job.any_pending = false;
    pending_any_[job.tag]--;
  }

  void finish_job(Job& job, int source_rank) {
    try {
      write_back(job);
    } catch (...) {
      fail(job, false);
      return;
    }
    // Host blocks back to the pool (those still ours) before the caller can see completion;
    // the caller's tensors stay referenced until the job is freed (see bury()).
    job.gloo_work.reset();
    job.header_work.reset();
    job.fp_work.reset();
    job.wire.clear();
    job.after = nullptr;
    for (auto& s : job.slots) {
      s.block.reset();
      s.staged = s.host = at::Tensor();
    }
    job.work->succeed(source_rank);
  }

  // The all-or-nothing write-back described at the top of the file.
  void write_back(Job& job) {
    struct Install {
      pj_storage_t* storage;
      PJRT_Buffer* buf;
      pj_dtype_t dt;
    };
    std::vector<Install> installs;
    std::vector<Slot*> views;
    try {
      for (auto& s : job.slots) {
        if (!s.write || !is_tpu(s.user) || s.user.numel() == 0) continue;
        if (s.host.scalar_type() != s.staged.scalar_type()) s.staged.copy_(s.host);  // narrow
        if (!s.whole) {
          views.push_back(&s);
          continue;
        }
        pj_storage_t* st = storage_of(s.user);
        const pj_dtype_t dt = storage_dtype(st, s.user.scalar_type());
        const int64_t n = static_cast<int64_t>(st->nbytes / pj_dtype_info(dt)->itemsize);
        installs.push_back({st, upload(s.user.device().index(), std::move(s.block), dt, n), dt});
      }
      RunLock lock;
      // View outputs, grouped by storage: the storage's current bytes with the views' values
      // written over them (each view in its own dtype), as one new buffer. Under the lock, so
      // no program run replaces the storage between our read and our install.
      std::vector<bool> done(views.size(), false);
      for (size_t i = 0; i < views.size(); i++) {
        if (done[i]) continue;
        const at::Tensor& u = views[i]->user;
        pj_storage_t* st = storage_of(u);
        const pj_dtype_t dt = storage_dtype(st, u.scalar_type());
        const size_t item = pj_dtype_info(dt)->itemsize;
        TORCH_CHECK(st->nbytes % item == 0, "tpu_dist: a storage of ", st->nbytes,
                    " bytes is not a whole number of its elements");
        Block image(st->nbytes);
        if (st->buf || st->failed) {
          check(pj_event_await(start_download_locked(st, dt, image.data(), st->nbytes),
                                "tpu_dist device-to-host copy"));
        } else {
          std::memset(image.data(), 0, st->nbytes);
        }
        for (size_t j = i; j < views.size(); j++) {
          const at::Tensor& v = views[j]->user;
          if (storage_of(v) != st) continue;
          const int64_t vn = static_cast<int64_t>(st->nbytes / v.element_size());
          at::from_blob(image.data(), {vn}, [](void*) {}, v.options().device(c10::kCPU))
              .as_strided(v.sizes(), v.strides(), v.storage_offset())
              .copy_(views[j]->staged);
          done[j] = true;
        }
        const int64_t n = static_cast<int64_t>(st->nbytes / item);
        installs.push_back({st, upload(u.device().index(), std::move(image), dt, n), dt});
      }
      for (const auto& in : installs) pj_storage_swap(in.storage, in.buf, in.dt);
    } catch (...) {
      for (const auto& in : installs) pj_buffer_destroy(in.buf);
      throw;
    }
  }

  // ----- shutdown -----

  // Stops taking jobs, fails the queued ones, and joins the threads (each in-flight wait is
  // bounded by Gloo's timeout). Called from Python with the GIL held, possibly: released while
  // joining, since a runner may be completing a future whose Python callbacks need it.
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stopping_) return;
      stopping_ = true;
      if (broken_.empty()) broken_ = "the process group was shut down";
    }
    channel_cv_.notify_all();
    gate_cv_.notify_all();
    for (auto* q : {&issue_queue_, &collective_queue_}) {
      for (auto& job : q->stop()) {
        await_downloads(*job);  // they write into the job's blocks
        try {
          C10_THROW_ERROR(DistBackendError, "tpu_dist: the process group was shut down before "
                                            "this call started");
        } catch (...) {
          job->work->fail(std::current_exception());
        }
        job->work->settle_future();
        bury(std::move(job));
      }
    }
    auto join_all = [this] {
      if (issuer_.joinable()) issuer_.join();
      if (collector_.joinable()) collector_.join();
      runners_.join();
    };
    // Joined, never detached: a detached thread would wake into this destroyed object. While
    // the interpreter exits the GIL is kept (releasing it then is not safe); our threads need
    // it only for Python callbacks on futures, never to free a caller's tensor (bury()).
    if (Py_IsInitialized() && !python_finalizing() && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      join_all();
    } else {
      join_all();
    }
    free_dead_jobs();
  }

  struct Channel {
    uint64_t tickets = 0;  // recvs called on this (source, tag)
    uint64_t posted = 0;   // data recvs posted to Gloo
  };
  Channel& channel(int src, int tag) {
    std::lock_guard<std::mutex> g(mu_);
    return channels_[{src, tag}];  // std::map: references stay valid
  }

  c10::intrusive_ptr<c10d::Backend> gloo_;   // the data
  c10::intrusive_ptr<c10d::Backend> check_;  // fingerprints and send headers
  std::mutex order_mu_;  // call order: see submit()
  std::mutex gloo_mu_;  // serializes calls into gloo_ and check_
  std::mutex mu_;  // guards dead_, stopping_, broken_, channels_, pending_any_
  std::condition_variable channel_cv_;  // a channel's posted count or broken_ changed
  std::condition_variable gate_cv_;     // issued_ or broken_ changed
  int64_t issued_ = 0;                  // data collectives handed to Gloo (under mu_)
  int64_t collectives_in_flight_ = 0;   // submitted and not yet finished (under mu_)
  std::vector<std::shared_ptr<Job>> dead_;  // finished jobs, freed on a caller's thread
  bool stopping_ = false;
  std::string broken_;  // first failure that may put the ranks out of step; empty while usable
  std::map<std::pair<int, int>, Channel> channels_;
  std::map<int, int> pending_any_;  // tag -> recvs from any source waiting for their header
  int64_t next_seq_ = 0;  // collectives submitted so far (under order_mu_)
  JobQueue issue_queue_;
  JobQueue collective_queue_;
  Runners runners_;
  std::thread issuer_;     // started last: they use everything above
  std::thread collector_;
};

}  // namespace

void bind_distributed(py::module_& m) {
  m.def(
      "_dist_backend",
      [](py::object gloo, py::object check, int rank, int size) {
        auto g = gloo.cast<c10::intrusive_ptr<c10d::Backend>>();
        auto c = check.cast<c10::intrusive_ptr<c10d::Backend>>();
        TORCH_CHECK(g && c, "tpu_dist: two Gloo backends are needed");
        c10::intrusive_ptr<c10d::Backend> b =
            c10::make_intrusive<StagedBackend>(g, c, rank, size);
        return py::cast(b);  // torch's own Backend binding
      },
      py::arg("gloo"), py::arg("check"), py::arg("rank"), py::arg("size"),
      "A tpu_dist c10d Backend staging collectives through host memory over `gloo` (data) and "
      "`check` (fingerprints and send headers), two Gloo backends of the same ranks.");
  m.def("_dist_stats", [] {
    size_t allocated = 0, cached = 0;
    pj_host_pool_stats(&allocated, &cached);
    py::dict d;
    d["calls"] = g_collectives.load();
    d["uploads"] = g_uploads.load();
    d["zero_copy_uploads"] = g_zero_copy_uploads.load();
    d["downloads"] = g_downloads.load();
    d["host_bytes"] = allocated;
    d["host_bytes_cached"] = cached;
    return d;
  });
}

}  // namespace torch_pjrt
