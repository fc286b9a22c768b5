#include "core/collectives/device_staging_plan.h"

#include <algorithm>

namespace railshard::collectives {

RingStaging::RingStaging(const SegmentLayout& layout, size_t element_size, size_t chunk_bytes)
    : length_(layout.length), element_size_(element_size) {
  const size_t max_length = layout.maxLength();
  segment_bytes_ = max_length * element_size;
  const size_t chunk = std::max<size_t>(1, chunk_bytes);
  chunks_ = std::max<size_t>(1, (segment_bytes_ + chunk - 1) / chunk);
  // Never more chunks than elements: an empty chunk carries nothing but costs a message.
  chunks_ = std::min(chunks_, std::max<size_t>(1, max_length));
}

size_t RingStaging::chunkOffset(int segment, size_t chunk) const {
  const size_t length = length_[static_cast<size_t>(segment)];
  const size_t base = length / chunks_;
  const size_t extra = length % chunks_;
  return (chunk * base + std::min(chunk, extra)) * element_size_;
}

size_t RingStaging::chunkBytes(int segment, size_t chunk) const {
  const size_t length = length_[static_cast<size_t>(segment)];
  return (length / chunks_ + (chunk < length % chunks_ ? 1 : 0)) * element_size_;
}

ChunkStream::ChunkStream(size_t bytes, size_t chunk_bytes)
    : total_(bytes), chunk_bytes_(std::max<size_t>(1, chunk_bytes)) {
  chunks_ = std::max<size_t>(1, (bytes + chunk_bytes_ - 1) / chunk_bytes_);
}

size_t ChunkStream::bytes(size_t chunk) const {
  const size_t begin = offset(chunk);
  return begin >= total_ ? 0 : std::min(chunk_bytes_, total_ - begin);
}

size_t ChunkStream::pinnedBytes() const {
  return std::min(total_, kSlots * chunk_bytes_);
}

std::vector<Slice> slices(size_t count, size_t slice) {
  slice = std::max<size_t>(1, slice);
  std::vector<Slice> result;
  if (count == 0) result.push_back(Slice{0, 0});
  for (size_t begin = 0; begin < count; begin += slice) {
    result.push_back(Slice{begin, std::min(slice, count - begin)});
  }
  return result;
}

}  // namespace railshard::collectives
