#include <algorithm>
#include <cstring>
#include <vector>

#include "core/collectives/algorithms.h"

namespace railshard::collectives {

void chainBroadcast(const Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                    int root) {
  const trace::Span phase(trace::Category::kPhase, "chain", ctx.tag.sequence);
  const size_t bytes = count * sizeOf(dtype);
  auto* out = static_cast<uint8_t*>(recv);
  if (ctx.rank == root && send != recv && bytes > 0) std::memcpy(out, send, bytes);
  if (ctx.size == 1) return;
  const int n = ctx.size;
  const int position = (ctx.rank - root + n) % n;  // 0 = root, n-1 = end of the chain
  const size_t chunks = std::max<size_t>(1, (bytes + ctx.chunk_bytes - 1) / ctx.chunk_bytes);
  auto chunkOffset = [&](size_t c) { return c * ctx.chunk_bytes; };
  auto chunkBytes = [&](size_t c) {
    return std::min(ctx.chunk_bytes, bytes - std::min(bytes, chunkOffset(c)));
  };

  std::vector<transport::RequestPtr> recvs;
  if (position > 0) {
    for (size_t c = 0; c < chunks; ++c) {
      recvs.push_back(ctx.transport.irecv(ctx.prev(), out + chunkOffset(c), chunkBytes(c),
                                          ctx.tagAt(static_cast<uint32_t>(c))));
    }
  }
  std::vector<transport::RequestPtr> sends;
  for (size_t c = 0; c < chunks; ++c) {
    if (position > 0) ctx.wait(recvs[c]);
    if (position < n - 1) {
      sends.push_back(ctx.transport.isend(ctx.next(), out + chunkOffset(c), chunkBytes(c),
                                          ctx.tagAt(static_cast<uint32_t>(c))));
    }
  }
  // The end of the chain confirms to the root. Without it a root that finished sending could
  // return before anyone checked its header: two ranks that each believe they are the root
  // would both "succeed" with nothing broadcast.
  const uint32_t ack_step = static_cast<uint32_t>(chunks);
  const int last = (root + n - 1) % n;
  if (position == n - 1)
    sends.push_back(ctx.transport.isend(root, nullptr, 0, ctx.tagAt(ack_step)));
  if (position == 0) ctx.wait(ctx.transport.irecv(last, nullptr, 0, ctx.tagAt(ack_step)));
  for (auto& send_request : sends) ctx.wait(send_request);
}

}  // namespace railshard::collectives
