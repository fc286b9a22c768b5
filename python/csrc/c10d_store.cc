#include "python/csrc/c10d_store.h"

#include <chrono>

#include "base/error.h"

namespace railshard::python {
namespace {

std::chrono::milliseconds toMillis(Duration timeout) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "" : ", ") + key;
  return out;
}

// c10::Error's what() carries a C++ backtrace; people need the first line.
std::string textOf(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

// c10d raises c10::Error (DistStoreError in 2.x) for a timeout and for a lost store alike, and
// std::system_error when the store's connection breaks; everything leaves as a railshard
// error (the communicator's background threads catch only those). The text tells a human
// which it was; a wait that failed is reported as a timeout.
[[noreturn]] void rethrowWaitFailure(const std::string& what, Duration timeout,
                                     const std::exception& e) {
  throw TimeoutError("c10d store: waited " +
                     std::to_string(std::chrono::duration<double>(timeout).count()) + " s for " +
                     what + ": " + textOf(e));
}

// A zero timeout asks whether keys are there, without waiting: c10d's check() answers at once,
// where a wait of even 1 ms is rounded up to whole seconds by torch's FileStore (the
// who-is-missing look at a timeout then took a second per missing rank with file://).
[[noreturn]] void notThere(const std::string& what) {
  throw TimeoutError("c10d store: " + what + " is not set");
}

}  // namespace

void C10dStore::set(const std::string& key, const Bytes& value, Duration /*timeout*/) {
  std::lock_guard lock(mutex_);
  try {
    store_->set(key, value);
  } catch (const std::exception& e) {
    throw PeerLostError("c10d store: set of key '" + key + "' failed: " + textOf(e));
  }
}

Store::Bytes C10dStore::get(const std::string& key, Duration timeout) {
  std::lock_guard lock(mutex_);
  try {
    if (timeout <= Duration::zero()) {
      if (!store_->check({key})) notThere("key '" + key + "'");
    } else {
      store_->wait({key}, toMillis(timeout));
    }
    return store_->get(key);
  } catch (const TimeoutError&) {
    throw;
  } catch (const std::exception& e) {
    rethrowWaitFailure("key '" + key + "'", timeout, e);
  }
}

int64_t C10dStore::add(const std::string& key, int64_t delta, Duration /*timeout*/) {
  std::lock_guard lock(mutex_);
  try {
    return store_->add(key, delta);
  } catch (const std::exception& e) {
    throw PeerLostError("c10d store: add to key '" + key + "' failed: " + textOf(e));
  }
}

void C10dStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::lock_guard lock(mutex_);
  try {
    if (timeout <= Duration::zero()) {
      if (!store_->check(keys)) notThere("keys " + joinKeys(keys));
      return;
    }
    store_->wait(keys, toMillis(timeout));
  } catch (const TimeoutError&) {
    throw;
  } catch (const std::exception& e) {
    rethrowWaitFailure("keys " + joinKeys(keys), timeout, e);
  }
}

bool C10dStore::remove(const std::string& key, Duration /*timeout*/) {
  std::lock_guard lock(mutex_);
  try {
    return store_->deleteKey(key);
  } catch (const std::exception& e) {
    throw PeerLostError("c10d store: removing key '" + key + "' failed: " + textOf(e));
  }
}

}  // namespace railshard::python
