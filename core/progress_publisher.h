#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/store.h"

namespace railshard {

// How often each of `ranks` ranks publishes its position: every 200 ms up to 400 ranks, then
// less often as the ranks grow, so that the store (one server) gets at most 2,000 of these a
// second at any N. Measured, each costs the store ~60 µs of its CPU (256 ranks on namespaced
// hosts, docs/scaling.md): at 200 ms, 4,096 ranks would have wanted 1.2 of its cores.
Duration publishPeriodFor(int ranks);

// Tells the store which collective this rank is in, so that a rank that times out can say
// who never arrived ("rank 3 never entered allreduce #1042"). The collective path only stores
// two atomics; a background thread writes the latest value a few times a second when it
// changed, so a fast training loop pays nothing per call. The same thread writes the "lost"
// marks this rank raises, off the error path.
class ProgressPublisher {
 public:
  // Publishes under `key` ("<sequence> <collective>") every `period` while it changes.
  ProgressPublisher(std::shared_ptr<Store> store, std::string key, Duration period);
  ~ProgressPublisher();
  ProgressPublisher(const ProgressPublisher&) = delete;
  ProgressPublisher& operator=(const ProgressPublisher&) = delete;

  // Called as a collective starts: `collective` must be a string literal (kept by pointer).
  void entered(uint64_t sequence, const char* collective) {
    collective_.store(collective, std::memory_order_relaxed);
    sequence_.store(sequence + 1, std::memory_order_release);  // 0 = nothing entered yet
  }
  // Writes `value` under `key` soon (in the background).
  void post(std::string key, std::string value);
  // Writes the current position now (before a diagnosis reads everyone's).
  void flush();

 private:
  void run();
  void publishPosition();

  std::shared_ptr<Store> store_;
  std::string key_;
  Duration period_;
  std::atomic<uint64_t> sequence_{0};
  std::atomic<const char*> collective_{""};
  uint64_t published_ = 0;  // guarded by store_mutex_
  std::mutex store_mutex_;  // one writer at a time: the thread or flush()
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool failed_ = false;  // the store is gone (its host died): stop trying
  std::vector<std::pair<std::string, std::string>> posts_;
  std::thread thread_;
};

}  // namespace railshard
