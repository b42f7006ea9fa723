// tpu_dist, native transport: the c10d Backend of a group whose ranks are threads of this
// process, each on its own device of the one PJRT client (run_threads). Each collective is one
// multi-device program run through the group's rendezvous (csrc/include/torch_pjrt/
// coll_group.h): the tensors' device buffers go in, the results come out as device buffers and
// are installed into the tensors' storages. No host copy, no Gloo, no socket.
//
// Calls. A collective call blocks its rank's thread until every rank of the group has entered
// it and the program was launched (not until it completes): the group reads every rank's
// buffers when the last rank arrives, and a rank's buffers stay valid only while that rank
// waits (a later write on its thread would replace them). The returned Work completes when the
// program has completed on this rank's device (its completion marker); the results, ordinary
// pending device buffers, are installed before the call returns, so every later op on them is
// ordered after the collective by PJRT itself, as ops after an NCCL call are by the stream.
// Consequence: an `async_op=True` collective returns only once the peers have called it too
// (NCCL returns at once). Send and recv must not wait for their partner at the call (a ring of
// isend/irecv would deadlock), so they take their place on their channel at the call and meet
// the partner on a thread of their own; a send first copies its tensor on the device, so the
// caller may overwrite it at once.
//
// Inputs are read through their views inside the program when every rank's view is the same
// (the usual case: the same code on every rank); when the views differ (FSDP2 reads rank r's
// shard at offset r of its buffer), the group says so to every rank and each passes a
// contiguous device copy instead (coll_group.h's views_differ). Outputs: a tensor covering its
// whole storage gets the result buffer as its storage's buffer; any other (a view, part of a
// storage) gets it through an ordinary device copy.
//
// Errors: ranks calling different collectives get DistBackendError at the call on every rank,
// naming each rank's call; a rank waiting longer than the group timeout gets one naming the
// ranks that did not come, and the group is broken from then on; abort() or destroy of any
// rank's group wakes every waiter of that group with an error.
#include "bridge.h"
#include "future_work.h"
#include "call_builder.h"
#include "eager_mode.h"

#include <c10/core/InferenceMode.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/headeronly/version.h>

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "torch_pjrt/bucket.h"
#include "torch_pjrt/capture.h"
#include "torch_pjrt/coll_group.h"
#include "torch_pjrt/transfer.h"
extern pthread_mutex_t pj_run_lock;  // graph/call_internal.h: program runs read storages under it
}

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13
using NativePreMulSumFactor = c10d::NCCLPreMulSumSupplement;
#else
using NativePreMulSumFactor = c10d::PreMulSumSupplement;
#endif

namespace py = pybind11;

namespace torch_pjrt {
namespace {

constexpr const char* kBackendName = "tpu_dist";

// The group object Python shares between the rank threads' backends (one per c10d group).
struct CollGroup {
  pj_cgroup_t* g = nullptr;
  CollGroup(const std::vector<int>& devices, int64_t timeout_ms) {
    check(pj_cgroup_new(static_cast<int>(devices.size()), devices.data(), timeout_ms, &g));
  }
  ~CollGroup() { pj_cgroup_release(g); }
  CollGroup(const CollGroup&) = delete;
  CollGroup& operator=(const CollGroup&) = delete;
};

class RunLock {
 public:
  RunLock() { pthread_mutex_lock(&pj_run_lock); }
  ~RunLock() { pthread_mutex_unlock(&pj_run_lock); }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
};

[[noreturn]] void raise_dist(pj_status_t* st) {
  std::string msg = std::string("tpu_dist (native): ") + pj_status_message(st);
  pj_status_free(st);
  C10_THROW_ERROR(DistBackendError, msg);
}

bool is_tpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

// t is its whole storage, row-major, in the storage's own element type.
bool is_whole(const at::Tensor& t) {
  pj_storage_t* s = storage_of(t);
  return s && t.storage_offset() == 0 && t.is_contiguous() &&
         static_cast<size_t>(t.numel()) * t.element_size() == s->nbytes &&
         (!s->buf || s->dtype == to_pj_dtype(t.scalar_type()));
}

// A contiguous device copy of t (rows: pad dim 0 with zeros up to that many rows).
at::Tensor device_copy(const at::Tensor& t, int64_t rows = -1) {
  at::AutoDispatchBelowADInplaceOrView below;
  if (rows < 0 || t.dim() == 0 || rows == t.size(0)) {
    at::Tensor c = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
    c.copy_(t);
    return c;
  }
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes[0] = rows;
  at::Tensor c = at::zeros(sizes, t.options());
  c.narrow(0, 0, t.size(0)).copy_(t);
  return c;
}

// A new tpu tensor of n elements like t holding buf (1-D, n elements of t's dtype).
at::Tensor wrap(PJRT_Buffer* buf, int64_t n, const at::Tensor& like) {
  at::Tensor w;
  try {
    at::AutoDispatchBelowADInplaceOrView below;
    w = at::empty({n}, like.options().memory_format(at::MemoryFormat::Contiguous));
  } catch (...) {
    pj_buffer_destroy(buf);
    throw;
  }
  RunLock lock;
  pj_storage_swap(storage_of(w), buf, to_pj_dtype(like.scalar_type()));
  return w;
}

// Installs buf (1-D, n elements of t's dtype, on t's device) as t's values; its first numel(t)
// elements when n is larger (an uneven all_to_all's padded result).
void install(const at::Tensor& t, PJRT_Buffer* buf, int64_t n) {
  if (t.numel() == 0) {
    pj_buffer_destroy(buf);
    return;
  }
  if (n == t.numel() && is_whole(t)) {
    RunLock lock;  // program runs read and replace storage buffers under it
    pj_storage_swap(storage_of(t), buf, to_pj_dtype(t.scalar_type()));
    return;
  }
  at::Tensor w = wrap(buf, n, t);
  at::AutoDispatchBelowADInplaceOrView below;
  t.copy_(w.narrow(0, 0, t.numel()).view(t.sizes()));
}

// ---------------------------------------------------------------------------------------------
// Work: completes on the program's completion on this rank's device (its markers).
// ---------------------------------------------------------------------------------------------

class NativeWork : public FutureWork {
 public:
  using FutureWork::FutureWork;
  ~NativeWork() override {
    for (pj_marker_t* m : markers_) pj_marker_free(m);
  }

  void add_marker(pj_marker_t* m) {
    if (m) markers_.push_back(m);
  }

  // On the completer thread (or a p2p thread): waits for the markers, then finishes.
  void complete(std::exception_ptr e = nullptr) {
    for (pj_marker_t* m : markers_) {
      pj_status_t* st = pj_marker_wait(m);
      if (st && !e) {
        try {
          check(st);
        } catch (...) {
          e = std::current_exception();
        }
      } else {
        pj_status_free(st);
      }
    }
    finish(e);
    settle_future();
  }

 private:
  std::vector<pj_marker_t*> markers_;  // owned; written before the Work is handed out
};

// What one rank asks of the group for one program.
struct Spec {
  pj_coll_kind_t kind = PJ_COLL_ALL_REDUCE;
  const char* name = nullptr;
  pj_reduce_op_t op = PJ_REDUCE_SUM;
  double factor = 1.0;
  int root = 0;
  bool list_out = false;
  bool flat = false;  // inputs read as 1-D (c10d's flat forms: only numel must fit)
  std::vector<at::Tensor> inputs;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> in_splits, out_splits;  // rows; uneven all_to_all
};

struct Got {
  std::vector<PJRT_Buffer*> outs;
  int64_t numel = 0;  // of each output
  int64_t rows = 0;   // data rows of outs[0]
  pj_marker_t* done = nullptr;
};

// One input as the group reads it.
struct Input {
  at::Tensor src;
  std::vector<int64_t> sizes, strides;
};

// ---------------------------------------------------------------------------------------------
// The backend.
// ---------------------------------------------------------------------------------------------

class NativeBackend final : public c10d::Backend {
 public:
  NativeBackend(std::shared_ptr<CollGroup> group, int rank, int size,
                c10::intrusive_ptr<Options> options)
      : Backend(rank, size), group_(std::move(group)), options_(std::move(options)) {
    completer_ = std::thread([this] { complete_loop(); });
  }
  ~NativeBackend() override { stop(false); }

  const std::string getBackendName() const override { return kBackendName; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  bool supportsSplitting() const override { return false; }
  bool supportsCoalescing() const override { return false; }
  void setTimeout(std::chrono::milliseconds timeout) override {
    pj_cgroup_set_timeout(group_->g, timeout.count());
  }
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  void shutdown() override { stop(false); }
  void abort() override { stop(true); }
  // the in-process group (functional collectives recorded into a capture run through it)
  pj_cgroup_t* group() const { return group_->g; }

  // ----- collectives -----

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    TORCH_CHECK_VALUE(!opts.sparseIndices.has_value(),
                      "tpu_dist: sparse allreduce is not supported");
    return reduce_each(tensors, opts.reduceOp, c10d::OpType::ALLREDUCE, "all_reduce");
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return reduce_each(tensors, opts.reduceOp, c10d::OpType::ALLREDUCE_COALESCED,
                       "all_reduce_coalesced");
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    check_root(opts.rootRank);
    auto work = begin(c10d::OpType::BROADCAST, tensors);
    for (auto& t : tensors) {
      Spec s;
      s.kind = PJ_COLL_BROADCAST;
      s.name = "broadcast";
      s.root = static_cast<int>(opts.rootRank);
      s.inputs = {t};
      Got got = run(s, *work);
      install(t, got.outs[0], got.numel);
    }
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    check_root(opts.rootRank);
    auto work = begin(c10d::OpType::REDUCE, tensors);
    for (auto& t : tensors) {
      Spec s = reduction(PJ_COLL_REDUCE, "reduce", opts.reduceOp, {t});
      s.root = static_cast<int>(opts.rootRank);
      Got got = run(s, *work);
      // Non-roots keep their tensor (the program hands their input back).
      if (opts.rootRank == getRank()) install(t, got.outs[0], got.numel);
      else pj_buffer_destroy(got.outs[0]);
    }
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1,
                      "tpu_dist: allgather takes one input tensor and one output list");
    check_list(outputs[0], inputs[0], "allgather output");
    auto work = begin(c10d::OpType::ALLGATHER, outputs[0]);
    gather_into_list(inputs[0], outputs[0], "all_gather", PJ_COLL_ALL_GATHER, 0, *work);
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions&) override {
    TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(getSize()),
                      "tpu_dist: allgather_coalesced needs one output list per rank");
    std::vector<at::Tensor> flat;
    for (auto& l : outputs) {
      TORCH_CHECK_VALUE(l.size() == inputs.size(), "tpu_dist: allgather_coalesced output lists "
                        "must hold one tensor per input");
      flat.insert(flat.end(), l.begin(), l.end());
    }
    auto work = begin(c10d::OpType::ALLGATHER_COALESCED, flat);
    for (size_t i = 0; i < inputs.size(); i++) {
      std::vector<at::Tensor> list;
      for (auto& l : outputs) list.push_back(l[i]);
      check_list(list, inputs[i], "allgather_coalesced output");
      gather_into_list(inputs[i], list, "all_gather_coalesced", PJ_COLL_ALL_GATHER, 0, *work);
    }
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    check_flat_pair(output, input, input.numel() * getSize(), "all_gather_into_tensor");
    auto work = begin(c10d::OpType::_ALLGATHER_BASE, {output});
    gather_into_tensor(input, output, "all_gather_into_tensor", *work);
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions&) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "tpu_dist: "
                      "allgather_into_tensor_coalesced needs as many outputs as inputs");
    for (size_t i = 0; i < inputs.size(); i++)
      check_flat_pair(outputs[i], inputs[i], inputs[i].numel() * getSize(),
                      "all_gather_into_tensor");
    auto work = begin(c10d::OpType::COALESCED, outputs);
    for (size_t i = 0; i < inputs.size(); i++)
      gather_into_tensor(inputs[i], outputs[i], "all_gather_into_tensor_coalesced", *work);
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    check_root(opts.rootRank);
    TORCH_CHECK_VALUE(inputs.size() == 1, "tpu_dist: gather takes one input tensor");
    const bool root = opts.rootRank == getRank();
    std::vector<at::Tensor> outs;
    if (root) {
      TORCH_CHECK_VALUE(outputs.size() == 1, "tpu_dist: gather takes one output list on the root");
      check_list(outputs[0], inputs[0], "gather output");
      outs = outputs[0];
    } else {
      TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                        "tpu_dist: gather takes no output tensors on ranks other than the root");
    }
    auto work = begin(c10d::OpType::GATHER, outs);
    gather_into_list(inputs[0], outs, "gather", PJ_COLL_GATHER, static_cast<int>(opts.rootRank),
                     *work);
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    check_root(opts.rootRank);
    TORCH_CHECK_VALUE(outputs.size() == 1, "tpu_dist: scatter takes one output tensor");
    const bool root = opts.rootRank == getRank();
    Spec s;
    s.kind = PJ_COLL_SCATTER;
    s.name = "scatter";
    s.root = static_cast<int>(opts.rootRank);
    s.flat = true;
    if (root) {
      TORCH_CHECK_VALUE(inputs.size() == 1, "tpu_dist: scatter takes one input list on the root");
      check_list(inputs[0], outputs[0], "scatter input");
      s.inputs = inputs[0];
    } else {
      TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                        "tpu_dist: scatter takes no input tensors on ranks other than the root");
      // The program is SPMD: non-roots pass inputs of the root's type (contents ignored).
      s.inputs.assign(getSize(), outputs[0]);
    }
    auto work = begin(c10d::OpType::SCATTER, outputs);
    Got got = run(s, *work);
    install(outputs[0], got.outs[0], got.numel);
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1,
                      "tpu_dist: reduce_scatter takes one output tensor and one input list");
    check_list(inputs[0], outputs[0], "reduce_scatter input");
    auto work = begin(c10d::OpType::REDUCE_SCATTER, outputs);
    Spec s = reduction(PJ_COLL_REDUCE_SCATTER, "reduce_scatter", opts.reduceOp, inputs[0]);
    s.flat = true;
    Got got = run(s, *work);
    install(outputs[0], got.outs[0], got.numel);
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    check_flat_pair(input, output, output.numel() * getSize(), "reduce_scatter_tensor");
    auto work = begin(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
    scatter_reduce_tensor(input, output, opts.reduceOp, "reduce_scatter_tensor", *work);
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "tpu_dist: "
                      "reduce_scatter_tensor_coalesced needs as many outputs as inputs");
    for (size_t i = 0; i < inputs.size(); i++)
      check_flat_pair(inputs[i], outputs[i], outputs[i].numel() * getSize(),
                      "reduce_scatter_tensor");
    auto work = begin(c10d::OpType::_REDUCE_SCATTER_BASE, outputs);
    for (size_t i = 0; i < inputs.size(); i++)
      scatter_reduce_tensor(inputs[i], outputs[i], opts.reduceOp,
                            "reduce_scatter_tensor_coalesced", *work);
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    check_splits(output, output_splits, "output");
    check_splits(input, input_splits, "input");
    TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(),
                      "tpu_dist: all_to_all_single needs input and output of one dtype");
    auto work = begin(c10d::OpType::ALLTOALL_BASE, {output});
    Spec s;
    s.kind = PJ_COLL_ALL_TO_ALL;
    s.name = "all_to_all_single";
    s.inputs = {input};
    if (!input_splits.empty() || !output_splits.empty()) {
      s.in_splits = even_or(input_splits, input.size(0));
      s.out_splits = even_or(output_splits, output.size(0));
    }
    Got got = run(s, *work);
    install(output, got.outs[0], got.numel);
    return end(work);
  }

  // The list form as one uneven all_to_all of the flattened, concatenated tensors (counts as
  // splits), so the tensors may have any sizes (as NCCL allows).
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(getSize()) &&
                          inputs.size() == static_cast<size_t>(getSize()),
                      "tpu_dist: all_to_all needs one input and one output tensor per rank");
    Spec s;
    s.kind = PJ_COLL_ALL_TO_ALL;
    s.name = "all_to_all";
    std::vector<at::Tensor> flat_in;
    for (size_t i = 0; i < inputs.size(); i++) {
      TORCH_CHECK_VALUE(outputs[i].scalar_type() == inputs[0].scalar_type() &&
                            inputs[i].scalar_type() == inputs[0].scalar_type(),
                        "tpu_dist: all_to_all needs tensors of one dtype");
      s.in_splits.push_back(inputs[i].numel());
      s.out_splits.push_back(outputs[i].numel());
      flat_in.push_back(inputs[i].reshape({-1}));
    }
    auto work = begin(c10d::OpType::ALLTOALL, outputs);
    {
      at::AutoDispatchBelowADInplaceOrView below;
      s.inputs = {at::cat(flat_in)};
    }
    Got got = run(s, *work);
    at::Tensor all = wrap(got.outs[0], got.numel, outputs[0]);
    int64_t off = 0;
    at::AutoDispatchBelowADInplaceOrView below;
    for (auto& o : outputs) {
      o.copy_(all.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
    return end(work);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    auto work = begin(c10d::OpType::BARRIER, {});
    Spec s;
    s.kind = PJ_COLL_BARRIER;
    s.name = "barrier";
    Got got = run(s, *work);
    pj_buffer_destroy(got.outs[0]);
    return end(work);
  }

  // ----- send / recv -----

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override {
    return p2p(tensors, dst, tag, true);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override {
    return p2p(tensors, src, tag, false);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    TORCH_CHECK(false, "tpu_dist (native): recv from any source is not supported on the native "
                       "transport; name the source, or use TORCH_PJRT_DIST_TRANSPORT=staged");
  }

 private:
  // ----- argument checks (raise at the call; the group stays usable) -----

  void check_root(int64_t root) const {
    TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "tpu_dist: invalid root rank ", root,
                      " for a group of ", getSize());
  }
  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& ref,
                  const char* what) const {
    TORCH_CHECK_VALUE(list.size() == static_cast<size_t>(getSize()), "tpu_dist: ", what,
                      " list has ", list.size(), " tensors, expected one per rank (", getSize(),
                      ")");
    for (const auto& t : list) {
      TORCH_CHECK_VALUE(t.scalar_type() == ref.scalar_type(), "tpu_dist: ", what, " has dtype ",
                        t.scalar_type(), ", expected ", ref.scalar_type());
      TORCH_CHECK_VALUE(t.numel() == ref.numel(), "tpu_dist: ", what, " has ", t.numel(),
                        " elements, expected ", ref.numel());
    }
  }
  static void check_flat_pair(const at::Tensor& big, const at::Tensor& small, int64_t numel,
                              const char* what) {
    TORCH_CHECK_VALUE(big.scalar_type() == small.scalar_type(), "tpu_dist: ", what,
                      " needs input and output of one dtype, got ", small.scalar_type(), " and ",
                      big.scalar_type());
    TORCH_CHECK_VALUE(big.numel() == numel, "tpu_dist: ", what, ": the larger tensor has ",
                      big.numel(), " elements, expected ", numel,
                      " (the other's times the group size)");
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
      TORCH_CHECK_VALUE(s >= 0, "tpu_dist: all_to_all_single ", what, " split sizes must be >= 0");
      sum += s;
    }
    TORCH_CHECK_VALUE(sum == t.size(0), "tpu_dist: all_to_all_single ", what, " splits sum to ",
                      sum, " but dim 0 is ", t.size(0));
  }
  std::vector<int64_t> even_or(const std::vector<int64_t>& splits, int64_t rows) const {
    if (!splits.empty()) return splits;
    return std::vector<int64_t>(getSize(), rows / getSize());
  }
  static void check_tensor(const at::Tensor& t) {
    TORCH_CHECK_VALUE(t.defined(), "tpu_dist: undefined tensor");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided,
                      "tpu_dist: only dense tensors are supported, got layout ", t.layout());
    TORCH_CHECK_VALUE(is_tpu(t), "tpu_dist (native): tensors must be on tpu, got one on ",
                      t.device());
    to_pj_dtype(t.scalar_type());  // TypeError for a dtype the device cannot hold
  }

  // ----- the shapes of calls -----

  static Spec reduction(pj_coll_kind_t kind, const char* name, const c10d::ReduceOp& op,
                        std::vector<at::Tensor> inputs) {
    TORCH_CHECK_VALUE(op.op_ != c10d::ReduceOp::UNUSED, "tpu_dist: invalid reduce op");
    Spec s;
    s.kind = kind;
    s.name = name;
    s.op = static_cast<pj_reduce_op_t>(op.op_);  // c10d's numbering (collective.h)
    s.inputs = std::move(inputs);
    if (op.op_ == c10d::ReduceOp::PREMUL_SUM) {
      auto* f = dynamic_cast<NativePreMulSumFactor*>(op.supplement_.get());
      TORCH_CHECK_VALUE(f, "tpu_dist: PREMUL_SUM without a factor");
      // A tensor factor is one number read back from wherever it lives (FSDP2 passes doubles).
      s.factor = f->tensor_factor.defined() ? f->tensor_factor.item<double>() : f->double_factor;
    }
    return s;
  }

  c10::intrusive_ptr<c10d::Work> reduce_each(std::vector<at::Tensor>& tensors,
                                             const c10d::ReduceOp& op, c10d::OpType type,
                                             const char* name) {
    TORCH_CHECK_VALUE(!tensors.empty(), "tpu_dist: ", name, " needs at least one tensor");
    auto work = begin(type, tensors);
    for (auto& t : tensors) {
      Spec s = reduction(PJ_COLL_ALL_REDUCE, name, op, {t});
      Got got = run(s, *work);
      install(t, got.outs[0], got.numel);
    }
    return end(work);
  }

  void gather_into_list(const at::Tensor& input, std::vector<at::Tensor>& outs, const char* name,
                        pj_coll_kind_t kind, int root, NativeWork& work) {
    Spec s;
    s.kind = kind;
    s.name = name;
    s.root = root;
    s.list_out = true;
    s.inputs = {input};
    Got got = run(s, work);
    for (size_t k = 0; k < got.outs.size(); k++) {
      if (k < outs.size()) install(outs[k], got.outs[k], got.numel);
      else pj_buffer_destroy(got.outs[k]);  // a non-root's copy of the gather list
    }
  }

  void gather_into_tensor(const at::Tensor& input, const at::Tensor& output, const char* name,
                          NativeWork& work) {
    Spec s;
    s.kind = PJ_COLL_ALL_GATHER;
    s.name = name;
    s.flat = true;
    s.inputs = {input};
    Got got = run(s, work);
    install(output, got.outs[0], got.numel);
  }

  void scatter_reduce_tensor(const at::Tensor& input, const at::Tensor& output,
                             const c10d::ReduceOp& op, const char* name, NativeWork& work) {
    Spec s = reduction(PJ_COLL_REDUCE_SCATTER, name, op, {input});
    s.flat = true;
    Got got = run(s, work);
    install(output, got.outs[0], got.numel);
  }

  // ----- running one program through the group -----

  c10::intrusive_ptr<NativeWork> begin(c10d::OpType type, std::vector<at::Tensor> outputs) {
    free_dead();
    {
      std::lock_guard<std::mutex> g(mu_);
      TORCH_CHECK(!stopping_, "tpu_dist: the process group was shut down");
    }
    return c10::make_intrusive<NativeWork>(getRank(), type, std::move(outputs));
  }

  c10::intrusive_ptr<c10d::Work> end(c10::intrusive_ptr<NativeWork> work) {
    {
      std::lock_guard<std::mutex> g(mu_);
      pending_.push_back(work);
    }
    cv_.notify_all();
    return work;
  }

  // Reads inputs as the group wants them: as they are (views), or (canonical) each a whole
  // contiguous storage, padded to pad_rows rows when given.
  std::vector<Input> prepare(const Spec& s, bool canonical, int64_t pad_rows) {
    std::vector<Input> ins;
    for (const auto& t : s.inputs) {
      check_tensor(t);
      TORCH_CHECK_VALUE(t.scalar_type() == s.inputs[0].scalar_type(), "tpu_dist: ", s.name,
                        " needs tensors of one dtype");
      Input in;
      const bool copy = pad_rows >= 0 || (canonical && !is_whole(t)) ||
                        (s.flat && !t.is_contiguous()) ||
                        (storage_of(t)->buf &&
                         storage_of(t)->dtype != to_pj_dtype(t.scalar_type()));
      in.src = copy ? device_copy(t, pad_rows) : t;
      if (s.flat) {
        in.sizes = {in.src.numel()};
        in.strides = {1};
      } else {
        in.sizes = in.src.sizes().vec();
        in.strides = in.src.strides().vec();
      }
      ins.push_back(std::move(in));
    }
    return ins;
  }

  Got run(const Spec& s, NativeWork& work) {
    c10::InferenceMode not_inference(false);  // our copies are ordinary tensors
    int64_t pad_rows = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
      std::vector<Input> ins = prepare(s, attempt > 0, pad_rows);
      // Recorded (defer_and_fuse) ops, our copies among them, run before the group reads the
      // buffers: the collective sees every op called before it.
      check(pj_defer_flush());
      const pj_dtype_t dt = s.inputs.empty() ? PJ_F32 : to_pj_dtype(s.inputs[0].scalar_type());
      std::vector<pj_coll_view_t> views(ins.size());
      std::vector<PJRT_Buffer*> bufs(ins.size());
      {
        RunLock lock;  // no program run replaces a buffer between our read and the group's
        for (size_t i = 0; i < ins.size(); i++) {
          pj_storage_t* st = storage_of(ins[i].src);
          check(pj_storage_readable(st));
          if (!st->buf) check(pj_storage_materialize(st, dt));
          check(pj_bucket_trim_locked(st));
          bufs[i] = st->buf;
          views[i] = {static_cast<int>(ins[i].sizes.size()), ins[i].sizes.data(),
                      ins[i].strides.data(), ins[i].src.storage_offset(),
                      static_cast<int64_t>(st->nbytes / pj_dtype_info(dt)->itemsize)};
        }
      }
      pj_cgroup_call_t c{};
      c.kind = s.kind;
      c.op = s.op;
      c.dtype = dt;
      c.ninputs = static_cast<int>(ins.size());
      c.inputs = views.data();
      c.buffers = bufs.data();
      c.list_out = s.list_out;
      c.root = s.root;
      c.in_splits = s.in_splits.empty() ? nullptr : s.in_splits.data();
      c.out_splits = s.out_splits.empty() ? nullptr : s.out_splits.data();
      c.factor = s.factor;
      c.name = s.name;
      pj_cgroup_result_t res;
      pj_status_t* st;
      seq_++;
      if (PyGILState_Check()) {  // the peers may need the GIL to reach their call
        py::gil_scoped_release no_gil;
        st = pj_cgroup_collective(group_->g, getRank(), &c, &res);
      } else {
        st = pj_cgroup_collective(group_->g, getRank(), &c, &res);
      }
      if (st) raise_dist(st);
      if (res.views_differ) {
        pad_rows = res.pad_rows > 0 ? res.pad_rows : -1;
        continue;
      }
      Got got;
      got.outs.assign(res.outs, res.outs + res.noutputs);
      got.numel = res.out_numel;
      got.rows = res.out_rows;
      work.add_marker(res.done);
      return got;
    }
    TORCH_CHECK(false, "tpu_dist (native): internal: the ranks' inputs still differ in layout "
                       "after contiguous copies");
  }

  // ----- send / recv -----

  c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor>& tensors, int peer, int tag,
                                     bool is_send) {
    TORCH_CHECK_VALUE(tensors.size() == 1, "tpu_dist: ", is_send ? "send" : "recv",
                      " takes exactly one tensor");
    TORCH_CHECK_VALUE(peer >= 0 && peer < getSize() && peer != getRank(),
                      "tpu_dist: invalid peer rank ", peer, " for rank ", getRank(),
                      " of a group of ", getSize());
    const at::Tensor t = tensors[0];
    check_tensor(t);
    c10::InferenceMode not_inference(false);
    auto work = begin(is_send ? c10d::OpType::SEND : c10d::OpType::RECV, tensors);
    // The send's data as at the call (a device copy the caller cannot touch), or the recv's
    // stand-in buffer of the same type (the permute replaces it).
    at::Tensor src;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      src = is_send ? device_copy(t).reshape({-1}) : at::zeros({t.numel()}, t.options());
    }
    uint64_t ticket = 0;
    const int me = getRank();
    check(pj_cgroup_p2p_ticket(group_->g, is_send ? me : peer, is_send ? peer : me, tag, is_send,
                               &ticket));
    check(pj_defer_flush());
    std::lock_guard<std::mutex> g(mu_);
    // stop() may have run since begin() (another thread aborted the group while this one
    // prepared the transfer): a thread started now would never be joined, and a joinable
    // std::thread destroyed with the backend ends the process (std::terminate)
    TORCH_CHECK(!stopping_, "tpu_dist: the process group was shut down");
    p2p_threads_.emplace_back([this, work, src, t, peer, tag, ticket, is_send] {
      set_thread_eager_mode(static_cast<int>(EagerMode::kStrict));
      std::exception_ptr e;
      try {
        const pj_dtype_t dt = to_pj_dtype(src.scalar_type());
        PJRT_Buffer* buf;
        {
          RunLock lock;
          pj_storage_t* st = storage_of(src);
          check(pj_storage_readable(st));
          if (!st->buf) check(pj_storage_materialize(st, dt));
          check(pj_bucket_trim_locked(st));
          buf = st->buf;
        }
        pj_cgroup_result_t res;
        pj_status_t* st = pj_cgroup_p2p(group_->g, getRank(), peer, tag, ticket, is_send, dt,
                                        src.numel(), buf, &res);
        if (st) raise_dist(st);
        work->add_marker(res.done);
        if (!is_send) {
          c10::InferenceMode not_inference(false);
          install(t, res.outs[0], res.out_numel);
        }
      } catch (...) {
        e = std::current_exception();
      }
      work->complete(e);
      bury(work, src);
    });
    return work;
  }

  // ----- completion -----

  void complete_loop() {
    set_thread_eager_mode(static_cast<int>(EagerMode::kStrict));
    for (;;) {
      c10::intrusive_ptr<NativeWork> w;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !pending_.empty(); });
        if (pending_.empty()) return;
        w = pending_.front();
        pending_.pop_front();
      }
      w->complete();
      bury(w, at::Tensor());
    }
  }

  // Our threads never drop the last reference to a Work or a tensor of the caller's (freeing a
  // tensor may need the GIL, which an exiting interpreter never gives back): callers free them.
  void bury(c10::intrusive_ptr<NativeWork> w, at::Tensor t) {
    std::lock_guard<std::mutex> g(mu_);
    dead_works_.push_back(std::move(w));
    if (t.defined()) dead_tensors_.push_back(std::move(t));
  }
  void free_dead() {
    std::vector<c10::intrusive_ptr<NativeWork>> works;
    std::vector<at::Tensor> tensors;
    std::lock_guard<std::mutex> g(mu_);
    works.swap(dead_works_);
    tensors.swap(dead_tensors_);
    // joined p2p threads: those that ended are joined by stop(); keep the list bounded here
  }

  // shutdown: sends and recvs in flight finish (each bounded by the group timeout), then this
  // rank leaves the group (failing the calls that wait for it). abort: breaks the group first.
  void stop(bool abort_now) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stopping_ && !abort_now) return;
    }
    if (abort_now) pj_cgroup_shutdown(group_->g, getRank(), "its process group was aborted");
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> g(mu_);
      stopping_ = true;
      threads.swap(p2p_threads_);
    }
    cv_.notify_all();
    auto join_all = [&] {
      for (auto& t : threads)
        if (t.joinable()) t.join();
      if (completer_.joinable()) completer_.join();
    };
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      join_all();
    } else {
      join_all();
    }
    pj_cgroup_leave(group_->g, getRank(), "its process group was destroyed");
    free_dead();
  }

  std::shared_ptr<CollGroup> group_;
  c10::intrusive_ptr<Options> options_;
  std::atomic<uint64_t> seq_{0};
  std::mutex mu_;  // pending_, stopping_, dead lists, p2p_threads_
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<NativeWork>> pending_;  // launched, not yet completed
  bool stopping_ = false;
  std::vector<c10::intrusive_ptr<NativeWork>> dead_works_;
  std::vector<at::Tensor> dead_tensors_;
  std::vector<std::thread> p2p_threads_;
  std::thread completer_;  // started last: it uses everything above
};

// ---------------------------------------------------------------------------------------------
// One process, several devices (issue 36 item 3(a); torch_pjrt/distributed/local.py): one
// collective over tensors the calling thread holds on distinct devices, run at once as one
// program over those devices (pj_coll_run; no rendezvous: every replica's input is here).
// ---------------------------------------------------------------------------------------------

pj_coll_kind_t local_kind(const std::string& kind) {
  if (kind == "all_reduce") return PJ_COLL_ALL_REDUCE;
  if (kind == "reduce") return PJ_COLL_REDUCE;
  if (kind == "broadcast") return PJ_COLL_BROADCAST;
  if (kind == "all_gather") return PJ_COLL_ALL_GATHER;
  TORCH_CHECK_VALUE(false, "local collective: unknown kind '", kind,
                    "' (all_reduce, reduce, broadcast, all_gather)");
}

// Results of `kind` over tensors[r] on device tensors[r].device() (distinct devices, one dtype
// and shape): one new tensor per replica, on its device. root: REDUCE's and BROADCAST's replica.
std::vector<at::Tensor> local_collective(const std::string& kind,
                                         const std::vector<at::Tensor>& tensors, int op,
                                         int root) {
  const pj_coll_kind_t k = local_kind(kind);
  const int n = static_cast<int>(tensors.size());
  TORCH_CHECK_VALUE(n >= 1 && n <= PJ_COLL_MAX_REPLICAS, "local collective: 1 to ",
                    PJ_COLL_MAX_REPLICAS, " tensors, got ", n);
  std::vector<int> devices(n);
  for (int r = 0; r < n; r++) {
    const at::Tensor& t = tensors[r];
    TORCH_CHECK_VALUE(is_tpu(t), "local collective: tensor ", r, " is on ", t.device(),
                      ", not a tpu device");
    TORCH_CHECK_VALUE(t.scalar_type() == tensors[0].scalar_type() &&
                          t.sizes() == tensors[0].sizes(),
                      "local collective: every tensor needs the first one's dtype and shape (",
                      tensors[0].scalar_type(), tensors[0].sizes(), "), tensor ", r, " is ",
                      t.scalar_type(), t.sizes());
    devices[r] = t.device().index();
    for (int q = 0; q < r; q++)
      TORCH_CHECK_VALUE(devices[q] != devices[r], "local collective: tensors ", q, " and ", r,
                        " are both on ", t.device(), " (one tensor per device)");
  }
  c10::InferenceMode not_inference(false);
  // One program reads one view on every replica: views that differ become contiguous copies.
  std::vector<at::Tensor> ins(tensors.begin(), tensors.end());
  bool same = true;
  for (int r = 1; r < n && same; r++)
    same = ins[r].strides() == ins[0].strides() &&
           ins[r].storage_offset() == ins[0].storage_offset() &&
           storage_of(ins[r])->nbytes == storage_of(ins[0])->nbytes;
  for (int r = 0; r < n; r++)
    if (!same || (storage_of(ins[r])->buf &&
                  storage_of(ins[r])->dtype != to_pj_dtype(ins[r].scalar_type())))
      ins[r] = device_copy(ins[r]);
  check(pj_defer_flush());  // recorded ops, the copies among them, run first
  const pj_dtype_t dt = to_pj_dtype(ins[0].scalar_type());
  std::vector<int64_t> sizes = ins[0].sizes().vec(), strides = ins[0].strides().vec();
  std::vector<PJRT_Buffer*> bufs(n);
  pj_coll_view_t view{};
  pj_coll_desc_t d{};
  d.kind = k;
  d.op = static_cast<pj_reduce_op_t>(op);
  d.dtype = dt;
  d.ninputs = 1;
  d.inputs = &view;
  d.nreplicas = n;
  d.group_size = n;
  d.root = root;
  d.flat_out = true;
  std::vector<PJRT_Buffer*> outs;
  int64_t out_numel = 0;
  {
    RunLock lock;  // no program run replaces a buffer between our read and the launch
    for (int r = 0; r < n; r++) {
      pj_storage_t* st = storage_of(ins[r]);
      check(pj_storage_readable(st));
      if (!st->buf) check(pj_storage_materialize(st, dt));
      check(pj_bucket_trim_locked(st));
      bufs[r] = st->buf;
    }
    view = {static_cast<int>(sizes.size()), sizes.data(), strides.data(),
            ins[0].storage_offset(),
            static_cast<int64_t>(storage_of(ins[0])->nbytes / pj_dtype_info(dt)->itemsize)};
    check(pj_coll_check(&d));
    pj_type_t ot;
    check(pj_coll_output_type(&d, 0, &ot));
    out_numel = pj_type_numel(&ot);
    outs.assign(static_cast<size_t>(n) * pj_coll_num_outputs(&d), nullptr);
  }
  // outside the run lock, which pj_coll_run takes itself (the buffers stay: only this thread
  // holds these tensors, as a rank's buffers in the rendezvous above)
  check(pj_coll_run(&d, devices.data(), bufs.data(), nullptr, outs.data(), nullptr));
  std::vector<int64_t> out_sizes = sizes;
  if (k == PJ_COLL_ALL_GATHER) {
    if (out_sizes.empty()) out_sizes = {n};
    else out_sizes[0] *= n;
  }
  std::vector<at::Tensor> results;
  for (int r = 0; r < n; r++) {
    at::Tensor w = wrap(outs[r], out_numel, tensors[r]);
    at::AutoDispatchBelowADInplaceOrView below;
    results.push_back(w.view(out_sizes));
  }
  return results;
}

// ---------------------------------------------------------------------------------------------
// Functional collectives inside a compiled graph's capture.
// ---------------------------------------------------------------------------------------------
//
// torch.compile puts c10d's functional collectives (_c10d_functional.all_reduce,
// all_gather_into_tensor, reduce_scatter_tensor: what tensor parallelism and compiled FSDP2
// emit) into graphs. While a rank thread captures such a graph (compile/graph_runner.py) over a
// native group, each is recorded into the capture as a _pj_collective op
// (csrc/ops/collective.c), so the whole graph becomes one SPMD program over the group's devices
// (capture.h, pj_capture_record_collective): the collective runs inside the program, between
// the graph's other ops, and the ranks' program keys are compared before it runs. Everywhere
// else (TORCH_PJRT_FUSE_COLLECTIVES=0, no capture, a staged group, a capture holding another group's collective, a call the
// description refuses) the op goes on to c10d's own kernel below autograd, as before.
// Registered at AutogradPrivateUse1, the key a tpu tensor reaches first: c10d's kernel is a
// CompositeExplicitAutograd one, which a backend key's kernel would replace with no way back.

// The native backend of a functional collective's group argument (a name or a ProcessGroup),
// or nullptr.
NativeBackend* native_backend_of(const c10::IValue& group) {
  try {
    c10::intrusive_ptr<c10d::ProcessGroup> pg;
    if (group.isString()) pg = c10d::resolve_process_group(group.toStringRef());
    else if (group.isCustomClass()) pg = group.toCustomClass<c10d::ProcessGroup>();
    if (!pg) return nullptr;
    return dynamic_cast<NativeBackend*>(pg->getBackend(c10::DeviceType::PrivateUse1).get());
  } catch (const std::exception&) {
    return nullptr;  // no such group or no tpu backend: c10d's kernel says what is wrong
  }
}

bool reduce_op_of(const std::string& name, pj_reduce_op_t* op) {
  static const std::pair<const char*, pj_reduce_op_t> kOps[] = {
      {"sum", PJ_REDUCE_SUM},   {"avg", PJ_REDUCE_AVG}, {"product", PJ_REDUCE_PRODUCT},
      {"min", PJ_REDUCE_MIN},   {"max", PJ_REDUCE_MAX}, {"band", PJ_REDUCE_BAND},
      {"bor", PJ_REDUCE_BOR},   {"bxor", PJ_REDUCE_BXOR}};
  for (const auto& [n, o] : kOps)
    if (name == n) {
      *op = o;
      return true;
    }
  return false;  // premul_sum (needs a factor) and unknown names: c10d's kernel
}

// Records the collective into this thread's capture; false when it cannot go there.
bool record_functional(const std::string& which, torch::jit::Stack* stack) {
  // TORCH_PJRT_FUSE_COLLECTIVES=0: every functional collective its own program (read once;
  // benchmarks/bench_spmd_graphs.py compares both)
  static const bool fuse = [] {
    const char* v = std::getenv("TORCH_PJRT_FUSE_COLLECTIVES");
    return !v || std::string(v) != "0";
  }();
  if (!fuse || !pj_capture_active()) return false;
  const auto& args = *stack;
  const size_t n = args.size();
  const at::Tensor input = args[0].toTensor();
  NativeBackend* b = native_backend_of(args[n - 1]);
  if (!b || !storage_of(input) || input.dim() == 0) return false;
  const int size = b->getSize();
  pj_coll_kind_t kind = PJ_COLL_ALL_REDUCE;
  pj_reduce_op_t op = PJ_REDUCE_SUM;
  std::vector<int64_t> out_shape = input.sizes().vec();
  if (which == "all_reduce") {
    if (!reduce_op_of(args[1].toStringRef(), &op)) return false;
  } else if (which == "all_gather_into_tensor") {
    if (args[1].toInt() != size) return false;
    kind = PJ_COLL_ALL_GATHER;
    out_shape[0] *= size;
  } else {  // reduce_scatter_tensor
    if (!reduce_op_of(args[1].toStringRef(), &op) || args[2].toInt() != size ||
        out_shape[0] % size != 0)
      return false;
    kind = PJ_COLL_REDUCE_SCATTER;
    out_shape[0] /= size;
  }
  pj_dtype_t dt;
  if (!pj_dtype_of(input.scalar_type(), &dt)) return false;
  // what the program could not do (a ReduceOp the dtype refuses) stays c10d's to report
  const std::vector<int64_t> strides = input.strides().vec();
  const pj_coll_view_t view = {static_cast<int>(input.dim()), input.sizes().data(),
                               strides.data(), 0, input.numel()};
  pj_coll_desc_t d{};
  d.kind = kind;
  d.op = op;
  d.dtype = dt;
  d.ninputs = 1;
  d.inputs = &view;
  d.nreplicas = d.group_size = size;
  if (pj_status_t* st = pj_coll_check(&d)) {
    pj_status_free(st);
    return false;
  }
  at::Tensor out = at::empty(out_shape, input.options());
  CallBuilder cb("_pj_collective", "", input.device().index());
  cb.add_tensor("self", input);
  cb.add_int("kind", kind);
  cb.add_int("reduce_op", op);
  cb.add_int("group_size", size);
  cb.add_out(out);
  bool recorded = false;
  check(pj_capture_record_collective(&cb.call(), b->group(), b->getRank(), &recorded));
  if (!recorded) return false;
  stack->clear();
  stack->push_back(std::move(out));
  return true;
}

template <const char* Which>
void functional_collective(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                           torch::jit::Stack* stack) {
  if (!record_functional(Which, stack))
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
}

constexpr char kAllReduce[] = "all_reduce";
constexpr char kAllGather[] = "all_gather_into_tensor";
constexpr char kReduceScatter[] = "reduce_scatter_tensor";

TORCH_LIBRARY_IMPL(_c10d_functional, AutogradPrivateUse1, m) {
  m.impl("all_reduce",
         torch::CppFunction::makeFromBoxedFunction<&functional_collective<kAllReduce>>());
  m.impl("all_gather_into_tensor",
         torch::CppFunction::makeFromBoxedFunction<&functional_collective<kAllGather>>());
  m.impl("reduce_scatter_tensor",
         torch::CppFunction::makeFromBoxedFunction<&functional_collective<kReduceScatter>>());
}

}  // namespace

// Whether a c10d Backend is this transport's (for torch_pjrt.distributed.transport()).
bool is_native_dist_backend(const c10::intrusive_ptr<c10d::Backend>& b) {
  return b && dynamic_cast<NativeBackend*>(b.get()) != nullptr;
}

void bind_native_dist(py::module_& m) {
  py::class_<CollGroup, std::shared_ptr<CollGroup>>(m, "_CollGroup")
      .def(py::init<const std::vector<int>&, int64_t>(), py::arg("devices"),
           py::arg("timeout_ms"))
      .def("shutdown", [](CollGroup& g, const std::string& why) {
        pj_cgroup_shutdown(g.g, -1, why.c_str());
      });
  m.def(
      "_dist_native_backend",
      [](std::shared_ptr<CollGroup> group, int rank, int size, const std::string& group_name,
         std::vector<uint64_t> global_ranks, int64_t timeout_ms) {
        TORCH_CHECK(group && pj_cgroup_size(group->g) == size, "tpu_dist: a group of ", size,
                    " ranks needs a collective group of as many");
        auto opts = c10::make_intrusive<c10d::Backend::Options>(
            kBackendName, std::chrono::milliseconds(timeout_ms));
        opts->group_name = group_name;
        opts->global_ranks_in_group = std::move(global_ranks);
        c10::intrusive_ptr<c10d::Backend> b =
            c10::make_intrusive<NativeBackend>(std::move(group), rank, size, opts);
        return py::cast(b);
      },
      py::arg("group"), py::arg("rank"), py::arg("size"), py::arg("group_name"),
      py::arg("global_ranks"), py::arg("timeout_ms"),
      "A tpu_dist c10d Backend whose collectives run as multi-device programs through `group`, "
      "shared by the rank threads of one process.");
  m.def("_local_collective", &local_collective, py::arg("kind"), py::arg("tensors"),
        py::arg("op") = 0, py::arg("root") = 0,
        "One collective (all_reduce, reduce, broadcast, all_gather) over tensors this thread "
        "holds on distinct tpu devices, as one program over those devices; returns one new "
        "tensor per device. op: c10d's ReduceOp number; root: the replica of reduce/broadcast.");
  m.def("_dist_transport", [](py::object backend) -> std::string {
    auto b = backend.cast<c10::intrusive_ptr<c10d::Backend>>();
    if (is_native_dist_backend(b)) return "native";
    return b && b->getBackendName() == kBackendName ? "staged" : "";
  });
}

}  // namespace torch_pjrt
