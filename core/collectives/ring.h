#pragma once

#include <cstddef>
#include <vector>

#include "core/collectives/context.h"

namespace railshard::collectives {

// Where each of the `size` segments of a ring collective lives, in elements.
struct SegmentLayout {
  std::vector<size_t> offset;
  std::vector<size_t> length;
  size_t maxLength() const;
  // `count` elements split as evenly as possible (allreduce).
  static SegmentLayout balanced(size_t count, int size);
  // `size` consecutive blocks of `block` elements (reduce-scatter, allgather).
  static SegmentLayout blocks(size_t block, int size);
  // Elements [begin, begin + length) of each of `size` consecutive blocks of `block` elements:
  // one slice of a blocked collective.
  static SegmentLayout blockSlice(size_t block, size_t begin, size_t length, int size);
};

// Pipelined ring phases (reduce-scatter then all-gather), each segment cut into the same
// number of chunks so that a chunk received in step s is forwarded in step s+1 while the
// next chunk is still arriving.
//
// Segment indices are rotated by `shift`: in step s rank r sends segment (r - s + shift)
// and receives (r - s - 1 + shift), so after the reduce-scatter rank r holds the full
// reduction of segment (r + 1 + shift) mod size. shift = 0 suits all-reduce, shift = -1
// leaves rank r with segment r (reduce-scatter, all-gather).
class RingPipeline {
 public:
  RingPipeline(const Context& ctx, const SegmentLayout& layout, size_t element_size, int shift);

  // The segment this rank owns after reduceScatter() and sends first in allGather().
  int ownedSegment() const;

  // `input`: this rank's contribution (indexed by element offset). `accumulate`: where the
  // running reduction of each segment goes (same indexing); may equal `input` (in place).
  // When `final_out` is set, the owned segment's result is written there instead (its
  // intermediate steps then go to workspace), so `accumulate` may be null.
  void reduceScatter(const uint8_t* input, uint8_t* accumulate, uint8_t* final_out, DataType dtype,
                     ReduceOp op, uint32_t step_base);

  // Circulates every segment so that `data` (indexed by element offset) ends up complete;
  // the owned segment must already be in place.
  void allGather(uint8_t* data, uint32_t step_base);

 private:
  size_t chunkOffset(int segment, size_t chunk) const;  // bytes from segment start
  size_t chunkBytes(int segment, size_t chunk) const;
  int segmentAt(int step_offset) const;  // (rank + step_offset + shift) mod size

  const Context& ctx_;
  const SegmentLayout& layout_;
  size_t element_size_;
  int shift_;
  size_t chunks_;  // per segment, the same for all segments
};

}  // namespace railshard::collectives
