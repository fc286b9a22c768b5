// Hostile input against a running job: while four in-process ranks rendezvous over a real
// TcpStoreServer and open their TCP mesh, a fifth party connects to the store port and to
// the ranks' data ports and sends what an attacker or a confused program would: wrong token,
// garbage, truncated frames, oversized lengths, silence. The job must still finish with
// verified results, and the server and ranks must have logged why they closed each
// connection.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "core/communicator.h"
#include "launcher/store_protocol.h"
#include "launcher/tcp_store.h"
#include "launcher/tcp_store_server.h"
#include "tests/hostile_peer.h"
#include "tests/test_util.h"
#include "transport/links/tcp/hello.h"
#include "transport/links/tcp/socket.h"

namespace railshard {
namespace {

using namespace std::chrono_literals;
namespace tcp = transport::links::tcp;
using launcher::Bytes;
using launcher::Command;
using test::closedByPeer;
using test::connectTo;
using test::sendSome;
using test::StderrCapture;

constexpr char kToken[] = "hostile-test-token";

Bytes u32le(uint32_t v) {
  return {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16),
          static_cast<uint8_t>(v >> 24)};
}

Bytes helloFrame(const std::string& token) {
  launcher::Request hello;
  hello.command = Command::kHello;
  hello.token = token;
  return launcher::encodeRequest(hello);
}

Bytes garbage(size_t size, uint32_t seed) {
  Bytes bytes(size);
  for (auto& b : bytes) {
    seed = seed * 1103515245u + 12345u;
    b = static_cast<uint8_t>(seed >> 16);
  }
  return bytes;
}

// What a data-port hello looks like on the wire (transport/links/tcp/hello.h).
Bytes dataHello(uint32_t rank, uint32_t world_size, const std::string& token,
                uint16_t announced_token_bytes) {
  tcp::Hello hello;
  hello.rank = rank;
  hello.world_size = world_size;
  hello.token_bytes = announced_token_bytes;
  // One allocation and two copies: vector::insert here trips GCC 12's -Warray-bounds
  // (a false positive).
  Bytes bytes(sizeof(hello) + token.size());
  std::memcpy(bytes.data(), &hello, sizeof(hello));
  if (!token.empty()) std::memcpy(bytes.data() + sizeof(hello), token.data(), token.size());
  return bytes;
}

// Attacks on the store port, each on its own connection. Returns the connections that must
// stay open for now (the silent one).
std::vector<tcp::Fd> attackStore(const std::string& store_addr) {
  std::vector<tcp::Fd> keep;
  {  // wrong token
    tcp::Fd fd = connectTo(store_addr);
    sendSome(fd.get(), helloFrame("not-the-token"));
    EXPECT_TRUE(closedByPeer(fd.get(), 5s)) << "wrong token";
  }
  {  // garbage instead of a HELLO
    tcp::Fd fd = connectTo(store_addr);
    sendSome(fd.get(), garbage(3000, 1));
    EXPECT_TRUE(closedByPeer(fd.get(), 5s)) << "garbage";
  }
  {  // a HELLO announcing a 4 GiB token: refused from its length field alone
    tcp::Fd fd = connectTo(store_addr);
    Bytes frame = u32le(0xfffffff0u);
    frame.push_back(static_cast<uint8_t>(Command::kHello));
    sendSome(fd.get(), frame);
    EXPECT_TRUE(closedByPeer(fd.get(), 5s)) << "oversized hello";
  }
  {  // a request before any HELLO
    launcher::Request set;
    set.command = Command::kSet;
    set.keys = {"railshard/boot/0"};
    set.value = {'e', 'v', 'i', 'l'};
    tcp::Fd fd = connectTo(store_addr);
    sendSome(fd.get(), launcher::encodeRequest(set));
    EXPECT_TRUE(closedByPeer(fd.get(), 5s)) << "set without hello";
  }
  {  // a truncated HELLO, then the connection closes
    tcp::Fd fd = connectTo(store_addr);
    const Bytes hello = helloFrame(kToken);
    sendSome(fd.get(), hello.data(), hello.size() - 3);
  }
  {  // silence: closed after the HELLO timeout
    keep.push_back(connectTo(store_addr));
  }
  return keep;
}

// Attacks on a rank's start-up port (its listener in the start-up ring, which accepts hellos
// as the data ports do: tcp::HelloAcceptor).
std::vector<tcp::Fd> attackStartupPort(const std::string& data_addr, int world_size) {
  std::vector<tcp::Fd> keep;
  const auto size = static_cast<uint32_t>(world_size);
  {  // garbage: bad magic
    tcp::Fd fd = connectTo(data_addr);
    sendSome(fd.get(), garbage(200, 2));
    EXPECT_TRUE(closedByPeer(fd.get(), 10s)) << "data garbage";
  }
  {  // a hello with the wrong token, then garbage frames
    tcp::Fd fd = connectTo(data_addr);
    Bytes bytes = dataHello(3, size, "wrong-token-wrong-", 18);
    const Bytes more = garbage(500, 3);
    bytes.insert(bytes.end(), more.begin(), more.end());
    sendSome(fd.get(), bytes);
    EXPECT_TRUE(closedByPeer(fd.get(), 10s)) << "wrong data token";
  }
  {  // a hello announcing a 64 KiB token
    tcp::Fd fd = connectTo(data_addr);
    sendSome(fd.get(), dataHello(3, size, "", 65535));
    EXPECT_TRUE(closedByPeer(fd.get(), 10s)) << "oversized data token";
  }
  {  // a rank number out of range
    tcp::Fd fd = connectTo(data_addr);
    sendSome(fd.get(), dataHello(1000, size, kToken, sizeof(kToken) - 1));
    EXPECT_TRUE(closedByPeer(fd.get(), 10s)) << "rank out of range";
  }
  {  // a rank of the job, but not the one this port waits for
    tcp::Fd fd = connectTo(data_addr);
    sendSome(fd.get(), dataHello(1, size, kToken, sizeof(kToken) - 1));
    EXPECT_TRUE(closedByPeer(fd.get(), 10s)) << "not the predecessor";
  }
  {  // half a hello, then close
    tcp::Fd fd = connectTo(data_addr);
    const Bytes hello = dataHello(3, size, kToken, sizeof(kToken) - 1);
    sendSome(fd.get(), hello.data(), 10);
  }
  {  // silence
    keep.push_back(connectTo(data_addr));
  }
  return keep;
}

TEST(HostileInput, JobFinishesAndEveryRefusalIsLogged) {
  constexpr int kSize = 4;
  constexpr int kIterations = 10;
  constexpr size_t kCount = 50000;
  StderrCapture log;

  launcher::TcpStoreServerOptions server_options;
  server_options.hello_timeout = 1s;
  launcher::TcpStoreServer server(tcp::resolve("127.0.0.1:0", "test"), kToken, server_options);
  const std::string store_addr = "127.0.0.1:" + std::to_string(server.port());

  // Rank 3 waits until the attacks are over, so ranks 0..2 are still accepting meanwhile.
  std::mutex mutex;
  std::condition_variable cv;
  bool attacks_done = false;
  std::atomic<int> verified{0};
  std::thread ranks([&] {
    const auto errors = test::runRanks(kSize, [&](int rank) {
      if (rank == kSize - 1) {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return attacks_done; });
      }
      launcher::TcpStore store(store_addr, kToken, 30s);
      Communicator::Options options;
      options.rank = rank;
      options.size = kSize;
      options.config.token = kToken;
      options.config.timeout = 60s;
      options.config.connect_timeout = 60s;
      auto comm = Communicator::create(store, options);
      std::vector<int64_t> data(kCount);
      for (int it = 0; it < kIterations; ++it) {
        for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<int64_t>(i) * (rank + 1) + it;
        comm->allreduce(data.data(), kCount, DataType::kInt64, ReduceOp::kSum);
        const int64_t factor = kSize * (kSize + 1) / 2;
        for (size_t i = 0; i < kCount; ++i) {
          const int64_t expected = static_cast<int64_t>(i) * factor + int64_t{it} * kSize;
          if (data[i] != expected) {
            throw Error("rank " + std::to_string(rank) + ": wrong result at iteration " +
                        std::to_string(it) + " element " + std::to_string(i));
          }
        }
      }
      verified.fetch_add(1);
    });
    for (int r = 0; r < kSize; ++r) {
      if (errors[static_cast<size_t>(r)]) {
        try {
          std::rethrow_exception(errors[static_cast<size_t>(r)]);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << ": " << e.what();
        }
      }
    }
  });

  std::vector<tcp::Fd> silent = attackStore(store_addr);
  // Rank 0's port in the start-up ring (it waits there for rank 3), read from the store as a
  // peer would.
  launcher::TcpStore reader(store_addr, kToken, 10s);
  const std::string addr = reader.getString("railshard/boot/0", 30s);
  auto more = attackStartupPort(addr, kSize);
  for (auto& fd : more) silent.push_back(std::move(fd));
  // Silent connections are closed by their HELLO deadline (store: 1 s, ranks: 5 s).
  EXPECT_TRUE(log.waitFor("no HELLO within", 10s));
  EXPECT_TRUE(log.waitFor("no complete hello within", 15s));
  for (auto& fd : silent) EXPECT_TRUE(closedByPeer(fd.get(), 10s));
  {
    std::lock_guard<std::mutex> lock(mutex);
    attacks_done = true;
  }
  cv.notify_all();
  ranks.join();
  EXPECT_EQ(verified.load(), kSize);

  const std::string text = log.text();
  // The store server's reasons.
  for (const char* reason : {"wrong token in HELLO", "the first message is not HELLO",
                             "frame length 4294967280 exceeds the limit",
                             "connection closed in the middle of a frame", "no HELLO within"}) {
    EXPECT_NE(text.find(reason), std::string::npos) << "store server did not log: " << reason;
  }
  // The ranks' reasons.
  for (const char* reason :
       {"refused a start-up ring connection from", "bad hello magic", "wrong job token",
        "token of 65535 bytes exceeds the limit", "unexpected rank 1000",
        "rank 1 is not this rank's predecessor in the ring", "connection closed after 10 byte(s)",
        "no complete hello within"}) {
    EXPECT_NE(text.find(reason), std::string::npos) << "ranks did not log: " << reason;
  }
}

}  // namespace
}  // namespace railshard
