#include "core/collectives/ring.h"

#include <algorithm>
#include <deque>

#include "kernels/reduce.h"

namespace railshard::collectives {

size_t SegmentLayout::maxLength() const {
  return length.empty() ? 0 : *std::max_element(length.begin(), length.end());
}

SegmentLayout SegmentLayout::balanced(size_t count, int size) {
  SegmentLayout layout;
  const size_t n = static_cast<size_t>(size);
  const size_t base = count / n;
  const size_t extra = count % n;
  size_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t length = base + (i < extra ? 1 : 0);
    layout.offset.push_back(offset);
    layout.length.push_back(length);
    offset += length;
  }
  return layout;
}

SegmentLayout SegmentLayout::blocks(size_t block, int size) {
  SegmentLayout layout;
  for (int i = 0; i < size; ++i) {
    layout.offset.push_back(static_cast<size_t>(i) * block);
    layout.length.push_back(block);
  }
  return layout;
}

SegmentLayout SegmentLayout::blockSlice(size_t block, size_t begin, size_t length, int size) {
  SegmentLayout layout;
  for (size_t r = 0; r < static_cast<size_t>(size); ++r) {
    layout.offset.push_back(r * block + begin);
    layout.length.push_back(length);
  }
  return layout;
}

RingPipeline::RingPipeline(const Context& ctx, const SegmentLayout& layout, size_t element_size,
                           int shift)
    : ctx_(ctx), layout_(layout), element_size_(element_size), shift_(shift) {
  const size_t max_bytes = layout.maxLength() * element_size;
  chunks_ = std::max<size_t>(1, (max_bytes + ctx.chunk_bytes - 1) / ctx.chunk_bytes);
  // Never more chunks than elements in the largest segment: empty chunks carry no data but
  // each costs a message.
  chunks_ = std::min(chunks_, std::max<size_t>(1, layout.maxLength()));
}

int RingPipeline::segmentAt(int step_offset) const {
  const int n = ctx_.size;
  return (((ctx_.rank + step_offset + shift_) % n) + n) % n;
}

int RingPipeline::ownedSegment() const {
  return segmentAt(1);
}

size_t RingPipeline::chunkOffset(int segment, size_t chunk) const {
  const size_t length = layout_.length[static_cast<size_t>(segment)];
  const size_t base = length / chunks_;
  const size_t extra = length % chunks_;
  return (chunk * base + std::min(chunk, extra)) * element_size_;
}

size_t RingPipeline::chunkBytes(int segment, size_t chunk) const {
  const size_t length = layout_.length[static_cast<size_t>(segment)];
  return (length / chunks_ + (chunk < length % chunks_ ? 1 : 0)) * element_size_;
}

void RingPipeline::reduceScatter(const uint8_t* input, uint8_t* accumulate, uint8_t* final_out,
                                 DataType dtype, ReduceOp op, uint32_t step_base) {
  const trace::Span phase(trace::Category::kPhase, "reduce_scatter", ctx_.tag.sequence);
  const int n = ctx_.size;
  const size_t k = chunks_;
  const size_t segment_bytes = layout_.maxLength() * element_size_;
  uint8_t* incoming[2] = {ctx_.workspace.get(0, segment_bytes),
                          ctx_.workspace.get(1, segment_bytes)};
  uint8_t* partial[2] = {nullptr, nullptr};
  if (final_out != nullptr) {
    partial[0] = ctx_.workspace.get(2, segment_bytes);
    partial[1] = ctx_.workspace.get(3, segment_bytes);
  }
  auto stepTag = [&](int step, size_t chunk) {
    return ctx_.tagAt(step_base + static_cast<uint32_t>(static_cast<size_t>(step) * k + chunk));
  };
  auto bytesAt = [&](int segment) {
    return layout_.offset[static_cast<size_t>(segment)] * element_size_;
  };

  std::vector<transport::RequestPtr> recvs[2];
  auto postRecvs = [&](int step) {
    const int segment = segmentAt(-step - 1);
    auto& list = recvs[step % 2];
    list.clear();
    for (size_t c = 0; c < k; ++c) {
      list.push_back(ctx_.transport.irecv(ctx_.prev(), incoming[step % 2] + chunkOffset(segment, c),
                                          chunkBytes(segment, c), stepTag(step, c)));
    }
  };
  // Sends of step s carry what was reduced in step s-1; they are waited for before that
  // memory is written again two steps later.
  std::deque<std::pair<int, transport::RequestPtr>> sends;
  auto waitSendsUpTo = [&](int step) {
    while (!sends.empty() && sends.front().first <= step) {
      ctx_.wait(sends.front().second);
      sends.pop_front();
    }
  };

  postRecvs(0);
  {
    const int segment = segmentAt(0);
    for (size_t c = 0; c < k; ++c) {
      sends.emplace_back(
          0, ctx_.transport.isend(ctx_.next(), input + bytesAt(segment) + chunkOffset(segment, c),
                                  chunkBytes(segment, c), stepTag(0, c)));
    }
  }
  for (int step = 0; step <= n - 2; ++step) {
    if (step + 1 <= n - 2) postRecvs(step + 1);
    waitSendsUpTo(step - 1);
    const int segment = segmentAt(-step - 1);
    const bool last = step == n - 2;
    uint8_t* destination;
    if (final_out != nullptr) {
      destination = last ? final_out : partial[step % 2];
    } else {
      destination = accumulate + bytesAt(segment);
    }
    const uint8_t* own = input + bytesAt(segment);
    for (size_t c = 0; c < k; ++c) {
      ctx_.wait(recvs[step % 2][c]);
      const size_t offset = chunkOffset(segment, c);
      const size_t bytes = chunkBytes(segment, c);
      kernels::reduce(destination + offset, own + offset, incoming[step % 2] + offset,
                      bytes / element_size_, dtype, op);
      if (!last) {
        sends.emplace_back(step + 1, ctx_.transport.isend(ctx_.next(), destination + offset, bytes,
                                                          stepTag(step + 1, c)));
      }
    }
  }
  waitSendsUpTo(n);
}

void RingPipeline::allGather(uint8_t* data, uint32_t step_base) {
  const trace::Span phase(trace::Category::kPhase, "all_gather", ctx_.tag.sequence);
  const int n = ctx_.size;
  const size_t k = chunks_;
  auto stepTag = [&](int step, size_t chunk) {
    return ctx_.tagAt(step_base + static_cast<uint32_t>(static_cast<size_t>(step) * k + chunk));
  };
  auto at = [&](int segment, size_t chunk) {
    return data + layout_.offset[static_cast<size_t>(segment)] * element_size_ +
           chunkOffset(segment, chunk);
  };
  // Every receive lands in its final place, so all of them can be posted up front.
  std::vector<transport::RequestPtr> recvs;
  recvs.reserve(static_cast<size_t>(n - 1) * k);
  for (int step = 0; step <= n - 2; ++step) {
    const int segment = segmentAt(-step);
    for (size_t c = 0; c < k; ++c) {
      recvs.push_back(ctx_.transport.irecv(ctx_.prev(), at(segment, c), chunkBytes(segment, c),
                                           stepTag(step, c)));
    }
  }
  std::vector<transport::RequestPtr> sends;
  sends.reserve(static_cast<size_t>(n - 1) * k);
  const int owned = ownedSegment();
  for (size_t c = 0; c < k; ++c) {
    sends.push_back(
        ctx_.transport.isend(ctx_.next(), at(owned, c), chunkBytes(owned, c), stepTag(0, c)));
  }
  for (int step = 0; step <= n - 2; ++step) {
    const int segment = segmentAt(-step);
    for (size_t c = 0; c < k; ++c) {
      ctx_.wait(recvs[static_cast<size_t>(step) * k + c]);
      if (step < n - 2) {
        sends.push_back(ctx_.transport.isend(ctx_.next(), at(segment, c), chunkBytes(segment, c),
                                             stepTag(step + 1, c)));
      }
    }
  }
  for (auto& send : sends) ctx_.wait(send);
}

}  // namespace railshard::collectives
