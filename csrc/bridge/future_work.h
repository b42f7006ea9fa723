// A c10d Work finished by one of tpu_dist's own threads, with the future PyTorch asks of it,
// shared by both transports (distributed.cpp's staged Work, native_dist.cpp's native Work).
// Completion, waiting with or without a timeout and the error are Work's own (finish() under
// its mutex). The future exists only once asked for (getFuture: DDP does at once, a plain
// wait() never does) and is settled, with the output tensors or the error, after the Work
// finished: by whoever finishes it when it was asked for before (its callbacks, DDP comm hooks
// or torch.futures then(), run there and may call and wait for further collectives), else by
// getFuture itself.
#pragma once
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace torch_pjrt {

class FutureWork : public c10d::Work {
 public:
  FutureWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs)
      : Work(rank, op), outputs_(std::move(outputs)) {}

  std::vector<at::Tensor> result() override { return outputs_; }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    bool finished = false;
    c10::intrusive_ptr<c10::ivalue::Future> f;
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (!future_) {
        std::vector<c10::Device> devices;
        for (const auto& t : outputs_)
          if (t.device().type() == c10::DeviceType::PrivateUse1) devices.push_back(t.device());
        future_ = c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()), devices);
      }
      f = future_;
      finished = completed_;
    }
    if (finished) settle_future();
    return f;
  }

  bool future_requested() {
    std::lock_guard<std::mutex> g(mutex_);
    return static_cast<bool>(future_);
  }

  // After the Work finished; once, whoever calls first (getFuture or the finishing thread).
  void settle_future() {
    c10::intrusive_ptr<c10::ivalue::Future> f;
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (!future_ || settled_ || !completed_) return;
      settled_ = true;
      f = future_;
      e = exception_;
    }
    if (e) {
      f->setErrorIfNeeded(e);
      return;
    }
    try {
      f->markCompleted(c10::IValue(outputs_));
    } catch (...) {
      // markCompleted only fails on a device mismatch, which the future's device list rules
      // out; a future that cannot complete must still not leave waiters hanging.
      if (!f->completed()) f->setErrorIfNeeded(std::current_exception());
    }
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // under mutex_; made by getFuture
  bool settled_ = false;
};

}  // namespace torch_pjrt
