#include <cstring>
#include <vector>

#include "core/collectives/algorithms.h"

namespace railshard::collectives {

// Pairwise exchange: every block to its rank at once, every receive posted first. Each pair
// exchanges one message per direction; the block's element count travels in the message tag
// (step: low 32 bits, reserved2: high), so a sender and a receiver that disagree on a split
// size get a MismatchError before a byte lands instead of a short or overlong block. The
// rounds run in the order rank+1, rank+2, ... so that no rank is every rank's first peer.
void allToAll(const Context& ctx, const void* send, const std::vector<size_t>& send_counts,
              const std::vector<size_t>& send_displs, void* recv,
              const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
              DataType dtype) {
  const size_t element = sizeOf(dtype);
  auto tagFor = [&](size_t count) {
    transport::MessageTag tag = ctx.tag;
    tag.step = static_cast<uint32_t>(count & 0xffffffffu);
    tag.reserved2 = static_cast<uint32_t>(count >> 32);
    return tag;
  };
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  std::vector<transport::RequestPtr> requests;
  requests.reserve(2 * static_cast<size_t>(ctx.size));
  for (int i = 1; i < ctx.size; ++i) {
    const auto from = static_cast<size_t>((ctx.rank + ctx.size - i) % ctx.size);
    requests.push_back(ctx.transport.irecv(static_cast<int>(from),
                                           out + recv_displs[from] * element,
                                           recv_counts[from] * element, tagFor(recv_counts[from])));
  }
  for (int i = 1; i < ctx.size; ++i) {
    const auto to = static_cast<size_t>((ctx.rank + i) % ctx.size);
    requests.push_back(ctx.transport.isend(static_cast<int>(to), in + send_displs[to] * element,
                                           send_counts[to] * element, tagFor(send_counts[to])));
  }
  const auto self = static_cast<size_t>(ctx.rank);
  if (send_counts[self] > 0) {
    std::memmove(out + recv_displs[self] * element, in + send_displs[self] * element,
                 send_counts[self] * element);
  }
  for (const auto& request : requests) ctx.wait(request);
}

}  // namespace railshard::collectives
