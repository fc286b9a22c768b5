// Trace events of the TCP transport (docs/tracing.md): each piece written to a rail (sends and
// receives: traceTransfer in transport.cc). Called only while tracing is on.
#include <string>

#include "base/trace.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

void TcpTransport::traceRailLocked(const Peer& peer, Channel& channel, const Segment& segment) {
  const int rank = trace_rank_.load(std::memory_order_relaxed);
  if (rank < 0) return;
  if (channel.trace_track == 0) {
    channel.trace_track =
        trace::track(rank, channel.name + " to rank " + std::to_string(peer.rank), channel.name);
  }
  trace::Event e;
  e.category = trace::Category::kRail;
  e.name = "send";
  e.rank = rank;
  e.peer = peer.rank;
  e.track = channel.trace_track;
  e.bytes = segment.header.payload_bytes;
  e.begin_ns = segment.trace_begin_ns;
  e.end_ns = trace::now();
  trace::record(e);
}

}  // namespace railshard::transport::tcp
