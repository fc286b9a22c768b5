#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "base/store.h"

namespace railshard::bench {

// Lets Gloo rendezvous through a railshard Store (the TCP store rank 0 hosts under
// railshard-launch), so the gloo backend needs no Redis, file system or second store.
// Keys get `prefix` so Gloo's names cannot collide with anything else in the store.
//
// Gloo's get() has no timeout and must block until the key exists; it gets `timeout`
// (RAILSHARD_CONNECT_TIMEOUT), so a rank that never shows up is a railshard TimeoutError
// naming the key instead of a hang.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<railshard::Store> store, std::string prefix,
            std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string prefixed(const std::string& key) const { return prefix_ + key; }

  std::shared_ptr<railshard::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace railshard::bench
