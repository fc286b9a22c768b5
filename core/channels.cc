// The links of every pair of ranks, chosen per pair, under one messenger per peer (channels.h).
#include "core/channels.h"

#include <thread>

#include "base/error.h"
#include "base/logging.h"
#include "core/collective_tag.h"
#include "core/collectives/shm_engine.h"
#include "core/topology/topology.h"
#include "transport/links/ibverbs/ibverbs_factory.h"
#include "transport/links/shm/shm_channel.h"
#include "transport/links/tcp/tcp_mesh.h"
#include "transport/messaging/machine_load.h"

namespace railshard {

namespace {

using transport::links::tcp::RailSpec;

// The rails between this rank's host and every other rank's, from the cluster graph: a TCP
// connection on each, and messages striped over them. Ranks on this host, and rails without IP
// addresses (native InfiniBand), get none.
std::vector<std::vector<RailSpec>> railsToPeers(const Channels::Options& options) {
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

transport::links::ibverbs::FactoryOptions rdmaOptions(const Channels::Options& options) {
  const Config& config = *options.config;
  transport::links::ibverbs::FactoryOptions ib;
  ib.rank = options.rank;
  ib.size = options.size;
  ib.connect_timeout = config.connect_timeout;
  ib.mode = config.transport == TransportKind::kIbverbs ? transport::links::ibverbs::Mode::kForced
                                                        : transport::links::ibverbs::Mode::kAuto;
  ib.rdma = config.rdma;
  return ib;
}

// RAILSHARD_TCP_CONNECT=auto: up to this many ranks, every pair that talks over TCP connects at
// start-up (its errors there, and no first message that waits for a connection); beyond, a
// rank would hold a socket to nearly every rank.
constexpr int kEagerTcpRanks = 64;

}  // namespace

Channels::Channels(const Options& options) : options_(options) {}

Channels::~Channels() {
  // The messengers say goodbye (and the links linger) while the segment is still mapped; the
  // segment's error state stops listening to the group's before either goes.
  if (mesh_ && failure_hook_ != 0) mesh_->failure().removeHook(failure_hook_);
  mesh_.reset();
  engine_.reset();
}

std::unique_ptr<Channels> Channels::connect(Store& store, const Options& options) {
  std::unique_ptr<Channels> channels(new Channels(options));
  channels->mesh_ =
      std::make_unique<transport::messaging::Mesh>(options.rank, options.size, tagFormatter());
  if (options.size > 1) {
    // What every rank tells every other goes round a ring of the ranks (two store requests
    // per rank), not through the store (one request per pair); its sockets close after. The
    // ring's first all-gather waits for the slowest rank, so the host's segment and then the
    // sockets are made with every rank there.
    transport::links::tcp::ConnectOptions tcp = channels->connectOptions();
    // Each step's time at debug level: where a large start-up spends it.
    Clock::time_point mark = Clock::now();
    auto lap = [&mark] {
      const Clock::time_point now = Clock::now();
      const double ms = std::chrono::duration<double, std::milli>(now - mark).count();
      mark = now;
      return ms;
    };
    transport::bootstrap::RingExchange exchange(store, transport::links::tcp::startupRing(tcp));
    const double ring_ms = lap();
    channels->setUpHost(store, exchange);
    const double host_ms = lap();
    // Sockets only to the peers the host's segment does not serve: a one-host job opens none
    // (at 256 ranks that was 255 per rank, 32,640 connections made at start-up).
    tcp.wanted.assign(static_cast<size_t>(options.size), true);
    for (int peer = 0; peer < options.size; ++peer) {
      tcp.wanted[static_cast<size_t>(peer)] = !channels->throughSegment(peer);
    }
    // And of those, at a large job's start-up none: a pair's connection is made when it is
    // first used, so that a rank holds sockets to the peers its collectives and messages use
    // (a ring's two neighbours, log2 partners), not to every rank of every other host (1,016
    // at 128 hosts x 8 ranks, past the usual 1,024 descriptors a process may open).
    if (channels->tcpLazy()) tcp.lazy.assign(static_cast<size_t>(options.size), true);
    transport::links::tcp::Connections sockets = transport::links::tcp::connectPeers(exchange, tcp);
    const double sockets_ms = lap();
    channels->connectLinks(exchange, std::move(sockets));
    RS_LOG_DEBUG(
        "rank {}: channels up: start-up ring {:.1f} ms, host set-up {:.1f} ms, sockets {:.1f} ms, "
        "links {:.1f} ms",
        options.rank, ring_ms, host_ms, sockets_ms, lap());
    channels->joinErrorStates();
  }
  return channels;
}

void Channels::joinErrorStates() {
  // One error state for the whole group: a failure anywhere (a lost peer on another host, a
  // mismatch a messenger found, an abort) aborts the host's segment, so that every rank of the
  // host waiting in a shared-memory step wakes with it at once; one the engine finds fails the
  // group (ShmEngine::fail), which tells the other hosts through the messengers.
  collectives::ShmEngine* engine = engine_.get();
  if (engine == nullptr) return;
  failure_hook_ =
      mesh_->failure().addHook([engine](ErrorKind kind, const std::string& message, int lost,
                                        bool) { engine->abort(kind, message, lost); });
}

transport::links::tcp::ConnectOptions Channels::connectOptions() const {
  const Config& config = *options_.config;
  transport::links::tcp::ConnectOptions tcp;
  tcp.rank = options_.rank;
  tcp.size = options_.size;
  tcp.token = config.token;
  tcp.advertise_host = options_.advertise_host;
  tcp.key_prefix = options_.key_prefix;
  tcp.connect_timeout = config.connect_timeout;
  tcp.peer_rails = railsToPeers(options_);
  tcp.sockets_per_rail = config.links.sockets_per_rail;
  return tcp;
}

bool Channels::tcpLazy() const {
  const LaneConnect mode = options_.config->links.tcp_connect;
  return mode == LaneConnect::kLazy ||
         (mode == LaneConnect::kAuto && options_.size > kEagerTcpRanks);
}

bool Channels::throughSegment(int peer) const {
  // An RDMA lane never joins a pair of one host when a segment exists (RAILSHARD_TRANSPORT=
  // ibverbs, which puts every pair on RDMA, maps none), so the segment is the pair's only link.
  return engine_ != nullptr && options_.config->shm.p2p && peer != options_.rank &&
         layout_->host_of[static_cast<size_t>(peer)] ==
             layout_->host_of[static_cast<size_t>(options_.rank)];
}

void Channels::connectLinks(transport::bootstrap::Exchange& exchange,
                            transport::links::tcp::Connections connections) {
  using transport::messaging::Messenger;
  const Config& config = *options_.config;
  const int rank = options_.rank;
  const int size = options_.size;
  // Waits poll as the host's cores and ranks allow (wait_policy.h).
  transport::messaging::MachineState machine;
  machine.cores = transport::messaging::allowedCores();
  machine.local_ranks =
      static_cast<unsigned>(layout_->localSize(rank) > 0 ? layout_->localSize(rank) : 1);
  mesh_->setWaitPlan(transport::messaging::planWait(
      config.wait.mode, machine, std::chrono::duration_cast<Duration>(config.wait.spin)));

  std::unique_ptr<transport::links::ibverbs::RdmaPlan> rdma;
  if (config.transport == TransportKind::kAuto || config.transport == TransportKind::kIbverbs) {
    auto ib = rdmaOptions(options_);
    ib.spin = mesh_->waiter().plan().poll;
    // Lanes exchange their records over the pair's TCP connection: made on first use, they
    // are too (the choice is the job's, so both ranks of every pair agree).
    if (tcpLazy()) ib.rdma.connect = LaneConnect::kLazy;
    rdma = transport::links::ibverbs::planRdma(exchange, ib, mesh_->failure());
  }

  transport::links::tcp::TcpDriver::Options driver_options;
  driver_options.rank = rank;
  driver_options.size = size;
  driver_options.token = config.token;
  driver_options.failure = &mesh_->failure();
  auto tcp_driver = std::make_unique<transport::links::tcp::TcpDriver>(
      driver_options, std::move(connections.listeners));
  transport::links::shm::ShmSegment* segment = engine_ ? &engine_->segment() : nullptr;
  bool any_rdma = false;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    std::vector<std::unique_ptr<transport::links::Link>> lanes;
    if (rdma) lanes.swap(rdma->lanes[static_cast<size_t>(peer)]);
    // A rank of this host's segment, in a pair that exchanges messages through it.
    const bool same_host = throughSegment(peer);
    if (same_host && !lanes.empty()) {
      throw Error("rank " + std::to_string(rank) + ": RDMA lanes planned to rank " +
                  std::to_string(peer) + ", which shares this host's segment");
    }
    transport::messaging::MessengerOptions messenger;
    messenger.peer = peer;
    messenger.peer_address = connections.address[static_cast<size_t>(peer)];
    messenger.links = config.links;
    messenger.initiator = rank > peer;  // it opened the connections
    if (!lanes.empty()) {
      messenger.rendezvous_bytes = rdma->rendezvous_bytes;
      messenger.write_rendezvous = rdma->write_rendezvous;
    }
    std::unique_ptr<transport::links::Link> channel;
    if (same_host) {
      const int mine = layout_->local_rank_of[static_cast<size_t>(rank)];
      const int theirs = layout_->local_rank_of[static_cast<size_t>(peer)];
      const bool reads = transport::links::shm::ShmChannel::readable(*segment, mine, theirs) &&
                         transport::links::shm::ShmChannel::readable(*segment, theirs, mine);
      channel = std::make_unique<transport::links::shm::ShmChannel>(*segment, mine, theirs, reads);
      // Larger messages are read straight out of the sender's process (one copy), where the
      // pair may; else they go in 64 KiB frames through the entries (two copies).
      if (reads) messenger.rendezvous_bytes = transport::links::shm::kMailPayloadBytes + 1;
    }
    auto m = std::make_unique<Messenger>(mesh_->group(), messenger);
    // Beside RDMA lanes the TCP connections carry control only (heartbeats, reports, aborts,
    // the lanes' records), unless asked to stripe with lanes; a process's end closes them, so
    // a peer that dies is noticed at once. A peer of this host's segment has none: its channel
    // carries control too, and its process is looked at while it is awaited.
    auto& tcp_links = connections.by_peer[static_cast<size_t>(peer)];
    transport::links::tcp::addLinks(
        *tcp_driver, *m, peer, tcp_links,
        channel == nullptr && (lanes.empty() || config.links.stripe_tcp));
    for (auto& lane : lanes) m->addLink(std::move(lane), true, false);
    if (channel) m->addLink(std::move(channel), true, true);
    any_rdma = any_rdma || !lanes.empty();
    mesh_->addMessenger(std::move(m));
  }
  // The host's ranks wake this one through its doorbell: it sleeps there, and whatever
  // completes its requests rings it too.
  if (segment != nullptr) {
    const int local = layout_->local_rank_of[static_cast<size_t>(rank)];
    mesh_->wake().use(segment->control(local).mail_doorbell, segment->header().sleepers);
  }
  // The RDMA driver first: its completion queues must exist before the TCP connections
  // deliver a peer's request to connect a lane (lanes connected on first use).
  if (rdma) rdma->driver->start();
  tcp_driver->start();
  mesh_->addDriver(std::move(tcp_driver));
  if (rdma) mesh_->addDriver(std::move(rdma->driver));
  mesh_->setName(any_rdma ? "ibverbs" : "tcp");
  mesh_->start(transport::links::tcp::tickPeriod(config.links));
  if (!any_rdma || rdma->lazy) return;
  // Lanes connected at start-up: nobody writes before every lane it writes on is ready.
  for (int peer = 0; peer < size; ++peer) {
    if (auto* m = mesh_->messenger(peer)) m->connect();
  }
  const Duration timeout = std::chrono::duration_cast<Duration>(config.connect_timeout);
  const Deadline until = deadlineAfter(timeout);
  for (int peer = 0; peer < size; ++peer) {
    auto* m = mesh_->messenger(peer);
    if (m == nullptr) continue;
    if (!mesh_->waitUntil([m] { return m->connected(); }, until)) {
      throw TimeoutError("rank " + std::to_string(rank) + ": the RDMA lanes to rank " +
                         std::to_string(peer) + " did not connect within " +
                         formatSeconds(std::chrono::duration<double>(timeout).count()));
    }
  }
  RS_LOG_DEBUG("rank {}: RDMA lanes connected", rank);
}

}  // namespace railshard
