#include "core/collectives/shm_engine.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "base/logging.h"
#include "base/trace.h"
#include "core/collective_tag.h"
#include "kernels/copy.h"
#include "kernels/reduce.h"
#include "transport/links/shm/shared_buffers.h"
#include "transport/messaging/machine_load.h"

namespace railshard::collectives {

using transport::links::shm::RankControl;
using transport::messaging::FutexWord;

namespace {

// Runs fn(offset, length) over [0, count) in pieces of at most `piece` elements; once with
// length 0 when count is 0, so that every rank still takes (and checks) one step.
template <typename Fn>
void forEachPiece(size_t count, size_t piece, Fn&& fn) {
  size_t offset = 0;
  do {
    const size_t length = std::min(piece, count - offset);
    fn(offset, length);
    offset += length;
  } while (offset < count);
}

// Blocks of a reduce-scatter or all-gather: block r is [begin[r], begin[r+1]), and piece p of
// every block (offset p * piece) moves in step p.
struct BlockPieces {
  const std::vector<size_t>& begin;
  size_t piece;
  size_t length(size_t r) const { return begin[r + 1] - begin[r]; }
  size_t longest() const {
    size_t most = 0;
    for (size_t r = 0; r + 1 < begin.size(); ++r) most = std::max(most, length(r));
    return most;
  }
  // Elements of block r in the piece that starts at `offset`.
  size_t at(size_t r, size_t offset) const {
    return std::min(piece, length(r) - std::min(length(r), offset));
  }
};

}  // namespace

ShmEngine::ShmEngine(std::unique_ptr<transport::links::shm::ShmSegment> segment, int rank, int size,
                     Duration timeout, Duration spin, std::vector<int> names, WaitMode wait)
    : segment_(std::move(segment)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      names_(std::move(names)) {
  segment_->control(rank_).pid.store(static_cast<int32_t>(::getpid()));
  peer_mappings_ = std::make_unique<transport::links::shm::PeerMappings>();
  transport::messaging::MachineState machine;
  machine.cores = transport::messaging::allowedCores();
  machine.local_ranks = static_cast<unsigned>(size_);
  waiter_.setPlan(transport::messaging::planWait(wait, machine, spin));
  cores_ = machine.cores;
}

ShmEngine::~ShmEngine() {
  // Tell ranks that may still wait for us (ranks in one process share the pid, so the
  // liveness check alone cannot see this).
  segment_->control(rank_).left.store(1);
  wakeEveryone();
}

void ShmEngine::wakeEveryone() {
  for (int r = 0; r < size_; ++r) {
    auto& control = segment_->control(r);
    control.box[0].posted.wakeAll();
    control.box[1].posted.wakeAll();
    control.reduced.wakeAll();
  }
}

void ShmEngine::abort(ErrorKind kind, const std::string& message, int lost) {
  auto& header = segment_->header();
  if (header.aborted.load() != 0) return;
  uint32_t unclaimed = 0;
  if (!header.abort_claimed.compare_exchange_strong(unclaimed, 1)) {
    // Another rank is writing its error; callers raise the segment's error next, so wait
    // until it is complete (a few microseconds; bounded in case that rank died meanwhile).
    const auto give_up = Clock::now() + std::chrono::seconds(1);
    while (header.aborted.load() == 0 && Clock::now() < give_up) std::this_thread::yield();
    return;
  }
  const size_t length = std::min(message.size(), sizeof(header.abort_message) - 1);
  std::memcpy(header.abort_message, message.data(), length);
  header.abort_message[length] = '\0';
  header.abort_kind.store(static_cast<uint32_t>(kind));
  header.abort_rank.store(rank_);
  header.abort_lost.store(lost);
  header.aborted.store(1, header.sleepers);
  wakeEveryone();
}

void ShmEngine::throwAborted() {
  auto& header = segment_->header();
  std::string message(header.abort_message);
  const int by = header.abort_rank.load();
  if (by != rank_) message += " [reported by rank " + std::to_string(nameOf(by)) + "]";
  const auto kind = static_cast<ErrorKind>(header.abort_kind.load());
  if (failure_ == nullptr) throwError(kind, message);
  // Before the group fails: its error names the lost rank from what it recorded.
  const int lost = header.abort_lost.load();
  if (lost >= 0) failure_->recordLost(lost, message);
  // Another rank of this host aborted the segment: this rank's group fails with it too (and
  // tells the ranks of other hosts, should that rank be gone); a failure the group had already
  // wins.
  failure_->fail(makeError(kind, message), true);
  failure_->rethrow();
}

void ShmEngine::fail(ErrorKind kind, const std::string& message, int lost) {
  abort(kind, message, lost);
  throwAborted();
}

void ShmEngine::checkPeerAlive(int peer, const char* what, bool process) {
  if (segment_->control(peer).left.load() != 0) {
    fail(ErrorKind::kPeerLost,
         "rank " + std::to_string(nameOf(rank_)) + ": rank " + std::to_string(nameOf(peer)) +
             " closed its communicator while " + describeTag(tag_) + " waited for its " + what);
  }
  const int32_t pid = segment_->control(peer).pid.load();
  if (process && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
    fail(ErrorKind::kPeerLost,
         "rank " + std::to_string(nameOf(rank_)) + ": rank " + std::to_string(nameOf(peer)) +
             " (pid " + std::to_string(pid) + ") exited while " + describeTag(tag_) +
             " waited for its " + what,
         nameOf(peer));
  }
}

void ShmEngine::waitFor(int peer, FutexWord& flag, uint32_t target, const char* what) {
  if (FutexWord::reached(flag.load(), target)) return;
  trace::Span span(trace::Category::kWait, "wait_peer");
  if (span.active()) span.event().peer = peer;
  auto& header = segment_->header();
  Clock::time_point start{};
  uint32_t polls = 0;
  // A wait long enough to be checked on makes the peer awaited until it ends (the hook's
  // lock stays off the fast path).
  struct Awaiting {
    const std::function<bool(int, bool)>& hook;
    int peer = -1;
    bool watched = false;  // by the group's messenger for the peer
    ~Awaiting() {
      if (peer >= 0) hook(peer, false);
    }
  } awaiting{await_hook_};
  const bool arrived = waiter_.waitFor(
      [&] {
        if (FutexWord::reached(flag.load(), target)) return true;
        // The abort flag every 64 polls: a peer's step is a few hundred nanoseconds away, and
        // another load per poll measured on an 8-byte all-reduce.
        if ((++polls & 63u) == 1 && header.aborted.load() != 0) throwAborted();
        return false;
      },
      flag, header.sleepers, timeout_,
      [&] {
        if (header.aborted.load() != 0) throwAborted();
        if (awaiting.peer < 0 && await_hook_) {
          awaiting.peer = nameOf(peer);
          awaiting.watched = await_hook_(awaiting.peer, true);
        }
        // A goodbye is this engine's to see (the messenger of a peer that said it has
        // nothing to wait for); a process gone is the messenger's, when it watches.
        checkPeerAlive(peer, what, !awaiting.watched);
        // The group failed elsewhere (a lost peer on another host): its hook aborted the
        // segment, but a wait that slept through it looks here too.
        if (failure_ != nullptr && failure_->failed()) failure_->rethrow();
      },
      &start);
  if (arrived) return;
  std::string message = "rank " + std::to_string(nameOf(rank_)) + ": " + describeTag(tag_) +
                        " timed out after " + std::to_string(secondsSince(start)) +
                        " s waiting for rank " + std::to_string(nameOf(peer)) + "'s " + what +
                        " (RAILSHARD_TIMEOUT)";
  if (timeout_explainer_) message += ": " + timeout_explainer_(tag_);
  fail(ErrorKind::kTimeout, message);
}

void ShmEngine::beginStep(const transport::MessageTag& tag) {
  if (segment_->header().aborted.load() != 0) throwAborted();
  tag_ = tag;
  ++step_;
  // No wait for the buffers of this parity (last used two steps ago): every step waits for
  // every rank's post, and a rank posts step k-1 only after it finished reading everything
  // of step k-2, so having seen all posts of step k-1 already proves the buffers are free.
  segment_->control(rank_).box[step_ & 1u].header = tag;
}

void ShmEngine::publishPosted() {
  segment_->control(rank_).box[step_ & 1u].posted.store(step_, segment_->header().sleepers);
}

void ShmEngine::publishReduced() {
  segment_->control(rank_).reduced.store(step_, segment_->header().sleepers);
}

void ShmEngine::waitPosted(int peer) {
  auto& box = segment_->control(peer).box[step_ & 1u];
  waitFor(peer, box.posted, step_, "data");
  if (!(box.header == tag_)) {
    const transport::MessageTag theirs = box.header;
    fail(ErrorKind::kMismatch, describeMismatch(nameOf(rank_), tag_, nameOf(peer), theirs));
  }
}

void ShmEngine::waitAllPosted() {
  for (int r = 0; r < size_; ++r) waitPosted(r);
}

void ShmEngine::reduceAll(void* out, const void* const* sources, size_t count, DataType dtype,
                          ReduceOp op) {
  // Rank order, the same on every rank, so every rank computes bit-identical results. Folding
  // n operands pairwise would stream the output through memory n-1 times; in L1-sized blocks
  // the partial result stays in cache and memory sees each operand once.
  const size_t element = sizeOf(dtype);
  const size_t block = std::max<size_t>(1, (16 * 1024) / element);
  auto* destination = static_cast<uint8_t*>(out);
  for (size_t begin = 0; begin < count; begin += block) {
    const size_t length = std::min(block, count - begin);
    const size_t offset = begin * element;
    uint8_t* d = destination + offset;
    kernels::reduce(d, static_cast<const uint8_t*>(sources[0]) + offset,
                    static_cast<const uint8_t*>(sources[1]) + offset, length, dtype, op);
    for (int r = 2; r < size_; ++r) {
      kernels::reduce(d, d, static_cast<const uint8_t*>(sources[r]) + offset, length, dtype, op);
    }
  }
  if (op == ReduceOp::kAvg) kernels::divide(out, count, dtype, static_cast<size_t>(size_));
}

void ShmEngine::allreduceDirect(const void* send, void* recv, size_t count, DataType dtype,
                                ReduceOp op, const transport::MessageTag& tag) {
  const size_t bytes = count * sizeOf(dtype);
  beginStep(tag);
  // Small messages travel inside the step box, next to the flag and header.
  const bool inline_data = bytes <= transport::links::shm::kInlineBytes;
  auto dataOf = [&](int r) -> uint8_t* {
    return inline_data ? segment_->control(r).box[step_ & 1u].inline_data
                       : segment_->inSlot(r, step_);
  };
  if (bytes > 0) kernels::copy(dataOf(rank_), send, bytes);
  publishPosted();
  const void* stack_sources[16];
  std::vector<const void*> heap_sources;
  const void** sources = stack_sources;
  if (size_ > 16) {
    heap_sources.resize(static_cast<size_t>(size_));
    sources = heap_sources.data();
  }
  for (int r = 0; r < size_; ++r) {
    waitPosted(r);
    sources[r] = dataOf(r);
  }
  // recv may be send: all operands are read from shared memory, never from user buffers.
  if (count > 0) reduceAll(recv, sources, count, dtype, op);
}

void ShmEngine::allreduceReduceScatterGather(const void* send, void* recv, size_t count,
                                             DataType dtype, ReduceOp op,
                                             const transport::MessageTag& tag) {
  const size_t element = sizeOf(dtype);
  if (single_copy_bytes_ > 0 && count * element >= single_copy_bytes_ && everyoneReadsEveryone() &&
      singleCopyAllreduce(send, recv, count, dtype, op, tag)) {
    return;
  }
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t piece = std::max<size_t>(1, segment_->slotBytes() / element);
  const size_t n = static_cast<size_t>(size_);
  std::vector<const void*> sources(n);
  forEachPiece(count, piece, [&](size_t offset, size_t length) {
    auto segmentBegin = [&](size_t r) { return length * r / n; };  // balanced split
    beginStep(tag);
    uint8_t* mine = segment_->inSlot(rank_, step_);
    for (size_t r = 0; r < n; ++r) {
      if (static_cast<int>(r) == rank_) continue;  // nobody else reads my own segment
      const size_t begin = segmentBegin(r);
      kernels::copy(mine + begin * element, in + (offset + begin) * element,
                    (segmentBegin(r + 1) - begin) * element);
    }
    publishPosted();
    const size_t my_begin = segmentBegin(static_cast<size_t>(rank_));
    const size_t my_length = segmentBegin(static_cast<size_t>(rank_) + 1) - my_begin;
    for (int r = 0; r < size_; ++r) {
      waitPosted(r);
      sources[static_cast<size_t>(r)] = r == rank_
                                            ? in + (offset + my_begin) * element
                                            : segment_->inSlot(r, step_) + my_begin * element;
    }
    uint8_t* reduced = segment_->outSlot(rank_, step_);
    if (my_length > 0) reduceAll(reduced, sources.data(), my_length, dtype, op);
    publishReduced();
    for (size_t r = 0; r < n; ++r) {
      waitFor(static_cast<int>(r), segment_->control(static_cast<int>(r)).reduced, step_,
              "reduced segment");
      const size_t begin = segmentBegin(r);
      const size_t bytes = (segmentBegin(r + 1) - begin) * element;
      if (bytes > 0)
        kernels::copy(out + (offset + begin) * element,
                      segment_->outSlot(static_cast<int>(r), step_), bytes);
    }
  });
}

void ShmEngine::reduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                              ReduceOp op, const transport::MessageTag& tag) {
  reduceScatterBlocks(send, recv, uniformBlocks(recv_count), dtype, op, tag);
}

void ShmEngine::allgather(const void* send, void* recv, size_t send_count, DataType dtype,
                          const transport::MessageTag& tag) {
  allgatherBlocks(send, recv, uniformBlocks(send_count), dtype, tag);
}

std::vector<size_t> ShmEngine::uniformBlocks(size_t block) const {
  std::vector<size_t> begin(static_cast<size_t>(size_) + 1);
  for (size_t r = 0; r < begin.size(); ++r) begin[r] = r * block;
  return begin;
}

void ShmEngine::reduceScatterBlocks(const void* send, void* recv, const std::vector<size_t>& begin,
                                    DataType dtype, ReduceOp op, const transport::MessageTag& tag) {
  const size_t element = sizeOf(dtype);
  const size_t n = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  // Every rank takes the same steps: piece p of every block, the blocks side by side in the
  // slot (a block's piece at r * piece, so blocks of unequal length never overlap).
  const BlockPieces blocks{begin, std::max<size_t>(1, segment_->slotBytes() / (element * n))};
  const size_t piece = blocks.piece;
  std::vector<const void*> sources(n);
  forEachPiece(blocks.longest(), piece, [&](size_t offset, size_t) {
    auto lengthOf = [&](size_t r) { return blocks.at(r, offset); };
    beginStep(tag);
    uint8_t* mine = segment_->inSlot(rank_, step_);
    for (size_t r = 0; r < n; ++r) {
      if (r == me || lengthOf(r) == 0) continue;
      kernels::copy(mine + r * piece * element, in + (begin[r] + offset) * element,
                    lengthOf(r) * element);
    }
    publishPosted();
    for (int r = 0; r < size_; ++r) {
      waitPosted(r);
      sources[static_cast<size_t>(r)] = static_cast<size_t>(r) == me
                                            ? in + (begin[me] + offset) * element
                                            : segment_->inSlot(r, step_) + me * piece * element;
    }
    // Accumulate in the out-slot: recv may overlap our own block of send (in place).
    const size_t length = lengthOf(me);
    uint8_t* reduced = segment_->outSlot(rank_, step_);
    if (length > 0) {
      reduceAll(reduced, sources.data(), length, dtype, op);
      kernels::copy(out + offset * element, reduced, length * element);
    }
  });
}

void ShmEngine::allgatherBlocks(const void* send, void* recv, const std::vector<size_t>& begin,
                                DataType dtype, const transport::MessageTag& tag) {
  const size_t element = sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const BlockPieces blocks{begin, std::max<size_t>(1, segment_->slotBytes() / element)};
  forEachPiece(blocks.longest(), blocks.piece, [&](size_t offset, size_t) {
    auto lengthOf = [&](size_t r) { return blocks.at(r, offset); };
    beginStep(tag);
    const size_t mine = lengthOf(static_cast<size_t>(rank_));
    if (mine > 0)
      kernels::copy(segment_->inSlot(rank_, step_), in + offset * element, mine * element);
    publishPosted();
    for (int r = 0; r < size_; ++r) {
      waitPosted(r);
      const size_t length = lengthOf(static_cast<size_t>(r));
      if (length > 0) {
        kernels::copy(out + (begin[static_cast<size_t>(r)] + offset) * element,
                      segment_->inSlot(r, step_), length * element);
      }
    }
  });
}

void ShmEngine::broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                          const transport::MessageTag& tag) {
  const size_t element = sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t piece = std::max<size_t>(1, segment_->slotBytes() / element);
  forEachPiece(count, piece, [&](size_t offset, size_t length) {
    beginStep(tag);
    if (rank_ == root && length > 0) {
      kernels::copy(segment_->inSlot(rank_, step_), in + offset * element, length * element);
    }
    // Everyone posts (without data) so that every rank checks every header.
    publishPosted();
    waitAllPosted();
    if (length > 0 && (rank_ != root || in != out)) {
      kernels::copy(out + offset * element, segment_->inSlot(root, step_), length * element);
    }
  });
}

void ShmEngine::barrier(const transport::MessageTag& tag) {
  beginStep(tag);
  publishPosted();
  waitAllPosted();
}

}  // namespace railshard::collectives
