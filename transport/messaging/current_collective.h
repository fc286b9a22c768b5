#pragma once

#include <mutex>
#include <optional>
#include <string>

#include "transport/message_tag.h"
#include "transport/transport.h"

namespace railshard::transport::messaging {

// The collective this rank's user thread is in (Transport::enterCollective), read by the
// threads that take messages apart: a message of the same collective number that arrives for
// no posted receive with another tag is a MismatchError at once, not a wait for the deadline
// (a rank that skipped a collective would otherwise leave its peers waiting). Thread-safe.
class CurrentCollective {
 public:
  CurrentCollective(int my_rank, const TagFormatter* formatter)
      : my_rank_(my_rank), formatter_(formatter) {}

  void enter(const MessageTag& tag);
  // The mismatch text when `theirs`, from `peer`, is of the current collective's number but
  // another collective; nullopt otherwise (or before the first collective).
  std::optional<std::string> unsolicited(int peer, const MessageTag& theirs) const;

 private:
  int my_rank_;
  const TagFormatter* formatter_;
  mutable std::mutex mutex_;
  MessageTag current_{};
  bool in_collective_ = false;
};

}  // namespace railshard::transport::messaging
