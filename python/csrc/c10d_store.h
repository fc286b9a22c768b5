#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "base/store.h"
#include "python/csrc/torch_compat.h"

namespace railshard::python {

// railshard's Store on top of the c10d::Store PyTorch hands a backend's creator (a PrefixStore
// over the TCPStore of env://, tcp:// or torchrun), so the backend rendezvouses wherever
// torch.distributed did and needs no second bootstrap. c10d errors (a wait that timed out, a
// store that went away) become railshard errors naming the keys.
class C10dStore : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const Bytes& value, Duration timeout) override;
  Bytes get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta, Duration timeout) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool remove(const std::string& key, Duration timeout) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  // One request at a time: the communicator's position publisher thread shares the client
  // with the collective path, and c10d clients are not documented as thread-safe.
  std::mutex mutex_;
};

}  // namespace railshard::python
