#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/config.h"
#include "base/function_ref.h"
#include "base/store.h"
#include "base/types.h"
#include "core/collectives/link_probe.h"
#include "core/collectives/tuner.h"
#include "core/communicator_options.h"
#include "core/device_path.h"
#include "core/tracing/link_limit.h"
#include "transport/message_tag.h"
#include "transport/request.h"

namespace railshard {

namespace transport {
class Transport;
}  // namespace transport
namespace topology {
class Topology;
}
namespace collectives {
class Workspace;
struct Context;
struct HostLayout;
}  // namespace collectives
class Channels;
class Diagnostics;
class Membership;
class Planner;
class PointToPoint;

// A group of ranks that run collectives together. Collectives are blocking and must be called
// in the same order with matching arguments on every rank; every call is checked against the
// other ranks (MismatchError when they disagree) and bounded by Config::timeout.
//
// Buffers are host memory. Out-of-place when send != recv; in-place when send == recv (for
// reduceScatter when send + rank*recv_count == recv, for allgather when
// recv + rank*send_count == send), as in NCCL. One thread at a time per communicator.
class Communicator {
 public:
  // What a communicator is made from (core/communicator_options.h), and how a grown generation
  // agrees on its cluster graph.
  using Options = CommunicatorOptions;
  using GraphRound = railshard::GraphRound;
  using GraphExtender = railshard::GraphExtender;

  // A per-call deadline that replaces Config::timeout (RAILSHARD_TIMEOUT) for one collective.
  using Timeout = std::chrono::milliseconds;
  static constexpr Timeout kDefaultTimeout{-1};

  // Where a call's buffers live and, for device buffers, the CUDA stream it is ordered on
  // (docs/gpu.md). Device collectives are ordered on `stream` as NCCL's are: they start after
  // the work enqueued on it before the call, and work enqueued on it after the call sees the
  // results. The call itself blocks the host until this rank's transfers are done (the last
  // device copies and reductions may still be queued on the stream when it returns). Every
  // buffer of one call must be of the same kind; a host/device mix is an InvalidArgument.
  using Placement = railshard::Placement;

  // Connects to every peer through `store` (address exchange) and returns when the mesh is
  // up. The store must outlive this call only.
  static std::unique_ptr<Communicator> create(Store& store, const Options& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Config& config() const { return config_; }

  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                 Timeout timeout = kDefaultTimeout) {
    allreduce(send, recv, count, dtype, op, Placement{}, timeout);
  }
  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                 const Placement& placement, Timeout timeout = kDefaultTimeout);
  void allreduce(void* buffer, size_t count, DataType dtype, ReduceOp op,
                 Timeout timeout = kDefaultTimeout) {
    allreduce(buffer, buffer, count, dtype, op, timeout);
  }
  // send: size() * recv_count elements; recv: recv_count elements (block rank()).
  void reduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op,
                     Timeout timeout = kDefaultTimeout) {
    reduceScatter(send, recv, recv_count, dtype, op, Placement{}, timeout);
  }
  void reduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op,
                     const Placement& placement, Timeout timeout = kDefaultTimeout);
  // send: send_count elements; recv: size() * send_count elements, rank r's at block r.
  void allgather(const void* send, void* recv, size_t send_count, DataType dtype,
                 Timeout timeout = kDefaultTimeout) {
    allgather(send, recv, send_count, dtype, Placement{}, timeout);
  }
  void allgather(const void* send, void* recv, size_t send_count, DataType dtype,
                 const Placement& placement, Timeout timeout = kDefaultTimeout);
  // `send` is read on the root only; every rank's `recv` receives the root's data.
  void broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                 Timeout timeout = kDefaultTimeout) {
    broadcast(send, recv, count, dtype, root, Placement{}, timeout);
  }
  void broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                 const Placement& placement, Timeout timeout = kDefaultTimeout);
  void broadcast(void* buffer, size_t count, DataType dtype, int root,
                 Timeout timeout = kDefaultTimeout) {
    broadcast(buffer, buffer, count, dtype, root, timeout);
  }
  void barrier(Timeout timeout = kDefaultTimeout);

  // --- point-to-point and all-to-all (docs/point_to_point.md) ---
  //
  // A message carries the caller's `tag`, its element count and dtype; the receive states the
  // same three, and any disagreement is a MismatchError on both ranks before a byte lands.
  // Messages between two ranks match in the order they are posted, in each direction, and
  // share that order with the collectives: two ranks that post a message and a collective in
  // opposite orders get a MismatchError, never mixed data. Host memory only. isend/irecv are
  // posted from the thread that runs the collectives; wait() may be called on any thread.
  // A peer outside the communicator or this rank itself is InvalidArgument.
  using P2PRequest = transport::RequestPtr;
  P2PRequest isend(const void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0);
  P2PRequest irecv(void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0);
  // Blocks until `request` is done: TimeoutError after `timeout` (from this call) naming the
  // peer and the message, PeerLostError when the peer is lost.
  void wait(const P2PRequest& request, Timeout timeout = kDefaultTimeout);
  // A receive from whichever rank's next message to this one is the first with `tag` to
  // arrive: waits for it (TimeoutError after `timeout`), then posts the receive from that
  // rank and returns it with the request. The count and dtype are checked as for irecv.
  std::pair<int, P2PRequest> irecvAny(void* data, size_t count, DataType dtype, uint32_t tag = 0,
                                      Timeout timeout = kDefaultTimeout);
  void send(const void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0,
            Timeout timeout = kDefaultTimeout);
  void recv(void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0,
            Timeout timeout = kDefaultTimeout);
  // Rank r's block of send_counts[r] elements (blocks laid end to end in `send`, in rank
  // order) goes to rank r, which receives it as block `rank()` of `recv`, recv_counts[]
  // likewise. Each pair's sender and receiver must agree on the block's size (MismatchError
  // naming both otherwise); the buffers must not overlap (InvalidArgument).
  void allToAll(const void* send, const std::vector<size_t>& send_counts, void* recv,
                const std::vector<size_t>& recv_counts, DataType dtype,
                Timeout timeout = kDefaultTimeout);

  // Blocks until the work queued on `stream` (cudaStream_t; nullptr = the legacy default
  // stream of `device`, -1 = the current device) so far is done: TimeoutError after `timeout`
  // (default Config::timeout) instead of cudaStreamSynchronize's unbounded wait, and NCCL's
  // asynchronous errors raised (then NCCL is aborted, so that its kernels stop). For callers
  // that must hand results to code outside the stream's order (the PyTorch backend).
  void waitForDevice(void* stream, int device = -1, Timeout timeout = kDefaultTimeout);

  // --- failures and elastic continuation (docs/reliability.md) ---
  //
  // Any failure poisons the communicator on every rank: the collective in flight and every
  // later one raise the error (PeerLostError naming the lost rank, its host, the collective
  // and how long it waited; TimeoutError naming the ranks that never entered the collective).
  //
  // shrink(): collective over the survivors. Every rank that is still alive calls it (after
  // catching the error); they agree through the store on who is left, and each gets a new
  // communicator of the survivors, renumbered 0..n-1 in the order of their ranks here
  // (deterministic: every survivor computes the same numbering). A rank declared lost by the
  // others (it was stopped and resumed, say) gets PeerLostError instead. This communicator is
  // unusable afterwards (InvalidArgument). `timeout` bounds the wait for the other survivors;
  // default Config::timeout.
  std::unique_ptr<Communicator> shrink(Timeout timeout = kDefaultTimeout);
  // grow(): collective over the members, at a step boundary (core/communicator_grow.cc).
  // Every member calls it; they admit every joiner waiting in join() whose job token
  // (Config::token) matches theirs -- a wrong one is refused, with an error at the joiner and
  // a warning here -- and each rank, members and joiners alike, gets the communicator of the
  // new generation: the members first, in their order here, then the joiners in the order
  // they asked. With nobody waiting it is a plain re-form. A member that does not call it is
  // left out as shrink() leaves it out (marked lost, or not arrived by `timeout`). Rank 0 of
  // the new communicator is the first member: the agreed source for handing joiners the
  // current step and state (a broadcast, docs/reliability.md). This communicator is unusable
  // afterwards (InvalidArgument).
  std::unique_ptr<Communicator> grow(Timeout timeout = kDefaultTimeout);
  // The joiner's side of grow(): asks to join the job whose store namespace is
  // options.key_root (or key_prefix), presenting options.config.token, and waits (at most
  // `timeout`) for the members' next grow(). rank, size and world_ranks are ignored; store
  // must be set. TimeoutError when no grow() came (the request is withdrawn: a later grow()
  // does not wait for this process), InvalidArgument when the members refused it.
  static std::unique_ptr<Communicator> join(const Options& options, Timeout timeout);
  // Collective: how many joiners have asked since the last grow() looked (a withdrawn one
  // counts until the next grow()), the same on every rank -- rank 0 reads the store and
  // broadcasts -- so that all members decide alike whether to call grow() this step.
  int joinersWaiting(Timeout timeout = kDefaultTimeout);
  // Fails every pending and later collective of this communicator on every rank; later calls
  // here raise InvalidArgument naming `reason`.
  void abort(const std::string& reason);
  // Launch rank of each member, by rank (identity for the world communicator).
  const std::vector<int>& worldRanks() const;
  int worldRank() const;
  // 0 for the communicator init() made, +1 per shrink() or grow().
  int generation() const;
  // Launch ranks handed out so far (the next joiner gets this one).
  int launchRanks() const;

  // Number of collectives started so far (the sequence number of the next one).
  uint64_t sequence() const { return sequence_; }
  // True when collectives run through shared memory (every rank on this host).
  bool usesSharedMemory() const;
  // True when the ranks span several hosts, some with several ranks, and every such host's
  // ranks share a segment: all-reduces then run in two levels (docs/architecture.md). The
  // same on every rank, also on a rank alone on its host.
  bool usesHostSharedMemory() const;
  // Which ranks share a host (ranks compared by host in the cluster graph and by whether they
  // can map each other's memory); null for one rank.
  const collectives::HostLayout* hostLayout() const;
  // Shared memory's hand-off and copy rate and the reduction kernel's rate, measured at
  // start-up on every host with several ranks (the slowest host's, the same on every rank);
  // zeros when no host has several ranks. The tuner plans with them, and one-host
  // efficiency figures use the copy rate as the limit.
  const collectives::MeasuredLinks& measuredLinks() const;
  // What bounds this communicator's busbw, for efficiency figures (allreduce_perf, the trace
  // report): the ring's slowest hop in the cluster graph (tracing::ringLimit), or on one host
  // whose graph knows no speed the measured copy rate. gbps 0, with the reason, when unknown.
  tracing::LinkLimit linkLimit() const;
  // Name of the algorithm the last all-reduce ran ("ring", "shm_direct", ...).
  std::string_view lastAlgorithm() const;
  // The messengers to the peers, as the collective algorithms see them.
  transport::Transport& transport();
  // The cluster graph this communicator was built with; null when none was given.
  const topology::Topology* topology() const;

  // Host memory the other ranks of this host can map (a memfd region, zeroed). A one-host
  // all-reduce from RAILSHARD_SHM_SINGLE_COPY bytes whose buffers come from here reads them
  // with plain loads, where other buffers are read with process_vm_readv, which pins their
  // pages every time (docs/benchmarks.md). Register once, reuse: as NCCL's user buffers.
  // Error naming errno when the memory cannot be had; freeSharedBuffer: InvalidArgument for
  // anything allocateSharedBuffer did not return.
  static void* allocateSharedBuffer(size_t bytes);
  static void freeSharedBuffer(void* buffer);
  // Keeps `resource` alive as long as this communicator (e.g. the store server rank 0 hosts).
  void keepAlive(std::shared_ptr<void> resource) { resources_.push_back(std::move(resource)); }

 private:
  Communicator(const Options& options, std::unique_ptr<Channels> channels);
  // InvalidArgument when [send, send + send_bytes) and [recv, recv + recv_bytes) share a byte;
  // `in_place_allowed`: send == recv is accepted (the collective's in-place form).
  static void checkDisjoint(const char* collective, const void* send, size_t send_bytes,
                            const void* recv, size_t recv_bytes, bool in_place_allowed);
  void checkBuffer(const char* collective, const char* what, const void* buffer, size_t count,
                   DataType dtype) const;
  void checkTypes(const char* collective, DataType dtype, ReduceOp op) const;
  Duration timeoutFor(const char* collective, Timeout timeout) const;
  // Runs one collective: publishes that this rank entered it, and turns a PeerLostError or
  // TimeoutError into one that names the collective, the lost or missing ranks and the time
  // waited. `bytes` and `algorithm` describe the call in its trace event. over_transport: the
  // collective runs over the messengers even when the host's segment could carry it (device
  // buffers), so the messengers check its header on entry.
  void run(const transport::MessageTag& tag, Duration timeout, size_t bytes, const char* algorithm,
           FunctionRef<void(const collectives::Context&)> fn, bool over_transport = false);
  // What a device collective needs of this communicator.
  DevicePath::Call deviceCall();
  PointToPoint& pointToPoint();
  // shrink() and grow() (`by`): retires this generation for this rank (nothing more is
  // published, the group's links stop) and returns the round's timeout.
  Duration retire(const char* by, Timeout timeout);

  int rank_;
  int size_;
  Config config_;
  // Device collectives' staging buffers. Before the channels, so that they are freed after
  // them: after a failed collective, receives may still be posted into their pinned memory.
  std::unique_ptr<DevicePath> device_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<Channels> channels_;
  std::unique_ptr<Planner> planner_;
  std::unique_ptr<Diagnostics> diagnostics_;  // after what it reads
  std::unique_ptr<PointToPoint> p2p_;         // made at the first message
  std::unique_ptr<collectives::Workspace> workspace_;
  uint64_t sequence_ = 0;
  std::vector<std::shared_ptr<void>> resources_;
};

}  // namespace railshard
