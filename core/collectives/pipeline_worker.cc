#include "core/collectives/pipeline_worker.h"

#include "base/trace.h"

namespace railshard::collectives {

PipelineWorker::PipelineWorker(std::function<void(size_t)> job, int trace_rank)
    : job_(std::move(job)), thread_([this, trace_rank] { loop(trace_rank); }) {}

PipelineWorker::~PipelineWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void PipelineWorker::submit() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++submitted_;
  }
  changed_.notify_all();
}

void PipelineWorker::waitFor(size_t index) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return done_ > index || error_ != nullptr; });
  if (done_ <= index) std::rethrow_exception(error_);
}

void PipelineWorker::loop(int trace_rank) {
  const trace::ScopedRank rank(trace_rank);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || done_ < submitted_; });
    // The caller waits for every job it needs before it lets go, so a job still queued when
    // it does is one it gave up on.
    if (stopping_) return;
    const size_t index = done_;
    lock.unlock();
    std::exception_ptr error;
    try {
      job_(index);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error != nullptr) {
      error_ = error;
      changed_.notify_all();
      // A failed job ends the pipeline; later jobs would only wait on a poisoned transport.
      changed_.wait(lock, [&] { return stopping_; });
      return;
    }
    ++done_;
    changed_.notify_all();
  }
}

}  // namespace railshard::collectives
