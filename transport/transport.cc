#include "transport/transport.h"

#include "base/trace.h"

namespace railshard::transport {

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
