#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "plugins/nccl/handle.h"
#include "plugins/nccl/net_devices.h"
#include "transport/links/tcp/socket.h"
#include "transport/links/tcp/tcp_connect.h"
#include "transport/links/tcp/tcp_driver.h"

namespace railshard::plugins::nccl {

namespace tcp = transport::links::tcp;

// The receiver's answer to each connection of a new comm: accepted, and the port on that
// rail where its comm accepts the connection again should it fail (re-admission).
struct Answer {
  static constexpr uint32_t kMagic = 0x52534e41;  // "RSNA"
  uint32_t magic = kMagic;
  uint16_t status = 0;  // 0: accepted
  uint16_t rejoin_port = 0;
};
static_assert(sizeof(Answer) == 8, "Answer is part of the wire format");

// One end of an NCCL connection, connected: a socket per rail, the hello and answer behind
// them, and what the comm needs to run them (the token its re-dials repeat, the receiver's
// listeners for them).
struct Established {
  std::vector<tcp::Connection> connections;
  std::vector<std::unique_ptr<tcp::Listener>> listeners;  // the receiver's, for re-dials
  std::string token;
  std::string peer;         // "10.200.0.2 (rail0)" for messages
  std::string peer_layers;  // the peer's RDMA rails' layers ("" when it has none)
};

// "<nonce>.<connection>" in hex: what every hello of one connection carries, and its
// re-dials after it.
std::string connectionToken(uint64_t nonce, uint64_t connection);

// The sending side's connect, one step per call (NCCL's connect() must not block): a socket
// to the receiver on each rail the two hosts share, a hello on each, then the receiver's
// answer on each (RDMA rails among `rails` connect later, by records over these). Rails are
// paired by subnet (a remote rail with no local rail in its subnet
// is left out); ProtocolError / TimeoutError / PeerLostError say what failed.
class PendingConnect {
 public:
  PendingConnect(const ListenHandle& handle, const std::vector<Rail>& rails, Duration timeout);
  // True once connected (then take() it); false: call again later.
  bool progress();
  Established take();

 private:
  enum class Stage : uint8_t { kConnecting, kSending, kAnswering, kDone };
  struct Socket {
    tcp::Fd fd;
    std::string name;    // the local rail
    std::string local;   // its address
    std::string remote;  // the receiver's address on it
    uint16_t remote_port = 0;
    double gbps = 0;
    Stage stage = Stage::kConnecting;
    std::string out;  // what is still to send
    uint8_t in[sizeof(Answer)] = {};
    size_t got = 0;
    uint16_t rejoin_port = 0;
  };
  void step(Socket& socket);

  std::vector<Socket> sockets_;
  std::string token_;
  std::string their_layers_;
  Deadline deadline_;
};

// The receiving side: a listening socket per rail of the device, and the connections coming
// in, their hellos read without blocking. A connection that is not a railshard hello for this
// listen comm (a stranger, garbage, a stale nonce) is refused with a warning and closed, and
// nothing else is disturbed; one silent for `hello_timeout` is closed too.
class Acceptor {
 public:
  Acceptor(const std::vector<Rail>& rails, const std::vector<int>& device_rails,
           Duration hello_timeout);
  const ListenHandle& handle() const { return handle_; }
  // Accepts and reads what is pending; a whole connection (every rail's socket of it) once
  // there is one. Never blocks (the answers are 8 bytes on fresh sockets).
  std::optional<Established> progress();

 private:
  struct Incoming {
    tcp::Fd fd;
    int rail = 0;  // which listening socket
    std::vector<uint8_t> bytes;
    size_t want = 0;
    Clock::time_point since;
    std::string from;
  };
  struct Gathered {
    std::map<int, Incoming> by_channel;
    int channels = 0;
  };
  void readHello(Incoming& incoming, std::vector<Incoming>& done);
  std::optional<Established> complete(const std::string& token, Gathered& gathered);

  const std::vector<Rail>& rails_;
  std::vector<int> listened_rails_;  // by listening socket: its rail (the device's TCP rails)
  std::vector<tcp::Fd> listeners_;
  ListenHandle handle_;
  Duration hello_timeout_;
  std::vector<Incoming> incoming_;
  std::map<std::string, Gathered> gathering_;  // by token
};

}  // namespace railshard::plugins::nccl
