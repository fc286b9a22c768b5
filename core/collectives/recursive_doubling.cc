#include <cstring>

#include "core/collectives/algorithms.h"
#include "kernels/reduce.h"

namespace railshard::collectives {

// Recursive doubling: in round k each rank swaps its whole buffer with the rank 2^k away and
// reduces, so after log2(n) rounds everyone has the result — few messages, which is what
// small all-reduces pay for. With n not a power of two, the first 2·(n - p) ranks (p the
// largest power of two below n) pair up: odd ones hand their data to their even neighbour
// before and get the result back after.
void recursiveDoublingAllreduce(const Context& ctx, const void* send, void* recv, size_t count,
                                DataType dtype, ReduceOp op) {
  const trace::Span phase(trace::Category::kPhase, "recursive_doubling", ctx.tag.sequence);
  const size_t bytes = count * sizeOf(dtype);
  auto* out = static_cast<uint8_t*>(recv);
  if (send != recv && bytes > 0) std::memcpy(out, send, bytes);
  const int n = ctx.size;
  if (n == 1) return;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  const int rank = ctx.rank;
  uint8_t* incoming = ctx.workspace.get(0, bytes);
  uint32_t round = 0;

  int virtual_rank;
  if (rank < 2 * extra) {
    if (rank % 2 == 1) {
      ctx.wait(ctx.transport.isend(rank - 1, out, bytes, ctx.tagAt(round)));
      virtual_rank = -1;
    } else {
      ctx.wait(ctx.transport.irecv(rank + 1, incoming, bytes, ctx.tagAt(round)));
      kernels::reduce(out, out, incoming, count, dtype, op);
      virtual_rank = rank / 2;
    }
  } else {
    virtual_rank = rank - extra;
  }
  ++round;
  if (virtual_rank >= 0) {
    for (int mask = 1; mask < p; mask <<= 1, ++round) {
      const int partner_virtual = virtual_rank ^ mask;
      const int partner = partner_virtual < extra ? partner_virtual * 2 : partner_virtual + extra;
      auto recv_request = ctx.transport.irecv(partner, incoming, bytes, ctx.tagAt(round));
      auto send_request = ctx.transport.isend(partner, out, bytes, ctx.tagAt(round));
      ctx.wait(recv_request);
      ctx.wait(send_request);  // `out` is rewritten next
      // Lower rank's data first, so both partners compute bit-identical results.
      if (partner < rank) {
        kernels::reduce(out, incoming, out, count, dtype, op);
      } else {
        kernels::reduce(out, out, incoming, count, dtype, op);
      }
    }
    if (op == ReduceOp::kAvg) kernels::divide(out, count, dtype, static_cast<size_t>(n));
  } else {
    round += static_cast<uint32_t>(__builtin_ctz(static_cast<unsigned>(p)));
  }
  if (rank < 2 * extra) {
    if (rank % 2 == 1) {
      ctx.wait(ctx.transport.irecv(rank - 1, out, bytes, ctx.tagAt(round)));
    } else {
      ctx.wait(ctx.transport.isend(rank + 1, out, bytes, ctx.tagAt(round)));
    }
  }
}

}  // namespace railshard::collectives
