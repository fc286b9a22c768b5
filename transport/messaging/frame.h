#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/error.h"
#include "transport/message_tag.h"

namespace railshard::transport::messaging {

inline constexpr uint32_t kFrameMagic = 0x464d5352;  // "RSMF"
// Largest payload of a frame that is not a piece of a message: an abort's text, a link's
// connection record, a rendezvous offer or grant. Bounds what a peer can make a rank buffer.
inline constexpr size_t kMaxControlPayload = 16 * 1024;

// What travels on every link (a TCP connection, an RDMA lane, a shared-memory channel): frames
// of the messenger's protocol (messenger.h), each a header and `length` payload bytes.
//
// Sequenced frames are counted by the receiver, per link and connection generation, once their
// payload is whole: an acknowledgement and a failed link's report say how many arrived, and the
// sender re-sends exactly the rest on the other links. The others are best effort.
enum class FrameKind : uint8_t {
  // Sequenced.
  kData = 1,      // bytes [offset, offset + length) of message `message` (`total` bytes, `tag`)
  kOffer = 2,     // rendezvous: message `message` (`total` bytes, `tag`) offered in place; the
                  // payload names the sender's registered buffer (empty: offered for writing)
  kGrant = 3,     // rendezvous: the receiver's registered buffer for the peer's message `message`
  kReadDone = 4,  // rendezvous: the peer's message `message` was read; `link` says on which of
                  // the `total` links that carried reads (the sender deregisters at the last)
  kWritten = 5,   // rendezvous: message `message` was written into the granted buffer; `link`
                  // and `total` as for kReadDone
  // Not sequenced.
  kBye = 8,          // closing: `message` = messages sent in total; travels behind the data
  kAck = 9,          // link `link` (generation) carried `message` sequenced frames of the peer's
                     // whole; `offset`: the sender's clock (ns) when it was queued
  kPing = 10,        // asks for an ack on this link (proof that the link and the peer are alive)
  kLinkDown = 11,    // link `link` (generation) is out: the sender took `message` sequenced frames
                     // of it whole; the peer re-sends the rest on the other links
  kAbort = 12,       // payload: the error's text; error_kind: its kind; `message`: lost rank + 1
  kConnect = 13,     // (re)connect link `link` at `generation`; payload: its connection record
                     // (empty: "this rank wants the link", to the rank that initiates)
  kConnectAck = 14,  // the accepting side's record for link `link` at `generation`
  kConnected = 15,   // sent on the re-made link itself: the path works both ways
};

// Flags.
inline constexpr uint8_t kFrameResent = 1;  // re-sent after the link it first went on failed

// Precedes every frame on every link. Fixed size, host byte order (all ranks of a job run the
// same build on the same architecture; the hello or connection record checks the magic, which
// catches a byte-order mismatch). `message` numbers the messages of one direction between two
// ranks (the n-th send matches the n-th receive); `offset`/`total` place a piece, so a message
// striped over several links is reassembled exactly whatever the split and the order.
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t kind = 0;
  uint8_t flags = 0;
  uint8_t error_kind = 0;
  uint8_t reserved = 0;
  uint16_t link = 0;
  uint16_t reserved2 = 0;
  uint32_t generation = 0;
  uint64_t length = 0;  // payload bytes after the header
  uint64_t message = 0;
  uint64_t offset = 0;
  uint64_t total = 0;
  MessageTag tag;
};
static_assert(sizeof(FrameHeader) == 80, "FrameHeader is part of the wire format");

inline FrameKind kindOf(const FrameHeader& header) {
  return static_cast<FrameKind>(header.kind);
}
// Counted by the receiver and re-sent exactly after a link failed.
inline bool isSequenced(FrameKind kind) {
  return kind >= FrameKind::kData && kind <= FrameKind::kWritten;
}
inline bool isSequenced(const FrameHeader& header) {
  return isSequenced(kindOf(header));
}

// Checks magic, kind and size limits before anything is allocated or written: ProtocolError
// naming what is wrong otherwise. `max_payload`: the most the link carries in one frame.
void validateFrameHeader(const FrameHeader& header, uint64_t max_payload = UINT64_MAX);
// The header in the first sizeof(FrameHeader) bytes of `bytes`, validated as above
// (ProtocolError also when fewer bytes are given). For tests and the fuzzer.
FrameHeader parseFrameHeader(std::span<const uint8_t> bytes);

// "data", "ack", ... for errors and logs.
std::string frameKindName(uint8_t kind);

}  // namespace railshard::transport::messaging
