#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>

namespace railshard::transport::links::ibverbs {

// A memory registration as the HCA knows it: [start, start + length) with its keys.
struct Registration {
  uintptr_t start = 0;
  size_t length = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  void* handle = nullptr;  // the ibv_mr*, for deregistration
};

// Registering memory pins pages and costs tens of microseconds per MB, so buffers that are
// sent again and again (gradient buckets) are registered once and looked up by address range.
// Ranges are widened to whole pages; a request inside a registered range is a hit; one that
// overlaps idle entries replaces them with one registration of the union (so a buffer that
// grows does not accumulate fragments). Idle entries beyond `max_bytes` are evicted, least
// recently used first. An entry in use (a lease is alive: a write from it is in flight) is
// never deregistered under the HCA; invalidate() marks it stale and it goes when the lease does.
//
// The cache cannot see free(): the owner must invalidate() a range before its memory is
// returned to the system (the transport does it for memory it allocated; users of
// registerMemory() call deregisterMemory()), otherwise a later buffer at the same address
// would be sent from the old pages. Thread-safe.
class RegistrationCache {
 public:
  using RegisterFn = std::function<Registration(uintptr_t start, size_t length)>;  // throws
  using DeregisterFn = std::function<void(const Registration&)>;
  using Lease = std::shared_ptr<const Registration>;

  RegistrationCache(RegisterFn register_fn, DeregisterFn deregister_fn, size_t max_bytes,
                    size_t page_bytes = 4096);
  ~RegistrationCache();  // deregisters everything
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  // A registration covering [addr, addr + length), registering when needed. The lease keeps
  // it registered. InvalidArgument for a null address or zero length.
  Lease acquire(const void* addr, size_t length);
  // Forgets every entry overlapping the range: deregistered now when idle, else when its last
  // lease ends. Returns how many entries it touched.
  size_t invalidate(const void* addr, size_t length);

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;     // registrations made
    uint64_t evictions = 0;  // idle entries dropped for room
    uint64_t merges = 0;     // idle entries folded into a wider registration
    uint64_t invalidations = 0;
    size_t entries = 0;
    size_t bytes = 0;  // registered now, stale-but-leased entries included
  };
  Stats stats() const;

 private:
  struct Entry;
  void reapLocked();
  void evictLocked(const std::shared_ptr<Entry>& keep);

  RegisterFn register_;
  DeregisterFn deregister_;
  size_t max_bytes_;
  size_t page_;
  mutable std::mutex mutex_;
  std::list<std::shared_ptr<Entry>> entries_;  // most recently used first
  std::list<std::shared_ptr<Entry>> stale_;    // invalidated while leased
  Stats stats_;
};

}  // namespace railshard::transport::links::ibverbs
