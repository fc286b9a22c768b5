#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/message_tag.h"

namespace railshard::transport::links::ibverbs {

// What one side of a lane (one reliable-connected queue pair between two ranks on one HCA
// rail) tells the other (its connection record, through the messenger: rdma_lane.h): how to reach
// its queue pair, and where its receive ring is. Fixed layout, little-endian, versioned; decode()
// checks every field against its range, so a corrupt or foreign record is a ProtocolError naming
// the field, never a queue pair moved with garbage.
struct LaneInfo {
  static constexpr uint32_t kMagic = 0x42495352;  // "RSIB"
  static constexpr uint16_t kVersion = 1;
  static constexpr size_t kEncodedBytes = 96;

  uint32_t rank = 0;
  uint16_t rail = 0;
  uint8_t port = 1;
  uint8_t mtu = 0;         // enum ibv_mtu of the port (1 = 256 ... 5 = 4096)
  uint8_t link_layer = 0;  // IBV_LINK_LAYER_INFINIBAND (1) or _ETHERNET (2)
  uint8_t gid_index = 0;
  uint16_t lid = 0;
  // RDMA reads this side serves and issues at once per queue pair (the zero-copy rendezvous);
  // 0 from a peer that never reads: the pair stays on staged writes.
  uint8_t rd_atomic = 0;
  uint32_t qpn = 0;  // 24 bits
  uint32_t psn = 0;  // 24 bits
  std::array<uint8_t, 16> gid{};
  uint64_t ring_addr = 0;  // receive ring: slots x slot_bytes, remote-writable
  uint32_t ring_rkey = 0;
  uint32_t slots = 0;
  uint32_t slot_bytes = 0;

  std::vector<uint8_t> encode() const;
  // ProtocolError naming the field and its value when a field is out of range.
  static LaneInfo decode(const std::vector<uint8_t>& bytes);
};

// The 32-bit immediate of an RDMA write with immediate: a frame landed in `slot`, or the
// receiver hands `value` slots back to the sender (a zero-length write).
enum class ImmKind : uint8_t { kData = 0, kCredit = 1 };
struct Immediate {
  ImmKind kind = ImmKind::kData;
  uint32_t value = 0;  // 24 bits: slot index or credit count
};
uint32_t encodeImmediate(const Immediate& imm);  // host order; the caller applies htonl
// ProtocolError for an unknown kind.
Immediate decodeImmediate(uint32_t host_order);

}  // namespace railshard::transport::links::ibverbs
