#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/error.h"
#include "transport/message_tag.h"

namespace railshard::transport::tcp {

inline constexpr uint32_t kFrameMagic = 0x52534652;  // "RSFR"
inline constexpr uint32_t kHelloMagic = 0x5253484c;  // "RSHL"
inline constexpr uint16_t kWireVersion = 2;
inline constexpr size_t kMaxAbortMessage = 16 * 1024;
inline constexpr size_t kMaxToken = 1024;

enum class FrameKind : uint8_t {
  kData = 1,      // payload = bytes [offset, offset + payload_bytes) of message `message`
  kAbort = 2,     // payload = error message; error_kind says which exception to raise
  kBye = 3,       // graceful close: nothing follows; `message` = messages sent in total
  kAck = 4,       // `offset` = bytes of this connection's stream the receiver has consumed
  kRailDown = 5,  // connection `message` is out; `offset` = its stream bytes the sender of
                  // this frame consumed (the peer re-sends everything after that)
  kPing = 6,      // asks for an ack (proof that this connection and the peer are alive)
  kPiece = 7,     // as kData, but a piece of another layer's message (messaging::PieceLink):
                  // `message` is that layer's number, the payload goes where it says, and
                  // error_kind is kPieceResent for a piece re-sent after a link failed
};

// Precedes every frame on a data connection. Fixed size, host byte order (all ranks of a job
// run the same build on the same architecture; the hello checks the magic, which catches a
// byte-order mismatch). A message may arrive in several data frames over several connections
// (rails): `message` numbers the messages of one direction between two ranks (the n-th send
// matches the n-th receive), `offset`/`total_bytes` place the piece, so reassembly is exact
// whatever the split and the order of arrival.
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t kind = 0;
  uint8_t error_kind = 0;
  uint16_t reserved = 0;
  uint64_t payload_bytes = 0;
  uint64_t message = 0;
  uint64_t offset = 0;
  uint64_t total_bytes = 0;
  MessageTag tag;
};
static_assert(sizeof(FrameHeader) == 72, "FrameHeader is part of the wire format");

// kPiece's error_kind: the piece was sent again (messaging::PieceInfo::resend).
constexpr uint8_t kPieceResent = 1;

// A frame with part of a message from user memory, of this transport's own messages (kData)
// or of another layer's (kPiece): kept, re-sent, stolen and detached alike.
inline bool isDataFrame(const FrameHeader& header) {
  return header.kind == static_cast<uint8_t>(FrameKind::kData) ||
         header.kind == static_cast<uint8_t>(FrameKind::kPiece);
}

// Checks magic, kind and size limits before anything is allocated or written; ProtocolError
// with the reason otherwise.
void validateFrameHeader(const FrameHeader& header);
// The header in the first sizeof(FrameHeader) bytes of `bytes`, validated as above
// (ProtocolError also when fewer bytes are given). The read path receives straight into a
// FrameHeader; this is the same check over raw bytes, for tests and the fuzzer.
FrameHeader parseFrameHeader(std::span<const uint8_t> bytes);

inline constexpr uint16_t kHelloRejoin = 1;  // Hello::flags: replaces a connection taken out

// First bytes on every data connection: who is connecting, which of the connections between
// the two ranks this is (the connecting rank's numbering, rail-major), and the job token.
struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kWireVersion;
  uint16_t token_bytes = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint16_t channel = 0;
  uint16_t channels = 1;
  uint16_t flags = 0;
  uint16_t generation = 0;  // rejoin: the incarnation of the connection this one starts
};
static_assert(sizeof(Hello) == 24, "Hello is part of the wire format");

// Length of the whole hello (fixed part + token) whose fixed part is the first sizeof(Hello)
// bytes of `fixed`. Checks magic, version and the token length before the token is received,
// so a peer that is not a railshard rank of this build, or announces an oversized token, is
// refused before anything is allocated for it: ProtocolError with the reason.
size_t helloSize(std::span<const uint8_t> fixed);

// A hello as received: the fixed part and the token that follows it.
struct ReceivedHello {
  Hello hello;
  std::string token;
};
// Decodes a complete hello of exactly helloSize() bytes; ProtocolError otherwise.
ReceivedHello parseHello(std::span<const uint8_t> bytes);

// Accepting side's check of a hello (token compared in constant time). Returns an empty
// string when acceptable, else the reason to refuse.
std::string checkHello(const Hello& hello, const std::string& token_received,
                       const std::string& expected_token, int my_rank, int world_size);

bool constantTimeEquals(const std::string& a, const std::string& b);

}  // namespace railshard::transport::tcp
