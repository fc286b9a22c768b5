#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/error.h"
#include "transport/message_tag.h"
#include "transport/request.h"

namespace railshard::transport {

// Turns tags into words for error messages ("allreduce #12 (float sum, count 1000)"), and
// explains a disagreement between two ranks' tags. Supplied by the layer that knows what the
// tag fields mean (core); the transport only compares them.
struct TagFormatter {
  std::function<std::string(const MessageTag&)> describe;
  std::function<std::string(int my_rank, const MessageTag& mine, int peer,
                            const MessageTag& theirs)>
      mismatch;
};

// The same collective, whatever the algorithm step.
inline bool sameCollective(const MessageTag& a, const MessageTag& b) {
  return a.sequence == b.sequence && a.count == b.count && a.root == b.root &&
         a.collective == b.collective && a.dtype == b.dtype && a.op == b.op;
}

// The trace event of one send or receive from posting to now (docs/tracing.md), in world rank
// `trace_rank`'s process; nothing when it is < 0 or the request was posted with tracing off.
void traceTransfer(const Request& request, int trace_rank);

// One connection (rail, socket) to one peer, as the rail scheduler sees it now.
struct RailStatus {
  int peer = -1;
  std::string name;    // "rail0" (local interface), "rail0#1" for a rail's second socket
  std::string local;   // local address, "" for the default connection
  std::string remote;  // peer's address
  bool up = true;
  double gbps = 0;          // current estimate (Gbit/s of payload)
  double fraction = 0;      // share of a large message it gets now (0 when down)
  uint64_t bytes_sent = 0;  // payload bytes handed to this connection so far
  // Of those, moved in place by the RDMA rendezvous (read from the peer's buffer, or written
  // into it: counted on the rank that posted the reads or writes), not through staging.
  uint64_t bytes_in_place = 0;
  std::string down_reason;  // why it is out, when !up
  // Times it was taken out. A look at `up` misses an outage that began and ended (re-admitted)
  // between two looks; this counts it.
  uint64_t outages = 0;
};

// A peer this rank no longer counts on: its connection ended without a goodbye, it fell
// silent past the heartbeat timeout, or another rank reported it lost.
struct LostPeer {
  int rank = -1;
  std::string reason;
};

// Point-to-point messaging between the ranks of one communicator. Messages between a pair of
// ranks are matched in the order they are posted (FIFO per direction), which is all the
// deterministic collective algorithms need. Every blocking call has a deadline. After any
// fatal error the transport is poisoned: every pending and later call raises that error.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // Starts sending `bytes` from `data` to `peer`; `data` must stay valid until completion.
  virtual RequestPtr isend(int peer, const void* data, size_t bytes, const MessageTag& tag) = 0;
  // Starts receiving exactly `bytes` into `data` from `peer`. The peer's message must carry
  // the same tag and size, else MismatchError on both sides.
  virtual RequestPtr irecv(int peer, void* data, size_t bytes, const MessageTag& tag) = 0;
  // Blocks until `request` completes. Raises TimeoutError at `deadline` (naming the peer and
  // the tag), or the error that poisoned the transport.
  virtual void wait(const RequestPtr& request, Deadline deadline) = 0;

  // Poisons the transport with `error`; when `tell_peers`, sends it to every peer so that
  // they fail fast with the same message instead of waiting for their deadlines.
  virtual void abort(std::exception_ptr error, bool tell_peers) = 0;
  // Throws the poisoning error if any.
  virtual void checkHealthy() const = 0;

  // Every connection to every peer with its rail scheduler state; empty for transports
  // without rails.
  virtual std::vector<RailStatus> rails() const { return {}; }

  // Called when a wait times out, before the error is raised and sent to the peers: says
  // who is missing from the collective of `tag` (the layer that knows who entered what).
  virtual void setTimeoutExplainer(std::function<std::string(const MessageTag&)> explain) {
    (void)explain;
  }

  // The caller starts the collective of `tag` (step 0): a message of the same collective
  // number that arrives for no posted receive, with a different tag, is then a MismatchError
  // at once (a rank that skipped a collective would otherwise leave its peers waiting for
  // their deadline). Raises that error, or the poisoning one.
  virtual void enterCollective(const MessageTag& tag) { (void)tag; }

  // Called (from any thread) once, when the transport is poisoned, with the error: lets the
  // layer above wake waits the transport does not own (shared-memory collectives) at once.
  // Null clears it; it is not called after that returns.
  virtual void setFailureListener(std::function<void(ErrorKind, const std::string&)> listener) {
    (void)listener;
  }

  // Trace events of this transport (rail transfers, sends and receives) belong to this world
  // rank's process in the trace (docs/tracing.md).
  virtual void setTraceRank(int world_rank) { (void)world_rank; }

  // The peers found or reported lost so far, first one first.
  virtual std::vector<LostPeer> lostPeers() const { return {}; }

  // For a receive from any source: the first of `peers` whose next message (the one the next
  // irecv from it would match) has begun to arrive and whose tag `accept` takes. Blocks until
  // there is one; -1 at `deadline`; the poisoning error if any. `accept` runs under the
  // transport's locks and must not call back into it. Transports that cannot look ahead
  // raise InvalidArgument (the default).
  virtual int awaitArrival(const std::vector<int>& peers,
                           const std::function<bool(const MessageTag&)>& accept,
                           Deadline deadline) {
    (void)peers;
    (void)accept;
    (void)deadline;
    throw InvalidArgument("the " + name() + " transport cannot receive from any source");
  }
};

}  // namespace railshard::transport
