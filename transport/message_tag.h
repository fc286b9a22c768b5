#pragma once

#include <cstdint>

namespace railshard::transport {

// What a message belongs to. Both sides of every transfer state the tag they expect; the
// transport compares them before a single payload byte lands in user memory, so ranks that
// disagree on the collective get a MismatchError instead of silently mixed data. The fields
// are the collective header of DESIGN.md; the transport treats them as opaque except for the
// equality check and hands them to the formatter below for the error message.
struct MessageTag {
  uint64_t sequence = 0;  // collective number on this communicator
  uint64_t count = 0;     // elements in the collective (as the caller passed them)
  uint32_t root = 0;
  uint8_t collective = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t reserved = 0;
  uint32_t step = 0;  // algorithm step and chunk, so an out-of-order message is caught too
  uint32_t reserved2 = 0;

  bool operator==(const MessageTag&) const = default;
};
static_assert(sizeof(MessageTag) == 32, "MessageTag is part of the wire format");

}  // namespace railshard::transport
