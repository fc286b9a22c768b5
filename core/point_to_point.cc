#include "core/point_to_point.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "core/collective_tag.h"

namespace railshard {
namespace {

// Point-to-point sequence numbers have the top bit set: a collective's number never reaches
// it, so the transport's check of unsolicited messages against the collective in progress
// (same sequence = same collective) never mistakes one for the other.
constexpr uint64_t kPointToPointBit = uint64_t{1} << 63;

}  // namespace

PointToPoint::PointToPoint(transport::Transport& transport, int rank, int size)
    : transport_(transport),
      rank_(rank),
      size_(size),
      sent_(static_cast<size_t>(size), 0),
      received_(static_cast<size_t>(size), 0) {}

bool PointToPoint::isPointToPoint(const transport::MessageTag& tag) {
  return tag.collective == static_cast<uint8_t>(CollectiveKind::kPointToPoint) &&
         (tag.sequence & kPointToPointBit) != 0;
}

transport::MessageTag PointToPoint::makeTag(uint64_t number, size_t count, DataType dtype,
                                            uint32_t tag) {
  return railshard::makeTag(CollectiveKind::kPointToPoint, kPointToPointBit | number, dtype,
                            ReduceOp::kSum, count, tag);
}

void PointToPoint::check(const char* what, const void* data, size_t count, int peer) const {
  if (peer < 0 || peer >= size_) {
    throw InvalidArgument(std::string("railshard ") + what + ": peer " + std::to_string(peer) +
                          " is not a rank of this communicator (size " + std::to_string(size_) +
                          ")");
  }
  if (peer == rank_) {
    throw InvalidArgument(std::string("railshard ") + what + ": peer " + std::to_string(peer) +
                          " is this rank itself (" + what + " needs another rank)");
  }
  if (data == nullptr && count > 0) {
    throw InvalidArgument(std::string("railshard ") + what + ": buffer is null for " +
                          std::to_string(count) + " element(s)");
  }
}

transport::RequestPtr PointToPoint::isend(const void* data, size_t count, DataType dtype, int peer,
                                          uint32_t tag) {
  check("send", data, count, peer);
  const auto message = makeTag(sent_[static_cast<size_t>(peer)], count, dtype, tag);
  auto request = transport_.isend(peer, data, count * sizeOf(dtype), message);
  ++sent_[static_cast<size_t>(peer)];
  return request;
}

transport::RequestPtr PointToPoint::irecv(void* data, size_t count, DataType dtype, int peer,
                                          uint32_t tag) {
  check("recv", data, count, peer);
  const auto message = makeTag(received_[static_cast<size_t>(peer)], count, dtype, tag);
  auto request = transport_.irecv(peer, data, count * sizeOf(dtype), message);
  ++received_[static_cast<size_t>(peer)];
  return request;
}

int PointToPoint::awaitArrival(const std::vector<int>& peers, uint32_t tag, Deadline deadline) {
  auto accept = [tag](const transport::MessageTag& next) {
    return isPointToPoint(next) && next.root == tag;
  };
  return transport_.awaitArrival(peers, accept, deadline);
}

}  // namespace railshard
