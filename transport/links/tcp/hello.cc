#include "transport/links/tcp/hello.h"

#include <cstdio>
#include <cstring>

namespace railshard::transport::links::tcp {

size_t helloSize(std::span<const uint8_t> fixed) {
  if (fixed.size() < sizeof(Hello)) {
    throw ProtocolError("truncated hello: " + std::to_string(fixed.size()) + " of " +
                        std::to_string(sizeof(Hello)) + " bytes");
  }
  Hello hello;
  std::memcpy(&hello, fixed.data(), sizeof(hello));
  if (hello.magic != kHelloMagic) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%08x", hello.magic);
    throw ProtocolError(std::string("not a railshard connection (bad hello magic 0x") + buf + ")");
  }
  if (hello.version != kWireVersion) {
    throw ProtocolError("wire version " + std::to_string(hello.version) + ", expected " +
                        std::to_string(kWireVersion));
  }
  if (hello.token_bytes > kMaxToken) {
    throw ProtocolError("token of " + std::to_string(hello.token_bytes) +
                        " bytes exceeds the limit of " + std::to_string(kMaxToken));
  }
  return sizeof(Hello) + hello.token_bytes;
}

ReceivedHello parseHello(std::span<const uint8_t> bytes) {
  const size_t size = helloSize(bytes);
  if (bytes.size() != size) {
    throw ProtocolError("hello of " + std::to_string(bytes.size()) + " bytes, expected " +
                        std::to_string(size) + " (" + std::to_string(sizeof(Hello)) + " + token)");
  }
  ReceivedHello received;
  std::memcpy(&received.hello, bytes.data(), sizeof(Hello));
  received.token.assign(reinterpret_cast<const char*>(bytes.data()) + sizeof(Hello),
                        size - sizeof(Hello));
  return received;
}

bool constantTimeEquals(const std::string& a, const std::string& b) {
  // Length is not secret; the bytes are.
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

std::string checkHello(const Hello& hello, const std::string& token_received,
                       const std::string& expected_token, int my_rank, int world_size) {
  if (hello.magic != kHelloMagic) return "not a railshard connection (bad magic)";
  if (hello.version != kWireVersion) {
    return "wire version " + std::to_string(hello.version) + ", expected " +
           std::to_string(kWireVersion);
  }
  if (!constantTimeEquals(token_received, expected_token)) return "wrong job token";
  if (static_cast<int>(hello.world_size) != world_size) {
    return "world size " + std::to_string(hello.world_size) + ", expected " +
           std::to_string(world_size);
  }
  if (hello.channels == 0 || hello.channel >= hello.channels) {
    return "connection " + std::to_string(hello.channel) + " of " + std::to_string(hello.channels);
  }
  if (static_cast<int>(hello.rank) <= my_rank || static_cast<int>(hello.rank) >= world_size) {
    return "unexpected rank " + std::to_string(hello.rank);
  }
  return "";
}

}  // namespace railshard::transport::links::tcp
