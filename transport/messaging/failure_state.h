#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "transport/transport.h"

namespace railshard::transport::messaging {

class Wake;

// The one error state of a group of ranks (a communicator): abort, poisoning, lost peers. Any
// failure — a mismatch a messenger found, a lost peer, a timeout, an abort a peer sent, the
// application's abort — fails the whole group: every pending and later request raises the
// first error, and (tell_peers) every peer is told so that it fails at once too instead of at
// its deadline. Thread-safe.
class FailureState {
 public:
  // What runs when the group fails: once, in the failing thread, before the failure is
  // published, so that no user buffer is touched once anyone can learn of the failure (and
  // free the buffers of the collective that failed). Each messenger detaches user memory and
  // sends the abort on; the host's segment is aborted. `lost_rank`: the first peer found lost,
  // -1 when none.
  using Hook = std::function<void(ErrorKind kind, const std::string& message, int lost_rank,
                                  bool tell_peers)>;

  explicit FailureState(int rank) : rank_(rank) {}

  // Returns an id for removeHook, which returns once no call into the hook runs. Hooks must
  // not add or remove hooks.
  int addHook(Hook hook);
  void removeHook(int id);
  // A thread that writes user memory outside every messenger's lock (a TCP link's reader)
  // says, through `quiesced`, once it has seen the failure: rethrow() waits for that (bounded),
  // because the caller frees the failed collective's buffers as soon as it has the error.
  int addQuiescer(std::function<bool()> quiesced);
  void removeQuiescer(int id);
  // Waiters sleep on `wake`; a failure bumps it (set at set-up).
  void setWake(Wake* wake) { wake_ = wake; }

  // The first caller's error wins. Returns only once the failure is published, whichever
  // thread raised it (the one that claimed it may re-enter from a hook), so that a failed()
  // or rethrow() after it always sees it.
  void fail(std::exception_ptr error, bool tell_peers);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  void check() const {
    if (failed()) rethrow();
  }
  [[noreturn]] void rethrow() const;
  // Closing: a failure now (a peer leaving while this rank leaves) is neither logged nor told.
  void setClosing() { closing_.store(true); }
  bool closing() const { return closing_.load(); }

  // A peer this rank no longer counts on (first one first); this rank itself is never listed.
  void recordLost(int rank, const std::string& reason);
  std::vector<LostPeer> lostPeers() const;

  // Tests: runs in the thread that starts failing the group, after it claimed the failure and
  // before the failure is published, so that a test can hold that window open.
  void setFailHookForTesting(std::function<void()> hook) { fail_hook_ = std::move(hook); }

 private:
  int rank_;
  Wake* wake_ = nullptr;
  std::atomic<bool> closing_{false};
  mutable std::mutex mutex_;
  std::condition_variable published_;
  bool failing_ = false;            // guarded by mutex_
  std::thread::id failing_thread_;  // guarded by mutex_
  std::exception_ptr error_;        // guarded by mutex_
  std::vector<LostPeer> lost_;      // guarded by mutex_
  std::atomic<bool> failed_{false};
  mutable std::mutex hooks_mutex_;
  std::map<int, Hook> hooks_;
  std::map<int, std::function<bool()>> quiescers_;
  int next_id_ = 1;
  std::function<void()> fail_hook_;
};

}  // namespace railshard::transport::messaging
