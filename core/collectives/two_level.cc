#include "core/collectives/two_level.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "base/error.h"
#include "base/trace.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/pipeline_worker.h"
#include "core/collectives/shm_engine.h"
#include "core/collectives/two_level_internal.h"
#include "kernels/reduce.h"
#include "transport/group_view.h"

namespace railshard::collectives {

namespace {

// Workspace slot of the direct variant's host sum; the algorithms it calls use slots 0-3.
constexpr size_t kHostSumSlot = 4;

bool contains(const std::vector<int>& members, int rank) {
  return std::find(members.begin(), members.end(), rank) != members.end();
}

// The host's sum of `send` (`each` over its ranks' inputs, one shared-memory step), kept in the
// workspace; a rank alone on its host has its own input there.
const uint8_t* hostSum(const Context& ctx, ShmEngine* host, const void* send, size_t count,
                       DataType dtype, ReduceOp each) {
  const size_t bytes = count * sizeOf(dtype);
  uint8_t* sum = ctx.workspace.get(kHostSumSlot, std::max<size_t>(1, bytes));
  if (host == nullptr) {
    if (bytes > 0) std::memcpy(sum, send, bytes);
  } else {
    twoLevelInHost(ctx, "host_reduce",
                   [&] { host->allreduceDirect(send, sum, count, dtype, each, ctx.tag); });
  }
  return sum;
}

// Chunks of a pipelined two-level all-reduce: at most kChunks, none below kMinChunkBytes
// (each chunk's ring pays a few round trips to start; fewer, larger chunks lengthen only the
// pipeline's fill and drain: the first chunk's reduce-scatter and the last one's all-gather).
constexpr size_t kChunks = 8;
constexpr size_t kMinChunkBytes = size_t{2} << 20;

}  // namespace

size_t twoLevelChunkElements(size_t count, size_t element) {
  const size_t least = std::max<size_t>(1, kMinChunkBytes / element);
  return std::max(least, (count + kChunks - 1) / kChunks);
}

size_t twoLevelChunks(size_t count, size_t element) {
  const size_t chunk = twoLevelChunkElements(count, element);
  return std::max<size_t>(1, (count + chunk - 1) / chunk);
}

void twoLevelAllreduce(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                       const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) {
  const size_t element = sizeOf(dtype);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const ReduceOp each = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const int local_size = host != nullptr ? host->size() : 1;
  const size_t me = host != nullptr ? static_cast<size_t>(host->rank()) : 0;
  const size_t chunk = twoLevelChunkElements(count, element);
  const size_t chunks = twoLevelChunks(count, element);
  auto offsetOf = [&](size_t k) { return k * chunk; };
  auto lengthOf = [&](size_t k) { return std::min(chunk, count - std::min(count, k * chunk)); };
  // The three phases of chunk k. A chunk's regions of send and recv are touched by nothing
  // but its own phases, so the cross-host phase of one chunk (on the worker) and the host
  // phases of its neighbours (here) never share memory, in place or not.
  auto reduceInHost = [&](size_t k) {
    const size_t offset = offsetOf(k);
    const size_t length = lengthOf(k);
    if (host == nullptr) {
      if (send != recv && length > 0) {
        std::memcpy(out + offset * element, in + offset * element, length * element);
      }
      return;
    }
    const std::vector<size_t> blocks = hostBlocks(length, local_size);
    twoLevelInHost(ctx, "host_reduce_scatter", [&] {
      host->reduceScatterBlocks(in + offset * element, out + (offset + blocks[me]) * element,
                                blocks, dtype, each, ctx.tag);
    });
  };
  auto crossHosts = [&](size_t k) {
    trace::Span span(trace::Category::kPhase, "cross_host");
    const size_t offset = offsetOf(k);
    for (const CrossRange& range : crossRanges(layout, lengthOf(k))) {
      if (!contains(range.members, ctx.rank)) continue;
      transport::GroupView view(ctx.transport, range.members);
      uint8_t* data = out + (offset + range.begin) * element;
      const size_t length = range.end - range.begin;
      ringAllreduce(over(ctx, view), data, data, length, dtype, each);
      if (op == ReduceOp::kAvg) {
        kernels::divide(data, length, dtype, static_cast<size_t>(ctx.size));
      }
    }
  };
  auto gatherInHost = [&](size_t k) {
    if (host == nullptr) return;
    const size_t offset = offsetOf(k);
    const std::vector<size_t> blocks = hostBlocks(lengthOf(k), local_size);
    twoLevelInHost(ctx, "host_allgather", [&] {
      host->allgatherBlocks(out + (offset + blocks[me]) * element, out + offset * element, blocks,
                            dtype, ctx.tag);
    });
  };
  if (chunks == 1) {
    reduceInHost(0);
    crossHosts(0);
    gatherInHost(0);
    return;
  }
  // Pipelined: while the worker all-reduces chunk k across hosts, this thread reduce-scatters
  // chunk k+1 and all-gathers chunk k-1 in the host; the worker always has the next chunk
  // queued, so the rails never wait for the host. The schedule is fixed (not "whatever is
  // ready"), so every rank of a host takes its shared-memory steps in the same order.
  PipelineWorker worker(crossHosts, trace::currentRank());
  try {
    for (size_t k = 0; k < chunks; ++k) {
      reduceInHost(k);
      worker.submit();
      if (k > 0) {
        worker.waitFor(k - 1);
        gatherInHost(k - 1);
      }
    }
    worker.waitFor(chunks - 1);
    gatherInHost(chunks - 1);
  } catch (...) {
    // The worker may be waiting on a peer that will never send: poisoning the transport ends
    // its wait at once (and tells every other rank) before the worker is joined.
    ctx.transport.abort(std::current_exception(), true);
    throw;
  }
}

void twoLevelDirectAllreduce(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                             const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op) {
  const ReduceOp each = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  // A rank in several groups (a host with fewer ranks than others) starts each group's
  // all-reduce from the host's sum.
  const uint8_t* host_sum = hostSum(ctx, host, send, count, dtype, each);
  trace::Span span(trace::Category::kPhase, "cross_host");
  for (const auto& members : directGroups(layout)) {
    if (!contains(members, ctx.rank)) continue;
    transport::GroupView view(ctx.transport, members);
    recursiveDoublingAllreduce(over(ctx, view), host_sum, recv, count, dtype, each);
  }
  if (op == ReduceOp::kAvg && count > 0) {
    kernels::divide(recv, count, dtype, static_cast<size_t>(ctx.size));
  }
}

void twoLevelLeaderAllreduce(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                             const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op) {
  const ReduceOp each = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  // Every rank of the host takes part in its sum; the others then sleep in the broadcast
  // while the leader is across, their cores its.
  const uint8_t* host_sum = hostSum(ctx, host, send, count, dtype, each);
  const auto& mine =
      layout.hosts[static_cast<size_t>(layout.host_of[static_cast<size_t>(ctx.rank)])];
  if (mine.front() == ctx.rank) {
    trace::Span span(trace::Category::kPhase, "cross_host");
    std::vector<int> leaders;
    for (const auto& ranks : layout.hosts) leaders.push_back(ranks.front());
    transport::GroupView view(ctx.transport, leaders);
    recursiveDoublingAllreduce(over(ctx, view), host_sum, recv, count, dtype, each);
    if (op == ReduceOp::kAvg && count > 0) {
      kernels::divide(recv, count, dtype, static_cast<size_t>(ctx.size));
    }
  }
  if (host == nullptr) return;
  const int local_leader = layout.local_rank_of[static_cast<size_t>(mine.front())];
  twoLevelInHost(ctx, "host_broadcast",
                 [&] { host->broadcast(recv, recv, count, dtype, local_leader, ctx.tag); });
}

void twoLevelBroadcast(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                       const void* send, void* recv, size_t count, DataType dtype, int root) {
  const int root_host = layout.host_of[static_cast<size_t>(root)];
  std::vector<int> carriers;
  for (size_t h = 0; h < layout.hosts.size(); ++h) {
    carriers.push_back(static_cast<int>(h) == root_host ? root : layout.hosts[h].front());
  }
  const int mine = layout.host_of[static_cast<size_t>(ctx.rank)];
  const int carrier = carriers[static_cast<size_t>(mine)];
  if (carrier == ctx.rank) {
    trace::Span span(trace::Category::kPhase, "cross_host");
    transport::GroupView view(ctx.transport, carriers);
    chainBroadcast(over(ctx, view), send, recv, count, dtype, root_host);  // root's copy too
  }
  if (host == nullptr) return;
  // The carrier's recv holds the message now (the root's too: the chain copied it there).
  const int local_carrier = layout.local_rank_of[static_cast<size_t>(carrier)];
  twoLevelInHost(ctx, "host_broadcast",
                 [&] { host->broadcast(recv, recv, count, dtype, local_carrier, ctx.tag); });
}

void twoLevelBarrier(const Context& ctx, ShmEngine* host, const HostLayout& layout) {
  if (host != nullptr) twoLevelInHost(ctx, "host_barrier", [&] { host->barrier(ctx.tag); });
  const auto& ranks =
      layout.hosts[static_cast<size_t>(layout.host_of[static_cast<size_t>(ctx.rank)])];
  if (ranks.front() == ctx.rank) {
    std::vector<int> leaders;
    for (const auto& each : layout.hosts) leaders.push_back(each.front());
    transport::GroupView view(ctx.transport, leaders);
    disseminationBarrier(over(ctx, view));
  }
  if (host != nullptr) twoLevelInHost(ctx, "host_barrier", [&] { host->barrier(ctx.tag); });
}

}  // namespace railshard::collectives
