#include <cstring>

#include "core/collectives/algorithms.h"
#include "core/collectives/ring.h"
#include "kernels/reduce.h"

namespace railshard::collectives {

size_t sliceSegmentElements(const Context& ctx, size_t element_size) {
  constexpr size_t kChunksPerSlice = 16;
  return std::max<size_t>(1, kChunksPerSlice * ctx.chunk_bytes / element_size);
}

void ringAllreduce(const Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                   ReduceOp op) {
  const size_t element_size = sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (ctx.size == 1) {
    if (in != out && count > 0) std::memcpy(out, in, count * element_size);
    return;
  }
  const size_t n = static_cast<size_t>(ctx.size);
  const size_t slice = sliceSegmentElements(ctx, element_size) * n;
  const size_t slices = count == 0 ? 1 : (count + slice - 1) / slice;
  uint32_t step_base = 0;
  for (size_t i = 0; i < slices; ++i) {
    const size_t offset = i * slice;
    const size_t length = std::min(slice, count - std::min(count, offset));
    const SegmentLayout layout = SegmentLayout::balanced(length, ctx.size);
    RingPipeline ring(ctx, layout, element_size, 0);
    const uint8_t* slice_in = in + offset * element_size;
    uint8_t* slice_out = out + offset * element_size;
    ring.reduceScatter(slice_in, slice_out, nullptr, dtype, op, step_base);
    step_base += 1u << 20;
    if (op == ReduceOp::kAvg) {
      const auto owned = static_cast<size_t>(ring.ownedSegment());
      kernels::divide(slice_out + layout.offset[owned] * element_size, layout.length[owned], dtype,
                      n);
    }
    ring.allGather(slice_out, step_base);
    step_base += 1u << 20;
  }
}

}  // namespace railshard::collectives
