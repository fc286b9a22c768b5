// The parsers the fuzzers of fuzz/ exercise, fed known-bad input: each malformed frame, hello
// or request must raise ProtocolError with a message that says what was wrong. The seed
// corpora (and any crash inputs saved there) are replayed through the fuzz harnesses
// themselves, so a fixed finding stays fixed without needing clang or libFuzzer.

#include <gtest/gtest.h>

// Everything the harnesses include, first: their include guards then keep these out of the
// namespaces the harnesses are compiled into below.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "launcher/store_protocol.h"
#include "transport/links/tcp/hello.h"
#include "transport/messaging/frame.h"
#include "transport/messaging/message_book.h"

// Each harness in its own namespace, its entry point renamed, so both fit in this binary.
namespace store_protocol_harness {
#define LLVMFuzzerTestOneInput storeProtocolTestOneInput
#include "fuzz/store_protocol_fuzz.cc"
#undef LLVMFuzzerTestOneInput
}  // namespace store_protocol_harness
namespace frame_harness {
#define LLVMFuzzerTestOneInput frameTestOneInput
#include "fuzz/frame_fuzz.cc"
#undef LLVMFuzzerTestOneInput
}  // namespace frame_harness
namespace message_book_harness {
#define LLVMFuzzerTestOneInput messageBookTestOneInput
#include "fuzz/message_book_fuzz.cc"
#undef LLVMFuzzerTestOneInput
}  // namespace message_book_harness

namespace railshard::transport::links::tcp {
namespace {

using messaging::FrameHeader;
using messaging::FrameKind;
using messaging::kFrameResent;
using messaging::kMaxControlPayload;
using messaging::parseFrameHeader;
using messaging::validateFrameHeader;
using Bytes = std::vector<uint8_t>;

template <typename T>
Bytes bytesOf(const T& value) {
  Bytes bytes(sizeof(value));
  std::memcpy(bytes.data(), &value, sizeof(value));
  return bytes;
}

// Runs fn, expecting ProtocolError whose message contains `needle`.
template <typename Fn>
void expectProtocolError(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

std::vector<Bytes> corpus(const std::string& target) {
  std::vector<Bytes> inputs;
  const std::filesystem::path dir =
      std::filesystem::path(RAILSHARD_SOURCE_DIR) / "fuzz" / "corpus" / target;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    inputs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return inputs;
}

TEST(FuzzCorpus, StoreProtocolSeedsReplay) {
  const auto inputs = corpus("store_protocol_fuzz");
  ASSERT_FALSE(inputs.empty());
  for (const auto& input : inputs) {
    store_protocol_harness::storeProtocolTestOneInput(input.data(), input.size());
  }
}

TEST(FuzzCorpus, FrameSeedsReplay) {
  const auto inputs = corpus("frame_fuzz");
  ASSERT_FALSE(inputs.empty());
  for (const auto& input : inputs) frame_harness::frameTestOneInput(input.data(), input.size());
}

TEST(FuzzCorpus, MessageBookSeedsReplay) {
  const auto inputs = corpus("message_book_fuzz");
  ASSERT_FALSE(inputs.empty());
  for (const auto& input : inputs) {
    message_book_harness::messageBookTestOneInput(input.data(), input.size());
  }
}

// ---- frame headers ------------------------------------------------------------------------

FrameHeader dataHeader(uint64_t payload, uint64_t offset, uint64_t total) {
  FrameHeader header;
  header.kind = static_cast<uint8_t>(FrameKind::kData);
  header.length = payload;
  header.offset = offset;
  header.total = total;
  return header;
}

TEST(FrameParser, AcceptsWellFormedHeaders) {
  EXPECT_NO_THROW(parseFrameHeader(bytesOf(dataHeader(64, 0, 64))));
  EXPECT_NO_THROW(parseFrameHeader(bytesOf(dataHeader(0, 64, 64))));
  FrameHeader abort;
  abort.kind = static_cast<uint8_t>(FrameKind::kAbort);
  abort.length = kMaxControlPayload;
  abort.error_kind = static_cast<uint8_t>(ErrorKind::kProtocol);
  EXPECT_NO_THROW(parseFrameHeader(bytesOf(abort)));
  for (const auto kind : {FrameKind::kBye, FrameKind::kAck, FrameKind::kLinkDown, FrameKind::kPing,
                          FrameKind::kConnected}) {
    FrameHeader control;
    control.kind = static_cast<uint8_t>(kind);
    EXPECT_NO_THROW(parseFrameHeader(bytesOf(control)));
  }
  FrameHeader end;
  end.kind = static_cast<uint8_t>(FrameKind::kReadDone);
  end.link = 1;
  end.total = 2;
  EXPECT_NO_THROW(parseFrameHeader(bytesOf(end)));
}

TEST(FrameParser, RejectsTruncatedHeader) {
  const Bytes bytes = bytesOf(dataHeader(8, 0, 8));
  expectProtocolError([&] { parseFrameHeader(std::span(bytes).first(79)); },
                      "truncated frame header: 79 of 80 bytes");
  expectProtocolError([&] { parseFrameHeader({}); }, "truncated frame header: 0 of 80 bytes");
}

TEST(FrameParser, RejectsBadMagicAndUnknownKinds) {
  FrameHeader header = dataHeader(8, 0, 8);
  header.magic = 0xdeadbeef;
  expectProtocolError([&] { parseFrameHeader(bytesOf(header)); }, "bad frame magic 0xdeadbeef");
  for (const uint8_t kind : {0, 6, 7, 16, 200, 255}) {
    header = dataHeader(0, 0, 0);
    header.kind = kind;
    expectProtocolError([&] { parseFrameHeader(bytesOf(header)); },
                        "unknown frame kind " + std::to_string(kind));
  }
}

// A frame re-sent after its link failed says so; no other flag exists.
TEST(FrameParser, DataFramesCarryOnlyTheResentFlag) {
  FrameHeader header = dataHeader(8, 8, 16);
  header.flags = kFrameResent;
  EXPECT_EQ(parseFrameHeader(bytesOf(header)).offset, 8u);
  header.flags = 2;
  expectProtocolError([&] { parseFrameHeader(bytesOf(header)); }, "data frame with flags 2");
}

TEST(FrameParser, RejectsDataOutsideItsMessage) {
  expectProtocolError([&] { validateFrameHeader(dataHeader(9, 0, 8)); },
                      "data frame [0, +9) outside its message of 8 bytes");
  expectProtocolError([&] { validateFrameHeader(dataHeader(1, 9, 8)); },
                      "data frame [9, +1) outside its message of 8 bytes");
  // offset + payload would wrap around 2^64: still refused.
  expectProtocolError([&] { validateFrameHeader(dataHeader(~uint64_t{0}, 2, 8)); },
                      "outside its message");
}

TEST(FrameParser, RejectsFramesBeyondWhatTheLinkCarries) {
  expectProtocolError([&] { validateFrameHeader(dataHeader(8192, 0, 1 << 20), 8112); },
                      "data frame of 8192 bytes exceeds the link's limit of 8112");
}

TEST(FrameParser, RejectsOversizedControlPayloadsAndUnknownErrorKind) {
  FrameHeader header;
  header.kind = static_cast<uint8_t>(FrameKind::kAbort);
  header.length = kMaxControlPayload + 1;
  expectProtocolError([&] { validateFrameHeader(header); },
                      "abort frame of 16385 bytes exceeds the limit of 16384");
  header.length = 10;
  header.error_kind = 200;
  expectProtocolError([&] { validateFrameHeader(header); },
                      "abort frame with unknown error kind 200");
  header = FrameHeader{};
  header.kind = static_cast<uint8_t>(FrameKind::kConnect);
  header.length = kMaxControlPayload + 1;
  expectProtocolError([&] { validateFrameHeader(header); },
                      "connect frame of 16385 bytes exceeds the limit of 16384");
}

TEST(FrameParser, RejectsControlFramesWithPayloadAndEndsForNoLink) {
  FrameHeader header;
  header.kind = static_cast<uint8_t>(FrameKind::kPing);
  header.length = 1;
  expectProtocolError([&] { validateFrameHeader(header); }, "ping frame with a payload");
  header = FrameHeader{};
  header.kind = static_cast<uint8_t>(FrameKind::kWritten);
  header.link = 64;
  header.total = 2;
  expectProtocolError([&] { validateFrameHeader(header); }, "written frame for link 64 of 2");
}

// ---- hellos -------------------------------------------------------------------------------

Bytes helloBytes(const Hello& hello, const std::string& token) {
  Bytes bytes = bytesOf(hello);
  bytes.insert(bytes.end(), token.begin(), token.end());
  return bytes;
}

TEST(HelloParser, DecodesAndChecksAValidHello) {
  Hello hello;
  hello.rank = 2;
  hello.world_size = 4;
  hello.token_bytes = 3;
  const Bytes bytes = helloBytes(hello, "tok");
  EXPECT_EQ(helloSize(bytes), sizeof(Hello) + 3);
  const ReceivedHello received = parseHello(bytes);
  EXPECT_EQ(received.token, "tok");
  EXPECT_EQ(received.hello.rank, 2u);
  EXPECT_EQ(checkHello(received.hello, received.token, "tok", 0, 4), "");
}

TEST(HelloParser, RefusesBeforeReadingTheToken) {
  Hello hello;
  const Bytes fixed = bytesOf(hello);
  expectProtocolError([&] { helloSize(std::span(fixed).first(23)); },
                      "truncated hello: 23 of 24 bytes");
  hello.magic = 0x01020304;
  expectProtocolError([&] { helloSize(bytesOf(hello)); },
                      "not a railshard connection (bad hello magic 0x01020304)");
  hello = Hello{};
  hello.version = 1;
  expectProtocolError([&] { helloSize(bytesOf(hello)); }, "wire version 1, expected 3");
  hello = Hello{};
  hello.token_bytes = 65535;
  expectProtocolError([&] { helloSize(bytesOf(hello)); },
                      "token of 65535 bytes exceeds the limit of 1024");
}

TEST(HelloParser, RejectsAHelloOfTheWrongLength) {
  Hello hello;
  hello.token_bytes = 5;
  expectProtocolError([&] { parseHello(helloBytes(hello, "abc")); },
                      "hello of 27 bytes, expected 29");
  expectProtocolError([&] { parseHello(helloBytes(hello, "abcdefg")); },
                      "hello of 31 bytes, expected 29");
}

TEST(HelloParser, CheckNamesEachReason) {
  Hello hello;
  hello.rank = 1;
  hello.world_size = 4;
  EXPECT_EQ(checkHello(hello, "bad", "good", 0, 4), "wrong job token");
  EXPECT_EQ(checkHello(hello, "good", "good", 0, 8), "world size 4, expected 8");
  EXPECT_EQ(checkHello(hello, "good", "good", 1, 4), "unexpected rank 1");
  hello.rank = 4;
  EXPECT_EQ(checkHello(hello, "good", "good", 0, 4), "unexpected rank 4");
  hello.rank = 1;
  hello.channels = 0;
  EXPECT_EQ(checkHello(hello, "good", "good", 0, 4), "connection 0 of 0");
  hello.channels = 2;
  hello.channel = 2;
  EXPECT_EQ(checkHello(hello, "good", "good", 0, 4), "connection 2 of 2");
}

}  // namespace
}  // namespace railshard::transport::links::tcp
