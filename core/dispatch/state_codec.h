#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dispatch/elastic_state.h"

namespace railshard::dispatch {

// The whole of one rank's dispatcher state as bytes, and back: how a rank that joins a
// running job (CollectiveDispatcher::adopt) gets the members' dispatcher -- epoch position,
// open step, estimates, options, the snapshot recovery may go back to. The members' own
// fingerprint check after the hand-over proves the copy is exact.
//
// The format is private to one build (little-endian, fixed-width fields, no versioning):
// every rank of a job runs the same binary, which the fingerprint check also catches.
// decode() throws ProtocolError naming the field when the bytes are short, too
// long, or carry counts that cannot be (it never allocates more than the bytes can hold).
class StateCodec {
 public:
  // `launch_ranks`: the launch rank of each dispatcher rank (CollectiveDispatcher's map).
  static std::vector<uint8_t> encode(const ElasticState& state,
                                     const std::vector<int>& launch_ranks = {});
  struct Decoded {
    ElasticState state;
    std::vector<int> launch_ranks;
  };
  static Decoded decode(std::span<const uint8_t> bytes);
};

}  // namespace railshard::dispatch
