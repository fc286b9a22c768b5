// Bruck's all-gather with chunks of any size (algorithms.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/collectives/algorithms.h"

namespace railshard::collectives {

namespace {

// The chunks in this rank's rotated order (its own first, then rank + 1, ...). Slots 0-6 are
// other algorithms', some of which call this one (the two-level all-gather over host leaders).
constexpr size_t kRotatedSlot = 7;

}  // namespace

void bruckAllgatherv(const Context& ctx, const void* send, const std::vector<size_t>& chunk_bytes,
                     void* recv) {
  const int n = ctx.size;
  const int r = ctx.rank;
  auto member = [&](int j) { return (r + j) % n; };
  // Byte offset of rotated position j: the chunks of members r, r + 1, ..., r + j - 1.
  std::vector<size_t> at(static_cast<size_t>(n) + 1, 0);
  for (int j = 0; j < n; ++j) {
    at[static_cast<size_t>(j) + 1] = at[static_cast<size_t>(j)] + chunk_bytes[member(j)];
  }
  uint8_t* rotated = ctx.workspace.get(kRotatedSlot, std::max<size_t>(1, at.back()));
  if (chunk_bytes[static_cast<size_t>(r)] > 0) {
    std::memcpy(rotated, send, chunk_bytes[static_cast<size_t>(r)]);
  }
  // Round k (distance d = 2^k): this rank holds positions [0, d); it sends the first
  // min(d, n - d) of them to rank - d and receives rank + d's first ones, which are its own
  // positions [d, d + count).
  uint32_t step = 0;
  for (int d = 1; d < n; d *= 2, ++step) {
    const int count = std::min(d, n - d);
    const size_t send_bytes = at[static_cast<size_t>(count)];
    const size_t recv_bytes = at[static_cast<size_t>(d + count)] - at[static_cast<size_t>(d)];
    auto in = ctx.transport.irecv((r + d) % n, rotated + at[static_cast<size_t>(d)], recv_bytes,
                                  ctx.tagAt(step));
    auto out = ctx.transport.isend((r - d + n) % n, rotated, send_bytes, ctx.tagAt(step));
    ctx.wait(in);
    ctx.wait(out);
  }
  // Back to member order.
  std::vector<size_t> natural(static_cast<size_t>(n) + 1, 0);
  for (int m = 0; m < n; ++m) {
    natural[static_cast<size_t>(m) + 1] =
        natural[static_cast<size_t>(m)] + chunk_bytes[static_cast<size_t>(m)];
  }
  auto* out = static_cast<uint8_t*>(recv);
  for (int j = 0; j < n; ++j) {
    const size_t bytes = at[static_cast<size_t>(j) + 1] - at[static_cast<size_t>(j)];
    if (bytes > 0) {
      std::memcpy(out + natural[static_cast<size_t>(member(j))],
                  rotated + at[static_cast<size_t>(j)], bytes);
    }
  }
}

}  // namespace railshard::collectives
