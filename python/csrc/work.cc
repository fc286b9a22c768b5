#include "python/csrc/work.h"

#include <string>

#include "base/error.h"

namespace railshard::python {

Work::Work(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

bool Work::isCompleted() {
  std::lock_guard lock(mutex_);
  return done_;
}

bool Work::isSuccess() const {
  std::lock_guard lock(mutex_);
  return done_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard lock(mutex_);
  return error_;
}

std::vector<at::Tensor> Work::result() {
  return outputs_;
}

void Work::setDriver(std::function<void()> driver) {
  std::lock_guard lock(mutex_);
  driver_ = std::move(driver);
}

bool Work::waitDone(std::chrono::microseconds limit) {
  std::unique_lock lock(mutex_);
  return done_cv_.wait_for(lock, limit, [&] { return done_; });
}

bool Work::wait(std::chrono::milliseconds timeout) {
  std::function<void()> driver;
  {
    std::lock_guard lock(mutex_);
    // Only for an unbounded wait: the transfer's own deadline bounds the driver, not `timeout`.
    if (!done_ && timeout.count() <= 0) driver = driver_;
  }
  if (driver) driver();
  std::unique_lock lock(mutex_);
  if (timeout.count() <= 0) {  // kNoTimeout (0): wait as long as it takes
    done_cv_.wait(lock, [&] { return done_; });
  } else if (!done_cv_.wait_for(lock, timeout, [&] { return done_; })) {
    // The collective itself is still bounded by its own deadline; this is only the caller
    // giving up on waiting for it.
    throw TimeoutError("railshard: Work.wait(timeout=" + std::to_string(timeout.count()) +
                       " ms) expired before the collective completed");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

int Work::sourceRank() const {
  const int rank = source_rank_.load();
  if (rank < 0) {
    throw InvalidArgument("railshard: this work is not a receive, it has no source rank");
  }
  return rank;
}

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() {
  return future_;
}

void Work::complete() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_all();
  future_->markCompleted(c10::IValue(outputs_));
}

void Work::fail(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = error;
  }
  done_cv_.notify_all();
  future_->setError(error);
}

}  // namespace railshard::python
