#include <cstring>

#include "core/collectives/algorithms.h"
#include "core/collectives/ring.h"
#include "kernels/reduce.h"

namespace railshard::collectives {

void ringReduceScatter(const Context& ctx, const void* send, void* recv, size_t recv_count,
                       DataType dtype, ReduceOp op) {
  const size_t element_size = sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (ctx.size == 1) {
    if (in != out && recv_count > 0) std::memcpy(out, in, recv_count * element_size);
    return;
  }
  const size_t n = static_cast<size_t>(ctx.size);
  const size_t slice = sliceSegmentElements(ctx, element_size);
  const size_t slices = recv_count == 0 ? 1 : (recv_count + slice - 1) / slice;
  uint32_t step_base = 0;
  for (size_t i = 0; i < slices; ++i) {
    const size_t begin = i * slice;
    const size_t length = std::min(slice, recv_count - std::min(recv_count, begin));
    const SegmentLayout layout = SegmentLayout::blockSlice(recv_count, begin, length, ctx.size);
    RingPipeline ring(ctx, layout, element_size, -1);
    uint8_t* result = out + begin * element_size;
    ring.reduceScatter(in, nullptr, result, dtype, op, step_base);
    step_base += 1u << 20;
    if (op == ReduceOp::kAvg) kernels::divide(result, length, dtype, n);
  }
}

}  // namespace railshard::collectives
