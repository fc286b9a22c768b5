// Single-copy all-reduce between the ranks of one host (issue #26): instead of copying every
// input into the segment, reducing from the slots and copying every result out (each byte
// through memory three times), each rank reduces its segment straight from the peers' own
// buffers into its recv buffer, then copies the other ranks' reduced segments straight out of
// their recv buffers. Three hand-offs per collective: where the buffers are, "my segment is
// reduced", and "done reading yours" (a rank's buffers must stay as they are until every peer
// has read them).
//
// A peer's buffer is read one of two ways, chosen per pair (reading is one-sided, so the pair
// need not agree): mapped, when the peer's buffer lies in a region from allocateShared and
// this rank could map it (then plain loads: the reduction reads the peer's memory directly);
// else with cross-memory attach (process_vm_readv) into a cache-sized piece here.
//
// process_vm_readv pins the peer's pages on every call, and it only beat the staged path where
// each rank has a core and the message is at most tens of MiB, and not on every CPU
// (docs/benchmarks.md, "One host: single copy": on an Intel Xeon np=2 at 4-16 MiB 1.2-1.4x
// the staged path, 0.8x at 1 MiB, 0.4-0.95x at 64-256 MiB and np=4 on 2 cores; on an AMD
// EPYC 0.6-0.65x at every size from 1 to 32 MiB). So each host measures it at start-up
// (Config::shm.cross_read, collectives::probeCrossRead) rather than assuming it: the ranks
// take the single copy when every rank's buffers are shared regions, or when every rank would
// read across at this size; else, after the first hand-off, all of them go the staged way
// (each decides from what all published, so they agree).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/trace.h"
#include "core/collective_tag.h"
#include "core/collectives/shm_engine.h"
#include "kernels/copy.h"
#include "transport/links/shm/cross_memory.h"
#include "transport/links/shm/shared_buffers.h"

namespace railshard::collectives {

namespace {

// Bytes read from each peer per reduction pass: small enough that the pieces stay in L2
// while they are reduced, large enough that process_vm_readv's per-call cost (pinning the
// peer's pages) is amortised.
constexpr size_t kPieceBytes = size_t{256} << 10;
// From this size the all-gather's copies out of mapped peers use non-temporal stores: the
// result no longer fits the caches, and skipping the read-for-ownership of each destination
// line measured +10-20 % busbw at 64 and 256 MiB (np=2, shared buffers) but -18 % at 16 MiB
// in place, where part of the buffer was still cached from the iteration before.
constexpr size_t kStreamBytes = size_t{32} << 20;
// Largest all-reduce read across with process_vm_readv (see above: 16 MiB won, 64 MiB lost).
constexpr size_t kCrossMemoryMostBytes = size_t{32} << 20;

// What a rank publishes in its in-slot for step 1: its buffers, by address (for
// process_vm_readv) and, when they lie in shared regions, by region.
struct BufferPlaces {
  uint64_t send;
  uint64_t recv;
  transport::links::shm::SharedRef send_ref;
  transport::links::shm::SharedRef recv_ref;
  uint64_t reads_across;  // 1: this rank would take the single copy with process_vm_readv
};

}  // namespace

bool ShmEngine::singleCopyAllreduce(const void* send, void* recv, size_t count, DataType dtype,
                                    ReduceOp op, const transport::MessageTag& tag) {
  const size_t element = sizeOf(dtype);
  const size_t n = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t bytes = count * element;
  auto segmentBegin = [&](size_t r) { return count * r / n; };
  // 1. Where this rank's buffers are, in its in-slot of this step (unused otherwise).
  beginStep(tag);
  BufferPlaces mine{reinterpret_cast<uint64_t>(send), reinterpret_cast<uint64_t>(recv),
                    transport::links::shm::findShared(send, bytes),
                    transport::links::shm::findShared(recv, bytes),
                    static_cast<uint64_t>(cross_read_ && static_cast<unsigned>(size_) <= cores_ &&
                                          bytes <= kCrossMemoryMostBytes)};
  std::memcpy(segment_->inSlot(rank_, step_), &mine, sizeof(mine));
  publishPosted();
  std::vector<BufferPlaces> theirs(n);
  std::vector<int> pid(n);
  // Mapped addresses of the peers' buffers; nullptr: read with process_vm_readv.
  std::vector<const uint8_t*> their_send(n, nullptr), their_recv(n, nullptr);
  for (size_t r = 0; r < n; ++r) {
    waitPosted(static_cast<int>(r));
    std::memcpy(&theirs[r], segment_->inSlot(static_cast<int>(r), step_), sizeof(BufferPlaces));
    pid[r] = segment_->control(static_cast<int>(r)).pid.load();
    if (r != me) {
      their_send[r] = peer_mappings_->map(pid[r], theirs[r].send_ref);
      their_recv[r] = peer_mappings_->map(pid[r], theirs[r].recv_ref);
    }
  }
  bool all_shared = true;
  bool all_read_across = true;
  for (const BufferPlaces& places : theirs) {
    all_shared = all_shared && places.send_ref.serial != 0 && places.recv_ref.serial != 0;
    all_read_across = all_read_across && places.reads_across != 0;
  }
  if (!all_shared && !all_read_across) return false;  // the staged path, on every rank
  trace::Span phase(trace::Category::kPhase, "shm_single_copy", tag.sequence);
  if (phase.active() && n > 1 && std::count(their_send.begin(), their_send.end(), nullptr) == 1 &&
      std::count(their_recv.begin(), their_recv.end(), nullptr) == 1) {
    phase.event().name = "shm_single_copy_mapped";  // every peer's buffers by plain loads
  }
  try {
    // 2. Reduce-scatter: segment `me` of every peer's send buffer (mapped, or read piece by
    // piece into scratch), reduced with this rank's own into its recv buffer. In place
    // (send == recv) this writes only segment `me`, which no peer reads before step 3.
    const size_t begin = segmentBegin(me);
    const size_t length = segmentBegin(me + 1) - begin;
    const size_t piece =
        std::max<size_t>(1, std::min(kPieceBytes, segment_->slotBytes()) / element);
    std::vector<std::vector<uint8_t>> scratch(n);
    std::vector<const void*> sources(n);
    for (size_t done = 0; done < length; done += piece) {
      const size_t take = std::min(piece, length - done);
      const size_t offset = (begin + done) * element;
      for (size_t r = 0; r < n; ++r) {
        if (r == me) {
          // In place, the output overwrites this rank's input as operands fold in rank order:
          // past the first two, its own operand must be a copy (cache-resident).
          if (in == out && me >= 2) {
            scratch[r].assign(in + offset, in + offset + take * element);
            sources[r] = scratch[r].data();
          } else {
            sources[r] = in + offset;
          }
        } else if (their_send[r] != nullptr) {
          sources[r] = their_send[r] + offset;
        } else {
          scratch[r].resize(take * element);
          transport::links::shm::readFromProcess(pid[r], theirs[r].send + offset, scratch[r].data(),
                                                 take * element);
          sources[r] = scratch[r].data();
        }
      }
      reduceAll(out + offset, sources.data(), take, dtype, op);
    }
    publishReduced();
    // 3. All-gather: every other segment from its owner's recv buffer, once it is reduced
    // there (which also means its owner read this rank's send segment: in place, it may now
    // be overwritten).
    for (size_t r = 0; r < n; ++r) {
      if (r == me) continue;
      waitFor(static_cast<int>(r), segment_->control(static_cast<int>(r)).reduced, step_,
              "reduced segment");
      const size_t from = segmentBegin(r) * element;
      const size_t length_bytes = segmentBegin(r + 1) * element - from;
      if (length_bytes == 0) continue;
      if (their_recv[r] != nullptr) {
        if (bytes >= kStreamBytes) {
          kernels::streamCopy(out + from, their_recv[r] + from, length_bytes);
        } else {
          kernels::copy(out + from, their_recv[r] + from, length_bytes);
        }
      } else {
        transport::links::shm::readFromProcess(pid[r], theirs[r].recv + from, out + from,
                                               length_bytes);
      }
    }
  } catch (const Error& e) {
    fail(kindOf(e), "rank " + std::to_string(nameOf(rank_)) + ": " + describeTag(tag) +
                        ": reading another rank's buffer failed: " + e.what());
  }
  // 4. Done reading: nobody returns (and lets its caller reuse the buffers) before all have.
  beginStep(tag);
  publishPosted();
  waitAllPosted();
  return true;
}

}  // namespace railshard::collectives
