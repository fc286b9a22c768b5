#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "transport/bootstrap/exchange.h"
#include "transport/bootstrap/ring_exchange.h"
#include "transport/links/tcp/socket.h"
#include "transport/links/tcp/tcp_driver.h"

namespace railshard::transport::links::tcp {

// One network link between this rank's host and a peer's: the pair of addresses on a shared
// subnet (topology::Rail seen from this rank).
struct RailSpec {
  std::string name;            // for logs and rail status: the local interface, "rail0"
  std::string local_address;   // this rank's IP on the rail (bound as the source)
  std::string remote_address;  // the peer's IP on the rail
  double gbps = 0;             // starting estimate (probed or nominal); 0 = unknown
};

struct ConnectOptions {
  int rank = 0;
  int size = 1;
  std::string token;           // job token demanded in every hello
  std::string advertise_host;  // address peers connect to (IPv4/IPv6 literal or name)
  std::string key_prefix;      // store namespace of this group (connectMesh's start-up ring)
  Duration connect_timeout = std::chrono::seconds(60);
  // Rails to each peer, by rank (missing or empty: one connection to the peer's advertised
  // address). Both ranks of a pair must list the same rails.
  std::vector<std::vector<RailSpec>> peer_rails;
  int sockets_per_rail = 1;
  // Peers this rank connects to at all (empty: every one). Both ranks of a pair must agree
  // (core/channels: none to the ranks its host's segment serves).
  std::vector<bool> wanted;
  // Of those, peers connected on first use rather than now (empty: none). Both ranks of a pair
  // must agree; a pair with several connections (rails, sockets per rail) connects now all the
  // same, as its rails are measured and striped from the first message.
  std::vector<bool> lazy;
};

// One connection to a peer, as start-up made it; or, for a peer connected on first use, as it
// is to be made (no descriptor: either rank dials `target` from `local` when the pair is first
// used, TcpDriver).
struct Connection {
  Fd fd;
  int channel = 0;           // among the pair's connections, the connecting rank's numbering
  std::string name = "tcp";  // "rail0", "rail0#1"; "tcp" for the default connection
  std::string local;         // local rail address ("" for the default connection)
  std::string remote;        // the peer's address
  std::string target;        // the peer's listener for it (the connecting rank dials it again)
  double gbps = 0;
};

struct Connections {
  std::vector<std::vector<Connection>> by_peer;  // by rank, in channel order
  std::vector<std::string> address;              // each peer's advertised address
  // Kept for rails that may need re-dialling (several connections to a peer); else empty.
  std::vector<std::unique_ptr<Listener>> listeners;
};

// The start-up ring of the group these options connect (same ranks, token, address, store
// prefix and deadline).
bootstrap::RingOptions startupRing(const ConnectOptions& options);

// Listens, tells every rank the addresses through `exchange` (no store request), connects to every
// lower rank and accepts every higher one that it wants now, on each rail both ends can use
// (`sockets_per_rail` sockets each; else one connection to the advertised address); the pairs
// connected on first use are described, not made. TimeoutError names the ranks that never showed
// up; every refused connection (a stranger, a wrong token, a silent client) is logged with why.
Connections connectPeers(bootstrap::Exchange& exchange, const ConnectOptions& options);

}  // namespace railshard::transport::links::tcp
