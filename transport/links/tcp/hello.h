#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/error.h"

namespace railshard::transport::links::tcp {

inline constexpr uint32_t kHelloMagic = 0x5253484c;  // "RSHL"
inline constexpr uint16_t kWireVersion = 3;          // 3: messenger frames (messaging/frame.h)
inline constexpr size_t kMaxToken = 1024;

inline constexpr uint16_t kHelloRejoin = 1;  // Hello::flags: replaces a connection taken out

// First bytes on every data connection: who is connecting, which of the connections between
// the two ranks this is (the connecting rank's numbering, rail-major), and the job token.
// Frames (messaging/frame.h) follow it.
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

}  // namespace railshard::transport::links::tcp
