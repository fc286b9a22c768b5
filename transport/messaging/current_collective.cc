#include "transport/messaging/current_collective.h"

namespace railshard::transport::messaging {

void CurrentCollective::enter(const MessageTag& tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_ = tag;
  in_collective_ = true;
}

std::optional<std::string> CurrentCollective::unsolicited(int peer,
                                                          const MessageTag& theirs) const {
  MessageTag current;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!in_collective_) return std::nullopt;
    current = current_;
  }
  if (theirs.sequence != current.sequence || sameCollective(theirs, current)) return std::nullopt;
  return formatter_ != nullptr && formatter_->mismatch
             ? formatter_->mismatch(my_rank_, current, peer, theirs)
             : "rank " + std::to_string(peer) + " sent a message of another collective";
}

}  // namespace railshard::transport::messaging
