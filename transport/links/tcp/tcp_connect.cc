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

namespace railshard::transport::links::tcp {

namespace {

std::string ipOf(const std::string& host_port) {
  return splitHostPort(host_port, "listener address").first;
}

// A silent or slow client must not hold start-up for long.
constexpr auto kHelloTimeout = std::chrono::seconds(5);
// Connections accepted during start-up whose hello is still incomplete. Beyond this many the
// oldest is closed: a peer that opens connections and never speaks cannot exhaust this
// process's descriptors, and the real ranks (which send their hello at once) still get in.
constexpr size_t kMaxPendingHellos = 64;
constexpr size_t kMaxChannelsPerPeer = 256;

// A connection accepted during start-up, its hello not yet complete. The hellos of all
// pending connections are read side by side, so one silent or slow connection delays
// nobody else's.
struct PendingHello {
  Fd fd;
  std::string from;
  Deadline deadline;
  std::vector<uint8_t> bytes;   // received so far
  size_t want = sizeof(Hello);  // the whole hello once its fixed part is known
};

}  // namespace

Connections connectPeers(Store& store, const ConnectOptions& options) {
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
      c.name = rail.name + (sockets > 1 ? "#" + std::to_string(index % sockets) : "");
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
    rail_listeners +=
        (rail_listeners.empty() ? "" : " ") + localAddress(rail_listener->fd.get()).toString();
    listeners.push_back(std::move(rail_listener));
  }
  auto keyOf = [&](int r) { return options.key_prefix + "/tcp/addr/" + std::to_string(r); };
  auto railsKeyOf = [&](int r) { return options.key_prefix + "/tcp/rails/" + std::to_string(r); };
  store.setString(keyOf(rank), my_address, options.connect_timeout);
  store.setString(railsKeyOf(rank), rail_listeners, options.connect_timeout);
  RS_LOG_DEBUG("rank {}: tcp transport listening on {} (rails: {})", rank, my_address,
               rail_listeners.empty() ? "none" : rail_listeners);

  const std::string token = options.token.substr(0, kMaxToken);
  // Connect to every lower rank; accept every higher one. Lower ranks accept only after
  // their own connects finish, and rank 0 connects to nobody, so this cannot deadlock.
  for (int r = 0; r < rank; ++r) {
    if (!wanted(r)) continue;
    auto left = [&] { return std::max<Duration>(Duration(0), deadline - Clock::now()); };
    const std::string address = store.getString(keyOf(r), left());
    const auto& rails = static_cast<size_t>(r) < options.peer_rails.size()
                            ? options.peer_rails[static_cast<size_t>(r)]
                            : std::vector<RailSpec>{};
    std::vector<std::string> their_rails;
    if (!rails.empty()) {
      std::istringstream in(store.getString(railsKeyOf(r), left()));
      for (std::string one; in >> one;) their_rails.push_back(one);
    }
    // Rails both ends can use: our address is here and the peer listens on its own.
    std::vector<std::pair<int, std::string>> usable;  // rail index, peer's listener
    for (size_t i = 0; i < rails.size(); ++i) {
      auto it = std::find_if(their_rails.begin(), their_rails.end(),
                             [&](const auto& l) { return ipOf(l) == rails[i].remote_address; });
      if (usable_ips.count(rails[i].local_address) > 0 && it != their_rails.end()) {
        usable.emplace_back(static_cast<int>(i), *it);
      }
    }
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
    if (!wanted(r)) return true;
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
  auto refuse = [&](const PendingHello& p, const std::string& reason) {
    RS_LOG_WARN("rank {}: refused a data connection from {}: {}", rank, p.from, reason);
  };
  // Takes a connection whose hello has arrived in full, or refuses it (closing it).
  auto admit = [&](PendingHello& p) {
    ReceivedHello received;
    std::string reason;
    try {
      received = parseHello(p.bytes);
      reason = refusal(received, p.fd.get());
    } catch (const Error& e) {
      reason = e.what();
    }
    if (!reason.empty()) {
      refuse(p, reason);
      return;
    }
    const Hello& hello = received.hello;
    int rail_index = -1;
    const auto& rails = hello.rank < options.peer_rails.size() ? options.peer_rails[hello.rank]
                                                               : std::vector<RailSpec>{};
    const std::string local_ip = ipOf(localAddress(p.fd.get()).toString());
    for (size_t i = 0; i < rails.size(); ++i) {
      if (rails[i].local_address == local_ip) rail_index = static_cast<int>(i);
    }
    Hello ack;
    ack.rank = static_cast<uint32_t>(rank);
    ack.world_size = static_cast<uint32_t>(size);
    ack.channel = hello.channel;
    ack.channels = hello.channels;
    try {
      sendAll(p.fd.get(), &ack, sizeof(ack), std::min(deadline, p.deadline),
              "hello reply to " + p.from);
    } catch (const Error& e) {
      // Gone right after its hello: a real rank would retry; nothing to keep.
      refuse(p, e.what());
      return;
    }
    add(static_cast<int>(hello.rank), hello.channel, hello.channels, rail_index, std::move(p.fd),
        p.from);
  };
  // Reads what has arrived of a pending hello; true when the connection is finished with
  // (admitted, refused or gone).
  auto readHello = [&](PendingHello& p) -> bool {
    while (p.bytes.size() < p.want) {
      const size_t got = p.bytes.size();
      p.bytes.resize(p.want);
      const ssize_t n = ::recv(p.fd.get(), p.bytes.data() + got, p.want - got, MSG_DONTWAIT);
      p.bytes.resize(got + (n > 0 ? static_cast<size_t>(n) : 0));
      if (n == 0) {
        refuse(p, "connection closed after " + std::to_string(got) + " byte(s) of its " +
                      (got < sizeof(Hello) ? std::to_string(sizeof(Hello)) + "-byte hello"
                                           : std::to_string(p.want) + "-byte hello and token"));
        return true;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        refuse(p, "receive failed: " + errnoText(errno));
        return true;
      }
      if (p.bytes.size() == sizeof(Hello)) {
        try {
          p.want = helloSize(p.bytes);
        } catch (const ProtocolError& e) {
          refuse(p, e.what());
          return true;
        }
      }
    }
    admit(p);
    return true;
  };

  std::vector<PendingHello> pending;
  while (!allComplete()) {
    const Deadline now = Clock::now();
    if (now >= deadline) {
      std::string missing;
      for (int r = rank + 1; r < size; ++r) {
        if (!complete(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw TimeoutError(
          "rank " + std::to_string(rank) + ": rank(s) " + missing + " did not connect within " +
          std::to_string(std::chrono::duration<double>(options.connect_timeout).count()) + " s");
    }
    // Silent connections past their hello deadline go first.
    std::erase_if(pending, [&](const PendingHello& p) {
      if (p.deadline > now) return false;
      refuse(p,
             "no complete hello within " +
                 std::to_string(
                     std::chrono::duration_cast<std::chrono::milliseconds>(kHelloTimeout).count()) +
                 " ms (" + std::to_string(p.bytes.size()) + " byte(s) received)");
      return true;
    });
    Deadline wake = std::min(deadline, now + std::chrono::seconds(1));
    for (const auto& p : pending) wake = std::min(wake, p.deadline);
    std::vector<pollfd> polled;
    for (const auto& l : listeners) polled.push_back({l->fd.get(), POLLIN, 0});
    for (const auto& p : pending) polled.push_back({p.fd.get(), POLLIN, 0});
    const auto wait_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
    const int n = ::poll(polled.data(), polled.size(), static_cast<int>(wait_ms));
    if (n < 0 && errno != EINTR) {
      throw Error("rank " + std::to_string(rank) + ": poll: " + errnoText(errno));
    }
    if (n <= 0) continue;
    // Pending connections first (their indices shift once new ones are appended).
    const size_t listener_count = listeners.size();
    std::vector<bool> done(pending.size(), false);
    for (size_t i = 0; i < pending.size(); ++i) {
      if (polled[listener_count + i].revents & (POLLIN | POLLHUP | POLLERR)) {
        done[i] = readHello(pending[i]);
      }
    }
    size_t index = 0;
    std::erase_if(pending, [&](const PendingHello&) { return done[index++]; });
    for (size_t i = 0; i < listener_count; ++i) {
      if (!(polled[i].revents & POLLIN)) continue;
      const int fd = ::accept4(polled[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;  // gone already, or out of descriptors: the next round retries
      // As on the connecting side: with Nagle on, a small message sent while the previous
      // one is unacknowledged waits for the peer's delayed ACK (~40 ms).
      setNoDelay(fd);
      PendingHello p;
      p.fd = Fd(fd);
      try {
        p.from = peerAddress(fd).toString();
      } catch (const Error&) {
        continue;  // reset before we got to it
      }
      p.deadline = std::min(deadline, deadlineAfter(kHelloTimeout));
      if (pending.size() >= kMaxPendingHellos) {
        refuse(pending.front(), "more than " + std::to_string(kMaxPendingHellos) +
                                    " connections without a complete hello; closing the oldest");
        pending.erase(pending.begin());
      }
      // Real ranks send their hello right after connecting: it is usually here already.
      if (!readHello(p)) pending.push_back(std::move(p));
    }
  }

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
  // Listeners stay open only for rails that may need re-dialling.
  if (!several) listeners.clear();
  return result;
}

}  // namespace railshard::transport::links::tcp
