#include "transport/messaging/frame.h"

#include <cstdio>
#include <cstring>

namespace railshard::transport::messaging {

std::string frameKindName(uint8_t kind) {
  switch (static_cast<FrameKind>(kind)) {
    case FrameKind::kData:
      return "data";
    case FrameKind::kOffer:
      return "offer";
    case FrameKind::kGrant:
      return "grant";
    case FrameKind::kReadDone:
      return "read-done";
    case FrameKind::kWritten:
      return "written";
    case FrameKind::kBye:
      return "bye";
    case FrameKind::kAck:
      return "ack";
    case FrameKind::kPing:
      return "ping";
    case FrameKind::kLinkDown:
      return "link-down";
    case FrameKind::kAbort:
      return "abort";
    case FrameKind::kConnect:
      return "connect";
    case FrameKind::kConnectAck:
      return "connect-ack";
    case FrameKind::kConnected:
      return "connected";
  }
  return "kind " + std::to_string(kind);
}

void validateFrameHeader(const FrameHeader& header, uint64_t max_payload) {
  if (header.magic != kFrameMagic) {
    char text[16];
    std::snprintf(text, sizeof(text), "%08x", header.magic);
    throw ProtocolError(std::string("bad frame magic 0x") + text);
  }
  const std::string what = frameKindName(header.kind) + " frame";
  if (header.flags > kFrameResent) {
    throw ProtocolError(what + " with flags " + std::to_string(header.flags));
  }
  if (header.length > max_payload) {
    throw ProtocolError(what + " of " + std::to_string(header.length) +
                        " bytes exceeds the link's limit of " + std::to_string(max_payload));
  }
  auto noPayload = [&] {
    if (header.length != 0) throw ProtocolError(what + " with a payload");
  };
  auto controlPayload = [&] {
    if (header.length > kMaxControlPayload) {
      throw ProtocolError(what + " of " + std::to_string(header.length) +
                          " bytes exceeds the limit of " + std::to_string(kMaxControlPayload));
    }
  };
  switch (static_cast<FrameKind>(header.kind)) {
    case FrameKind::kData:
      if (header.offset > header.total || header.length > header.total - header.offset) {
        throw ProtocolError("data frame [" + std::to_string(header.offset) + ", +" +
                            std::to_string(header.length) + ") outside its message of " +
                            std::to_string(header.total) + " bytes");
      }
      return;
    case FrameKind::kOffer:
    case FrameKind::kGrant:
    case FrameKind::kConnect:
    case FrameKind::kConnectAck:
    case FrameKind::kLinkDown:  // why the sender took the link out
      controlPayload();
      return;
    case FrameKind::kAbort:
      controlPayload();
      if (header.error_kind > static_cast<uint8_t>(ErrorKind::kProtocol)) {
        throw ProtocolError("abort frame with unknown error kind " +
                            std::to_string(header.error_kind));
      }
      return;
    case FrameKind::kReadDone:
    case FrameKind::kWritten:
      noPayload();
      if (header.total == 0 || header.total > 64 || header.link >= 64) {
        throw ProtocolError(what + " for link " + std::to_string(header.link) + " of " +
                            std::to_string(header.total));
      }
      return;
    case FrameKind::kBye:
    case FrameKind::kAck:
    case FrameKind::kPing:
    case FrameKind::kConnected:
      noPayload();
      return;
  }
  throw ProtocolError("unknown frame kind " + std::to_string(header.kind));
}

FrameHeader parseFrameHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < sizeof(FrameHeader)) {
    throw ProtocolError("truncated frame header: " + std::to_string(bytes.size()) + " of " +
                        std::to_string(sizeof(FrameHeader)) + " bytes");
  }
  FrameHeader header;
  std::memcpy(&header, bytes.data(), sizeof(header));
  validateFrameHeader(header);
  return header;
}

}  // namespace railshard::transport::messaging
