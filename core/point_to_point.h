#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/clock.h"
#include "base/types.h"
#include "transport/message_tag.h"
#include "transport/request.h"
#include "transport/transport.h"

namespace railshard {

// Point-to-point messages of one communicator (docs/point_to_point.md): sends and receives
// with a caller's tag, numbered per pair and direction apart from the collectives, so that
// two ranks exchanging messages never disturb the collective numbering the others count.
//
// Each message's tag carries the caller's tag, the element count and dtype; the receiver
// states the same and the transport compares them before a byte lands, so a disagreement is a
// MismatchError naming both sides, never a silently truncated or reinterpreted buffer.
// Messages between two ranks match in the order they were posted, in each direction (MPI's
// non-overtaking rule, without matching by tag out of order). Posting is one thread at a
// time, like the collectives; waiting may happen on any thread.
class PointToPoint {
 public:
  // Every pair's messages go through its messenger (a shared-memory channel inside a host).
  PointToPoint(transport::Transport& transport, int rank, int size);

  // InvalidArgument for a peer outside 0..size-1 or this rank itself, and for a null buffer
  // with count > 0 (named `what`: "send", "recv").
  transport::RequestPtr isend(const void* data, size_t count, DataType dtype, int peer,
                              uint32_t tag);
  transport::RequestPtr irecv(void* data, size_t count, DataType dtype, int peer, uint32_t tag);
  void wait(const transport::RequestPtr& request, Deadline deadline) {
    transport_.wait(request, deadline);
  }
  // The first of `peers` whose next message to this rank has begun to arrive with the caller's
  // `tag`, or -1 at the deadline.
  int awaitArrival(const std::vector<int>& peers, uint32_t tag, Deadline deadline);

  // True for the tags isend/irecv make (their sequence is of a space of its own).
  static bool isPointToPoint(const transport::MessageTag& tag);
  // The tag of the n-th message (from 0) of one direction of a pair.
  static transport::MessageTag makeTag(uint64_t number, size_t count, DataType dtype, uint32_t tag);

 private:
  // The InvalidArguments above.
  void check(const char* what, const void* data, size_t count, int peer) const;

  transport::Transport& transport_;
  int rank_;
  int size_;
  std::vector<uint64_t> sent_;      // messages posted to each peer so far
  std::vector<uint64_t> received_;  // receives posted from each peer so far
};

}  // namespace railshard
