// libFuzzer target: a real TcpStoreServer fed untrusted bytes over loopback.
//
// One server lives for the whole run (so state built up by earlier inputs, keys and parked
// waiters included, is part of what later inputs meet). Each input is one connection: byte 0
// chooses whether the harness first sends a correct HELLO (most inputs, so the fuzzer reaches
// the authenticated commands) or leaves the whole conversation to the input; the rest is sent
// as is, then the write side is shut. The server must answer or close the connection
// promptly: it either closes (EOF) or, with only well-formed requests, has answered each one
// by the time the connection ends. A crash, a sanitizer report, a stuck server (no close
// within the time limit) or a server that stops accepting is a finding.

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "base/logging.h"
#include "launcher/store_protocol.h"
#include "launcher/tcp_store_server.h"
#include "transport/links/tcp/socket.h"

namespace {

using namespace railshard;
using namespace railshard::launcher;
namespace tcp = railshard::transport::links::tcp;

constexpr char kToken[] = "fuzz-token";

TcpStoreServer& server() {
  static std::unique_ptr<TcpStoreServer> instance = [] {
    // Refusals are expected by the thousand; only errors are worth printing.
    log::configure(LogLevel::kError, -1);
    TcpStoreServerOptions options;
    options.hello_timeout = std::chrono::seconds(2);
    options.max_data_bytes = 16 << 20;  // reachable by the fuzzer, bounded for the run
    return std::make_unique<TcpStoreServer>(tcp::resolve("127.0.0.1:0", "fuzz"), kToken, options);
  }();
  return *instance;
}

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "store_server_fuzz: %s\n", what);
  std::abort();
}

// Reads and discards until EOF/reset or `limit`; false on timeout.
bool drainUntilClosed(int fd, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  uint8_t buffer[64 * 1024];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return true;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  TcpStoreServer& s = server();
  tcp::Fd fd = tcp::connectWithRetry(tcp::resolve("127.0.0.1:" + std::to_string(s.port()), "fuzz"),
                                     deadlineAfter(std::chrono::seconds(5)), "fuzz");
  try {
    if ((data[0] & 0x7) != 0) {
      Request hello;
      hello.command = Command::kHello;
      hello.token = kToken;
      const Bytes frame = encodeRequest(hello);
      tcp::sendAll(fd.get(), frame.data(), frame.size(), deadlineAfter(std::chrono::seconds(5)),
                   "fuzz");
    }
    tcp::sendAll(fd.get(), data + 1, size - 1, deadlineAfter(std::chrono::seconds(5)), "fuzz");
  } catch (const Error&) {
    // The server may close mid-send on a bad frame: that is a valid outcome.
  }
  ::shutdown(fd.get(), SHUT_WR);
  // Parked requests are dropped when the peer half-closes; a non-HELLO first frame, a bad
  // frame or a clean EOF closes at once. The HELLO timeout (2 s) is the longest legitimate
  // wait; well past it the server is stuck.
  if (!drainUntilClosed(fd.get(), std::chrono::seconds(10))) {
    finding("server did not close a half-closed connection within 10 s");
  }
  return 0;
}
