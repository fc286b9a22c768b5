#include "transport/links/ibverbs/registration_cache.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace railshard::transport::links::ibverbs {

// The lease handed out aliases the entry's Registration, so use_count() > 1 means "in use".
struct RegistrationCache::Entry {
  Registration registration;
  uintptr_t end() const { return registration.start + registration.length; }
};

RegistrationCache::RegistrationCache(RegisterFn register_fn, DeregisterFn deregister_fn,
                                     size_t max_bytes, size_t page_bytes)
    : register_(std::move(register_fn)),
      deregister_(std::move(deregister_fn)),
      max_bytes_(max_bytes),
      page_(page_bytes == 0 ? 4096 : page_bytes) {}

RegistrationCache::~RegistrationCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& e : entries_) deregister_(e->registration);
  for (auto& e : stale_) deregister_(e->registration);
}

RegistrationCache::Lease RegistrationCache::acquire(const void* addr, size_t length) {
  if (addr == nullptr || length == 0) {
    throw InvalidArgument("registration cache: cannot register " + std::to_string(length) +
                          " bytes at " + (addr == nullptr ? "null" : "an address"));
  }
  const auto begin = reinterpret_cast<uintptr_t>(addr);
  uintptr_t start = begin / page_ * page_;
  uintptr_t end = (begin + length + page_ - 1) / page_ * page_;
  std::lock_guard<std::mutex> lock(mutex_);
  reapLocked();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const auto& e = *it;
    if (e->registration.start <= begin && begin + length <= e->end()) {
      ++stats_.hits;
      entries_.splice(entries_.begin(), entries_, it);  // most recently used
      return Lease(e, &e->registration);
    }
  }
  // Fold idle overlapping (or touching) entries into one wider registration.
  for (auto it = entries_.begin(); it != entries_.end();) {
    const auto& e = *it;
    const bool overlaps = e->registration.start <= end && start <= e->end();
    if (overlaps && e.use_count() == 1) {
      start = std::min(start, e->registration.start);
      end = std::max(end, e->end());
      deregister_(e->registration);
      stats_.bytes -= e->registration.length;
      ++stats_.merges;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  auto entry = std::make_shared<Entry>();
  entry->registration = register_(start, end - start);
  ++stats_.misses;
  stats_.bytes += entry->registration.length;
  entries_.push_front(entry);
  Lease lease(entry, &entry->registration);
  evictLocked(entry);
  stats_.entries = entries_.size();
  return lease;
}

size_t RegistrationCache::invalidate(const void* addr, size_t length) {
  const auto start = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t end = start + length;
  std::lock_guard<std::mutex> lock(mutex_);
  size_t touched = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const auto& e = *it;
    if (e->registration.start < end && start < e->end()) {
      ++touched;
      ++stats_.invalidations;
      if (e.use_count() == 1) {
        deregister_(e->registration);
        stats_.bytes -= e->registration.length;
      } else {
        stale_.push_back(e);
      }
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  reapLocked();
  stats_.entries = entries_.size();
  return touched;
}

RegistrationCache::Stats RegistrationCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void RegistrationCache::reapLocked() {
  for (auto it = stale_.begin(); it != stale_.end();) {
    if (it->use_count() == 1) {
      deregister_((*it)->registration);
      stats_.bytes -= (*it)->registration.length;
      it = stale_.erase(it);
    } else {
      ++it;
    }
  }
}

void RegistrationCache::evictLocked(const std::shared_ptr<Entry>& keep) {
  // From the least recently used end, idle entries only.
  for (auto it = entries_.end(); stats_.bytes > max_bytes_ && it != entries_.begin();) {
    --it;
    if (*it == keep || it->use_count() > 1) continue;
    deregister_((*it)->registration);
    stats_.bytes -= (*it)->registration.length;
    ++stats_.evictions;
    it = entries_.erase(it);
  }
}

}  // namespace railshard::transport::links::ibverbs
