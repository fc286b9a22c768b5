#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "base/store.h"

namespace railshard {

// In-process Store for ranks that are threads of one process (tests, simulations).
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value, Duration timeout) override;
  Bytes get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta, Duration timeout) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool remove(const std::string& key, Duration timeout) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
};

// The integer encoding add() uses, shared by every Store implementation: decimal text, so a
// value set by hand ("7") can be added to.
int64_t decodeCounter(const std::string& key, const Store::Bytes& value);
Store::Bytes encodeCounter(int64_t value);

}  // namespace railshard
