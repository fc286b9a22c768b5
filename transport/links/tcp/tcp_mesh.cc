#include "transport/links/tcp/tcp_mesh.h"

#include <algorithm>

namespace railshard::transport::links::tcp {

namespace {

// Over several connections a message is cut into frames of at most this, so that each link
// is acknowledged (and timed) several times per message and a failed one re-sends little.
constexpr uint64_t kStripedFrameBytes = uint64_t{1} << 20;

}  // namespace

void addLinks(TcpDriver& driver, messaging::Messenger& messenger, int peer,
              std::vector<Connection>& connections, bool data, Duration rejoin_interval) {
  const bool several = connections.size() > 1;
  for (Connection& c : connections) {
    LinkAttributes a;
    a.kind = LinkKind::kTcp;
    a.name = c.name;
    a.local = c.local;
    a.remote = c.remote;
    a.gbps = c.gbps;
    a.latency_us = 50;  // a TCP round trip through two kernels, before anything is measured
    a.delivery = Delivery::kAck;
    a.sees_peer_exit = true;
    // One connection to a peer is the peer: when it ends there is nothing to fail over to, and
    // nothing to make again. One still to be made (connected on first use) is dialled once.
    const bool up = c.fd.valid();
    a.redials = several || !up;
    a.rejoin_interval = several ? rejoin_interval : Duration::zero();
    a.max_payload = several ? kStripedFrameBytes : UINT64_MAX;
    a.trace_name = "send";
    messenger.addLink(
        driver.makeLink(std::move(c.fd), std::move(a), peer, c.channel, c.target, c.local), data,
        up);
  }
}

Duration tickPeriod(const LinkConfig& links) {
  Duration period = std::chrono::milliseconds(100);
  if (links.rail_timeout > Duration::zero()) {
    period = std::min<Duration>(period, links.rail_timeout / 8);
  }
  if (links.heartbeat_timeout > Duration::zero()) {
    period = std::min<Duration>(period, links.heartbeat_timeout / 10);
  }
  return std::max<Duration>(period, std::chrono::milliseconds(5));
}

std::unique_ptr<messaging::Mesh> connectMesh(Store& store, const MeshOptions& options) {
  const ConnectOptions& connect = options.connect;
  auto mesh = std::make_unique<messaging::Mesh>(connect.rank, connect.size, options.formatter);
  mesh->setWaitPlan(options.wait);
  if (connect.size < 2) return mesh;
  bootstrap::RingExchange exchange(store, startupRing(connect));
  Connections connections = connectPeers(exchange, connect);
  TcpDriver::Options driver_options;
  driver_options.rank = connect.rank;
  driver_options.size = connect.size;
  driver_options.token = connect.token;
  driver_options.failure = &mesh->failure();
  auto driver = std::make_unique<TcpDriver>(driver_options, std::move(connections.listeners));
  for (int peer = 0; peer < connect.size; ++peer) {
    auto& theirs = connections.by_peer[static_cast<size_t>(peer)];
    if (peer == connect.rank || theirs.empty()) continue;
    messaging::MessengerOptions messenger_options;
    messenger_options.peer = peer;
    messenger_options.peer_address = connections.address[static_cast<size_t>(peer)];
    messenger_options.links = options.links;
    messenger_options.initiator = connect.rank > peer;  // it opened the connections
    auto messenger = std::make_unique<messaging::Messenger>(mesh->group(), messenger_options);
    addLinks(*driver, *messenger, peer, theirs, true, options.rejoin_interval);
    mesh->addMessenger(std::move(messenger));
  }
  driver->start();
  mesh->addDriver(std::move(driver));
  mesh->start(tickPeriod(options.links));
  return mesh;
}

}  // namespace railshard::transport::links::tcp
