#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/memory_store.h"
#include "launcher/store_protocol.h"
#include "launcher/tcp_store.h"
#include "launcher/tcp_store_server.h"
#include "tests/test_util.h"
#include "transport/links/tcp/socket.h"

namespace railshard::launcher {
namespace {

using namespace std::chrono_literals;
namespace tcp = transport::links::tcp;

constexpr char kToken[] = "s3cret-job-token";

std::string hostPort(const TcpStoreServer& server) {
  return "127.0.0.1:" + std::to_string(server.port());
}

std::unique_ptr<TcpStoreServer> startServer(TcpStoreServerOptions options = {}) {
  return std::make_unique<TcpStoreServer>(tcp::resolve("127.0.0.1:0", "test"), kToken, options);
}

Store::Bytes bytesOf(const std::string& s) {
  return Store::Bytes(s.begin(), s.end());
}

// A raw connection for feeding the server bytes no TcpStore would send.
tcp::Fd rawConnect(const TcpStoreServer& server) {
  return tcp::connectWithRetry(tcp::resolve(hostPort(server), "test"), deadlineAfter(5s), "raw");
}

void rawSend(int fd, const Bytes& bytes) {
  tcp::sendAll(fd, bytes.data(), bytes.size(), deadlineAfter(5s), "raw");
}

void rawHello(int fd, const std::string& token = kToken) {
  Request hello;
  hello.command = Command::kHello;
  hello.token = token;
  rawSend(fd, encodeRequest(hello));
  uint8_t answer[5];
  tcp::recvAll(fd, answer, sizeof(answer), deadlineAfter(5s), "raw");
  const Response response = parseResponse(Command::kHello, answer);
  ASSERT_EQ(response.status, Status::kOk);
}

// True when the server closes `fd` (EOF or reset) within `limit`, reading and discarding
// anything it sends first.
bool closedByServer(int fd, std::chrono::milliseconds limit) {
  const Deadline deadline = deadlineAfter(limit);
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, millisUntil(deadline)) <= 0) continue;
    uint8_t buffer[256];
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) return true;
    if (n < 0 && errno != EINTR && errno != EAGAIN) return true;
  }
  return false;
}

// The server still answers a well-behaved client.
void expectServing(const TcpStoreServer& server, const std::string& key) {
  TcpStore store(hostPort(server), kToken, 5s);
  store.setString(key, "alive", 5s);
  EXPECT_EQ(store.getString(key, 5s), "alive");
}

// ---- protocol ---------------------------------------------------------------------------

std::vector<Request> sampleRequests() {
  std::vector<Request> requests;
  Request r;
  r.command = Command::kHello;
  r.token = "tok";
  requests.push_back(r);
  r = Request{};
  r.command = Command::kSet;
  r.keys = {"k"};
  r.value = {0, 1, 2, 0xff, 0};
  requests.push_back(r);
  r = Request{};
  r.command = Command::kSet;
  r.keys = {""};
  requests.push_back(r);
  r = Request{};
  r.command = Command::kGet;
  r.keys = {"key/with/slashes"};
  r.timeout_ms = 123456;
  requests.push_back(r);
  r = Request{};
  r.command = Command::kAdd;
  r.keys = {"counter"};
  r.delta = -9'000'000'000'000'000'000LL;
  requests.push_back(r);
  r = Request{};
  r.command = Command::kWait;
  r.keys = {"a", "b", "c"};
  r.timeout_ms = 7;
  requests.push_back(r);
  r = Request{};
  r.command = Command::kWait;
  requests.push_back(r);
  r = Request{};
  r.command = Command::kRemove;
  r.keys = {"gone"};
  requests.push_back(r);
  return requests;
}

TEST(StoreProtocol, RequestsRoundTrip) {
  for (const Request& request : sampleRequests()) {
    const Bytes frame = encodeRequest(request);
    EXPECT_EQ(frameSize(frame), frame.size());
    // Every strict prefix is "need more bytes", never an error.
    for (size_t cut = 0; cut < frame.size(); ++cut) {
      EXPECT_EQ(frameSize(std::span<const uint8_t>(frame.data(), cut)), 0u);
    }
    EXPECT_EQ(parseRequest(frame), request) << commandName(request.command);
  }
}

TEST(StoreProtocol, ResponsesRoundTrip) {
  Response ok_get;
  ok_get.value = {9, 0, 8};
  Response ok_add;
  ok_add.number = -42;
  Response ok_remove;
  ok_remove.existed = true;
  Response timeout;
  timeout.status = Status::kTimeout;
  timeout.message = "key 'x' not set";
  Response error;
  error.status = Status::kError;
  error.error_kind = ErrorKind::kInvalidArgument;
  error.message = "not an integer";
  const std::vector<std::pair<Command, Response>> cases = {
      {Command::kHello, Response{}}, {Command::kSet, Response{}},  {Command::kGet, ok_get},
      {Command::kAdd, ok_add},       {Command::kWait, Response{}}, {Command::kRemove, ok_remove},
      {Command::kGet, timeout},      {Command::kAdd, error}};
  for (const auto& [command, response] : cases) {
    const Bytes frame = encodeResponse(command, response);
    EXPECT_EQ(parseResponse(command, frame), response) << commandName(command);
  }
}

Bytes frameOf(uint8_t tag, const Bytes& body) {
  Bytes frame;
  const auto length = static_cast<uint32_t>(body.size() + 1);
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<uint8_t>(length >> (8 * i)));
  frame.push_back(tag);
  frame.insert(frame.end(), body.begin(), body.end());
  return frame;
}

Bytes u32le(uint32_t v) {
  return {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16),
          static_cast<uint8_t>(v >> 24)};
}

Bytes concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

void expectProtocolError(const Bytes& frame, const std::string& reason_part) {
  try {
    parseRequest(frame);
    ADD_FAILURE() << "no ProtocolError; expected one mentioning '" << reason_part << "'";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(reason_part), std::string::npos) << e.what();
  }
}

TEST(StoreProtocol, MalformedRequestsAreProtocolErrors) {
  const uint8_t kSet = static_cast<uint8_t>(Command::kSet);
  const uint8_t kGet = static_cast<uint8_t>(Command::kGet);
  const uint8_t kWait = static_cast<uint8_t>(Command::kWait);
  const uint8_t kRemove = static_cast<uint8_t>(Command::kRemove);
  expectProtocolError({0, 0, 0}, "shorter");
  expectProtocolError(frameOf(0, {}), "unknown command");
  expectProtocolError(frameOf(99, {}), "unknown command");
  // Key length field running past the end of the frame.
  expectProtocolError(frameOf(kRemove, concat({u32le(100), bytesOf("abc")})), "truncated key");
  // Key over the 4 KiB limit (rejected from its length field, before allocating).
  expectProtocolError(frameOf(kRemove, concat({u32le(kMaxKeyBytes + 1)})), "exceeds the limit");
  // Value claiming 4 GiB in a tiny frame.
  expectProtocolError(frameOf(kSet, concat({u32le(1), bytesOf("k"), u32le(0xffffffffu)})),
                      "value length");
  expectProtocolError(frameOf(kSet, concat({u32le(1), bytesOf("k"), u32le(kMaxValueBytes + 1)})),
                      "exceeds the limit");
  // GET missing its timeout.
  expectProtocolError(frameOf(kGet, concat({u32le(1), bytesOf("k")})), "truncated timeout");
  // WAIT over the key-count limit, and a count the frame cannot possibly hold.
  expectProtocolError(frameOf(kWait, u32le(kMaxWaitKeys + 1)), "exceeds the limit");
  expectProtocolError(frameOf(kWait, u32le(1000)), "does not fit");
  // Trailing bytes after a complete body.
  expectProtocolError(frameOf(kRemove, concat({u32le(1), bytesOf("kX")})), "trailing");
  // Length field disagreeing with the bytes given.
  Bytes frame = encodeRequest(sampleRequests()[1]);
  frame.push_back(0);
  expectProtocolError(frame, "length field");
  // Over-long token.
  expectProtocolError(frameOf(static_cast<uint8_t>(Command::kHello), u32le(kMaxTokenBytes + 1)),
                      "token length");
}

TEST(StoreProtocol, FrameHeaderLimits) {
  EXPECT_THROW(frameSize(u32le(0)), ProtocolError);
  EXPECT_THROW(frameSize(u32le(kMaxFrameBytes + 1)), ProtocolError);
  EXPECT_THROW(frameSize(u32le(0xffffffffu)), ProtocolError);
  EXPECT_EQ(frameSize(u32le(kMaxFrameBytes)), 0u);  // legal, just incomplete
  EXPECT_THROW(frameSize(u32le(kMaxHelloFrameBytes + 1), kMaxHelloFrameBytes), ProtocolError);
}

TEST(StoreProtocol, MalformedResponsesAreProtocolErrors) {
  const auto ok = static_cast<uint8_t>(Status::kOk);
  const auto err = static_cast<uint8_t>(Status::kError);
  EXPECT_THROW(parseResponse(Command::kRemove, frameOf(ok, {2})), ProtocolError);
  EXPECT_THROW(parseResponse(Command::kRemove, frameOf(ok, {})), ProtocolError);
  EXPECT_THROW(parseResponse(Command::kAdd, frameOf(ok, {1, 2, 3})), ProtocolError);
  EXPECT_THROW(parseResponse(Command::kSet, frameOf(ok, {0})), ProtocolError);
  EXPECT_THROW(parseResponse(Command::kSet, frameOf(7, {})), ProtocolError);
  EXPECT_THROW(parseResponse(Command::kSet, frameOf(err, concat({{200}, u32le(0)}))),
               ProtocolError);
  EXPECT_THROW(parseResponse(Command::kGet, frameOf(ok, u32le(0xffffffffu))), ProtocolError);
}

TEST(StoreProtocol, EncodeRejectsOversizedFields) {
  Request r;
  r.command = Command::kSet;
  r.keys = {std::string(kMaxKeyBytes + 1, 'k')};
  EXPECT_THROW(encodeRequest(r), InvalidArgument);
  r.keys = {"k"};
  r.value.resize(kMaxValueBytes + 1);
  EXPECT_THROW(encodeRequest(r), InvalidArgument);
  Request w;
  w.command = Command::kWait;
  w.keys.assign(kMaxWaitKeys + 1, "k");
  EXPECT_THROW(encodeRequest(w), InvalidArgument);
}

TEST(StoreProtocol, TokensEqual) {
  EXPECT_TRUE(tokensEqual("abc", "abc"));
  EXPECT_TRUE(tokensEqual("", ""));
  EXPECT_FALSE(tokensEqual("abd", "abc"));
  EXPECT_FALSE(tokensEqual("ab", "abc"));
  EXPECT_FALSE(tokensEqual("abcd", "abc"));
  EXPECT_FALSE(tokensEqual("", "abc"));
  EXPECT_FALSE(tokensEqual(std::string("ab\0", 3), "ab"));
}

// ---- server and client over real sockets ------------------------------------------------

TEST(TcpStore, SetGetRoundTripWithBinaryAndEmptyValues) {
  auto server = startServer();
  TcpStore store(hostPort(*server), kToken, 5s);
  Store::Bytes binary(70000);
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<uint8_t>(i * 31 + 7);
  binary[0] = 0;
  store.set("binary", binary, 5s);
  store.set("empty", {}, 5s);
  store.setString("text", "hello", 5s);
  EXPECT_EQ(store.get("binary", 5s), binary);
  EXPECT_TRUE(store.get("empty", 5s).empty());
  EXPECT_EQ(store.getString("text", 5s), "hello");
  store.setString("text", "overwritten", 5s);
  EXPECT_EQ(store.getString("text", 5s), "overwritten");
  // A second client sees the same data.
  TcpStore other(hostPort(*server), kToken, 5s);
  EXPECT_EQ(other.get("binary", 5s), binary);
}

TEST(TcpStore, LargeValueRoundTrip) {
  auto server = startServer();
  TcpStore store(hostPort(*server), kToken, 5s);
  Store::Bytes big(8 * 1024 * 1024);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i ^ (i >> 8));
  store.set("big", big, 10s);
  EXPECT_EQ(store.get("big", 10s), big);
}

TEST(TcpStore, GetBlocksUntilAnotherClientSets) {
  auto server = startServer();
  TcpStore reader(hostPort(*server), kToken, 5s);
  TcpStore writer(hostPort(*server), kToken, 5s);
  const auto start = std::chrono::steady_clock::now();
  std::string got;
  std::thread waiter([&] { got = reader.getString("late", 10s); });
  std::this_thread::sleep_for(200ms);
  writer.setString("late", "here", 5s);
  waiter.join();
  EXPECT_EQ(got, "here");
  EXPECT_GE(secondsSince(start), 0.15);
  EXPECT_LT(secondsSince(start), 5.0);
}

TEST(TcpStore, AddFromEightConcurrentClientsSumsExactly) {
  auto server = startServer();
  const std::string address = hostPort(*server);
  constexpr int kClients = 8;
  constexpr int kAddsEach = 200;
  std::vector<std::vector<int64_t>> seen(kClients);
  const auto errors = test::runRanks(kClients, [&](int rank) {
    TcpStore store(address, kToken, 5s);
    for (int i = 0; i < kAddsEach; ++i) seen[rank].push_back(store.add("counter", 1, 5s));
  });
  test::rethrowFirst(errors);
  TcpStore store(address, kToken, 5s);
  EXPECT_EQ(store.add("counter", 0, 5s), kClients * kAddsEach);
  EXPECT_EQ(store.getString("counter", 5s), std::to_string(kClients * kAddsEach));
  // Atomicity: every intermediate sum was handed out exactly once.
  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kClients * kAddsEach));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kClients * kAddsEach);
}

// The server's own CPU time, the store's service time at scale: something (every request is a
// read and a write on a socket), but never more than the time the server has existed.
TEST(TcpStoreServer, CountsItsThreadsCpuTimeWithinItsLifetime) {
  const auto born = std::chrono::steady_clock::now();
  auto server = startServer();
  EXPECT_EQ(server->stats().requests(), 0u);
  const auto errors = test::runRanks(4, [&](int rank) {
    TcpStore store(hostPort(*server), kToken, 5s);
    for (int i = 0; i < 250; ++i) store.add("n" + std::to_string(rank), 1, 5s);
  });
  test::rethrowFirst(errors);
  const StoreStats stats = server->stats();
  const auto lived = std::chrono::steady_clock::now() - born;
  EXPECT_EQ(stats.adds, 1000u) << stats.describe();
  EXPECT_GT(stats.cpu_ns, 0u) << stats.describe();
  EXPECT_LE(stats.cpu_ns, static_cast<uint64_t>(
                              std::chrono::duration_cast<std::chrono::nanoseconds>(lived).count()))
      << stats.describe();
  EXPECT_NE(stats.describe().find(" s of CPU ("), std::string::npos) << stats.describe();
  EXPECT_NE(stats.describe().find(" µs per request)"), std::string::npos) << stats.describe();
}

TEST(TcpStore, OneClientSharedByThreads) {
  auto server = startServer();
  TcpStore store(hostPort(*server), kToken, 5s);
  const auto errors = test::runRanks(4, [&](int rank) {
    for (int i = 0; i < 50; ++i) {
      store.add("shared", 1, 5s);
      store.setString(std::string("t").append(std::to_string(rank)), std::to_string(i), 5s);
    }
  });
  test::rethrowFirst(errors);
  EXPECT_EQ(store.add("shared", 0, 5s), 200);
  EXPECT_EQ(store.getString("t3", 5s), "49");
}

TEST(TcpStore, AddUsesDecimalCountersAndRejectsNonIntegers) {
  auto server = startServer();
  TcpStore store(hostPort(*server), kToken, 5s);
  store.setString("n", "7", 5s);
  EXPECT_EQ(store.add("n", 3, 5s), 10);
  EXPECT_EQ(store.add("fresh", -4, 5s), -4);
  store.setString("word", "abc", 5s);
  try {
    store.add("word", 1, 5s);
    ADD_FAILURE() << "add on a non-integer succeeded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("word"), std::string::npos) << e.what();
  }
  // The connection is still usable after a server-side ERROR.
  EXPECT_EQ(store.add("n", 1, 5s), 11);
}

TEST(TcpStore, WaitOnSeveralKeys) {
  auto server = startServer();
  TcpStore waiter_store(hostPort(*server), kToken, 5s);
  TcpStore writer(hostPort(*server), kToken, 5s);
  writer.setString("w1", "x", 5s);
  waiter_store.wait({"w1"}, 5s);  // already there: immediate
  waiter_store.wait({}, 5s);      // nothing to wait for
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    waiter_store.wait({"w1", "w2", "w3", "w4"}, 10s);
    done = true;
  });
  for (const char* key : {"w4", "w2"}) {
    std::this_thread::sleep_for(50ms);
    writer.setString(key, "x", 5s);
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(done.load());
  writer.add("w3", 1, 5s);  // ADD also makes a key appear
  waiter.join();
  EXPECT_TRUE(done.load());
}

TEST(TcpStore, ManyParkedWaitersAllWake) {
  auto server = startServer();
  const std::string address = hostPort(*server);
  const auto errors = test::runRanks(16, [&](int rank) {
    TcpStore store(address, kToken, 5s);
    if (rank == 0) {
      std::this_thread::sleep_for(200ms);
      store.setString("go", "now", 5s);
    } else {
      EXPECT_EQ(store.getString("go", 10s), "now");
    }
  });
  test::rethrowFirst(errors);
}

TEST(TcpStore, Remove) {
  auto server = startServer();
  TcpStore store(hostPort(*server), kToken, 5s);
  store.setString("r", "v", 5s);
  EXPECT_TRUE(store.remove("r", 5s));
  EXPECT_FALSE(store.remove("r", 5s));
  EXPECT_FALSE(store.remove("never", 5s));
  EXPECT_THROW(store.get("r", 100ms), TimeoutError);
}

TEST(TcpStore, GetOfMissingKeyTimesOutNamingTheKey) {
  auto server = startServer();
  TcpStore store(hostPort(*server), kToken, 5s);
  const auto start = std::chrono::steady_clock::now();
  try {
    store.get("missing/key", 300ms);
    ADD_FAILURE() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("missing/key"), std::string::npos) << message;
    EXPECT_NE(message.find(hostPort(*server)), std::string::npos) << message;
  }
  const double elapsed = secondsSince(start);
  EXPECT_GE(elapsed, 0.25);
  EXPECT_LT(elapsed, 2.0);
  // A WAIT timeout names the keys still missing, and the client stays usable.
  store.setString("present", "1", 5s);
  try {
    store.wait({"present", "absent"}, 200ms);
    ADD_FAILURE() << "wait for a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("absent"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.getString("present", 5s), "1");
}

TEST(TcpStore, WrongTokenIsRefusedAndServerKeepsServing) {
  auto server = startServer();
  try {
    TcpStore bad(hostPort(*server), "not-the-token", 5s);
    ADD_FAILURE() << "a client with a wrong token connected";
  } catch (const PeerLostError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("RAILSHARD_TOKEN"), std::string::npos) << message;
    EXPECT_NE(message.find(hostPort(*server)), std::string::npos) << message;
  }
  expectServing(*server, "after-wrong-token");
}

TEST(TcpStore, ConnectRetriesUntilTheServerListens) {
  const int port = test::freePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  std::unique_ptr<TcpStoreServer> server;
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>(tcp::resolve(address, "test"), kToken);
  });
  TcpStore store(address, kToken, 10s);
  late.join();
  store.setString("k", "v", 5s);
  EXPECT_EQ(store.getString("k", 5s), "v");
}

TEST(TcpStore, ConnectTimesOutWhenNobodyListens) {
  const std::string address = "127.0.0.1:" + std::to_string(test::freePort());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW({ TcpStore store(address, kToken, 300ms); }, TimeoutError);
  EXPECT_LT(secondsSince(start), 3.0);
}

TEST(TcpStoreServer, DropsGarbageBeforeHello) {
  auto server = startServer();
  tcp::Fd raw = rawConnect(*server);
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  rawSend(raw.get(), bytesOf(http));
  EXPECT_TRUE(closedByServer(raw.get(), 3000ms));
  expectServing(*server, "after-garbage");
}

TEST(TcpStoreServer, DropsRequestsWithoutHello) {
  auto server = startServer();
  tcp::Fd raw = rawConnect(*server);
  Request set;
  set.command = Command::kSet;
  set.keys = {"sneaky"};
  set.value = bytesOf("v");
  rawSend(raw.get(), encodeRequest(set));
  EXPECT_TRUE(closedByServer(raw.get(), 3000ms));
  TcpStore store(hostPort(*server), kToken, 5s);
  EXPECT_FALSE(store.remove("sneaky", 5s));
}

TEST(TcpStoreServer, DropsOversizedLength) {
  auto server = startServer();
  {
    tcp::Fd raw = rawConnect(*server);  // before HELLO: even a legal SET size is too big
    rawSend(raw.get(), concat({u32le(1024 * 1024), {static_cast<uint8_t>(Command::kHello)}}));
    EXPECT_TRUE(closedByServer(raw.get(), 3000ms));
  }
  {
    tcp::Fd raw = rawConnect(*server);  // after HELLO: over the frame limit
    rawHello(raw.get());
    rawSend(raw.get(), concat({u32le(0xfffffff0u), {static_cast<uint8_t>(Command::kSet)}}));
    EXPECT_TRUE(closedByServer(raw.get(), 3000ms));
  }
  expectServing(*server, "after-oversized");
}

TEST(TcpStoreServer, DropsMalformedAndTruncatedFrames) {
  auto server = startServer();
  {
    // A complete frame whose key length runs past its end.
    tcp::Fd raw = rawConnect(*server);
    rawHello(raw.get());
    rawSend(raw.get(), frameOf(static_cast<uint8_t>(Command::kRemove),
                               concat({u32le(500), bytesOf("short")})));
    EXPECT_TRUE(closedByServer(raw.get(), 3000ms));
  }
  {
    // Unknown command after HELLO.
    tcp::Fd raw = rawConnect(*server);
    rawHello(raw.get());
    rawSend(raw.get(), frameOf(77, {}));
    EXPECT_TRUE(closedByServer(raw.get(), 3000ms));
  }
  {
    // Half a frame, then the client goes away.
    tcp::Fd raw = rawConnect(*server);
    rawHello(raw.get());
    Request set;
    set.command = Command::kSet;
    set.keys = {"half"};
    set.value = Bytes(1000, 1);
    const Bytes frame = encodeRequest(set);
    rawSend(raw.get(), Bytes(frame.begin(), frame.begin() + 300));
    std::this_thread::sleep_for(50ms);
  }
  {
    // Random bytes after HELLO.
    tcp::Fd raw = rawConnect(*server);
    rawHello(raw.get());
    Bytes noise(4096);
    uint32_t x = 12345;
    for (auto& b : noise) {
      x = x * 1103515245u + 12345u;
      b = static_cast<uint8_t>(x >> 16);
    }
    rawSend(raw.get(), noise);
    EXPECT_TRUE(closedByServer(raw.get(), 3000ms));
  }
  expectServing(*server, "after-malformed");
  TcpStore store(hostPort(*server), kToken, 5s);
  EXPECT_FALSE(store.remove("half", 5s));
}

TEST(TcpStoreServer, DropsSilentConnectionBeforeHello) {
  TcpStoreServerOptions options;
  options.hello_timeout = 200ms;
  auto server = startServer(options);
  tcp::Fd raw = rawConnect(*server);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(closedByServer(raw.get(), 3000ms));
  EXPECT_GE(secondsSince(start), 0.15);
  // An authenticated connection is not subject to that timeout.
  TcpStore store(hostPort(*server), kToken, 5s);
  std::this_thread::sleep_for(400ms);
  store.setString("k", "v", 5s);
  EXPECT_EQ(store.getString("k", 5s), "v");
}

TEST(TcpStoreServer, AdoptsAListeningSocket) {
  tcp::Fd listener = tcp::listenOn(tcp::resolve("127.0.0.1:0", "test"));
  const uint16_t port = tcp::localAddress(listener.get()).port();
  auto server = TcpStoreServer::adopt(listener.release(), kToken);
  EXPECT_EQ(server->port(), port);
  EXPECT_EQ(server->address().toString(), "127.0.0.1:" + std::to_string(port));
  expectServing(*server, "adopted");
}

TEST(TcpStoreServer, StoppingWakesParkedClientsWithPeerLost) {
  auto server = startServer();
  TcpStore store(hostPort(*server), kToken, 5s);
  const auto start = std::chrono::steady_clock::now();
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    server.reset();
  });
  EXPECT_THROW(store.get("never", 20s), PeerLostError);
  stopper.join();
  EXPECT_LT(secondsSince(start), 5.0);
}

TEST(TcpStoreServer, PipelinedRequestsAreAnsweredInOrder) {
  // Several requests in one write, the first of them parked: answers must come in request
  // order, the later ones only after the parked one completes.
  auto server = startServer();
  tcp::Fd raw = rawConnect(*server);
  rawHello(raw.get());
  Request get;
  get.command = Command::kGet;
  get.keys = {"p"};
  get.timeout_ms = 5000;
  Request add;
  add.command = Command::kAdd;
  add.keys = {"c"};
  add.delta = 5;
  rawSend(raw.get(), concat({encodeRequest(get), encodeRequest(add), encodeRequest(add)}));
  std::this_thread::sleep_for(100ms);
  TcpStore writer(hostPort(*server), kToken, 5s);
  EXPECT_EQ(writer.add("c", 0, 5s), 0);  // the ADDs behind the parked GET have not run
  writer.setString("p", "pv", 5s);
  auto readFrame = [&](Command command) {
    uint8_t header[4];
    tcp::recvAll(raw.get(), header, 4, deadlineAfter(5s), "raw");
    const uint32_t length = frameLength(header);
    Bytes frame(header, header + 4);
    frame.resize(4 + length);
    tcp::recvAll(raw.get(), frame.data() + 4, length, deadlineAfter(5s), "raw");
    return parseResponse(command, frame);
  };
  EXPECT_EQ(readFrame(Command::kGet).value, bytesOf("pv"));
  EXPECT_EQ(readFrame(Command::kAdd).number, 5);
  EXPECT_EQ(readFrame(Command::kAdd).number, 10);
}

TEST(TcpStoreServer, ClosesTheOldestUnauthenticatedConnectionsBeyondTheLimit) {
  TcpStoreServerOptions options;
  options.max_unauthenticated = 4;
  auto server = startServer(options);
  std::vector<tcp::Fd> silent;
  for (int i = 0; i < 6; ++i) {
    silent.push_back(rawConnect(*server));
    // One at a time, so the server sees them in this order.
    std::this_thread::sleep_for(20ms);
  }
  // The two oldest are closed at once (well before the 10 s HELLO timeout)...
  EXPECT_TRUE(closedByServer(silent[0].get(), 3000ms));
  EXPECT_TRUE(closedByServer(silent[1].get(), 3000ms));
  // ...the newest four stay, and a real client still gets in (closing the next oldest).
  EXPECT_FALSE(closedByServer(silent[5].get(), 200ms));
  expectServing(*server, "past-the-silent-ones");
  EXPECT_TRUE(closedByServer(silent[2].get(), 3000ms));
}

TEST(TcpStoreServer, RefusesDataBeyondItsLimitAndKeepsServing) {
  TcpStoreServerOptions options;
  options.max_data_bytes = 64 * 1024;
  auto server = startServer(options);
  TcpStore store(hostPort(*server), kToken, 5s);
  store.set("small", Bytes(1000, 1), 5s);
  try {
    store.set("big", Bytes(100 * 1000, 2), 5s);
    ADD_FAILURE() << "a SET past the store's limit succeeded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("over its limit of 65536"), std::string::npos) << e.what();
  }
  // Nothing changed, the connection is still good, and freed room is reusable.
  EXPECT_FALSE(store.remove("big", 5s));
  EXPECT_EQ(store.get("small", 5s).size(), 1000u);
  EXPECT_TRUE(store.remove("small", 5s));
  store.set("big", Bytes(65400, 2), 5s);
  // Replacing a value counts only the difference.
  store.set("big", Bytes(65400, 3), 5s);
  EXPECT_EQ(store.get("big", 5s)[0], 3);
  EXPECT_THROW(store.add("counter-does-not-fit", 1, 5s), InvalidArgument);
}

}  // namespace
}  // namespace railshard::launcher

namespace railshard {
namespace {

// The in-process store keeps the TCP store's promises about counters: an add that would
// overflow 64 bits is refused and changes nothing; a non-integer value is quoted, cut short.
TEST(MemoryStoreCounters, OverflowIsRefusedAndLongValuesAreCutInTheMessage) {
  MemoryStore store;
  EXPECT_EQ(store.add("n", std::numeric_limits<int64_t>::max() - 1, std::chrono::seconds(1)),
            std::numeric_limits<int64_t>::max() - 1);
  try {
    store.add("n", 2, std::chrono::seconds(1));
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("adding 2 overflows 64 bits"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(store.add("n", 0, std::chrono::seconds(1)), std::numeric_limits<int64_t>::max() - 1);
  store.setString("text", std::string(100000, 'x'), std::chrono::seconds(1));
  try {
    store.add("text", 1, std::chrono::seconds(1));
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u);
    EXPECT_NE(std::string(e.what()).find("xxx...', not an integer"), std::string::npos);
  }
}

}  // namespace
}  // namespace railshard
