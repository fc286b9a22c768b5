// All-to-all among the ranks of one host, through the host's shared-memory segment
// (ShmEngine; docs/point_to_point.md): blocks read straight from the other ranks' send
// buffers where every rank can read every other's memory (set-up checks it:
// core/channels_host.cc), else through the slots.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/collective_tag.h"
#include "core/collectives/shm_engine.h"
#include "kernels/copy.h"
#include "transport/links/shm/cross_memory.h"

namespace railshard::collectives {

namespace {

// The tag of one pair's block, as the transports' all-to-all sends it (count in step and
// reserved2), so a split-size disagreement reads the same on every path.
transport::MessageTag blockTag(transport::MessageTag tag, uint64_t count) {
  tag.step = static_cast<uint32_t>(count & 0xffffffffu);
  tag.reserved2 = static_cast<uint32_t>(count >> 32);
  return tag;
}

}  // namespace

bool ShmEngine::everyoneReadsEveryone() const {
  if (size_ > 64) return false;
  const uint64_t all = size_ == 64 ? ~uint64_t{0} : (uint64_t{1} << size_) - 1;
  for (int r = 0; r < size_; ++r) {
    if ((segment_->control(r).readable_mask.load(std::memory_order_acquire) & all) != all) {
      return false;
    }
  }
  return true;
}

void ShmEngine::allToAll(const void* send, const std::vector<size_t>& send_counts,
                         const std::vector<size_t>& send_displs, void* recv,
                         const std::vector<size_t>& recv_counts,
                         const std::vector<size_t>& recv_displs, DataType dtype,
                         const transport::MessageTag& tag) {
  const size_t n = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  const size_t element = sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);

  // Step 1: every rank publishes its split sizes (what it sends to each rank, what it expects
  // from each), so all ranks see the whole matrix: they agree on the number of piece steps,
  // and a disagreement is found by every rank at once, before any block moves, with the same
  // message — no rank returns while another raises.
  const size_t counts_bytes = (3 * n + 1) * sizeof(uint64_t);
  if (counts_bytes > slotBytes()) {
    throw InvalidArgument("all_to_all: " + std::to_string(size_) +
                          " ranks' split sizes do not fit a shared-memory slot of " +
                          std::to_string(slotBytes()) + " bytes (RAILSHARD_SHM_SLOT_BYTES)");
  }
  beginStep(tag);
  auto* mine = reinterpret_cast<uint64_t*>(segment_->inSlot(rank_, step_));
  for (size_t r = 0; r < n; ++r) {
    mine[r] = send_counts[r];
    mine[n + r] = recv_counts[r];
    mine[2 * n + r] = send_displs[r];
  }
  mine[3 * n] = reinterpret_cast<uint64_t>(send);
  publishPosted();
  waitAllPosted();
  size_t longest = 0;
  for (size_t s = 0; s < n; ++s) {
    const auto* from_s =
        reinterpret_cast<const uint64_t*>(segment_->inSlot(static_cast<int>(s), step_));
    for (size_t d = 0; d < n; ++d) {
      const auto* to_d =
          reinterpret_cast<const uint64_t*>(segment_->inSlot(static_cast<int>(d), step_));
      const uint64_t sends = from_s[d];
      const uint64_t expects = to_d[n + s];
      if (sends != expects) {
        throw MismatchError(describeMismatch(nameOf(static_cast<int>(d)), blockTag(tag, expects),
                                             nameOf(static_cast<int>(s)), blockTag(tag, sends)));
      }
      if (s != d) longest = std::max<size_t>(longest, sends);
    }
  }
  // Our own block never passes through the segment (send and recv never overlap: checked by
  // the communicator).
  if (send_counts[me] > 0) {
    kernels::copy(out + recv_displs[me] * element, in + send_displs[me] * element,
                  send_counts[me] * element);
  }
  if (everyoneReadsEveryone()) {
    // Single copy: every rank reads its block straight out of each other rank's send buffer
    // (cross-memory attach), then a last step keeps every send buffer alive until all have
    // read it. Two hand-offs in all, whatever the size.
    try {
      for (size_t s = 0; s < n; ++s) {
        if (s == me || recv_counts[s] == 0) continue;
        const auto* published =
            reinterpret_cast<const uint64_t*>(segment_->inSlot(static_cast<int>(s), step_));
        transport::links::shm::readFromProcess(segment_->control(static_cast<int>(s)).pid.load(),
                                               published[3 * n] + published[2 * n + me] * element,
                                               out + recv_displs[s] * element,
                                               recv_counts[s] * element);
      }
    } catch (const Error& e) {
      fail(kindOf(e), "rank " + std::to_string(nameOf(rank_)) + ": " + describeTag(tag) +
                          ": reading a block from another rank failed: " + e.what());
    }
    beginStep(tag);
    publishPosted();
    waitAllPosted();
    return;
  }
  // Otherwise piece steps: the slot holds one region per destination; in step p each rank copies
  // piece p of its block for rank d into region d of its slot, and every rank copies region
  // `me` out of every other rank's slot. Two copies per byte, one hand-off per piece.
  const size_t piece = std::max<size_t>(1, slotBytes() / (n * element));
  for (size_t offset = 0; offset < longest; offset += piece) {
    auto lengthOf = [&](size_t count) { return std::min(piece, count - std::min(count, offset)); };
    beginStep(tag);
    uint8_t* slot = segment_->inSlot(rank_, step_);
    for (size_t d = 0; d < n; ++d) {
      const size_t length = d == me ? 0 : lengthOf(send_counts[d]);
      if (length > 0) {
        kernels::copy(slot + d * piece * element, in + (send_displs[d] + offset) * element,
                      length * element);
      }
    }
    publishPosted();
    for (size_t s = 0; s < n; ++s) {
      if (s == me) continue;
      waitPosted(static_cast<int>(s));
      const size_t length = lengthOf(recv_counts[s]);
      if (length > 0) {
        kernels::copy(out + (recv_displs[s] + offset) * element,
                      segment_->inSlot(static_cast<int>(s), step_) + me * piece * element,
                      length * element);
      }
    }
  }
}

}  // namespace railshard::collectives
