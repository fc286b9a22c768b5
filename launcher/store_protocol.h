#pragma once

// Wire format of the TCP rendezvous store (TcpStoreServer <-> TcpStore).
//
// Every message is one frame:  u32 length (little-endian) | u8 tag | body
// where `length` counts the tag and the body (not itself). Requests carry a Command tag,
// responses a Status tag. Strings and byte arrays are u32 length + bytes; integers are
// little-endian; i64 is two's complement.
//
//   HELLO   token                       -> OK
//   SET     key, value                  -> OK
//   GET     key, u32 timeout_ms         -> OK value | TIMEOUT
//   ADD     key, i64 delta              -> OK i64 sum | ERROR
//   WAIT    u32 n, n x key, u32 timeout_ms -> OK | TIMEOUT
//   REMOVE  key                         -> OK u8 existed
//
//   OK      body as above
//   TIMEOUT message (names the keys that did not appear)
//   ERROR   u8 ErrorKind, message
//
// Everything here is a pure function over bytes (no I/O, no globals) so the parsers can be
// fuzzed on their own. Every length is checked against its hard limit and against the bytes
// actually present *before* anything is allocated, so a hostile length field costs nothing.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace railshard::launcher {

using Bytes = std::vector<uint8_t>;

inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr size_t kMaxKeyBytes = 4 * 1024;
inline constexpr size_t kMaxValueBytes = 64 * 1024 * 1024;
inline constexpr size_t kMaxWaitKeys = 1024;
inline constexpr size_t kMaxTokenBytes = 4 * 1024;
inline constexpr size_t kMaxMessageBytes = 64 * 1024;
// Limit on the length field (tag + body): the largest SET plus room for its key and framing.
inline constexpr size_t kMaxFrameBytes = kMaxValueBytes + 64 * 1024;
// Limit on the length field of a HELLO: a server applies it until a connection has
// authenticated, so an unauthenticated peer can never make it buffer more than this.
inline constexpr size_t kMaxHelloFrameBytes = 1 + 4 + kMaxTokenBytes;

enum class Command : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kWait = 5,
  kRemove = 6,
};

enum class Status : uint8_t {
  kOk = 0,
  kTimeout = 1,
  kError = 2,
};

const char* commandName(Command command);

struct Request {
  Command command = Command::kHello;
  std::string token;              // kHello
  std::vector<std::string> keys;  // exactly one for kSet/kGet/kAdd/kRemove; 0..1024 for kWait
  Bytes value;                    // kSet
  int64_t delta = 0;              // kAdd
  uint32_t timeout_ms = 0;        // kGet, kWait

  bool operator==(const Request&) const = default;
};

struct Response {
  Status status = Status::kOk;
  Bytes value;                                 // kOk to kGet
  int64_t number = 0;                          // kOk to kAdd: the new sum
  bool existed = false;                        // kOk to kRemove
  ErrorKind error_kind = ErrorKind::kGeneric;  // kError
  std::string message;                         // kTimeout, kError

  bool operator==(const Response&) const = default;
};

// The length field of the frame header at the start of `header` (at least 4 bytes).
// ProtocolError when it is 0 or exceeds `max_length`.
uint32_t frameLength(std::span<const uint8_t> header, size_t max_length = kMaxFrameBytes);
// Size of the complete frame (header included) at the start of `buffer`, or 0 when more
// bytes are needed. ProtocolError when the length field is 0 or exceeds `max_length`; this is
// known from the first 4 bytes, before the body has been received or buffered.
size_t frameSize(std::span<const uint8_t> buffer, size_t max_length = kMaxFrameBytes);

// Parse exactly one complete frame (header included). ProtocolError, with the reason, when
// the frame is malformed: length field disagreeing with the span, unknown command, a field
// running past the end, a limit exceeded, trailing bytes.
Request parseRequest(std::span<const uint8_t> frame);
// `answered` is the command this frame answers (the protocol is strictly request/response,
// so the client knows it); it decides the OK body.
Response parseResponse(Command answered, std::span<const uint8_t> frame);

// Serialise into one frame. InvalidArgument when a field exceeds its limit, so a caller
// learns about an oversized key or value before anything is sent.
Bytes encodeRequest(const Request& request);
Bytes encodeResponse(Command answered, const Response& response);

// Token comparison whose running time depends only on the length of `expected`, so a peer
// cannot learn the token byte by byte from response timing.
bool tokensEqual(std::string_view given, std::string_view expected);

}  // namespace railshard::launcher
