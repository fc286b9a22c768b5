#include "transport/messaging/failure_state.h"

#include "base/logging.h"
#include "transport/messaging/waiter.h"

namespace railshard::transport::messaging {

int FailureState::addHook(Hook hook) {
  std::lock_guard<std::mutex> lock(hooks_mutex_);
  hooks_.emplace(next_id_, std::move(hook));
  return next_id_++;
}

void FailureState::removeHook(int id) {
  std::lock_guard<std::mutex> lock(hooks_mutex_);
  hooks_.erase(id);
}

int FailureState::addQuiescer(std::function<bool()> quiesced) {
  std::lock_guard<std::mutex> lock(hooks_mutex_);
  quiescers_.emplace(next_id_, std::move(quiesced));
  return next_id_++;
}

void FailureState::removeQuiescer(int id) {
  std::lock_guard<std::mutex> lock(hooks_mutex_);
  quiescers_.erase(id);
}

void FailureState::fail(std::exception_ptr error, bool tell_peers) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (failing_) {
      // Another thread claimed the failure and is still detaching user memory and telling the
      // peers; failed_ is not set yet. Return only once it is: returning now would let a wait
      // that ran into its deadline return as if its receive had completed, and the collective
      // reduce a buffer that was never filled. (The thread that claimed the failure may
      // re-enter from a hook, and must not wait for itself.)
      if (failing_thread_ != std::this_thread::get_id()) {
        published_.wait(lock, [&] { return failed_.load(); });
      }
      return;
    }
    failing_ = true;
    failing_thread_ = std::this_thread::get_id();
    error_ = error;
  }
  if (fail_hook_) fail_hook_();
  ErrorKind kind = ErrorKind::kGeneric;
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    kind = kindOf(e);
    message = e.what();
  }
  int lost_rank = -1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!lost_.empty()) lost_rank = lost_.front().rank;
  }
  const bool tell = tell_peers && !closing_.load();
  {
    std::lock_guard<std::mutex> lock(hooks_mutex_);
    for (auto& [id, hook] : hooks_) hook(kind, message, lost_rank, tell);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_.store(true, std::memory_order_release);
  }
  published_.notify_all();
  if (wake_ != nullptr) wake_->bump();
  // A failure this rank tells its peers about is news. One it keeps to itself is the group
  // being retired by shrink() or grow() while everyone re-forms: not an error.
  if (!closing_.load()) {
    if (tell_peers) {
      RS_LOG_ERROR("{}", message);
    } else {
      RS_LOG_DEBUG("{}", message);
    }
  }
}

void FailureState::rethrow() const {
  // A link's reader may be in the middle of copying into a buffer of the failed collective;
  // the caller frees that buffer as soon as we throw.
  const Deadline until = deadlineAfter(std::chrono::seconds(5));
  auto quiet = [&] {
    std::lock_guard<std::mutex> lock(hooks_mutex_);
    for (const auto& [id, quiesced] : quiescers_) {
      if (!quiesced()) return false;
    }
    return true;
  };
  while (!quiet() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_) throw Error("rank " + std::to_string(rank_) + ": the group failed without an error");
  std::rethrow_exception(error_);
}

void FailureState::recordLost(int rank, const std::string& reason) {
  if (rank == rank_) return;  // the others wrote this rank off: its own error says so
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& lost : lost_) {
    if (lost.rank == rank) return;
  }
  lost_.push_back(LostPeer{rank, reason});
}

std::vector<LostPeer> FailureState::lostPeers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_;
}

}  // namespace railshard::transport::messaging
