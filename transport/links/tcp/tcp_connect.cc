// Start-up: every pair of ranks connects (docs/architecture.md). Connect to every lower rank;
// accept every higher one. Lower ranks accept only after their own connects finish, and rank 0
// connects to nobody, so this cannot deadlock.
#include "transport/links/tcp/tcp_connect.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "transport/links/tcp/hello.h"
#include "transport/links/tcp/hello_acceptor.h"

namespace railshard::transport::links::tcp {

namespace {

std::string ipOf(const std::string& host_port) {
  return splitHostPort(host_port, "listener address").first;
}

constexpr size_t kMaxChannelsPerPeer = 256;

}  // namespace

bootstrap::RingOptions startupRing(const ConnectOptions& options) {
  bootstrap::RingOptions ring;
  ring.rank = options.rank;
  ring.size = options.size;
  ring.token = options.token;
  ring.advertise_host = options.advertise_host;
  ring.key_prefix = options.key_prefix;
  ring.timeout = options.connect_timeout;
  return ring;
}

Connections connectPeers(bootstrap::Exchange& exchange, const ConnectOptions& options) {
  Connections result;
  result.by_peer.resize(static_cast<size_t>(options.size));
  result.address.resize(static_cast<size_t>(options.size));
  std::vector<std::unique_ptr<Listener>>& listeners = result.listeners;
  // Connection `index` of `count` to `peer`, on rail `rail_index` of its rails (-1: the default
  // connection to its advertised address).
  auto add = [&](int peer, int index, int count, int rail_index, Fd fd, const std::string& remote) {
    auto& slot = result.by_peer[static_cast<size_t>(peer)];
    if (slot.empty()) slot.resize(static_cast<size_t>(count));
    Connection& c = slot[static_cast<size_t>(index)];
    c.fd = std::move(fd);
    c.channel = index;
    c.remote = remote;
    const auto& rails = static_cast<size_t>(peer) < options.peer_rails.size()
                            ? options.peer_rails[static_cast<size_t>(peer)]
                            : std::vector<RailSpec>{};
    if (rail_index >= 0 && static_cast<size_t>(rail_index) < rails.size()) {
      const int sockets = options.sockets_per_rail;
      const RailSpec& rail = rails[static_cast<size_t>(rail_index)];
      c.name = rail.name;
      if (sockets > 1) c.name += '#' + std::to_string(index % sockets);
      c.local = rail.local_address;
      c.remote = rail.remote_address;
      c.gbps = rail.gbps / sockets;
    }
    if (index == 0) result.address[static_cast<size_t>(peer)] = remote;
  };
  auto wanted = [&](int r) {
    return options.wanted.empty() || options.wanted[static_cast<size_t>(r)];
  };
  const int rank = options.rank;
  const int size = options.size;
  const Deadline deadline = deadlineAfter(options.connect_timeout);
  const int sockets = options.sockets_per_rail;

  // The default listener (peers without rails connect there), and one per local rail address
  // so that a connection on a rail stays on it both ways.
  std::string host = options.advertise_host.empty() ? "127.0.0.1" : options.advertise_host;
  auto listener = std::make_unique<Listener>();
  listener->fd = listenOn(resolve(joinHostPort(host, 0), "tcp transport listen address"));
  const std::string my_address = localAddress(listener->fd.get()).toString();
  listeners.push_back(std::move(listener));
  std::set<std::string> rail_ips;
  for (const auto& rails : options.peer_rails) {
    for (const auto& rail : rails) rail_ips.insert(rail.local_address);
  }
  std::string rail_listeners;
  std::set<std::string> usable_ips;
  for (const auto& ip : rail_ips) {
    auto rail_listener = std::make_unique<Listener>();
    rail_listener->ip = ip;
    try {
      rail_listener->fd = listenOn(resolve(joinHostPort(ip, 0), "rail address " + ip));
    } catch (const Error& e) {
      // A graph from a file may name addresses this host does not have: no rail there (the
      // peer, finding no listener, leaves it out too).
      RS_LOG_WARN("rank {}: rail address {} is not usable on this host, rail skipped: {}",
                  options.rank, ip, e.what());
      continue;
    }
    usable_ips.insert(ip);
    if (!rail_listeners.empty()) rail_listeners += ' ';
    rail_listeners += localAddress(rail_listener->fd.get()).toString();
    listeners.push_back(std::move(rail_listener));
  }
  // Every rank's listeners, from the start-up exchange: "address" or "address rail rail...".
  const std::vector<std::string> published = exchange.allGather(
      rail_listeners.empty() ? my_address : my_address + " " + rail_listeners, "tcp listeners");
  RS_LOG_DEBUG("rank {}: tcp transport listening on {} (rails: {})", rank, my_address,
               rail_listeners.empty() ? "none" : rail_listeners);

  // How this rank reaches rank `r`: its advertised address, and the rails both ends can use
  // (our address is here and the peer listens on its own), as (rail index, peer's listener).
  struct Route {
    std::string address;
    std::vector<std::pair<int, std::string>> usable;
  };
  auto routeTo = [&](int r) {
    Route route;
    std::istringstream in(published[static_cast<size_t>(r)]);
    in >> route.address;
    const auto& rails = static_cast<size_t>(r) < options.peer_rails.size()
                            ? options.peer_rails[static_cast<size_t>(r)]
                            : std::vector<RailSpec>{};
    std::vector<std::string> their_rails;
    for (std::string one; in >> one;) their_rails.push_back(one);
    for (size_t i = 0; i < rails.size(); ++i) {
      auto it = std::find_if(their_rails.begin(), their_rails.end(),
                             [&](const auto& l) { return ipOf(l) == rails[i].remote_address; });
      if (usable_ips.count(rails[i].local_address) > 0 && it != their_rails.end()) {
        route.usable.emplace_back(static_cast<int>(i), *it);
      }
    }
    return route;
  };
  // Peers connected on first use: one connection each, described now (the same on both ends,
  // as either may dial it), made by the driver when the pair is first used.
  auto lazy = [&](int r) {
    const size_t rails = static_cast<size_t>(r) < options.peer_rails.size()
                             ? options.peer_rails[static_cast<size_t>(r)].size()
                             : 0;
    return wanted(r) && !options.lazy.empty() && options.lazy[static_cast<size_t>(r)] &&
           rails * static_cast<size_t>(sockets) <= 1;
  };
  bool any_lazy = false;
  for (int r = 0; r < size; ++r) {
    if (r == rank || !lazy(r)) continue;
    any_lazy = true;
    const Route route = routeTo(r);
    const int rail_index = route.usable.empty() ? -1 : route.usable.front().first;
    const std::string target = route.usable.empty() ? route.address : route.usable.front().second;
    add(r, 0, 1, rail_index, Fd(), target);
    result.by_peer[static_cast<size_t>(r)][0].target = target;
  }

  const std::string token = options.token.substr(0, kMaxToken);
  // Connect to every lower rank; accept every higher one. Lower ranks accept only after
  // their own connects finish, and rank 0 connects to nobody, so this cannot deadlock.
  for (int r = 0; r < rank; ++r) {
    if (!wanted(r) || lazy(r)) continue;
    const Route route = routeTo(r);
    const std::string& address = route.address;
    const auto& usable = route.usable;
    const auto& rails = static_cast<size_t>(r) < options.peer_rails.size()
                            ? options.peer_rails[static_cast<size_t>(r)]
                            : std::vector<RailSpec>{};
    if (!rails.empty() && usable.empty()) {
      RS_LOG_WARN("rank {}: none of the {} rail(s) to rank {} is usable; using {}", rank,
                  rails.size(), r, address);
    }
    const int count = usable.empty() ? 1 : static_cast<int>(usable.size()) * sockets;
    for (int c = 0; c < count; ++c) {
      std::string target = address;
      std::optional<SockAddr> source;
      int rail_index = -1;
      if (!usable.empty()) {
        rail_index = usable[static_cast<size_t>(c / sockets)].first;
        target = usable[static_cast<size_t>(c / sockets)].second;
        source = resolve(joinHostPort(rails[static_cast<size_t>(rail_index)].local_address, 0),
                         "rail address");
      }
      const std::string what = "rank " + std::to_string(rank) + " connecting to rank " +
                               std::to_string(r) + " at " + target;
      Fd fd = connectWithRetry(resolve(target, what), deadline, what, source ? &*source : nullptr);
      Hello hello;
      hello.rank = static_cast<uint32_t>(rank);
      hello.world_size = static_cast<uint32_t>(size);
      hello.token_bytes = static_cast<uint16_t>(token.size());
      hello.channel = static_cast<uint16_t>(c);
      hello.channels = static_cast<uint16_t>(count);
      sendAll(fd.get(), &hello, sizeof(hello), deadline, what);
      sendAll(fd.get(), token.data(), token.size(), deadline, what);
      Hello ack;
      try {
        recvAll(fd.get(), &ack, sizeof(ack), deadline, what);
      } catch (const PeerLostError&) {
        throw PeerLostError(what +
                            ": the peer refused the connection (different RAILSHARD_TOKEN, "
                            "world size or RAILSHARD_SOCKETS_PER_RAIL?)");
      }
      if (ack.magic != kHelloMagic || static_cast<int>(ack.rank) != r) {
        throw ProtocolError(what + ": unexpected reply to hello");
      }
      add(r, c, count, rail_index, std::move(fd), target);
      result.by_peer[static_cast<size_t>(r)][static_cast<size_t>(c)].target = target;
    }
  }
  // Higher ranks connect to us; each says in its hello how many connections it opens.
  auto complete = [&](int r) {
    if (!wanted(r) || lazy(r)) return true;
    const auto& peer = result.by_peer[static_cast<size_t>(r)];
    if (peer.empty()) return false;
    for (const auto& c : peer) {
      if (!c.fd.valid()) return false;
    }
    return true;
  };
  auto allComplete = [&] {
    for (int r = rank + 1; r < size; ++r) {
      if (!complete(r)) return false;
    }
    return true;
  };
  // Checks a complete hello against the job and what has connected so far; empty when it
  // is acceptable, else the reason to refuse it.
  auto refusal = [&](const ReceivedHello& received, int fd) -> std::string {
    const Hello& hello = received.hello;
    std::string reason = checkHello(hello, received.token, token, rank, size);
    if (!reason.empty()) return reason;
    if (hello.flags & kHelloRejoin) return "reconnection during start-up";
    const auto& peer = result.by_peer[hello.rank];
    if (!wanted(static_cast<int>(hello.rank))) {
      return "rank " + std::to_string(hello.rank) + " is not a peer this rank connects to";
    }
    if (lazy(static_cast<int>(hello.rank))) {
      return "rank " + std::to_string(hello.rank) +
             " is connected on first use, not at start-up (RAILSHARD_TCP_CONNECT differs?)";
    }
    if (!peer.empty() && hello.channels != peer.size()) {
      return "rank " + std::to_string(hello.rank) + " announced " + std::to_string(peer.size()) +
             " connection(s), now " + std::to_string(hello.channels);
    }
    if (!peer.empty() && peer[hello.channel].fd.valid()) {
      return "rank " + std::to_string(hello.rank) + " connected twice";
    }
    // Which of our rails it came in on: the ranks may list their common rails in different
    // orders, so the connection's local address decides.
    const auto& rails = hello.rank < options.peer_rails.size() ? options.peer_rails[hello.rank]
                                                               : std::vector<RailSpec>{};
    const std::string local_ip = ipOf(localAddress(fd).toString());
    bool on_rail = false;
    for (const auto& rail : rails) on_rail = on_rail || rail.local_address == local_ip;
    if (hello.channels > 1 && !on_rail) {
      return "rank " + std::to_string(hello.rank) + " connected to " + local_ip +
             ", which is none of the rails to it";
    }
    // Each announced connection costs a Channel: a count far beyond one per rail and socket
    // is no peer of this job (generous, in case the two ends list different rails).
    const size_t most =
        std::max<size_t>(kMaxChannelsPerPeer, rails.size() * static_cast<size_t>(sockets));
    if (hello.channels > most) {
      return "rank " + std::to_string(hello.rank) + " announced " + std::to_string(hello.channels) +
             " connections, at most " + std::to_string(most) + " expected";
    }
    return "";
  };
  // Takes a connection whose hello was acceptable: replies, and files it under its rank.
  auto admit = [&](Fd fd, const ReceivedHello& received, const std::string& from) -> std::string {
    const Hello& hello = received.hello;
    int rail_index = -1;
    const auto& rails = hello.rank < options.peer_rails.size() ? options.peer_rails[hello.rank]
                                                               : std::vector<RailSpec>{};
    const std::string local_ip = ipOf(localAddress(fd.get()).toString());
    for (size_t i = 0; i < rails.size(); ++i) {
      if (rails[i].local_address == local_ip) rail_index = static_cast<int>(i);
    }
    Hello ack;
    ack.rank = static_cast<uint32_t>(rank);
    ack.world_size = static_cast<uint32_t>(size);
    ack.channel = hello.channel;
    ack.channels = hello.channels;
    try {
      sendAll(fd.get(), &ack, sizeof(ack),
              std::min(deadline, deadlineAfter(HelloAcceptor::kHelloTimeout)),
              "hello reply to " + from);
    } catch (const Error& e) {
      // Gone right after its hello: a real rank would retry; nothing to keep.
      return e.what();
    }
    add(static_cast<int>(hello.rank), hello.channel, hello.channels, rail_index, std::move(fd),
        from);
    return "";
  };
  std::vector<int> listen_fds;
  for (const auto& l : listeners) listen_fds.push_back(l->fd.get());
  HelloAcceptor("rank " + std::to_string(rank), "data connection")
      .run(listen_fds, deadline, options.connect_timeout, allComplete, refusal, admit, [&] {
        std::string missing;
        for (int r = rank + 1; r < size; ++r) {
          if (!complete(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        return "rank(s) " + missing + " did not connect";
      });

  bool several = false;
  for (int r = 0; r < size; ++r) {
    const auto& peer = result.by_peer[static_cast<size_t>(r)];
    if (peer.size() < 2) continue;
    several = true;
    std::string plan;
    for (const auto& c : peer) {
      plan += (plan.empty() ? "" : ", ") + c.name + " " + c.local + "->" + c.remote + " " +
              std::to_string(c.gbps) + " Gbit/s";
    }
    RS_LOG_INFO("rank {}: {} connections to rank {}: {}", rank, peer.size(), r, plan);
  }
  // Listeners stay open only for rails that may need re-dialling and peers still to connect.
  if (!several && !any_lazy) listeners.clear();
  return result;
}

}  // namespace railshard::transport::links::tcp
