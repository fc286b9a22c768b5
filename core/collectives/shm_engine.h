#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/error.h"
#include "base/types.h"
#include "transport/links/shm/shm_segment.h"
#include "transport/message_tag.h"
#include "transport/messaging/failure_state.h"
#include "transport/messaging/waiter.h"

namespace railshard::transport::links::shm {
class PeerMappings;
}

namespace railshard::collectives {

// Collectives for ranks that share a host, through one shared-memory segment
// (transport/shm). No messages: each rank copies what the others need into its own slot
// once, and every reduction reads its operands straight from the other ranks' slots into the
// destination ("reduce from the peer's buffer"). Ranks step through numbered steps; a step's
// slots are reused two steps later, once every rank reports it is done with them.
//
// Each step publishes the collective's header next to the data, and every rank compares all
// headers it reads with its own: disagreeing ranks all raise MismatchError. Any error aborts
// the segment, which wakes every waiting rank with the same error; a rank whose process is
// gone is detected by its pid while others wait for it.
class ShmEngine {
 public:
  // `spin`: how long a wait polls before sleeping (Config::spin). `names`: the communicator's
  // rank of each of the segment's ranks, for messages (one host of several: its ranks are
  // 0..size-1 here but not in the communicator); empty = the same numbers.
  ShmEngine(std::unique_ptr<transport::links::shm::ShmSegment> segment, int rank, int size,
            Duration timeout, Duration spin, std::vector<int> names = {},
            WaitMode wait = WaitMode::kAuto);
  ~ShmEngine();

  // Everyone reads every rank's whole input and reduces all of it: one synchronisation,
  // best for small messages. Requires count * size(dtype) <= slotBytes().
  void allreduceDirect(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       const transport::MessageTag& tag);
  // Rank r reduces segment r of each piece from all slots, then everyone copies every
  // reduced segment out: bandwidth-optimal, pipelined by slot-sized pieces.
  void allreduceReduceScatterGather(const void* send, void* recv, size_t count, DataType dtype,
                                    ReduceOp op, const transport::MessageTag& tag);
  void reduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op,
                     const transport::MessageTag& tag);
  void allgather(const void* send, void* recv, size_t send_count, DataType dtype,
                 const transport::MessageTag& tag);
  // The same with blocks of any length: rank r's block is elements [begin[r], begin[r+1]) of
  // the whole buffer (begin has size() + 1 entries, the same on every rank). reduceScatter:
  // `send` is the whole buffer, `recv` receives this rank's block, reduced. allgather: `send`
  // is this rank's block, `recv` the whole buffer. Two-level collectives use them for the
  // phases inside a host, with blocks that need not divide evenly.
  void reduceScatterBlocks(const void* send, void* recv, const std::vector<size_t>& begin,
                           DataType dtype, ReduceOp op, const transport::MessageTag& tag);
  void allgatherBlocks(const void* send, void* recv, const std::vector<size_t>& begin,
                       DataType dtype, const transport::MessageTag& tag);
  void broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                 const transport::MessageTag& tag);
  // Block d of `send` (send_counts[d] elements from send_displs[d]) goes to rank d; block s of
  // `recv` (recv_counts[s] at recv_displs[s]) comes from rank s. Every rank first publishes its
  // split sizes, so a disagreement is a MismatchError on every rank before a block moves
  // (shm_all_to_all.cc). send and recv must not overlap.
  void allToAll(const void* send, const std::vector<size_t>& send_counts,
                const std::vector<size_t>& send_displs, void* recv,
                const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                DataType dtype, const transport::MessageTag& tag);
  void barrier(const transport::MessageTag& tag);

  size_t slotBytes() const { return segment_->slotBytes(); }
  // The segment, for the host's point-to-point messages (transport/links/shm/shm_channel.h).
  transport::links::shm::ShmSegment& segment() { return *segment_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // All-reduces of at least this many bytes read the peers' buffers in place when every rank
  // of the segment may read every other's memory (Config::shm_single_copy_bytes; 0 = never).
  // Ordinary (not shared-region) buffers are read with process_vm_readv only when
  // `cross_read` (Config::shm_cross_read): it is slower than the staged path on some CPUs.
  void setSingleCopy(size_t bytes, bool cross_read) {
    single_copy_bytes_ = bytes;
    cross_read_ = cross_read;
  }
  std::pair<size_t, bool> singleCopy() const { return {single_copy_bytes_, cross_read_}; }
  // Whether every rank of the segment could read across (process_vm_readv) by itself: each has
  // as many cores as the segment has ranks (reading across while a peer waits for a core costs
  // more than it saves).
  bool hasCoreEach() const { return static_cast<unsigned>(size_) <= cores_; }
  // Every rank of the segment can read every other's memory (RankControl::readable_mask).
  bool everyoneReadsEveryone() const;
  // Deadline of every wait from now on (a per-call override of Config::timeout).
  void setTimeout(Duration timeout) { timeout_ = timeout; }
  // The group's one error state: an error found here fails the whole group (its messengers
  // tell the other hosts' ranks), and one found anywhere in it reaches the waits here (the
  // group's failure aborts the segment: Channels joins the two). Null: the segment alone.
  void setFailure(transport::messaging::FailureState* failure) { failure_ = failure; }
  // Says who is missing when a wait times out (see Transport::setTimeoutExplainer).
  void setTimeoutExplainer(std::function<std::string(const transport::MessageTag&)> explain) {
    timeout_explainer_ = std::move(explain);
  }
  // Told (world rank, true) when a wait on a peer has lasted a liveness check period, and
  // (rank, false) when it ends: the group's heartbeat pings only awaited peers, and a peer
  // that stopped (SIGSTOP, a hung host process: its pid lives) is found only by it. It
  // returns whether the group watches that peer (then the group, not this engine, finds its
  // process gone, and records it lost with its host for shrink()).
  void setAwaitHook(std::function<bool(int, bool)> hook) { await_hook_ = std::move(hook); }
  // Makes every rank's current and next wait on the segment fail with this error; `lost` is
  // the group rank it says was lost (-1: none), recorded as lost by every rank of the host.
  void abort(ErrorKind kind, const std::string& message, int lost = -1);

 private:
  std::vector<size_t> uniformBlocks(size_t block) const;
  int nameOf(int rank) const { return names_.empty() ? rank : names_[static_cast<size_t>(rank)]; }
  void beginStep(const transport::MessageTag& tag);
  void publishPosted();
  void publishReduced();
  void wakeEveryone();
  void waitFor(int peer, transport::messaging::FutexWord& word, uint32_t target, const char* what);
  void waitPosted(int peer);  // plus the header check
  void waitAllPosted();
  void reduceAll(void* out, const void* const* sources, size_t count, DataType dtype, ReduceOp op);
  // shm_single_copy.cc: the all-reduce through the peers' own buffers (mapped shared regions
  // or cross-memory attach). False when the ranks chose the staged path after the first
  // hand-off (which then starts at the next step).
  bool singleCopyAllreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                           const transport::MessageTag& tag);
  // The segment's error, raised as the group's (whose first error wins).
  [[noreturn]] void throwAborted();
  // An error this rank found: the segment and the group fail with it, and it is raised.
  [[noreturn]] void fail(ErrorKind kind, const std::string& message, int lost = -1);
  // Its goodbye, and with `process` whether its process still exists.
  void checkPeerAlive(int peer, const char* what, bool process);

  std::unique_ptr<transport::links::shm::ShmSegment> segment_;
  int rank_;
  int size_;
  Duration timeout_;
  uint32_t step_ = 0;
  transport::MessageTag tag_;  // collective of the current step
  std::vector<int> names_;
  // How waits poll (transport/messaging/wait_policy.h), planned once from the cores.
  transport::messaging::Waiter waiter_;
  unsigned cores_ = 1;  // cores this rank may run on (the single copy reads across within them)
  size_t single_copy_bytes_ = 0;
  bool cross_read_ = false;
  // The peers' shared regions this rank mapped (shm_single_copy.cc).
  std::unique_ptr<transport::links::shm::PeerMappings> peer_mappings_;
  transport::messaging::FailureState* failure_ = nullptr;
  std::function<std::string(const transport::MessageTag&)> timeout_explainer_;
  std::function<bool(int, bool)> await_hook_;
};

}  // namespace railshard::collectives
