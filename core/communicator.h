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
#include "base/store.h"
#include "base/types.h"
#include "core/collectives/link_probe.h"
#include "core/collectives/tuner.h"
#include "core/tracing/link_limit.h"
#include "transport/message_tag.h"
#include "transport/request.h"

namespace railshard {

namespace transport {
class Transport;
struct LostPeer;
}  // namespace transport
namespace topology {
class Topology;
}
namespace collectives {
class Workspace;
class ShmEngine;
struct Context;
struct HostLayout;
class CudaDeviceOps;
}  // namespace collectives
class HierarchicalAllreduce;
class PointToPoint;
class ShmMessages;
class ProgressPublisher;

// A group of ranks that run collectives together. Collectives are blocking and must be called
// in the same order with matching arguments on every rank; every call is checked against the
// other ranks (MismatchError when they disagree) and bounded by Config::timeout.
//
// Buffers are host memory. Out-of-place when send != recv; in-place when send == recv (for
// reduceScatter when send + rank*recv_count == recv, for allgather when
// recv + rank*send_count == send), as in NCCL. One thread at a time per communicator.
class Communicator {
 public:
  // A generation that admits joiners agrees on a cluster graph extended by their hosts: the
  // members know the cluster, each joiner only its own host. Discovery and the graph's
  // exchange live in the launcher, above this layer, so the communicator is handed a function
  // that does it (launcher::graphExtender(); init() and the torch backend set it). It runs on
  // every rank of the new generation and returns the graph all of them agreed on.
  struct GraphRound {
    std::string key_prefix;  // the new generation's store namespace
    int rank = 0;            // in the new generation
    int size = 0;
    int members = 0;  // ranks 0..members-1 were members before, the rest joined
    // Members: the cluster graph with the members placed as ranks 0..members-1; joiners: null.
    std::shared_ptr<const topology::Topology> known;
  };
  using GraphExtender =
      std::function<std::shared_ptr<const topology::Topology>(Store&, const GraphRound&)>;

  struct Options {
    int rank = 0;
    int size = 1;
    Config config;
    std::string key_prefix = "railshard";  // store namespace, distinct per communicator
    std::string advertise_host;            // address peers reach this rank at; "" = loopback
    // The cluster graph (launcher::buildClusterTopology); when set, it decides which ranks
    // share a host. Null: ranks compare host identities through the store.
    std::shared_ptr<const topology::Topology> topology;
    // The store the ranks rendezvoused through, kept for the communicator's lifetime: ranks
    // publish which collective they are in (so a timeout can say who never arrived), mark
    // lost peers, and shrink() re-forms through it. Null: none of that (errors still name
    // the peer, shrink() is an InvalidArgument).
    std::shared_ptr<Store> store;
    // Launch ("world") rank of each member, by rank; empty = 0..size-1. Set by shrink() and
    // grow().
    std::vector<int> world_ranks;
    int generation = 0;  // how many times the group was re-formed; set by shrink() and grow()
    // Store namespace shared by every generation (lost marks, shrink and grow rounds,
    // joiners); empty = key_prefix. Set by shrink() and grow(); a joiner names it.
    std::string key_root;
    // Launch ranks handed out so far (joiners get the next ones, so that a number, and the
    // lost mark that may carry it, never comes back); 0 = size. Set by grow().
    int launch_ranks = 0;
    // How a grow() with joiners (and a joiner's join()) agrees on the extended cluster graph;
    // carried into every later generation. Null: a generation with joiners compares host
    // identities through the store, without a graph (no rails from it).
    GraphExtender extend_topology;
  };

  // A per-call deadline that replaces Config::timeout (RAILSHARD_TIMEOUT) for one collective.
  using Timeout = std::chrono::milliseconds;
  static constexpr Timeout kDefaultTimeout{-1};

  // Where a call's buffers live and, for device buffers, the CUDA stream it is ordered on
  // (docs/gpu.md). Device collectives are ordered on `stream` as NCCL's are: they start after
  // the work enqueued on it before the call, and work enqueued on it after the call sees the
  // results. The call itself blocks the host until this rank's transfers are done (the last
  // device copies and reductions may still be queued on the stream when it returns). Every
  // buffer of one call must be of the same kind; a host/device mix is an InvalidArgument.
  struct Placement {
    MemoryKind memory = MemoryKind::kAuto;
    void* stream = nullptr;  // cudaStream_t; nullptr = the legacy default stream
  };

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
  const std::vector<int>& worldRanks() const { return world_ranks_; }
  int worldRank() const { return world_ranks_[static_cast<size_t>(rank_)]; }
  // 0 for the communicator init() made, +1 per shrink() or grow().
  int generation() const { return generation_; }
  // Launch ranks handed out so far (the next joiner gets this one).
  int launchRanks() const { return launch_ranks_; }

  // Number of collectives started so far (the sequence number of the next one).
  uint64_t sequence() const { return sequence_; }
  // True when collectives run through shared memory (every rank on this host).
  bool usesSharedMemory() const { return shm_ != nullptr; }
  // True when the ranks span several hosts, some with several ranks, and every such host's
  // ranks share a segment: all-reduces then run in two levels (docs/architecture.md). The
  // same on every rank, also on a rank alone on its host.
  bool usesHostSharedMemory() const { return two_level_; }
  // Which ranks share a host (ranks compared by host in the cluster graph and by whether they
  // can map each other's memory); null for one rank.
  const collectives::HostLayout* hostLayout() const { return layout_.get(); }
  // Shared memory's hand-off and copy rate and the reduction kernel's rate, measured at
  // start-up on every host with several ranks (the slowest host's, the same on every rank);
  // zeros when no host has several ranks. The tuner plans with them, and one-host
  // efficiency figures use the copy rate as the limit.
  const collectives::MeasuredLinks& measuredLinks() const { return measured_; }
  // What bounds this communicator's busbw, for efficiency figures (allreduce_perf, the trace
  // report): the ring's slowest hop in the cluster graph (tracing::ringLimit), or on one host
  // whose graph knows no speed the measured copy rate. gbps 0, with the reason, when unknown.
  tracing::LinkLimit linkLimit() const;
  // Name of the algorithm the last all-reduce ran ("ring", "shm_direct", ...).
  std::string_view lastAlgorithm() const { return last_algorithm_; }
  transport::Transport& transport() { return *transport_; }
  // The cluster graph this communicator was built with; null when none was given.
  const topology::Topology* topology() const { return topology_.get(); }

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
  Communicator(const Options& options, std::unique_ptr<transport::Transport> transport);
  // InvalidArgument when [send, send + send_bytes) and [recv, recv + recv_bytes) share a byte;
  // `in_place_allowed`: send == recv is accepted (the collective's in-place form).
  static void checkDisjoint(const char* collective, const void* send, size_t send_bytes,
                            const void* recv, size_t recv_bytes, bool in_place_allowed);
  void checkBuffer(const char* collective, const char* what, const void* buffer, size_t count,
                   DataType dtype) const;
  void checkTypes(const char* collective, DataType dtype, ReduceOp op) const;
  // Groups the ranks by host (layout_) and maps one segment per host with several ranks:
  // shm_ when that is every rank, else host_shm_ (core/communicator_shm.cc).
  void setUpSharedMemory(Store& store, const std::string& key_prefix);
  // Creates (lowest rank) or attaches the segment of this host's ranks `mine` (world ranks,
  // ascending, several); stays without one when the leader could not make it.
  void mapHostSegment(Store& store, const std::string& key_prefix, const std::vector<int>& mine);
  // Start-up measurements (collectives/link_probe.h): the host's ranks time hand-offs through
  // `engine`, its leader a copy and the kernel, and publishes them; then every rank takes the
  // slowest host's figures.
  // This host's point-to-point messages through `engine`'s segment (shm_messages_).
  void setUpMessages(collectives::ShmEngine& engine, int local_rank);
  void measureHost(Store& store, const std::string& key_prefix, collectives::ShmEngine& engine,
                   int leader);
  void agreeOnMeasuredLinks(Store& store, const std::string& key_prefix);
  // Enough hand-offs for a stable median, few enough to cost well under a millisecond; and
  // copies larger than the per-core caches, as collectives' data is.
  static constexpr int kHandOffRounds = 32;
  static constexpr size_t kProbeBytes = size_t{2} << 20;
  // The segment of this rank's host's ranks, whichever of the two it is; null when none.
  collectives::ShmEngine* engine() const { return shm_ ? shm_.get() : host_shm_.get(); }
  // RAILSHARD_TRACE: aligns this rank's clock with rank 0's through the store (first
  // generation only) and registers what its trace file says about it (core/communicator_trace.cc).
  void setUpTracing(Store& store, const Options& options);
  // The "railshard" metadata members of this rank's trace file: rails, link limit, topology.
  std::string traceMetadata() const;
  // RAILSHARD_METRICS (core/communicator_metrics.cc): starts the process's exporter once and
  // registers this communicator's rail gauges; counts collectives and errors.
  void setUpMetrics();
  void tearDownMetrics();
  void countCollective(const char* collective, const char* algorithm, size_t bytes, double seconds);
  void countError(const std::exception& error);
  // InvalidArgument when the communicator was shrunk or aborted.
  void checkUsable(const char* collective) const;
  Duration timeoutFor(const char* collective, Timeout timeout) const;
  // Runs one collective: publishes that this rank entered it, and turns a PeerLostError or
  // TimeoutError into one that names the collective, the lost or missing ranks and the time
  // waited.
  // `bytes` and `algorithm` describe the call in its trace event.
  // over_transport: the collective runs over the transport even when shared memory is set up
  // (device buffers), so the transport checks its header on entry.
  template <typename Fn>
  void run(const transport::MessageTag& tag, Duration timeout, size_t bytes, const char* algorithm,
           Fn&& fn, bool over_transport = false);
  // run() for the files that cannot see its definition (core/communicator_device.cc,
  // core/communicator_p2p.cc).
  void runOutOfLine(const transport::MessageTag& tag, Duration timeout, size_t bytes,
                    const char* algorithm,
                    const std::function<void(const collectives::Context&)>& fn,
                    bool over_transport);

  // --- device buffers (core/communicator_device.cc, docs/gpu.md) ---
  // True when the call's buffers are device memory (placement.memory, or asked of CUDA for
  // kAuto); ConfigError for kDevice without CUDA, InvalidArgument for a host/device mix.
  // Null buffers (count 0, a non-root's broadcast send) do not count.
  // count 0 is always host (nothing is moved, and every rank must agree on the path).
  bool onDevice(const char* collective, const Placement& placement, const void* send,
                const void* recv, size_t count) const;
  void allreduceOnDevice(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                         void* stream, Duration timeout);
  void reduceScatterOnDevice(const void* send, void* recv, size_t recv_count, DataType dtype,
                             ReduceOp op, void* stream, Duration timeout);
  void allgatherOnDevice(const void* send, void* recv, size_t send_count, DataType dtype,
                         void* stream, Duration timeout);
  void broadcastOnDevice(const void* send, void* recv, size_t count, DataType dtype, int root,
                         void* stream, Duration timeout);
  // The staging machinery for `device`, made on first use; makes `device` current.
  collectives::CudaDeviceOps& deviceOps(int device);
  // One staging collective: begin(stream), run `fn` over the transport, end(stream) — also
  // when `fn` fails, so that the user's stream stays ordered after whatever device work the
  // failed collective left queued.
  void runStaged(
      const transport::MessageTag& tag, Duration timeout, size_t bytes, const char* algorithm,
      int device, void* stream,
      const std::function<void(const collectives::Context&, collectives::CudaDeviceOps&)>& fn);
  // The two-level all-reduce, decided (collectively, through the store) on the first device
  // all-reduce; null when it cannot run here (hierarchical_why_ says why).
  HierarchicalAllreduce* hierarchical(int device, Duration timeout);
  // Host of every rank, by rank: from the cluster graph, else exchanged through the store.
  std::vector<std::string> hostOfEveryRank(Duration timeout);
  // Why NCCL cannot run: two ranks of one host on the same GPU ("" when none), from every
  // rank's PCI bus id exchanged through the store.
  std::string sharedGpu(const std::vector<std::string>& hosts, int device, Duration timeout);
  std::string explainLoss(const transport::MessageTag& tag, double waited,
                          const std::string& error);
  std::string explainTimeout(const transport::MessageTag& tag, double waited,
                             const std::string& error);
  // "rank 3 never entered allreduce #12 (ranks 0,1,2 waiting 30.00 s; ...)", from the
  // positions every rank published; empty without a store.
  std::string diagnoseMissing(const transport::MessageTag& tag);
  // "rank 3 (host node-b)", with the launch rank when it differs.
  std::string describeRank(int rank) const;
  std::optional<std::string> lostMark(const std::string& round, int world);
  // Store key and value saying `lost` is gone, for the next shrink round.
  std::pair<std::string, std::string> lostMarkFor(const transport::LostPeer& lost) const;
  std::vector<int> decideSurvivors(const std::string& round, Deadline deadline,
                                   std::string& excluded);
  // shrink() and grow() (`by`): checks this communicator can re-form (usable, with a store),
  // then retires it for this rank; returns the round's timeout.
  Duration retire(const char* by, Timeout timeout);
  // Joins the members' round of generation `next` (leader: the first to arrive, which decides
  // through `decide`, writing round/members and round/excluded) and returns the members and
  // what was excluded.
  std::pair<std::vector<int>, std::string> agreeOnMembers(
      const std::string& round, Duration timeout, const std::function<void(Deadline)>& decide);
  // The shrink() leader: the survivors.
  void decideShrink(const std::string& round, Deadline deadline);
  // The grow() leader: the survivors (as shrink() decides them), then the joiners admitted.
  void decideGrowth(const std::string& round, int next, Deadline deadline);
  // The new generation's options for launch rank `me` among `members`.
  Options nextOptions(const std::string& round, int next, const std::vector<int>& members, int me,
                      int launch_ranks) const;
  // This generation's cluster graph with `members` renumbered in their order; null when a
  // member is not in this generation (a joiner) or there is no graph.
  std::shared_ptr<const topology::Topology> renumberedTopology(
      const std::vector<int>& members) const;
  // The graph of generation `next` (options): renumbered when nobody joined, else extended
  // through extend_topology_ when the round says every rank takes part ("graph" in
  // round/topology), else null.
  std::shared_ptr<const topology::Topology> grownTopology(const std::string& round,
                                                          const Options& next,
                                                          const std::vector<int>& members) const;
  // A member that closes a healthy communicator (not retired, not aborted) counts itself
  // closed; the last of the generation marks the job finished and turns away the joiners
  // still waiting, so that they fail at once instead of at their timeout.
  void markClosed() noexcept;

  int rank_;
  int size_;
  Config config_;
  // Staging buffers of device collectives. Declared before transport_ so that it is destroyed
  // after it: after a failed collective receives may still be posted into its pinned memory.
  std::unique_ptr<collectives::CudaDeviceOps> device_ops_;
  int device_ops_device_ = -1;
  std::unique_ptr<transport::Transport> transport_;
  std::shared_ptr<const topology::Topology> topology_;
  std::unique_ptr<collectives::Workspace> workspace_;
  std::unique_ptr<collectives::ShmEngine> shm_;
  // Several hosts: the layout, this host's ranks' segment (when it has several ranks), and the
  // link between hosts as the tuner models it.
  std::unique_ptr<collectives::HostLayout> layout_;
  std::unique_ptr<collectives::ShmEngine> host_shm_;  // null on a rank alone on its host
  // Point-to-point messages through that host's segment (after the engines: goes first).
  std::unique_ptr<ShmMessages> shm_messages_;
  bool two_level_ = false;      // every host with several ranks has its segment (all ranks agree)
  size_t host_slot_bytes_ = 0;  // the smallest of those segments' slots
  collectives::LinkModel network_{0, 0};
  collectives::MeasuredLinks measured_;
  std::string_view last_algorithm_ = "none";
  // Last tuner decision (see allreduce()).
  bool tuned_ = false;
  size_t tuned_bytes_ = 0;
  collectives::Algorithm tuned_algorithm_{};
  uint64_t sequence_ = 0;
  std::vector<std::shared_ptr<void>> resources_;
  std::shared_ptr<Store> store_;
  std::vector<int> world_ranks_;
  int generation_ = 0;
  int launch_ranks_ = 0;
  std::string key_prefix_;
  std::string key_root_;
  std::string advertise_host_;
  GraphExtender extend_topology_;
  std::unique_ptr<ProgressPublisher> publisher_;
  std::unique_ptr<PointToPoint> p2p_;  // made at the first message
  PointToPoint& pointToPoint();
  const char* retired_ = nullptr;  // "shrink" or "grow": use the communicator it returned
  Clock::time_point collective_start_{};
  std::string aborted_;     // the reason abort() was given
  int trace_provider_ = 0;  // trace metadata provider id, 0 = none
  bool metrics_ = false;    // RAILSHARD_METRICS set: count collectives
  int metrics_collector_ = 0;
  // Device buffers (core/communicator_device.cc); device_ops_ is declared before transport_.
  std::unique_ptr<HierarchicalAllreduce> hierarchical_;
  bool hierarchical_decided_ = false;
  std::string hierarchical_why_;
  // Set when building the two-level all-reduce failed: every later device all-reduce raises
  // it (falling back to staging on some ranks only would leave the ranks on different paths).
  std::exception_ptr hierarchical_error_;
};

}  // namespace railshard
