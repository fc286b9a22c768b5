// Trace events of the RDMA transport (docs/tracing.md): each piece from posting to its
// acknowledgement ("rdma_write"; "rdma_read" for a rendezvous read, on the reading rank), on
// one track per lane (rail and peer), and each send or receive from
// posting to completion. Called only while tracing is on.
#include <string>

#include "base/trace.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

void IbverbsTransport::traceRailLocked(Lane& lane, size_t bytes, int64_t begin_ns,
                                       const char* name) {
  const int rank = trace_rank_.load(std::memory_order_relaxed);
  if (rank < 0) return;
  if (lane.trace_track == 0) {
    const Rail& rail = *rails_[static_cast<size_t>(lane.rail)];
    const std::string port = rail.port.device + ":" + std::to_string(rail.port.port);
    lane.trace_track = trace::track(rank, port + " to rank " + std::to_string(lane.peer), port);
  }
  trace::Event e;
  e.category = trace::Category::kRail;
  e.name = name;
  e.rank = rank;
  e.peer = lane.peer;
  e.track = lane.trace_track;
  e.bytes = bytes;
  e.begin_ns = begin_ns;
  e.end_ns = trace::now();
  trace::record(e);
}

}  // namespace railshard::transport::ibverbs
