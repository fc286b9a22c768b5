// Two-level reduce-scatter and all-gather (two_level.h): the collectives whose block d belongs
// to rank d. Each block is handled on every host by one rank (blockHandler): inside the host
// the handlers reduce or share their blocks in shared memory, and between hosts each handler
// exchanges its blocks directly with their owners, so same-host ranks send each other nothing
// over the network and each host moves (H-1)/H of the buffer, like the ring across hosts.
#include <algorithm>
#include <cstring>
#include <vector>

#include "base/trace.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/shm_engine.h"
#include "core/collectives/two_level.h"
#include "core/collectives/two_level_internal.h"
#include "kernels/reduce.h"

namespace railshard::collectives {

namespace {

// Workspace slots: the buffer in handler order, the blocks received from the other hosts.
// (Slots 0-4 belong to the algorithms two_level.cc uses.)
constexpr size_t kHandlerOrderSlot = 5;
constexpr size_t kReceivedSlot = 6;

// Where the blocks of this rank's host go in handler order: local rank l's blocks, ascending,
// then local rank l+1's. `begin` (elements) has one entry per local rank and one more, as
// ShmEngine's block collectives take it.
struct HandlerOrder {
  std::vector<std::vector<int>> handled;
  std::vector<size_t> begin;
  HandlerOrder(const HostLayout& layout, int host, size_t block) {
    handled = handledBlocks(layout, host);
    begin.push_back(0);
    for (const auto& blocks : handled) begin.push_back(begin.back() + blocks.size() * block);
  }
};

// Blocks laid out group by group (`groups[g]`: the ranks whose blocks follow, in order) to
// rank order: rank r's block at r * block_bytes of `out`.
void toRankOrder(const std::vector<std::vector<int>>& groups, const uint8_t* grouped, uint8_t* out,
                 size_t block_bytes) {
  if (block_bytes == 0) return;
  size_t at = 0;
  for (const auto& ranks : groups) {
    for (int rank : ranks) {
      std::memcpy(out + static_cast<size_t>(rank) * block_bytes, grouped + at, block_bytes);
      at += block_bytes;
    }
  }
}

}  // namespace

void twoLevelReduceScatter(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                           const void* send, void* recv, size_t recv_count, DataType dtype,
                           ReduceOp op) {
  const size_t element = sizeOf(dtype);
  const size_t block_bytes = recv_count * element;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const ReduceOp each = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const int my_host = layout.host_of[static_cast<size_t>(ctx.rank)];
  const auto local = static_cast<size_t>(layout.local_rank_of[static_cast<size_t>(ctx.rank)]);
  const HandlerOrder order(layout, my_host, recv_count);
  const std::vector<int>& mine = order.handled[local];
  // The host's sum of each block this rank handles: reduced in shared memory, or (alone on
  // the host) this rank's input as it is.
  const uint8_t* sums = in;
  std::vector<size_t> sum_at(static_cast<size_t>(ctx.size), 0);
  if (host != nullptr) {
    // The buffer in handler order, then (in the same slot) the blocks this rank reduced.
    const size_t total = order.begin.back() * element;
    uint8_t* ordered = ctx.workspace.get(kHandlerOrderSlot,
                                         std::max<size_t>(1, total + mine.size() * block_bytes));
    uint8_t* reduced = ordered + total;
    size_t at = 0;
    for (const auto& blocks : order.handled) {
      for (int block : blocks) {
        if (block_bytes > 0) {
          std::memcpy(ordered + at, in + static_cast<size_t>(block) * block_bytes, block_bytes);
        }
        at += block_bytes;
      }
    }
    twoLevelInHost(ctx, "host_reduce_scatter", [&] {
      host->reduceScatterBlocks(ordered, reduced, order.begin, dtype, each, ctx.tag);
    });
    sums = reduced;
    for (size_t i = 0; i < mine.size(); ++i) sum_at[static_cast<size_t>(mine[i])] = i * block_bytes;
  } else {
    for (int block = 0; block < ctx.size; ++block) {
      sum_at[static_cast<size_t>(block)] = static_cast<size_t>(block) * block_bytes;
    }
  }

  trace::Span span(trace::Category::kPhase, "cross_host");
  // This rank's block: one partial sum from the handler of every other host.
  const int hosts = layout.hostCount();
  uint8_t* received =
      ctx.workspace.get(kReceivedSlot, std::max<size_t>(1, (hosts - 1) * block_bytes));
  std::vector<transport::RequestPtr> requests;
  std::vector<const uint8_t*> partials;
  for (int h = 0; h < hosts; ++h) {
    if (h == my_host) continue;
    uint8_t* into = received + partials.size() * block_bytes;
    requests.push_back(
        ctx.transport.irecv(blockHandler(layout, h, ctx.rank), into, block_bytes, ctx.tagAt(0)));
    partials.push_back(into);
  }
  for (int block : mine) {
    if (block == ctx.rank) continue;
    requests.push_back(ctx.transport.isend(block, sums + sum_at[static_cast<size_t>(block)],
                                           block_bytes, ctx.tagAt(0)));
  }
  for (const auto& request : requests) ctx.wait(request);
  // recv may be this rank's block of send (in place); the first reduction reads it before
  // writing it.
  const uint8_t* own = sums + sum_at[static_cast<size_t>(ctx.rank)];
  if (partials.empty()) {
    if (out != own && block_bytes > 0) std::memmove(out, own, block_bytes);
  }
  for (size_t i = 0; i < partials.size(); ++i) {
    kernels::reduce(out, i == 0 ? own : out, partials[i], recv_count, dtype, each);
  }
  if (op == ReduceOp::kAvg && recv_count > 0) {
    kernels::divide(out, recv_count, dtype, static_cast<size_t>(ctx.size));
  }
}

void twoLevelAllgather(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                       const void* send, void* recv, size_t send_count, DataType dtype) {
  const size_t element = sizeOf(dtype);
  const size_t block_bytes = send_count * element;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const int my_host = layout.host_of[static_cast<size_t>(ctx.rank)];
  const auto local = static_cast<size_t>(layout.local_rank_of[static_cast<size_t>(ctx.rank)]);
  const HandlerOrder order(layout, my_host, send_count);
  const std::vector<int>& mine = order.handled[local];
  // The blocks this rank handles, from their owners on the other hosts: straight into recv
  // when it is alone on its host, else into its part of the buffer in handler order.
  uint8_t* ordered = nullptr;
  if (host != nullptr) {
    ordered =
        ctx.workspace.get(kHandlerOrderSlot, std::max<size_t>(1, order.begin.back() * element));
  }
  auto landing = [&](size_t i, int block) {
    return ordered != nullptr ? ordered + order.begin[local] * element + i * block_bytes
                              : out + static_cast<size_t>(block) * block_bytes;
  };
  {
    trace::Span span(trace::Category::kPhase, "cross_host");
    std::vector<transport::RequestPtr> requests;
    for (size_t i = 0; i < mine.size(); ++i) {
      uint8_t* into = landing(i, mine[i]);
      if (mine[i] == ctx.rank) {
        if (into != in && block_bytes > 0) std::memmove(into, in, block_bytes);
        continue;
      }
      requests.push_back(ctx.transport.irecv(mine[i], into, block_bytes, ctx.tagAt(0)));
    }
    for (int h = 0; h < layout.hostCount(); ++h) {
      if (h == my_host) continue;
      requests.push_back(
          ctx.transport.isend(blockHandler(layout, h, ctx.rank), in, block_bytes, ctx.tagAt(0)));
    }
    for (const auto& request : requests) ctx.wait(request);
  }
  if (host == nullptr) return;
  twoLevelInHost(ctx, "host_allgather", [&] {
    host->allgatherBlocks(ordered + order.begin[local] * element, ordered, order.begin, dtype,
                          ctx.tag);
  });
  toRankOrder(order.handled, ordered, out, block_bytes);
}

void twoLevelLeaderAllgather(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                             const void* send, void* recv, size_t send_count, DataType dtype) {
  const size_t element = sizeOf(dtype);
  const size_t block_bytes = send_count * element;
  const int my_host = layout.host_of[static_cast<size_t>(ctx.rank)];
  const auto& mine = layout.hosts[static_cast<size_t>(my_host)];
  const auto locals = static_cast<size_t>(mine.size());
  // The host's blocks in local order, on every rank of the host (`send` may lie in `recv`: it
  // is read here, before anything is written there).
  const uint8_t* host_blocks = static_cast<const uint8_t*>(send);
  if (host != nullptr) {
    uint8_t* gathered =
        ctx.workspace.get(kHandlerOrderSlot, std::max<size_t>(1, locals * block_bytes));
    std::vector<size_t> begin;
    for (size_t l = 0; l <= locals; ++l) begin.push_back(l * send_count);
    twoLevelInHost(ctx, "host_allgather",
                   [&] { host->allgatherBlocks(send, gathered, begin, dtype, ctx.tag); });
    host_blocks = gathered;
  }
  auto* out = static_cast<uint8_t*>(recv);
  if (mine.front() == ctx.rank) {
    trace::Span span(trace::Category::kPhase, "cross_host");
    std::vector<int> leaders;
    std::vector<size_t> chunk_bytes;
    for (const auto& ranks : layout.hosts) {
      leaders.push_back(ranks.front());
      chunk_bytes.push_back(ranks.size() * block_bytes);
    }
    // Every host's blocks in host order, then each block to its rank's place.
    uint8_t* by_host = ctx.workspace.get(
        kReceivedSlot, std::max<size_t>(1, static_cast<size_t>(ctx.size) * block_bytes));
    transport::GroupView view(ctx.transport, leaders);
    bruckAllgatherv(over(ctx, view), host_blocks, chunk_bytes, by_host);
    toRankOrder(layout.hosts, by_host, out, block_bytes);
  }
  if (host == nullptr) return;
  const int local_leader = layout.local_rank_of[static_cast<size_t>(mine.front())];
  twoLevelInHost(ctx, "host_broadcast", [&] {
    host->broadcast(recv, recv, send_count * static_cast<size_t>(ctx.size), dtype, local_leader,
                    ctx.tag);
  });
}

}  // namespace railshard::collectives
