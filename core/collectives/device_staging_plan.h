#pragma once

// The bookkeeping of the staged collectives (device_staging.h), apart from any transport or
// device so that it can be unit-tested: how segments are cut into chunks, which pinned buffer
// each ring step or chunk uses, and which earlier step or chunk must be finished (sent and
// copied) before that buffer may be written again.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/collectives/ring.h"

namespace railshard::collectives {

// One ring phase (reduce-scatter or all-gather) of one slice. Every segment is cut into the
// same number of chunks, so the chunk received in step s is the one forwarded in step s+1.
//
// Each role (received data, data to send) has kBuffers pinned buffers of segmentBytes() that
// the steps use in turn: step s writes buffer(s), which step reuses(s) used before, so all of
// that step's sends and device copies must be complete first. Step -1 is the data sent in
// step 0 (the first copy of this rank's own segment).
class RingStaging {
 public:
  static constexpr int kBuffers = 2;

  RingStaging(const SegmentLayout& layout, size_t element_size, size_t chunk_bytes);

  size_t chunks() const { return chunks_; }
  size_t segmentBytes() const { return segment_bytes_; }
  // Bytes from the start of `segment` (and of its staging buffer) to chunk `chunk`.
  size_t chunkOffset(int segment, size_t chunk) const;
  size_t chunkBytes(int segment, size_t chunk) const;
  size_t chunkElements(int segment, size_t chunk) const {
    return chunkBytes(segment, chunk) / element_size_;
  }

  static int buffer(int step) { return ((step % kBuffers) + kBuffers) % kBuffers; }
  static int reuses(int step) { return step - kBuffers; }

  // The transport tag step of chunk `chunk` of ring step `step`; distinct for every (step,
  // chunk) of a phase, and the same on every rank.
  uint32_t tagStep(uint32_t phase_base, int step, size_t chunk) const {
    return phase_base + static_cast<uint32_t>(static_cast<size_t>(step) * chunks_ + chunk);
  }

 private:
  std::vector<size_t> length_;  // elements per segment
  size_t element_size_;
  size_t segment_bytes_;
  size_t chunks_;
};

// A message streamed in chunks of chunk_bytes through a ring of kSlots pinned chunk slots
// (broadcast): chunk c uses slot(c), whose previous chunk reuses(c) must be sent and copied
// before c is written there. Work runs kLookahead chunks ahead of the chunk being finished, so
// a reused slot's chunk was finished kSlots - kLookahead chunks earlier.
class ChunkStream {
 public:
  static constexpr size_t kSlots = 32;
  static constexpr size_t kLookahead = kSlots / 2;

  ChunkStream(size_t bytes, size_t chunk_bytes);

  // At least one: an empty message still travels, as one empty chunk, so every rank checks
  // the header.
  size_t chunks() const { return chunks_; }
  size_t offset(size_t chunk) const { return chunk * chunk_bytes_; }
  size_t bytes(size_t chunk) const;
  // Bytes from the start of the pinned area to the chunk's slot.
  size_t slotOffset(size_t chunk) const { return (chunk % kSlots) * chunk_bytes_; }
  // Bytes of pinned memory the stream needs.
  size_t pinnedBytes() const;
  // The chunk whose slot `chunk` takes over; negative: none.
  static long reuses(size_t chunk) { return static_cast<long>(chunk) - static_cast<long>(kSlots); }

 private:
  size_t total_;
  size_t chunk_bytes_;
  size_t chunks_;
};

// [begin, begin + length) of a message processed as one slice.
struct Slice {
  size_t begin = 0;
  size_t length = 0;
};

// `count` elements cut into slices of at most `slice` elements; one empty slice for count 0
// (the collective still exchanges empty messages, so headers are checked).
std::vector<Slice> slices(size_t count, size_t slice);

}  // namespace railshard::collectives
