#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace railshard::collectives {

// A second thread that runs numbered jobs 0, 1, 2, ... one after another, in order, as they
// are submitted, while the submitting thread goes on with other work. The two-level
// all-reduce hands it each chunk's all-reduce across hosts, so the rails stay busy while the
// caller's thread reduces and gathers the neighbouring chunks inside the host.
//
// The first job that throws stops it: waitFor() of that job or any later one rethrows the
// error. Jobs must end by themselves (every wait in them has a deadline): the destructor
// waits for the job running, so a caller that gives up must first make it fail fast (poison
// the transport it waits on).
class PipelineWorker {
 public:
  // `job(i)` runs on the worker thread; `trace_rank` is the world rank its trace events
  // belong to (trace::currentRank() of the caller).
  PipelineWorker(std::function<void(size_t)> job, int trace_rank);
  ~PipelineWorker();
  PipelineWorker(const PipelineWorker&) = delete;
  PipelineWorker& operator=(const PipelineWorker&) = delete;

  // Queues the next job (numbers are consecutive from 0).
  void submit();
  // Blocks until job `index` is done; rethrows the error of a job that failed.
  void waitFor(size_t index);

 private:
  void loop(int trace_rank);

  std::function<void(size_t)> job_;
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t submitted_ = 0;
  size_t done_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace railshard::collectives
