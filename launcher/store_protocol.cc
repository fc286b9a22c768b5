#include "launcher/store_protocol.h"

#include <algorithm>

namespace railshard::launcher {

namespace {

uint32_t loadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// Appends little-endian fields to a frame. The length field is patched in by finish(), so
// the body never needs to be sized twice.
class Writer {
 public:
  explicit Writer(uint8_t tag) {
    out_.resize(kFrameHeaderBytes);
    u8(tag);
  }
  void u8(uint8_t v) { out_.push_back(v); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void i64(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  void bytes(const void* data, size_t size) {
    u32(static_cast<uint32_t>(size));
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + size);
  }
  void reserve(size_t extra) { out_.reserve(out_.size() + extra); }
  Bytes finish() {
    const auto length = static_cast<uint32_t>(out_.size() - kFrameHeaderBytes);
    for (int i = 0; i < 4; ++i) out_[i] = static_cast<uint8_t>(length >> (8 * i));
    return std::move(out_);
  }

 private:
  Bytes out_;
};

// Bounds-checked cursor over a frame body. Every read checks the bytes left first; every
// variable-length read checks its limit and the bytes left before allocating.
class Reader {
 public:
  Reader(std::span<const uint8_t> data, std::string context)
      : data_(data), context_(std::move(context)) {}

  uint8_t u8(const char* field) {
    need(1, field);
    return data_[pos_++];
  }
  uint32_t u32(const char* field) {
    need(4, field);
    const uint32_t v = loadU32(data_.data() + pos_);
    pos_ += 4;
    return v;
  }
  int64_t i64(const char* field) {
    need(8, field);
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return static_cast<int64_t>(u);
  }
  std::string string(const char* field, size_t max) {
    const size_t size = length(field, max);
    std::string s(reinterpret_cast<const char*>(data_.data() + pos_), size);
    pos_ += size;
    return s;
  }
  Bytes bytes(const char* field, size_t max) {
    const size_t size = length(field, max);
    Bytes b(data_.begin() + static_cast<std::ptrdiff_t>(pos_),
            data_.begin() + static_cast<std::ptrdiff_t>(pos_ + size));
    pos_ += size;
    return b;
  }
  size_t left() const { return data_.size() - pos_; }
  void finish() {
    if (pos_ != data_.size()) {
      fail(std::to_string(data_.size() - pos_) + " unexpected trailing byte(s)");
    }
  }
  [[noreturn]] void fail(const std::string& reason) const {
    throw ProtocolError("store protocol: " + context_ + ": " + reason);
  }

 private:
  void need(size_t n, const char* field) const {
    if (left() < n) {
      fail(std::string("truncated ") + field + " (needs " + std::to_string(n) + " byte(s), " +
           std::to_string(left()) + " left)");
    }
  }
  size_t length(const char* field, size_t max) {
    const uint32_t size = u32(field);
    if (size > max) {
      fail(std::string(field) + " length " + std::to_string(size) + " exceeds the limit of " +
           std::to_string(max) + " bytes");
    }
    need(size, field);
    return size;
  }

  std::span<const uint8_t> data_;
  std::string context_;
  size_t pos_ = 0;
};

// Checks the length field against the span and returns the body (after the tag).
std::span<const uint8_t> frameBody(std::span<const uint8_t> frame, const char* what) {
  if (frame.size() < kFrameHeaderBytes + 1) {
    throw ProtocolError(std::string("store protocol: ") + what + " frame of " +
                        std::to_string(frame.size()) + " byte(s) is shorter than the minimum 5");
  }
  const uint32_t length = loadU32(frame.data());
  if (length != frame.size() - kFrameHeaderBytes) {
    throw ProtocolError(std::string("store protocol: ") + what + " frame length field says " +
                        std::to_string(length) + " but " +
                        std::to_string(frame.size() - kFrameHeaderBytes) + " byte(s) follow it");
  }
  return frame.subspan(kFrameHeaderBytes + 1);
}

void checkLimit(const std::string& what, size_t size, size_t max) {
  if (size > max) {
    throw InvalidArgument("store: " + what + " of " + std::to_string(size) +
                          " bytes exceeds the limit of " + std::to_string(max) + " bytes");
  }
}

void checkKey(const std::string& key) {
  if (key.size() > kMaxKeyBytes) {
    throw InvalidArgument("store: key '" + key.substr(0, 64) + "...' of " +
                          std::to_string(key.size()) + " bytes exceeds the limit of " +
                          std::to_string(kMaxKeyBytes) + " bytes");
  }
}

const std::string& singleKey(const Request& request) {
  if (request.keys.size() != 1) {
    throw InvalidArgument(std::string("store: ") + commandName(request.command) +
                          " takes exactly one key, got " + std::to_string(request.keys.size()));
  }
  checkKey(request.keys[0]);
  return request.keys[0];
}

}  // namespace

const char* commandName(Command command) {
  switch (command) {
    case Command::kHello:
      return "HELLO";
    case Command::kSet:
      return "SET";
    case Command::kGet:
      return "GET";
    case Command::kAdd:
      return "ADD";
    case Command::kWait:
      return "WAIT";
    case Command::kRemove:
      return "REMOVE";
  }
  return "UNKNOWN";
}

uint32_t frameLength(std::span<const uint8_t> header, size_t max_length) {
  if (header.size() < kFrameHeaderBytes) {
    throw ProtocolError("store protocol: frame header needs 4 bytes, got " +
                        std::to_string(header.size()));
  }
  const uint32_t length = loadU32(header.data());
  if (length == 0) throw ProtocolError("store protocol: frame with length 0 (no tag)");
  if (length > max_length) {
    throw ProtocolError("store protocol: frame length " + std::to_string(length) +
                        " exceeds the limit of " + std::to_string(max_length) + " bytes");
  }
  return length;
}

size_t frameSize(std::span<const uint8_t> buffer, size_t max_length) {
  if (buffer.size() < kFrameHeaderBytes) return 0;
  const uint32_t length = frameLength(buffer, max_length);
  const size_t total = kFrameHeaderBytes + length;
  return buffer.size() >= total ? total : 0;
}

Request parseRequest(std::span<const uint8_t> frame) {
  const std::span<const uint8_t> body = frameBody(frame, "request");
  Request request;
  const uint8_t tag = frame[kFrameHeaderBytes];
  if (tag < static_cast<uint8_t>(Command::kHello) || tag > static_cast<uint8_t>(Command::kRemove)) {
    throw ProtocolError("store protocol: unknown command " + std::to_string(tag));
  }
  request.command = static_cast<Command>(tag);
  Reader in(body, commandName(request.command));
  switch (request.command) {
    case Command::kHello:
      request.token = in.string("token", kMaxTokenBytes);
      break;
    case Command::kSet:
      request.keys.push_back(in.string("key", kMaxKeyBytes));
      request.value = in.bytes("value", kMaxValueBytes);
      break;
    case Command::kGet:
      request.keys.push_back(in.string("key", kMaxKeyBytes));
      request.timeout_ms = in.u32("timeout");
      break;
    case Command::kAdd:
      request.keys.push_back(in.string("key", kMaxKeyBytes));
      request.delta = in.i64("delta");
      break;
    case Command::kWait: {
      const uint32_t count = in.u32("key count");
      if (count > kMaxWaitKeys) {
        in.fail("WAIT for " + std::to_string(count) + " keys exceeds the limit of " +
                std::to_string(kMaxWaitKeys));
      }
      // Each key takes at least its 4-byte length: reject an impossible count before
      // reserving room for it.
      if (static_cast<size_t>(count) * 4 > in.left()) {
        in.fail("key count " + std::to_string(count) + " does not fit in the " +
                std::to_string(in.left()) + " byte(s) left");
      }
      request.keys.reserve(count);
      for (uint32_t i = 0; i < count; ++i) request.keys.push_back(in.string("key", kMaxKeyBytes));
      request.timeout_ms = in.u32("timeout");
      break;
    }
    case Command::kRemove:
      request.keys.push_back(in.string("key", kMaxKeyBytes));
      break;
  }
  in.finish();
  return request;
}

Response parseResponse(Command answered, std::span<const uint8_t> frame) {
  const std::span<const uint8_t> body = frameBody(frame, "response");
  Response response;
  const uint8_t tag = frame[kFrameHeaderBytes];
  Reader in(body, std::string("response to ") + commandName(answered));
  switch (tag) {
    case static_cast<uint8_t>(Status::kOk):
      response.status = Status::kOk;
      switch (answered) {
        case Command::kGet:
          response.value = in.bytes("value", kMaxValueBytes);
          break;
        case Command::kAdd:
          response.number = in.i64("sum");
          break;
        case Command::kRemove: {
          const uint8_t existed = in.u8("existed flag");
          if (existed > 1) in.fail("existed flag " + std::to_string(existed) + " is not 0 or 1");
          response.existed = existed == 1;
          break;
        }
        case Command::kHello:
        case Command::kSet:
        case Command::kWait:
          break;
      }
      break;
    case static_cast<uint8_t>(Status::kTimeout):
      response.status = Status::kTimeout;
      response.message = in.string("message", kMaxMessageBytes);
      break;
    case static_cast<uint8_t>(Status::kError): {
      response.status = Status::kError;
      const uint8_t kind = in.u8("error kind");
      if (kind > static_cast<uint8_t>(ErrorKind::kProtocol)) {
        in.fail("unknown error kind " + std::to_string(kind));
      }
      response.error_kind = static_cast<ErrorKind>(kind);
      response.message = in.string("message", kMaxMessageBytes);
      break;
    }
    default:
      in.fail("unknown status " + std::to_string(tag));
  }
  in.finish();
  return response;
}

Bytes encodeRequest(const Request& request) {
  Writer out(static_cast<uint8_t>(request.command));
  switch (request.command) {
    case Command::kHello:
      checkLimit("token", request.token.size(), kMaxTokenBytes);
      out.bytes(request.token.data(), request.token.size());
      break;
    case Command::kSet: {
      const std::string& key = singleKey(request);
      checkLimit("value for key '" + key + "'", request.value.size(), kMaxValueBytes);
      out.reserve(8 + key.size() + request.value.size());
      out.bytes(key.data(), key.size());
      out.bytes(request.value.data(), request.value.size());
      break;
    }
    case Command::kGet: {
      const std::string& key = singleKey(request);
      out.bytes(key.data(), key.size());
      out.u32(request.timeout_ms);
      break;
    }
    case Command::kAdd: {
      const std::string& key = singleKey(request);
      out.bytes(key.data(), key.size());
      out.i64(request.delta);
      break;
    }
    case Command::kWait:
      if (request.keys.size() > kMaxWaitKeys) {
        throw InvalidArgument("store: wait for " + std::to_string(request.keys.size()) +
                              " keys exceeds the limit of " + std::to_string(kMaxWaitKeys));
      }
      out.u32(static_cast<uint32_t>(request.keys.size()));
      for (const auto& key : request.keys) {
        checkKey(key);
        out.bytes(key.data(), key.size());
      }
      out.u32(request.timeout_ms);
      break;
    case Command::kRemove: {
      const std::string& key = singleKey(request);
      out.bytes(key.data(), key.size());
      break;
    }
    default:
      throw InvalidArgument("store: cannot encode unknown command " +
                            std::to_string(static_cast<int>(request.command)));
  }
  return out.finish();
}

Bytes encodeResponse(Command answered, const Response& response) {
  Writer out(static_cast<uint8_t>(response.status));
  // Messages are diagnostics: cut rather than refuse, so an error can always be reported.
  const size_t message_size = std::min(response.message.size(), kMaxMessageBytes);
  switch (response.status) {
    case Status::kOk:
      switch (answered) {
        case Command::kGet:
          checkLimit("value", response.value.size(), kMaxValueBytes);
          out.reserve(4 + response.value.size());
          out.bytes(response.value.data(), response.value.size());
          break;
        case Command::kAdd:
          out.i64(response.number);
          break;
        case Command::kRemove:
          out.u8(response.existed ? 1 : 0);
          break;
        case Command::kHello:
        case Command::kSet:
        case Command::kWait:
          break;
      }
      break;
    case Status::kTimeout:
      out.bytes(response.message.data(), message_size);
      break;
    case Status::kError:
      out.u8(static_cast<uint8_t>(response.error_kind));
      out.bytes(response.message.data(), message_size);
      break;
    default:
      throw InvalidArgument("store: cannot encode unknown status " +
                            std::to_string(static_cast<int>(response.status)));
  }
  return out.finish();
}

bool tokensEqual(std::string_view given, std::string_view expected) {
  // Walk `expected` whatever `given` is, accumulating differences without branching on them.
  unsigned diff = given.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto g = static_cast<unsigned char>(i < given.size() ? given[i] : 0);
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  // Keep the compiler from turning the loop into an early-exit comparison.
  volatile unsigned result = diff;
  return result == 0;
}

}  // namespace railshard::launcher
