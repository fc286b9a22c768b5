#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include "python/csrc/torch_compat.h"

namespace railshard::python {

// One queued collective. Completes (successfully or with the railshard error) when the
// backend's worker has run it; wait() rethrows the error, getFuture() is a real
// c10::ivalue::Future holding the output tensors, which is what DDP's reducer waits on.
class Work : public c10d::Work {
 public:
  Work(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // The rank a receive got its message from (torch's Work._source_rank()); InvalidArgument
  // for other work.
  int sourceRank() const override;
  void setSourceRank(int rank) { source_rank_.store(rank); }

  // Point-to-point: what wait() runs first on the caller's thread (it completes or fails this
  // Work unless the backend's completer got there first); set once the transfer is posted.
  void setDriver(std::function<void()> driver);
  // Waits at most `limit` for completion; true when complete.
  bool waitDone(std::chrono::microseconds limit);
  // Called once by the worker.
  void complete();
  void fail(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::atomic<int> source_rank_{-1};
  std::function<void()> driver_;  // guarded by mutex_
};

}  // namespace railshard::python
