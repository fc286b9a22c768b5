#pragma once

#include <cstdint>
#include <string>

#include "base/types.h"
#include "transport/message_tag.h"
#include "transport/transport.h"

namespace railshard {

// Which collective a message belongs to; travels in every message tag.
enum class CollectiveKind : uint8_t {
  kAllreduce = 1,
  kReduceScatter = 2,
  kAllgather = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kAllToAll = 6,      // the pair's block size in step (low 32 bits) and reserved2 (high)
  kPointToPoint = 7,  // sequence: the pair's own numbering (PointToPoint); root: the user's tag
};

std::string_view name(CollectiveKind kind);
// The collective's name, as a literal (trace events and the publisher keep it by pointer).
inline const char* collectiveName(const transport::MessageTag& tag) {
  return name(static_cast<CollectiveKind>(tag.collective)).data();
}

// The collective header of DESIGN.md, as the tag every message of the collective carries.
transport::MessageTag makeTag(CollectiveKind kind, uint64_t sequence, DataType dtype, ReduceOp op,
                              uint64_t count, uint32_t root);

// "allreduce #12 (float sum, count 1000)".
std::string describeTag(const transport::MessageTag& tag);
// "allreduce #12: ranks disagree: count: rank 0 has 1000, rank 1 has 7".
std::string describeMismatch(int my_rank, const transport::MessageTag& mine, int peer,
                             const transport::MessageTag& theirs);
transport::TagFormatter tagFormatter();

}  // namespace railshard
