#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/message_tag.h"

namespace railshard::transport::ibverbs {

// What one side of a lane (one reliable-connected queue pair between two ranks on one HCA
// rail) tells the other through the store: how to reach its queue pair, and where its
// receive ring is. Fixed layout, little-endian, versioned; decode() checks every field
// against its range, so a corrupt or foreign record is a ProtocolError naming the field, never
// a queue pair moved with garbage.
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

// A connection record as the store carries it (hex text); fromHex() raises ProtocolError for
// anything but pairs of lowercase hex digits.
std::string toHex(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> fromHex(const std::string& text);

// At the start of every slot a data write fills: which message and which part of it.
struct PieceHeader {
  static constexpr uint32_t kMagic = 0x50495352;  // "RSIP"
  // A piece sent again on another lane after the lane it first went on failed: it may be a
  // duplicate of one that landed without its acknowledgement, and is dropped if so.
  static constexpr uint32_t kMagicResend = 0x52495352;  // "RSIR"
  // A large message offered for reading (zero-copy rendezvous): the payload is a
  // ReadDescriptor, `total` the message size; the receiver reads the bytes straight from the
  // sender's buffer into its own and answers with a kFin immediate.
  static constexpr uint32_t kMagicRendezvous = 0x56495352;        // "RSIV"
  static constexpr uint32_t kMagicRendezvousResend = 0x57495352;  // "RSIW"
  // A large message offered for writing (write rendezvous): no payload, `total` the message
  // size; the receiver answers with a grant.
  static constexpr uint32_t kMagicWriteOffer = 0x4f495352;        // "RSIO"
  static constexpr uint32_t kMagicWriteOfferResend = 0x51495352;  // "RSIQ"
  // The receiver's answer to a write offer, for the sender's message `message`: the payload
  // is a ReadDescriptor of the buffer to write into (a control piece, not a message).
  static constexpr uint32_t kMagicGrant = 0x47495352;  // "RSIG"
  uint32_t magic = kMagic;
  uint32_t length = 0;   // payload bytes after the header in this slot
  uint64_t message = 0;  // per direction of a pair: 0, 1, 2, ... in posting order
  uint64_t offset = 0;   // of this piece in the message
  uint64_t total = 0;    // message size
  MessageTag tag;
};
static_assert(sizeof(PieceHeader) == 64, "PieceHeader is part of the wire format");

// Where a rendezvous message can be read (the sender's buffer) or written (the receiver's,
// in a grant): its address and, per rail of the pair, the rkey of its registration with that
// rail's protection domain. Little-endian on the wire.
struct ReadDescriptor {
  uint64_t addr = 0;
  std::vector<uint32_t> rkeys;  // by rail
  std::vector<uint8_t> encode() const;
  // ProtocolError naming what is wrong unless `bytes` is a descriptor for `rails` rails.
  static ReadDescriptor decode(const uint8_t* bytes, size_t length, size_t rails);
  static size_t encodedBytes(size_t rails) { return 12 + 4 * rails; }
};

// The 32-bit immediate of an RDMA write with immediate: a data piece landed in `slot`, the
// receiver hands `value` slots back to the sender (a zero-length write), it finished
// reading the rendezvous message `value` names (zero-length, finImmediate()), the sender's
// side of the lane `value` names failed (zero-length, on another lane; laneDownValue(): rail
// and queue pair generation), or the sender finished writing the write-rendezvous message
// `value` names (zero-length).
enum class ImmKind : uint8_t { kData = 0, kCredit = 1, kFin = 2, kLaneDown = 3, kWritten = 4 };
struct Immediate {
  ImmKind kind = ImmKind::kData;
  uint32_t value = 0;  // 24 bits: slot index, credit count or message number
};
uint32_t encodeImmediate(const Immediate& imm);  // host order; the caller applies htonl
// ProtocolError for an unknown kind.
Immediate decodeImmediate(uint32_t host_order);

}  // namespace railshard::transport::ibverbs
