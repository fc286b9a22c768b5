#include "transport/links/shm/shared_pool.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "transport/links/shm/shared_buffers.h"

namespace railshard::transport::links::shm {

SharedPool::~SharedPool() {
  releaseKept();
}

void* SharedPool::take(size_t bytes) {
  if (bytes == 0) throw InvalidArgument("SharedPool::take: 0 bytes");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t rounded = (bytes + page - 1) / page * page;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.taken;
    const auto it = kept_.lower_bound(rounded);
    if (it != kept_.end() && it->first <= rounded + rounded / 4) {
      void* address = it->second;
      const size_t size = it->first;
      kept_.erase(it);
      stats_.kept_bytes -= size;
      --stats_.kept_regions;
      ++stats_.reused;
      markLive(address, size);
      return address;
    }
  }
  // Outside the lock: allocateShared takes the region registry's lock, and fork handlers take
  // both (shared_buffers.cc), so this lock is never held while waiting for that one.
  void* address = allocateShared(rounded);
  const std::lock_guard<std::mutex> lock(mutex_);
  markLive(address, rounded);
  return address;
}

void SharedPool::markLive(void* address, size_t size) {
  live_[address] = size;
  stats_.live_bytes += size;
  ++stats_.live_regions;
  stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
}

void SharedPool::give(void* address) {
  bool release = false;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = live_.find(address);
    if (it == live_.end()) {
      throw InvalidArgument(
          "SharedPool::give: " + std::to_string(reinterpret_cast<uintptr_t>(address)) +
          " is not a region this pool handed out");
    }
    const size_t size = it->second;
    live_.erase(it);
    stats_.live_bytes -= size;
    --stats_.live_regions;
    release = stats_.kept_bytes + size > stats_.peak_live_bytes;
    if (!release) {
      kept_.emplace(size, address);
      stats_.kept_bytes += size;
      ++stats_.kept_regions;
    }
  }
  if (release) releaseShared(address);
}

void SharedPool::releaseKept() {
  std::vector<void*> released;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [size, address] : kept_) released.push_back(address);
    kept_.clear();
    stats_.kept_bytes = 0;
    stats_.kept_regions = 0;
  }
  for (void* address : released) releaseShared(address);
}

bool SharedPool::owns(const void* address) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return live_.count(address) != 0;
}

SharedPool::Stats SharedPool::stats() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace railshard::transport::links::shm
