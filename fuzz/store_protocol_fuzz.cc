// libFuzzer target: the TCP store's wire format (launcher/store_protocol.h).
//
// The input is treated as a byte stream arriving on one store connection and cut into frames
// exactly as TcpStoreServer does (HELLO limit first, then the full limit). Every frame goes
// through parseRequest, and through parseResponse for each command it could answer. Whatever
// parses must survive a round trip through the encoder unchanged. The only exception allowed
// out of the parsers is ProtocolError; anything else (or a sanitizer report) is a finding.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "base/error.h"
#include "launcher/store_protocol.h"

namespace {

using namespace railshard::launcher;

constexpr Command kCommands[] = {Command::kHello, Command::kSet,  Command::kGet,
                                 Command::kAdd,   Command::kWait, Command::kRemove};

void check(bool ok) {
  if (!ok) std::abort();
}

void roundTripRequest(const Request& request, std::span<const uint8_t> frame) {
  const Bytes encoded = encodeRequest(request);
  // The encoding is canonical: re-encoding what parsed gives back the very bytes.
  check(encoded.size() == frame.size());
  check(std::equal(encoded.begin(), encoded.end(), frame.begin()));
  check(parseRequest(encoded) == request);
}

void fuzzFrame(std::span<const uint8_t> frame) {
  try {
    const Request request = parseRequest(frame);
    roundTripRequest(request, frame);
  } catch (const railshard::ProtocolError&) {
  }
  for (const Command answered : kCommands) {
    try {
      const Response response = parseResponse(answered, frame);
      const Bytes encoded = encodeResponse(answered, response);
      check(parseResponse(answered, encoded) == response);
    } catch (const railshard::ProtocolError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> stream(data, size);
  // The whole input as one frame too: reaches the "length field disagrees" paths.
  fuzzFrame(stream);
  bool authenticated = false;
  while (!stream.empty()) {
    size_t frame_size = 0;
    try {
      frame_size = frameSize(stream, authenticated ? kMaxFrameBytes : kMaxHelloFrameBytes);
    } catch (const railshard::ProtocolError&) {
      break;  // the server closes the connection here
    }
    if (frame_size == 0) break;  // incomplete: the server would wait for more
    check(frame_size <= stream.size());
    check(frame_size >= kFrameHeaderBytes + 1);
    fuzzFrame(stream.first(frame_size));
    authenticated = true;
    stream = stream.subspan(frame_size);
  }
  // Every command name is printable, whatever the byte.
  if (size > 0) check(commandName(static_cast<Command>(data[0])) != nullptr);
  // Token comparison: equal exactly when the strings are.
  if (size >= 2) {
    const size_t half = data[0] % size;
    const std::string_view a(reinterpret_cast<const char*>(data), half);
    const std::string_view b(reinterpret_cast<const char*>(data) + half, size - half);
    check(tokensEqual(a, b) == (a == b));
    check(tokensEqual(a, a));
  }
  return 0;
}
