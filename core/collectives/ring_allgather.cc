#include <cstring>

#include "core/collectives/algorithms.h"
#include "core/collectives/ring.h"

namespace railshard::collectives {

void ringAllgather(const Context& ctx, const void* send, void* recv, size_t send_count,
                   DataType dtype) {
  const size_t element_size = sizeOf(dtype);
  const size_t block_bytes = send_count * element_size;
  auto* out = static_cast<uint8_t*>(recv);
  uint8_t* mine = out + static_cast<size_t>(ctx.rank) * block_bytes;
  if (send != mine && block_bytes > 0) std::memcpy(mine, send, block_bytes);
  if (ctx.size == 1) return;
  const size_t slice = sliceSegmentElements(ctx, element_size);
  const size_t slices = send_count == 0 ? 1 : (send_count + slice - 1) / slice;
  uint32_t step_base = 0;
  for (size_t i = 0; i < slices; ++i) {
    const size_t begin = i * slice;
    const size_t length = std::min(slice, send_count - std::min(send_count, begin));
    const SegmentLayout layout = SegmentLayout::blockSlice(send_count, begin, length, ctx.size);
    RingPipeline ring(ctx, layout, element_size, -1);
    ring.allGather(out, step_base);
    step_base += 1u << 20;
  }
}

}  // namespace railshard::collectives
