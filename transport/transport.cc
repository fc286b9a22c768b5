#include "transport/transport.h"

#include "core/base/trace.h"

namespace railshard::transport {

std::optional<std::string> unsolicitedMismatch(const TagFormatter& formatter, int my_rank,
                                               bool in_collective, const MessageTag& current,
                                               int peer, const MessageTag& theirs) {
  if (!in_collective || theirs.sequence != current.sequence || sameCollective(theirs, current)) {
    return std::nullopt;
  }
  return formatter.mismatch
             ? formatter.mismatch(my_rank, current, peer, theirs)
             : "rank " + std::to_string(peer) + " sent a message of another collective";
}

void traceTransfer(const Request& request, int trace_rank) {
  if (trace_rank < 0 || request.postedNs() == 0) return;
  trace::Event e;
  e.category = trace::Category::kTransfer;
  e.name = request.kind() == Request::Kind::kSend ? "send" : "recv";
  e.rank = trace_rank;
  e.peer = request.peer();
  e.bytes = request.bytes();
  e.seq = request.tag().sequence;
  e.begin_ns = request.postedNs();
  e.end_ns = trace::now();
  trace::record(e);
}

}  // namespace railshard::transport
