#include "transport/tcp/tcp_transport.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/base/error.h"
#include "core/base/logging.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

void TcpTransport::connectMesh(Store& store) {
  const int rank = options_.rank;
  const int size = options_.size;
  const Deadline deadline = deadlineAfter(options_.connect_timeout);
  std::string host = options_.advertise_host.empty() ? "127.0.0.1" : options_.advertise_host;
  const std::string bind_spec = joinHostPort(host, 0);
  listen_fd_ = listenOn(resolve(bind_spec, "tcp transport listen address"));
  const std::string my_address = localAddress(listen_fd_.get()).toString();
  auto keyOf = [&](int r) { return options_.key_prefix + "/tcp/addr/" + std::to_string(r); };
  store.setString(keyOf(rank), my_address, options_.connect_timeout);
  RS_LOG_DEBUG("rank {}: tcp transport listening on {}", rank, my_address);

  const std::string token = options_.token.substr(0, kMaxToken);
  // Connect to every lower rank; accept every higher one. Lower ranks accept only after
  // their own connects finish, and rank 0 connects to nobody, so this cannot deadlock.
  for (int r = 0; r < rank; ++r) {
    const auto left = std::max<Duration>(Duration(0), deadline - Clock::now());
    const std::string address = store.getString(keyOf(r), left);
    const std::string what = "rank " + std::to_string(rank) + " connecting to rank " +
                             std::to_string(r) + " at " + address;
    Fd fd = connectWithRetry(resolve(address, what), deadline, what);
    Hello hello;
    hello.rank = static_cast<uint32_t>(rank);
    hello.world_size = static_cast<uint32_t>(size);
    hello.token_bytes = static_cast<uint16_t>(token.size());
    sendAll(fd.get(), &hello, sizeof(hello), deadline, what);
    sendAll(fd.get(), token.data(), token.size(), deadline, what);
    Hello ack;
    try {
      recvAll(fd.get(), &ack, sizeof(ack), deadline, what);
    } catch (const PeerLostError&) {
      throw PeerLostError(what +
                          ": the peer refused the connection (different RAILSHARD_TOKEN "
                          "or world size?)");
    }
    if (ack.magic != kHelloMagic || static_cast<int>(ack.rank) != r) {
      throw ProtocolError(what + ": unexpected reply to hello");
    }
    auto peer = std::make_unique<Peer>();
    peer->rank = r;
    peer->address = address;
    peer->fd = std::move(fd);
    peers_[static_cast<size_t>(r)] = std::move(peer);
  }
  int expected = size - 1 - rank;
  while (expected > 0) {
    Fd fd;
    try {
      fd = acceptBefore(listen_fd_.get(), deadline, "rank " + std::to_string(rank));
    } catch (const TimeoutError&) {
      std::string missing;
      for (int r = rank + 1; r < size; ++r) {
        if (!peers_[static_cast<size_t>(r)])
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw TimeoutError(
          "rank " + std::to_string(rank) + ": rank(s) " + missing + " did not connect within " +
          std::to_string(std::chrono::duration<double>(options_.connect_timeout).count()) + " s");
    }
    const std::string from = peerAddress(fd.get()).toString();
    // A silent or slow client must not hold start-up for long.
    const Deadline hello_deadline = std::min(deadline, deadlineAfter(std::chrono::seconds(5)));
    Hello hello;
    std::string received_token;
    std::string reason;
    try {
      recvAll(fd.get(), &hello, sizeof(hello), hello_deadline, "hello from " + from);
      if (hello.token_bytes > kMaxToken) {
        reason = "token too long";
      } else {
        received_token.resize(hello.token_bytes);
        recvAll(fd.get(), received_token.data(), received_token.size(), hello_deadline,
                "hello from " + from);
        reason = checkHello(hello, received_token, token, rank, size);
      }
    } catch (const Error& e) {
      reason = e.what();
    }
    if (reason.empty() && peers_[hello.rank])
      reason = "rank " + std::to_string(hello.rank) + " connected twice";
    if (!reason.empty()) {
      RS_LOG_WARN("rank {}: refused a data connection from {}: {}", rank, from, reason);
      continue;  // fd closes here; keep waiting for the real peers
    }
    Hello ack;
    ack.rank = static_cast<uint32_t>(rank);
    ack.world_size = static_cast<uint32_t>(size);
    sendAll(fd.get(), &ack, sizeof(ack), deadline, "hello reply to " + from);
    auto peer = std::make_unique<Peer>();
    peer->rank = static_cast<int>(hello.rank);
    peer->address = from;
    peer->fd = std::move(fd);
    peers_[hello.rank] = std::move(peer);
    --expected;
  }
  listen_fd_.reset();
}

}  // namespace railshard::transport::tcp
