#include "core/collectives/algorithms.h"

namespace railshard::collectives {

void disseminationBarrier(const Context& ctx) {
  const trace::Span phase(trace::Category::kPhase, "dissemination", ctx.tag.sequence);
  const int n = ctx.size;
  uint32_t round = 0;
  // After round k every rank has (transitively) heard from the 2^(k+1) ranks before it, so
  // after ceil(log2 n) rounds from all of them.
  for (int distance = 1; distance < n; distance *= 2, ++round) {
    const int to = (ctx.rank + distance) % n;
    const int from = (ctx.rank - distance + n) % n;
    auto recv = ctx.transport.irecv(from, nullptr, 0, ctx.tagAt(round));
    auto send = ctx.transport.isend(to, nullptr, 0, ctx.tagAt(round));
    ctx.wait(recv);
    ctx.wait(send);
  }
}

}  // namespace railshard::collectives
