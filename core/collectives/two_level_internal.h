#pragma once

// Shared by the two-level collectives' implementation files (two_level.cc,
// two_level_blocks.cc). Not part of the interface.
#include <exception>

#include "base/error.h"
#include "base/trace.h"
#include "core/collectives/context.h"
#include "transport/group_view.h"

namespace railshard::collectives {

// Runs a phase inside the host; an error there is first handed to the transport, which tells
// every other rank (the other hosts only hear of it that way).
template <typename Fn>
void twoLevelInHost(const Context& ctx, const char* phase, Fn&& fn) {
  trace::Span span(trace::Category::kPhase, phase);
  try {
    fn();
  } catch (const Error&) {
    ctx.transport.abort(std::current_exception(), true);
    throw;
  }
}

// `ctx` over the view: the same collective, deadline and workspace.
inline Context over(const Context& ctx, transport::GroupView& view) {
  return Context{view,        view.rank(), view.size(),  ctx.chunk_bytes,
                 ctx.timeout, ctx.tag,     ctx.workspace};
}

}  // namespace railshard::collectives
