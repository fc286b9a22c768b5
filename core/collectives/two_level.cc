#include "core/collectives/two_level.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/base/error.h"
#include "core/base/trace.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/shm_engine.h"
#include "kernels/reduce.h"
#include "transport/group_view.h"

namespace railshard::collectives {

namespace {

// Workspace slot of the direct variant's host sum; the algorithms it calls use slots 0-3.
constexpr size_t kHostSumSlot = 4;

// Runs a phase inside the host; an error there is first handed to the transport, which tells
// every other rank (the other hosts only hear of it that way).
template <typename Fn>
void inHost(const Context& ctx, const char* phase, Fn&& fn) {
  trace::Span span(trace::Category::kPhase, phase);
  try {
    fn();
  } catch (const Error&) {
    ctx.transport.abort(std::current_exception(), true);
    throw;
  }
}

bool contains(const std::vector<int>& members, int rank) {
  return std::find(members.begin(), members.end(), rank) != members.end();
}

// `ctx` over the view: the same collective, deadline and workspace.
Context over(const Context& ctx, transport::GroupView& view) {
  return Context{view,        view.rank(), view.size(),  ctx.chunk_bytes,
                 ctx.timeout, ctx.tag,     ctx.workspace};
}

}  // namespace

void twoLevelAllreduce(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                       const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) {
  const size_t element = sizeOf(dtype);
  auto* out = static_cast<uint8_t*>(recv);
  const ReduceOp each = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const std::vector<size_t> blocks = hostBlocks(count, host != nullptr ? host->size() : 1);
  const size_t mine = host != nullptr ? blocks[static_cast<size_t>(host->rank())] : 0;
  if (host == nullptr) {
    if (send != recv && count > 0) std::memcpy(out, send, count * element);
  } else {
    inHost(ctx, "host_reduce_scatter", [&] {
      host->reduceScatterBlocks(send, out + mine * element, blocks, dtype, each, ctx.tag);
    });
  }
  {
    trace::Span span(trace::Category::kPhase, "cross_host");
    for (const CrossRange& range : crossRanges(layout, count)) {
      if (!contains(range.members, ctx.rank)) continue;
      transport::GroupView view(ctx.transport, range.members);
      uint8_t* data = out + range.begin * element;
      const size_t length = range.end - range.begin;
      ringAllreduce(over(ctx, view), data, data, length, dtype, each);
      if (op == ReduceOp::kAvg) {
        kernels::divide(data, length, dtype, static_cast<size_t>(ctx.size));
      }
    }
  }
  if (host == nullptr) return;
  inHost(ctx, "host_allgather",
         [&] { host->allgatherBlocks(out + mine * element, out, blocks, dtype, ctx.tag); });
}

void twoLevelDirectAllreduce(const Context& ctx, ShmEngine* host, const HostLayout& layout,
                             const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op) {
  const size_t bytes = count * sizeOf(dtype);
  const ReduceOp each = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  // The host's sum stays aside: a rank in several groups (a host with fewer ranks than
  // others) starts each group's all-reduce from it.
  uint8_t* host_sum = ctx.workspace.get(kHostSumSlot, std::max<size_t>(1, bytes));
  if (host == nullptr) {
    if (bytes > 0) std::memcpy(host_sum, send, bytes);
  } else {
    inHost(ctx, "host_reduce",
           [&] { host->allreduceDirect(send, host_sum, count, dtype, each, ctx.tag); });
  }
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

}  // namespace railshard::collectives
