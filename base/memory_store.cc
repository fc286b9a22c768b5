#include "base/memory_store.h"

#include <string>

#include "base/error.h"

namespace railshard {

int64_t decodeCounter(const std::string& key, const Store::Bytes& value) {
  const std::string text(value.begin(), value.end());
  try {
    size_t used = 0;
    const long long parsed = std::stoll(text, &used);
    if (used == text.size()) return parsed;
  } catch (const std::exception&) {
  }
  // Quote at most 64 bytes: the value may be megabytes.
  const std::string shown = text.size() > 64 ? text.substr(0, 64) + "..." : text;
  throw InvalidArgument("store add: key '" + key + "' holds '" + shown + "', not an integer");
}

Store::Bytes encodeCounter(int64_t value) {
  const std::string text = std::to_string(value);
  return Store::Bytes(text.begin(), text.end());
}

void MemoryStore::set(const std::string& key, const Bytes& value, Duration) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

Store::Bytes MemoryStore::get(const std::string& key, Duration timeout) {
  wait({key}, timeout);
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta, Duration) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    const int64_t current = it == data_.end() ? 0 : decodeCounter(key, it->second);
    if (__builtin_add_overflow(current, delta, &result)) {
      throw InvalidArgument("store add: key '" + key + "' holds " + std::to_string(current) +
                            "; adding " + std::to_string(delta) + " overflows 64 bits");
    }
    data_[key] = encodeCounter(result);
  }
  changed_.notify_all();
  return result;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const Deadline deadline = deadlineAfter(timeout);
  std::unique_lock<std::mutex> lock(mutex_);
  for (const auto& key : keys) {
    if (!changed_.wait_until(lock, deadline, [&] { return data_.count(key) > 0; })) {
      throw TimeoutError("store: key '" + key + "' did not appear within " +
                         std::to_string(std::chrono::duration<double>(timeout).count()) + " s");
    }
  }
}

bool MemoryStore::remove(const std::string& key, Duration) {
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.erase(key) > 0;
}

}  // namespace railshard
