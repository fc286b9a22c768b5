#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace railshard::transport::links::shm {

// Shared regions (allocateShared) kept for reuse when freed, as a caching allocator keeps
// blocks (issue #45): a training step frees and allocates tensors of the same shapes every
// step, and a region reused keeps its serial, so the peers' mappings of it (PeerMappings) stay
// valid and the next collective on it needs no new mapping, no memfd and no page faults.
//
// A freed region is kept while the kept bytes stay within the most bytes ever live at once
// (so the pool never holds more than twice what the job used at its peak), else released.
// take() reuses a kept region of at least the size asked and at most a quarter larger.
class SharedPool {
 public:
  struct Stats {
    size_t live_bytes = 0;  // handed out and not given back (region sizes, pages)
    size_t live_regions = 0;
    size_t kept_bytes = 0;  // given back, kept for reuse
    size_t kept_regions = 0;
    size_t peak_live_bytes = 0;
    uint64_t taken = 0;   // take() calls
    uint64_t reused = 0;  // of which served by a kept region
  };

  SharedPool() = default;
  ~SharedPool();
  SharedPool(const SharedPool&) = delete;
  SharedPool& operator=(const SharedPool&) = delete;

  // A region of at least `bytes` (not zeroed when reused). Error (naming errno) when a new one
  // cannot be had; InvalidArgument for 0 bytes.
  void* take(size_t bytes);
  // Gives back what take() returned. InvalidArgument for any other address.
  void give(void* address);
  // Releases every kept region (as torch.cuda.empty_cache() does for its cache).
  void releaseKept();
  bool owns(const void* address) const;
  Stats stats() const;
  // For the owner's pthread_atfork handlers: the pool's lock held across fork(), so that a
  // child never inherits it locked by a thread it does not have.
  void lockForFork() { mutex_.lock(); }
  void unlockAfterFork() { mutex_.unlock(); }

 private:
  // Books a region handed out (under mutex_).
  void markLive(void* address, size_t size);

  mutable std::mutex mutex_;
  std::unordered_map<const void*, size_t> live_;  // address -> region bytes
  std::multimap<size_t, void*> kept_;             // region bytes -> address
  Stats stats_;
};

}  // namespace railshard::transport::links::shm
