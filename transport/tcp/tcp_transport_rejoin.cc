// Re-admission of a rail that was taken out (tcp_transport_rails.cc). Once both ranks are
// through its failover, the rank that opened the connection at start-up tries to reconnect it
// every rejoin_interval from the keeper thread, binding its rail address; the other rank's
// keeper accepts only a connection whose failover is complete and whose generation follows
// the last one. The progress thread adopts the new connection: a fresh stream, and the
// scheduler's previous estimate of the rail, which measurement then corrects.
#include <poll.h>
#include <sys/socket.h>

#include "base/error.h"
#include "base/logging.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_transport_internal.h"

namespace railshard::transport::tcp {

void TcpTransport::installRejoined() {
  std::vector<std::unique_ptr<Rejoined>> ready;
  {
    std::lock_guard<std::mutex> lock(rejoin_mutex_);
    ready.swap(rejoined_);
  }
  for (auto& r : ready) {
    Peer& peer = *peers_[static_cast<size_t>(r->peer)];
    Channel& channel = *peer.channels[static_cast<size_t>(r->channel)];
    double gbps;
    {
      std::lock_guard<std::mutex> lock(peer.mutex);
      if (channel.up || peer.lost) continue;
      channel.restart(std::move(r->fd), r->generation);
      registerChannel(peer, channel);
      peer.scheduler->markUp(channel.index);
      gbps = peer.scheduler->gbps(channel.index);
    }
    RS_LOG_WARN("rank {}: rail {} ({} -> {}) to rank {} is back; re-admitted at {:.3f} Gbit/s",
                options_.rank, channel.name, channel.local.empty() ? "-" : channel.local,
                channel.remote, peer.rank, gbps);
  }
}

void TcpTransport::keeperLoop() {
  const std::string token = options_.token.substr(0, kMaxToken);
  std::vector<pollfd> polled;
  for (const auto& l : listeners_) polled.push_back({l->fd.get(), POLLIN, 0});
  auto handOver = [&](int peer, int channel, uint16_t generation, Fd fd) {
    auto r = std::make_unique<Rejoined>();
    r->peer = peer;
    r->channel = channel;
    r->generation = generation;
    r->fd = std::move(fd);
    {
      std::lock_guard<std::mutex> lock(rejoin_mutex_);
      rejoined_.push_back(std::move(r));
    }
    wake();
  };
  // Both sides must be through the failover of that connection before it is re-made.
  auto rejoinable = [](const Channel& c) { return !c.up && c.report_sent && c.report_received; };
  while (!closing_.load() && !stopping_.load()) {
    for (auto& p : polled) p.revents = 0;
    const int n = ::poll(polled.data(), polled.size(), 100);
    if (closing_.load() || failed_.load()) break;
    // Accepting side: a higher rank reconnecting one of its rails.
    for (auto& p : polled) {
      if (n <= 0 || !(p.revents & POLLIN)) continue;
      const int raw = ::accept4(p.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (raw < 0) continue;
      Fd fd(raw);
      setNoDelay(fd.get());  // as at start-up
      const std::string from = peerAddress(fd.get()).toString();
      // As at start-up (tcp_transport_connect.cc): the fixed part is checked (magic, version,
      // token length) before the token is read, every refusal is logged with its reason, and
      // a connection that is silent or slow holds the keeper for at most a second.
      auto refuse = [&](const std::string& reason) {
        RS_LOG_WARN("rank {}: refused a rail rejoin connection from {}: {}", options_.rank, from,
                    reason);
      };
      const Deadline deadline = deadlineAfter(std::chrono::seconds(1));
      try {
        std::vector<uint8_t> bytes(sizeof(Hello));
        recvAll(fd.get(), bytes.data(), bytes.size(), deadline, "rejoin hello");
        bytes.resize(helloSize(bytes));
        recvAll(fd.get(), bytes.data() + sizeof(Hello), bytes.size() - sizeof(Hello), deadline,
                "rejoin hello");
        const ReceivedHello received = parseHello(bytes);
        const Hello& hello = received.hello;
        if (auto reason = checkHello(hello, received.token, token, options_.rank, options_.size);
            !reason.empty()) {
          refuse(reason);
          continue;
        }
        if (!(hello.flags & kHelloRejoin)) {
          refuse("not a rejoin (start-up is over)");
          continue;
        }
        Peer* peer = peers_[hello.rank].get();
        if (peer == nullptr || hello.channels != peer->channels.size()) {
          refuse("rank " + std::to_string(hello.rank) + " announces " +
                 std::to_string(hello.channels) + " connection(s), this rank has " +
                 std::to_string(peer == nullptr ? 0 : peer->channels.size()));
          continue;
        }
        {
          std::lock_guard<std::mutex> lock(peer->mutex);
          const Channel& c = *peer->channels[hello.channel];
          if (!rejoinable(c) || peer->lost ||
              hello.generation != static_cast<uint16_t>(c.generation + 1)) {
            // Also a normal race (a retry after the connection was re-made): no warning.
            RS_LOG_DEBUG(
                "rank {}: rejoin of connection {} from rank {} (generation {}) not "
                "wanted now",
                options_.rank, hello.channel, hello.rank, hello.generation);
            continue;
          }
        }
        Hello ack;
        ack.rank = static_cast<uint32_t>(options_.rank);
        ack.world_size = static_cast<uint32_t>(options_.size);
        ack.channel = hello.channel;
        ack.channels = hello.channels;
        ack.flags = kHelloRejoin;
        ack.generation = hello.generation;
        sendAll(fd.get(), &ack, sizeof(ack), deadline, "rejoin reply");
        handOver(static_cast<int>(hello.rank), hello.channel, hello.generation, std::move(fd));
      } catch (const Error& e) {
        refuse(e.what());
      }
    }
    // Connecting side: our rails to lower ranks that are down.
    for (auto& peer_ptr : peers_) {
      if (!peer_ptr || !peer_ptr->multi() || !peer_ptr->connector) continue;
      Peer& peer = *peer_ptr;
      for (auto& channel_ptr : peer.channels) {
        Channel& channel = *channel_ptr;
        std::string local;
        std::string target;
        uint16_t generation;
        {
          std::lock_guard<std::mutex> lock(peer.mutex);
          const Clock::time_point now = Clock::now();
          if (peer.lost || !rejoinable(channel) ||
              now - channel.last_rejoin_attempt < options_.rejoin_interval) {
            continue;
          }
          channel.last_rejoin_attempt = now;
          local = channel.local;
          target = channel.listener;
          generation = static_cast<uint16_t>(channel.generation + 1);
        }
        if (closing_.load()) break;
        const std::string what = "rank " + std::to_string(options_.rank) + " reconnecting " +
                                 channel.name + " to rank " + std::to_string(peer.rank);
        try {
          const Deadline deadline = deadlineAfter(std::chrono::seconds(1));
          const SockAddr source = resolve(joinHostPort(local, 0), "rail address");
          Fd fd = connectWithRetry(resolve(target, what), deadline, what,
                                   local.empty() ? nullptr : &source);
          Hello hello;
          hello.rank = static_cast<uint32_t>(options_.rank);
          hello.world_size = static_cast<uint32_t>(options_.size);
          hello.token_bytes = static_cast<uint16_t>(token.size());
          hello.channel = static_cast<uint16_t>(channel.index);
          hello.channels = static_cast<uint16_t>(peer.channels.size());
          hello.flags = kHelloRejoin;
          hello.generation = generation;
          sendAll(fd.get(), &hello, sizeof(hello), deadline, what);
          sendAll(fd.get(), token.data(), token.size(), deadline, what);
          Hello ack;
          recvAll(fd.get(), &ack, sizeof(ack), deadline, what);
          if (ack.magic != kHelloMagic || !(ack.flags & kHelloRejoin)) continue;
          handOver(peer.rank, channel.index, generation, std::move(fd));
        } catch (const Error& e) {
          RS_LOG_DEBUG("{}: {}", what, e.what());
        }
      }
    }
  }
}

}  // namespace railshard::transport::tcp
