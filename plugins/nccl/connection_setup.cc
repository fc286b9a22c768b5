#include "plugins/nccl/connection_setup.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "base/error.h"
#include "base/logging.h"
#include "transport/links/tcp/hello.h"

namespace railshard::plugins::nccl {
namespace {

std::string hex16(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

uint64_t randomWord() {
  static std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

uint32_t ipv4Of(const std::string& address) {
  in_addr parsed{};
  if (::inet_pton(AF_INET, address.c_str(), &parsed) != 1) return 0;
  return parsed.s_addr;
}

bool sameSubnet(uint32_t a, uint32_t b, int prefix_length) {
  if (prefix_length <= 0 || prefix_length > 32) return false;
  const uint32_t mask = prefix_length == 32 ? ~0u : ~((1u << (32 - prefix_length)) - 1);
  return (ntohl(a) & mask) == (ntohl(b) & mask);
}

// ".IE": a sender's RDMA layers as its token ends (at most one per handle slot).
bool validLayers(const std::string& tail) {
  if (tail.size() < 2 || tail.size() > 1 + ListenHandle::kMaxRails || tail[0] != '.') return false;
  return tail.find_first_not_of("IE", 1) == std::string::npos;
}

// A non-blocking socket bound to `local` and connecting to `remote`:`port`.
tcp::Fd startConnect(const std::string& local, const std::string& remote, uint16_t port) {
  tcp::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw Error("socket(): " + tcp::errnoText(errno));
  sockaddr_in source{};
  source.sin_family = AF_INET;
  source.sin_addr.s_addr = ipv4Of(local);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&source), sizeof(source)) != 0) {
    throw Error("binding to " + local + ": " + tcp::errnoText(errno));
  }
  sockaddr_in target{};
  target.sin_family = AF_INET;
  target.sin_addr.s_addr = ipv4Of(remote);
  target.sin_port = htons(port);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&target), sizeof(target)) != 0 &&
      errno != EINPROGRESS) {
    throw PeerLostError("connecting " + local + " to " + remote + ":" + std::to_string(port) +
                        ": " + tcp::errnoText(errno));
  }
  return fd;
}

}  // namespace

std::string connectionToken(uint64_t nonce, uint64_t connection) {
  return hex16(nonce) + "." + hex16(connection);
}

// --- the sending side ---

PendingConnect::PendingConnect(const ListenHandle& handle, const std::vector<Rail>& rails,
                               Duration timeout)
    : token_(connectionToken(handle.nonce, randomWord())),
      their_layers_(handleLayers(handle)),
      deadline_(deadlineAfter(timeout)) {
  // The RDMA rails' layers ride in the hellos' token: the receiver pairs its lanes with them.
  if (const std::string mine = rdmaLayers(rails); !mine.empty()) token_ += "." + mine;
  std::vector<bool> used(rails.size(), false);
  for (int r = 0; r < handle.rails; ++r) {
    const HandleRail& theirs = handle.rail[r];
    for (size_t i = 0; i < rails.size(); ++i) {
      const uint32_t mine = ipv4Of(rails[i].address);
      if (used[i] || rails[i].rdma || !sameSubnet(mine, theirs.ipv4, rails[i].prefix_length))
        continue;
      used[i] = true;
      Socket socket;
      socket.name = rails[i].name;
      socket.local = rails[i].address;
      socket.remote = railAddress(theirs).substr(0, railAddress(theirs).rfind(':'));
      socket.remote_port = theirs.port;
      socket.gbps = rails[i].gbps;
      sockets_.push_back(std::move(socket));
      break;
    }
  }
  if (sockets_.empty()) {
    std::string theirs;
    for (int r = 0; r < handle.rails; ++r) theirs += (r ? ", " : "") + railAddress(handle.rail[r]);
    std::string mine;
    for (const Rail& rail : rails) {
      if (!rail.rdma) mine += (mine.empty() ? "" : ", ") + rail.address;
    }
    throw PeerLostError("no rail of this host (" + mine +
                        ") shares a subnet with the receiver's (" + theirs + ")");
  }
  for (size_t i = 0; i < sockets_.size(); ++i) {
    tcp::Hello hello;
    hello.rank = 1;
    hello.world_size = 2;
    hello.channel = static_cast<uint16_t>(i);
    hello.channels = static_cast<uint16_t>(sockets_.size());
    hello.token_bytes = static_cast<uint16_t>(token_.size());
    Socket& socket = sockets_[i];
    socket.out.assign(reinterpret_cast<const char*>(&hello), sizeof(hello));
    socket.out += token_;
    socket.fd = startConnect(socket.local, socket.remote, socket.remote_port);
  }
}

void PendingConnect::step(Socket& socket) {
  const std::string what = "connecting " + socket.name + " to " + socket.remote + ":" +
                           std::to_string(socket.remote_port);
  if (socket.stage == Stage::kConnecting) {
    pollfd p{socket.fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) return;
    int error = 0;
    socklen_t length = sizeof(error);
    ::getsockopt(socket.fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
    if (error == ECONNREFUSED || error == ETIMEDOUT) {
      // Not listening (yet, or any more): again until the deadline.
      socket.fd = startConnect(socket.local, socket.remote, socket.remote_port);
      return;
    }
    if (error != 0) throw PeerLostError(what + ": " + tcp::errnoText(error));
    tcp::setNoDelay(socket.fd.get());
    socket.stage = Stage::kSending;
  }
  if (socket.stage == Stage::kSending) {
    while (!socket.out.empty()) {
      const ssize_t n = ::send(socket.fd.get(), socket.out.data(), socket.out.size(), MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (n <= 0) throw PeerLostError(what + ": sending the hello: " + tcp::errnoText(errno));
      socket.out.erase(0, static_cast<size_t>(n));
    }
    socket.stage = Stage::kAnswering;
  }
  if (socket.stage == Stage::kAnswering) {
    while (socket.got < sizeof(Answer)) {
      const ssize_t n =
          ::recv(socket.fd.get(), socket.in + socket.got, sizeof(Answer) - socket.got, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (n == 0)
        throw PeerLostError(
            what + ": the receiver closed the connection (it refused the hello: see its log)");
      if (n < 0) throw PeerLostError(what + ": " + tcp::errnoText(errno));
      socket.got += static_cast<size_t>(n);
    }
    Answer answer;
    std::memcpy(&answer, socket.in, sizeof(answer));
    if (answer.magic != Answer::kMagic || answer.status != 0) {
      throw ProtocolError(what + ": the receiver's answer is not a railshard one");
    }
    socket.rejoin_port = answer.rejoin_port;
    socket.stage = Stage::kDone;
  }
}

bool PendingConnect::progress() {
  bool done = true;
  for (Socket& socket : sockets_) {
    if (socket.stage != Stage::kDone) step(socket);
    done = done && socket.stage == Stage::kDone;
  }
  if (!done && Clock::now() >= deadline_) {
    throw TimeoutError("connecting to " + sockets_.front().remote +
                       ": no answer on every rail before RAILSHARD_CONNECT_TIMEOUT");
  }
  return done;
}

Established PendingConnect::take() {
  Established established;
  established.token = token_;
  established.peer = sockets_.front().remote;
  established.peer_layers = their_layers_;
  for (size_t i = 0; i < sockets_.size(); ++i) {
    Socket& socket = sockets_[i];
    tcp::Connection c;
    c.fd = std::move(socket.fd);
    c.channel = static_cast<int>(i);
    c.name = socket.name;
    c.local = socket.local;
    c.remote = socket.remote;
    c.target = socket.remote + ":" + std::to_string(socket.rejoin_port);
    c.gbps = socket.gbps;
    established.connections.push_back(std::move(c));
  }
  return established;
}

// --- the receiving side ---

Acceptor::Acceptor(const std::vector<Rail>& rails, const std::vector<int>& device_rails,
                   Duration hello_timeout)
    : rails_(rails), hello_timeout_(hello_timeout) {
  handle_.nonce = randomWord();
  handle_.fused = device_rails.size() > 1 ? 1 : 0;
  int layers = 0;
  for (int index : device_rails) {
    const Rail& rail = rails[static_cast<size_t>(index)];
    if (rail.rdma) {
      // Its lane connects by records over the TCP rails: the handle says only its layer.
      if (layers < ListenHandle::kMaxRails) handle_.layers[layers++] = rail.layer;
      continue;
    }
    tcp::Fd fd = tcp::listenOn(tcp::resolve(rail.address + ":0", "rail " + rail.name));
    tcp::setNonBlocking(fd.get(), true);
    listened_rails_.push_back(index);
    HandleRail& slot = handle_.rail[handle_.rails++];
    slot.ipv4 = ipv4Of(rail.address);
    slot.port = tcp::localAddress(fd.get()).port();
    listeners_.push_back(std::move(fd));
  }
}

void Acceptor::readHello(Incoming& incoming, std::vector<Incoming>& done) {
  while (incoming.bytes.size() < incoming.want) {
    uint8_t buffer[256];
    const size_t want = std::min(sizeof(buffer), incoming.want - incoming.bytes.size());
    const ssize_t n = ::recv(incoming.fd.get(), buffer, want, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) throw ProtocolError("closed before its hello was complete");
    incoming.bytes.insert(incoming.bytes.end(), buffer, buffer + n);
    if (incoming.bytes.size() == sizeof(tcp::Hello) && incoming.want == sizeof(tcp::Hello)) {
      incoming.want = tcp::helloSize(incoming.bytes);  // magic, version, token length checked
    }
  }
  done.push_back(std::move(incoming));
}

std::optional<Established> Acceptor::progress() {
  for (size_t r = 0; r < listeners_.size(); ++r) {
    while (true) {
      const int raw =
          ::accept4(listeners_[r].get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (raw < 0) break;
      Incoming incoming;
      incoming.fd = tcp::Fd(raw);
      incoming.rail = static_cast<int>(r);
      incoming.want = sizeof(tcp::Hello);
      incoming.since = Clock::now();
      try {
        incoming.from = tcp::peerAddress(raw).toString();
      } catch (const Error&) {
        incoming.from = "?";
      }
      incoming_.push_back(std::move(incoming));
    }
  }
  const std::string nonce = hex16(handle_.nonce);
  std::vector<Incoming> pending;
  std::vector<Incoming> complete;
  for (Incoming& incoming : incoming_) {
    const std::string from = incoming.from;
    try {
      if (Clock::now() - incoming.since > hello_timeout_) {
        throw ProtocolError("no whole hello within " +
                            std::to_string(std::chrono::duration<double>(hello_timeout_).count()) +
                            " s");
      }
      const size_t before = complete.size();
      readHello(incoming, complete);
      if (complete.size() == before) pending.push_back(std::move(incoming));
    } catch (const Error& e) {
      RS_LOG_WARN("NCCL plugin: refused a connection from {}: {}", from, e.what());
    }
  }
  incoming_ = std::move(pending);
  std::optional<Established> ready;
  for (Incoming& incoming : complete) {
    try {
      const tcp::ReceivedHello received = tcp::parseHello(incoming.bytes);
      const std::string& token = received.token;
      if (token.size() < 33 || !tcp::constantTimeEquals(token.substr(0, 16), nonce)) {
        throw ProtocolError("not for this listen comm (stale or foreign nonce)");
      }
      if (token.size() > 33 && !validLayers(token.substr(33))) {
        throw ProtocolError("its token names no RDMA layers after the connection number");
      }
      if (auto why = tcp::checkHello(received.hello, token, token, 0, 2); !why.empty()) {
        throw ProtocolError(why);
      }
      Gathered& gathered = gathering_[token];
      if (gathered.channels != 0 && gathered.channels != received.hello.channels) {
        throw ProtocolError("hellos of one connection disagree on its rail count");
      }
      gathered.channels = received.hello.channels;
      if (!gathered.by_channel.emplace(received.hello.channel, std::move(incoming)).second) {
        throw ProtocolError("rail " + std::to_string(received.hello.channel) + " said hello twice");
      }
      if (!ready && static_cast<int>(gathered.by_channel.size()) == gathered.channels) {
        ready = this->complete(token, gathered);
        gathering_.erase(token);
      }
    } catch (const Error& e) {
      RS_LOG_WARN("NCCL plugin: refused a connection from {}: {}", incoming.from, e.what());
    }
  }
  return ready;
}

std::optional<Established> Acceptor::complete(const std::string& token, Gathered& gathered) {
  Established established;
  established.token = token;
  if (token.size() > 34) established.peer_layers = token.substr(34);
  for (auto& [channel, incoming] : gathered.by_channel) {
    const Rail& rail =
        rails_[static_cast<size_t>(listened_rails_[static_cast<size_t>(incoming.rail)])];
    // Where this comm takes the rail back should it fail: a listener of its own on the rail.
    auto listener = std::make_unique<tcp::Listener>();
    listener->ip = rail.address;
    listener->fd = tcp::listenOn(tcp::resolve(rail.address + ":0", "rail " + rail.name));
    Answer answer;
    answer.rejoin_port = tcp::localAddress(listener->fd.get()).port();
    tcp::sendAll(incoming.fd.get(), &answer, sizeof(answer), deadlineAfter(std::chrono::seconds(5)),
                 "answering " + incoming.from);
    tcp::Connection c;
    c.channel = channel;
    c.name = rail.name;
    c.local = rail.address;
    c.remote = incoming.from.substr(0, incoming.from.rfind(':'));
    c.gbps = rail.gbps;
    tcp::setNonBlocking(incoming.fd.get(), false);
    tcp::setNoDelay(incoming.fd.get());
    c.fd = std::move(incoming.fd);
    if (established.peer.empty()) established.peer = c.remote;
    established.connections.push_back(std::move(c));
    established.listeners.push_back(std::move(listener));
  }
  return established;
}

}  // namespace railshard::plugins::nccl
