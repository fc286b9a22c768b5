// Point-to-point messages and all-to-all (docs/point_to_point.md).
#include <cstring>
#include <numeric>
#include <string>

#include "base/error.h"
#include "core/channels.h"
#include "core/collective_tag.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/shm_engine.h"
#include "core/communicator.h"
#include "core/membership.h"
#include "core/point_to_point.h"

namespace railshard {
namespace {

const char* kindOf(const transport::RequestPtr& request) {
  return request->kind() == transport::Request::Kind::kSend ? "send" : "recv";
}

}  // namespace

PointToPoint& Communicator::pointToPoint() {
  if (!p2p_) p2p_ = std::make_unique<PointToPoint>(channels_->mesh(), rank_, size_);
  return *p2p_;
}

Communicator::P2PRequest Communicator::isend(const void* data, size_t count, DataType dtype,
                                             int peer, uint32_t tag) {
  membership_->checkUsable("send");
  checkTypes("send", dtype, ReduceOp::kSum);
  channels_->mesh().checkHealthy();
  return pointToPoint().isend(data, count, dtype, peer, tag);
}

Communicator::P2PRequest Communicator::irecv(void* data, size_t count, DataType dtype, int peer,
                                             uint32_t tag) {
  membership_->checkUsable("recv");
  checkTypes("recv", dtype, ReduceOp::kSum);
  channels_->mesh().checkHealthy();
  return pointToPoint().irecv(data, count, dtype, peer, tag);
}

void Communicator::wait(const P2PRequest& request, Timeout timeout) {
  if (!request) throw InvalidArgument("railshard wait: the request is null");
  const char* what = kindOf(request);
  const Duration deadline = timeoutFor(what, timeout);
  const Clock::time_point start = Clock::now();
  try {
    pointToPoint().wait(request, deadlineAfter(deadline));
  } catch (const TimeoutError& e) {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    throw TimeoutError(
        "rank " + std::to_string(rank_) + ": " + what +
        (request->kind() == transport::Request::Kind::kSend ? " to rank " : " from rank ") +
        std::to_string(request->peer()) + " (" + describeTag(request->tag()) +
        ") timed out after " + formatSeconds(waited) + " -- " + e.what());
  }
}

std::pair<int, Communicator::P2PRequest> Communicator::irecvAny(void* data, size_t count,
                                                                DataType dtype, uint32_t tag,
                                                                Timeout timeout) {
  membership_->checkUsable("recv");
  checkTypes("recv", dtype, ReduceOp::kSum);
  if (size_ == 1) {
    throw InvalidArgument("railshard recv from any source: this rank is the only one");
  }
  std::vector<int> peers;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) peers.push_back(r);
  }
  const Duration deadline = timeoutFor("recv", timeout);
  const Clock::time_point start = Clock::now();
  const int peer = pointToPoint().awaitArrival(peers, tag, start + deadline);
  if (peer < 0) {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    throw TimeoutError("rank " + std::to_string(rank_) + ": recv from any rank (tag " +
                       std::to_string(tag) + ", " + std::string(name(dtype)) + ", count " +
                       std::to_string(count) + ") timed out after " + formatSeconds(waited) +
                       ": no rank's next message to this one has that tag");
  }
  return {peer, pointToPoint().irecv(data, count, dtype, peer, tag)};
}

void Communicator::send(const void* data, size_t count, DataType dtype, int peer, uint32_t tag,
                        Timeout timeout) {
  wait(isend(data, count, dtype, peer, tag), timeout);
}

void Communicator::recv(void* data, size_t count, DataType dtype, int peer, uint32_t tag,
                        Timeout timeout) {
  wait(irecv(data, count, dtype, peer, tag), timeout);
}

void Communicator::allToAll(const void* send, const std::vector<size_t>& send_counts, void* recv,
                            const std::vector<size_t>& recv_counts, DataType dtype,
                            Timeout timeout) {
  membership_->checkUsable("all_to_all");
  checkTypes("all_to_all", dtype, ReduceOp::kSum);
  const auto n = static_cast<size_t>(size_);
  for (const auto* counts : {&send_counts, &recv_counts}) {
    if (counts->size() != n) {
      throw InvalidArgument(std::string("all_to_all: ") +
                            (counts == &send_counts ? "send_counts" : "recv_counts") + " has " +
                            std::to_string(counts->size()) + " entries, the communicator has " +
                            std::to_string(size_) + " ranks");
    }
  }
  const auto self = static_cast<size_t>(rank_);
  if (send_counts[self] != recv_counts[self]) {
    throw InvalidArgument("all_to_all: rank " + std::to_string(rank_) + " sends " +
                          std::to_string(send_counts[self]) +
                          " element(s) to itself but expects to receive " +
                          std::to_string(recv_counts[self]));
  }
  const size_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
  const size_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
  checkBuffer("all_to_all", "send", send, send_total, dtype);
  checkBuffer("all_to_all", "recv", recv, recv_total, dtype);
  const size_t element = sizeOf(dtype);
  checkDisjoint("all_to_all", send, send_total * element, recv, recv_total * element, false);
  std::vector<size_t> send_displs(n, 0);
  std::vector<size_t> recv_displs(n, 0);
  for (size_t i = 1; i < n; ++i) {
    send_displs[i] = send_displs[i - 1] + send_counts[i - 1];
    recv_displs[i] = recv_displs[i - 1] + recv_counts[i - 1];
  }
  const Duration deadline = timeoutFor("all_to_all", timeout);
  const auto tag = makeTag(CollectiveKind::kAllToAll, sequence_++, dtype, ReduceOp::kSum, 0, 0);
  if (size_ == 1) {
    if (send_total > 0) std::memcpy(recv, send, send_total * element);
    return;
  }
  // One host: through its shared-memory segment (two copies per byte, no sockets). Several
  // hosts: pairwise over the transports (same-host pairs of a multi-host job included).
  if (channels_->oneHost()) {
    run(tag, deadline, send_total * element, "shm", [&](const collectives::Context&) {
      channels_->engine()->allToAll(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                                    dtype, tag);
    });
    return;
  }
  run(
      tag, deadline, send_total * element, "pairwise",
      [&](const collectives::Context& context) {
        collectives::allToAll(context, send, send_counts, send_displs, recv, recv_counts,
                              recv_displs, dtype);
      },
      true);
}

}  // namespace railshard
