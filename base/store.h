#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/clock.h"

namespace railshard {

// Key/value rendezvous used at start-up (address exchange) and when re-forming after a
// failure. Never on the data path. Every call that can block takes a timeout and raises
// TimeoutError naming the key(s) it waited for.
class Store {
 public:
  using Bytes = std::vector<uint8_t>;
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value, Duration timeout) = 0;
  // Waits until `key` exists, then returns its value.
  virtual Bytes get(const std::string& key, Duration timeout) = 0;
  // Atomically adds `delta` to the integer stored at `key` (0 when absent); returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta, Duration timeout) = 0;
  // Waits until every key exists.
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  // Removes `key`; returns whether it existed.
  virtual bool remove(const std::string& key, Duration timeout) = 0;

  // Convenience for string values.
  void setString(const std::string& key, const std::string& value, Duration timeout) {
    set(key, Bytes(value.begin(), value.end()), timeout);
  }
  std::string getString(const std::string& key, Duration timeout) {
    const Bytes value = get(key, timeout);
    return std::string(value.begin(), value.end());
  }
};

}  // namespace railshard
