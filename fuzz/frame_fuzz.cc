// libFuzzer target: what a data connection's accepting side decodes from untrusted bytes
// (links/tcp/hello.h, messaging/frame.h): the hello (fixed part, token length, token) and its check
// against the job, then frame headers as the read path validates them.
//
// Input layout: byte 0 picks this rank's view (my_rank, world_size), the rest is the stream
// as it arrives on the connection: one hello, then frame headers back to back. Only
// ProtocolError may come out of the decoders; a sanitizer report, another exception or a
// broken invariant (asserted below) is a finding.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "base/error.h"
#include "transport/links/tcp/hello.h"
#include "transport/messaging/frame.h"

namespace {

using namespace railshard::transport::links::tcp;
using namespace railshard::transport::messaging;

void check(bool ok) {
  if (!ok) std::abort();
}

void fuzzHeader(std::span<const uint8_t> bytes) {
  try {
    const FrameHeader header = parseFrameHeader(bytes);
    // What validation promises the read path, which sizes buffers and copies from these.
    check(header.magic == kFrameMagic);
    check(header.flags <= kFrameResent);
    switch (static_cast<FrameKind>(header.kind)) {
      case FrameKind::kData:
        check(header.offset <= header.total);
        check(header.length <= header.total - header.offset);
        break;
      case FrameKind::kOffer:
      case FrameKind::kGrant:
      case FrameKind::kConnect:
      case FrameKind::kConnectAck:
      case FrameKind::kLinkDown:
        check(header.length <= kMaxControlPayload);
        break;
      case FrameKind::kAbort:
        check(header.length <= kMaxControlPayload);
        check(header.error_kind <= static_cast<uint8_t>(railshard::ErrorKind::kProtocol));
        break;
      case FrameKind::kReadDone:
      case FrameKind::kWritten:
        check(header.length == 0);
        check(header.total >= 1 && header.total <= 64 && header.link < 64);
        break;
      case FrameKind::kBye:
      case FrameKind::kAck:
      case FrameKind::kPing:
      case FrameKind::kConnected:
        check(header.length == 0);
        break;
      default:
        check(false);  // an unknown kind must not validate
    }
  } catch (const railshard::ProtocolError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int world_size = 1 + (data[0] & 0x0f);
  const int my_rank = (data[0] >> 4) % world_size;
  std::span<const uint8_t> stream(data + 1, size - 1);
  const std::string expected_token = "fuzz-token";

  // The hello, as the accepting side reads it: fixed part, then the announced token.
  try {
    const size_t hello_size = helloSize(stream);
    check(hello_size >= sizeof(Hello) && hello_size <= sizeof(Hello) + kMaxToken);
    if (hello_size <= stream.size()) {
      const ReceivedHello received = parseHello(stream.first(hello_size));
      check(received.token.size() == received.hello.token_bytes);
      const std::string reason =
          checkHello(received.hello, received.token, expected_token, my_rank, world_size);
      if (reason.empty()) {
        // Accepted: everything the acceptor indexes with is in range.
        check(received.token == expected_token);
        check(static_cast<int>(received.hello.rank) > my_rank);
        check(static_cast<int>(received.hello.rank) < world_size);
        check(received.hello.channel < received.hello.channels);
      }
      stream = stream.subspan(hello_size);
    }
  } catch (const railshard::ProtocolError&) {
  }
  // A truncated header must be refused, not read past its end.
  fuzzHeader(stream);
  while (stream.size() >= sizeof(FrameHeader)) {
    fuzzHeader(stream.first(sizeof(FrameHeader)));
    stream = stream.subspan(sizeof(FrameHeader));
  }
  return 0;
}
