#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/clock.h"
#include "transport/links/tcp/socket.h"

namespace railshard::launcher {

struct TcpStoreServerOptions {
  // A connection that has not completed HELLO by then is dropped, so port scanners and
  // half-open connections cannot pile up.
  Duration hello_timeout = std::chrono::seconds(10);
  // Connections that have not completed HELLO, at most; beyond it the oldest is closed. Each
  // costs a descriptor (and at most a HELLO's worth of buffer), so a peer opening connections
  // in a loop cannot run the server out of descriptors and lock the real ranks out.
  size_t max_unauthenticated = 256;
  // Keys plus values held, at most; a SET or ADD that would exceed it is answered with an
  // error (InvalidArgument) and changes nothing. Rendezvous data is small; this only stops a
  // runaway client from exhausting the host's memory.
  size_t max_data_bytes = size_t{1} << 30;
  // Called on the server's thread with the peer's address each time a HELLO carries another
  // token (besides the warning and the closed connection). The launcher of a job over several
  // hosts ends the job on it: a node started with another RAILSHARD_TOKEN can never join, and
  // the ranks waiting for it would otherwise wait out their whole timeout.
  std::function<void(const std::string& peer)> on_wrong_token;
};

// What a server was asked since it started (after HELLO), counted as it answers. A start-up's
// cost at the store is these: at thousands of ranks one server answers them all, so they must
// grow as the ranks do, not as their square (issue #46; docs/scaling.md).
struct StoreStats {
  uint64_t sets = 0;
  uint64_t gets = 0;
  uint64_t adds = 0;
  uint64_t waits = 0;
  uint64_t removes = 0;
  uint64_t keys_waited = 0;  // the keys the WAITs named, together
  uint64_t bytes_in = 0;     // every frame received, HELLOs included
  uint64_t bytes_out = 0;    // every response sent
  uint64_t connections = 0;  // accepted
  // The server thread's CPU time: what answering cost the host serving the store, apart from
  // waiting. Per request it is the store's service time, the figure that bounds how many
  // ranks one server can start (benchmarks/sim takes it as --store-us).
  uint64_t cpu_ns = 0;

  uint64_t requests() const { return sets + gets + adds + waits + removes; }
  // "1,234 requests (512 set, 700 get, 20 add, 2 wait), 1.2 MB in, 3.4 MB out, 256 connections,
  // 0.031 s of CPU (25.1 µs per request)"
  std::string describe() const;
};

// The rendezvous store every rank talks to at start-up (usually hosted by rank 0 or by
// railshard-launch). One background thread multiplexes the listening socket and all client
// connections with epoll; a GET or WAIT that cannot be answered yet is parked with its
// deadline and answered when a SET/ADD makes its key(s) appear, or with TIMEOUT.
//
// Every connection must open with HELLO carrying the job token. Anything else (wrong token,
// malformed or oversized frame, silence before HELLO) closes that connection with a warning
// naming the peer; the server keeps serving everyone else. Protocol: launcher/store_protocol.h.
class TcpStoreServer {
 public:
  // Listens on `addr` (port 0 = any free port) and starts serving.
  TcpStoreServer(const transport::links::tcp::SockAddr& addr, std::string token,
                 TcpStoreServerOptions options = {});
  // Takes ownership of a socket that is already bound (and usually listening), e.g. one a
  // launcher bound before forking the ranks, and starts serving on it.
  static std::unique_ptr<TcpStoreServer> adopt(int listen_fd, std::string token,
                                               TcpStoreServerOptions options = {});

  // Stops the thread, then closes every socket; clients see their connection close.
  ~TcpStoreServer();

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  // The bound address ("0.0.0.0:29500" when listening on every interface).
  const transport::links::tcp::SockAddr& address() const;
  // Safe from any thread while the server runs.
  StoreStats stats() const;

 private:
  TcpStoreServer(transport::links::tcp::Fd listen_fd, std::string token,
                 TcpStoreServerOptions options);

  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace railshard::launcher
