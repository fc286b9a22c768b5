#include "core/channels.h"

#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "core/collective_tag.h"
#include "core/topology/topology.h"
#include "transport/links/ibverbs/ibverbs_factory.h"
#include "transport/links/tcp/tcp_mesh.h"
#include "transport/messaging/machine_load.h"

namespace railshard {

namespace {

using transport::links::tcp::RailSpec;

// The rails between this rank's host and every other rank's, from the cluster graph: a TCP
// connection on each, and messages striped over them. Ranks on this host, and rails without IP
// addresses (native InfiniBand), get none.
std::vector<std::vector<RailSpec>> railsToPeers(const ChannelOptions& options) {
  std::vector<std::vector<RailSpec>> result(static_cast<size_t>(options.size));
  const topology::Topology* graph = options.topology;
  if (graph == nullptr || graph->worldSize() != options.size) return result;
  const std::string& mine = graph->rank(options.rank).host;
  for (int peer = 0; peer < options.size; ++peer) {
    const std::string& theirs = graph->rank(peer).host;
    if (peer == options.rank || theirs == mine) continue;
    for (const auto& rail : graph->rails(mine, theirs)) {
      if (rail.address_a.empty() || rail.address_b.empty()) continue;
      RailSpec spec;
      spec.name = graph->vertex(rail.nic_a).name;
      spec.local_address = rail.address_a;
      spec.remote_address = rail.address_b;
      spec.gbps = rail.gbps();
      result[static_cast<size_t>(peer)].push_back(spec);
    }
  }
  return result;
}

transport::links::ibverbs::FactoryOptions rdmaOptions(const ChannelOptions& options) {
  const Config& config = *options.config;
  transport::links::ibverbs::FactoryOptions ib;
  ib.rank = options.rank;
  ib.size = options.size;
  ib.key_prefix = options.key_prefix;
  ib.connect_timeout = config.connect_timeout;
  ib.mode = config.transport == TransportKind::kIbverbs ? transport::links::ibverbs::Mode::kForced
                                                        : transport::links::ibverbs::Mode::kAuto;
  ib.hca = config.ib_hca;
  ib.gid_index = config.ib_gid_index;
  ib.ib_timeout = config.ib_timeout;
  ib.ib_retry_cnt = config.ib_retry_cnt;
  ib.slots = config.ib_slots;
  ib.slot_bytes = config.ib_slot_bytes;
  ib.rendezvous_bytes = config.ib_rendezvous;
  ib.rendezvous_auto = config.ib_rendezvous_auto;
  ib.rendezvous_verb = config.ib_rendezvous_verb;
  ib.readmit_interval = std::chrono::duration_cast<Duration>(config.ib_readmit);
  ib.connect = config.ib_connect;
  return ib;
}

}  // namespace

std::unique_ptr<transport::messaging::Mesh> connectChannels(Store& store,
                                                            const ChannelOptions& options) {
  using transport::messaging::Messenger;
  const Config& config = *options.config;
  auto mesh = std::make_unique<transport::messaging::Mesh>(options.rank, options.size,
                                                           tagFormatter());
  transport::messaging::MachineState machine;
  machine.cores = transport::messaging::allowedCores();
  mesh->setWaitPlan(transport::messaging::planWait(
      config.wait, machine, std::chrono::duration_cast<Duration>(config.spin)));
  if (options.size < 2) return mesh;

  transport::links::tcp::ConnectOptions tcp;
  tcp.rank = options.rank;
  tcp.size = options.size;
  tcp.token = config.token;
  tcp.advertise_host = options.advertise_host;
  tcp.key_prefix = options.key_prefix;
  tcp.connect_timeout = config.connect_timeout;
  tcp.peer_rails = railsToPeers(options);
  tcp.sockets_per_rail = config.sockets_per_rail;
  transport::links::tcp::Connections connections = transport::links::tcp::connectPeers(store, tcp);

  std::unique_ptr<transport::links::ibverbs::RdmaPlan> rdma;
  if (config.transport == TransportKind::kAuto || config.transport == TransportKind::kIbverbs) {
    rdma = transport::links::ibverbs::planRdma(store, rdmaOptions(options), mesh->failure());
  }

  transport::links::tcp::TcpDriver::Options driver_options;
  driver_options.rank = options.rank;
  driver_options.size = options.size;
  driver_options.token = config.token;
  driver_options.failure = &mesh->failure();
  auto tcp_driver = std::make_unique<transport::links::tcp::TcpDriver>(
      driver_options, std::move(connections.listeners));
  const Duration rail_timeout = std::chrono::duration_cast<Duration>(config.rail_timeout);
  const Duration heartbeat = std::chrono::duration_cast<Duration>(config.heartbeat_timeout);
  bool any_rdma = false;
  for (int peer = 0; peer < options.size; ++peer) {
    if (peer == options.rank) continue;
    auto& tcp_links = connections.by_peer[static_cast<size_t>(peer)];
    std::vector<std::unique_ptr<transport::links::Link>> lanes;
    if (rdma) lanes.swap(rdma->lanes[static_cast<size_t>(peer)]);
    transport::messaging::MessengerOptions messenger;
    messenger.peer = peer;
    messenger.peer_address = connections.address[static_cast<size_t>(peer)];
    messenger.weights = config.rail_weights;
    messenger.rail_timeout = rail_timeout;
    messenger.heartbeat_timeout = heartbeat;
    messenger.initiator = options.rank > peer;  // it opened the connections
    if (!lanes.empty()) {
      messenger.rendezvous_bytes = rdma->rendezvous_bytes;
      messenger.write_rendezvous = rdma->write_rendezvous;
    }
    auto m = std::make_unique<Messenger>(mesh->group(), messenger);
    // Beside RDMA lanes the TCP connections carry control only (heartbeats, reports, aborts,
    // the lanes' records), unless asked to stripe with them; a process's end closes them, so
    // a peer that dies is noticed at once rather than after the lanes' retry budget.
    transport::links::tcp::addLinks(*tcp_driver, *m, peer, tcp_links,
                                    lanes.empty() || config.stripe_tcp);
    for (auto& lane : lanes) m->addLink(std::move(lane), true, false);
    any_rdma = any_rdma || !lanes.empty();
    mesh->addMessenger(std::move(m));
  }
  tcp_driver->start();
  mesh->addDriver(std::move(tcp_driver));
  if (rdma) {
    rdma->driver->start();
    mesh->addDriver(std::move(rdma->driver));
  }
  mesh->setName(any_rdma ? "ibverbs" : "tcp");
  mesh->start(transport::links::tcp::tickPeriod(rail_timeout, heartbeat));
  if (any_rdma && !rdma->lazy) {
    // Lanes connected at start-up: nobody writes before every lane it writes on is ready.
    for (int peer = 0; peer < options.size; ++peer) {
      if (auto* m = mesh->messenger(peer)) m->connect();
    }
    const Deadline until = deadlineAfter(std::chrono::duration_cast<Duration>(config.connect_timeout));
    for (int peer = 0; peer < options.size; ++peer) {
      auto* m = mesh->messenger(peer);
      if (m == nullptr) continue;
      while (!m->connected()) {
        mesh->failure().check();
        if (Clock::now() >= until) {
          throw TimeoutError("rank " + std::to_string(options.rank) +
                             ": the RDMA lanes to rank " + std::to_string(peer) +
                             " did not connect within " +
                             formatSeconds(std::chrono::duration<double>(config.connect_timeout)
                                               .count()));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    RS_LOG_DEBUG("rank {}: RDMA lanes connected", options.rank);
  }
  return mesh;
}

}  // namespace railshard
