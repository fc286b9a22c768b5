// Single-copy all-reduce between the ranks of one host (issue #26): instead of copying every input
// into the segment, reducing from the slots and copying every result out (each byte through memory
// three times), each rank reads the peers' parts of *their* buffers with cross-memory attach
// (process_vm_readv) into a cache-sized piece and reduces it with its own into its recv
// segment, then reads the other ranks' reduced segments straight out of their recv buffers.
// Three hand-offs per collective: the buffers' addresses, "my segment is reduced", and "done
// reading yours" (a rank's buffers must stay as they are until every peer has read them).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/trace.h"
#include "core/collective_tag.h"
#include "core/collectives/shm_engine.h"
#include "kernels/copy.h"
#include "transport/shm/cross_memory.h"

namespace railshard::collectives {

namespace {

// Bytes read from each peer per reduction pass: small enough that the pieces stay in L2
// while they are reduced, large enough that process_vm_readv's per-call cost (pinning the
// peer's pages) is amortised.
constexpr size_t kPieceBytes = size_t{256} << 10;

}  // namespace

void ShmEngine::singleCopyAllreduce(const void* send, void* recv, size_t count, DataType dtype,
                                    ReduceOp op, const transport::MessageTag& tag) {
  const trace::Span phase(trace::Category::kPhase, "shm_single_copy", tag.sequence);
  const size_t element = sizeOf(dtype);
  const size_t n = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto segmentBegin = [&](size_t r) { return count * r / n; };
  // 1. Addresses: this rank's send and recv buffers, inline in its step box.
  beginStep(tag);
  auto& box = segment_->control(rank_).box[step_ & 1u];
  const uint64_t mine[2] = {reinterpret_cast<uint64_t>(send), reinterpret_cast<uint64_t>(recv)};
  std::memcpy(box.inline_data, mine, sizeof(mine));
  publishPosted();
  std::vector<uint64_t> their_send(n), their_recv(n);
  std::vector<int> pid(n);
  for (size_t r = 0; r < n; ++r) {
    waitPosted(static_cast<int>(r));
    uint64_t addresses[2];
    std::memcpy(addresses, segment_->control(static_cast<int>(r)).box[step_ & 1u].inline_data,
                sizeof(addresses));
    their_send[r] = addresses[0];
    their_recv[r] = addresses[1];
    pid[r] = segment_->control(static_cast<int>(r)).pid.load();
  }
  try {
    // 2. Reduce-scatter: segment `me` of every peer's send buffer, read piece by piece into
    // this rank's scratch (one slot per peer: the in-slots of this step are not used
    // otherwise), reduced with its own into its recv buffer. In place (send == recv) this
    // writes only segment `me`, which no peer reads before step 3.
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
          continue;
        }
        scratch[r].resize(take * element);
        transport::shm::readFromProcess(pid[r], their_send[r] + offset, scratch[r].data(),
                                        take * element);
        sources[r] = scratch[r].data();
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
      const size_t from = segmentBegin(r);
      const size_t bytes = (segmentBegin(r + 1) - from) * element;
      if (bytes > 0) {
        transport::shm::readFromProcess(pid[r], their_recv[r] + from * element,
                                        out + from * element, bytes);
      }
    }
  } catch (const Error& e) {
    abort(kindOf(e), "rank " + std::to_string(nameOf(rank_)) + ": " + describeTag(tag) +
                         ": reading another rank's buffer failed: " + e.what());
    throwAborted();
  }
  // 4. Done reading: nobody returns (and lets its caller reuse the buffers) before all have.
  beginStep(tag);
  publishPosted();
  waitAllPosted();
}

}  // namespace railshard::collectives
