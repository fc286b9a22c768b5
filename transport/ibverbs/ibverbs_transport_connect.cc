// Setting up and tearing down the RDMA transport: rails (one device context, protection
// domain, completion queue and channel per HCA port), lanes (one RC queue pair per peer per
// rail with its two rings), and the connection exchange through the store.

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "base/error.h"
#include "base/logging.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

namespace {

std::string errnoText(int err) {
  return std::string(std::strerror(err));
}

RegisteredBuffer allocateRegistered(const VerbsApi& api, ibv_pd* pd, size_t bytes, int access,
                                    const std::string& what) {
  RegisteredBuffer buffer;
  void* memory = nullptr;
  if (::posix_memalign(&memory, 4096, bytes) != 0) {
    throw Error("ibverbs: cannot allocate " + std::to_string(bytes) + " bytes for " + what);
  }
  std::memset(memory, 0, bytes);
  buffer.data = static_cast<uint8_t*>(memory);
  buffer.bytes = bytes;
  buffer.mr = api.reg_mr(pd, memory, bytes, access);
  if (buffer.mr == nullptr) {
    const int err = errno;
    std::free(memory);
    throw Error("ibverbs: ibv_reg_mr of " + std::to_string(bytes) + " bytes for " + what +
                " failed: " + errnoText(err) +
                (err == ENOMEM ? " (raise the locked-memory limit: ulimit -l unlimited)" : ""));
  }
  return buffer;
}

void freeRegistered(const VerbsApi& api, RegisteredBuffer& buffer) {
  if (buffer.mr != nullptr) api.dereg_mr(buffer.mr);
  std::free(buffer.data);
  buffer = RegisteredBuffer{};
}

}  // namespace

IbverbsTransport::IbverbsTransport(Store& store, const VerbsApi& api, const FactoryOptions& options,
                                   std::vector<HcaPort> ports, std::vector<bool> rdma_peers,
                                   std::unique_ptr<Transport> control)
    : api_(api),
      cuda_(CudaDriver::get()),
      options_(options),
      store_(&store),
      control_(std::move(control)) {
  timing_.timeout = static_cast<uint8_t>(options.ib_timeout);
  timing_.retry_cnt = static_cast<uint8_t>(options.ib_retry_cnt);
  peers_.resize(static_cast<size_t>(options.size));
  for (int r = 0; r < options.size; ++r) {
    if (r == options.rank || !rdma_peers[static_cast<size_t>(r)]) continue;
    peers_[static_cast<size_t>(r)] = std::make_unique<Peer>();
    peers_[static_cast<size_t>(r)]->rank = r;
    peers_[static_cast<size_t>(r)]->book = messaging::MessageBook(
        options.rank, r, &options_.formatter, messaging::MessageBook::Pieces::kWhole);
  }
  const auto rdma_peers_count = std::count(rdma_peers.begin(), rdma_peers.end(), true) -
                                (rdma_peers[static_cast<size_t>(options.rank)] ? 1 : 0);
  lazy_ = options.connect == LaneConnect::kLazy ||
          (options.connect == LaneConnect::kAuto && rdma_peers_count > kEagerPeers);
  control_->setFailureListener(
      [this](ErrorKind kind, const std::string& message) { onControlFailure(kind, message); });
  if (options.stripe_tcp) {
    // Before the lanes are exchanged: no peer sends a piece before that exchange is over.
    tcp_link_ = dynamic_cast<messaging::PieceLink*>(control_.get());
    if (tcp_link_ != nullptr) tcp_link_->setPieceSink(this);
  }
  try {
    openRails(ports);
    connectLanes(store);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw Error("ibverbs: eventfd failed: " + errnoText(errno));
    progress_ = std::thread([this] { progressLoop(); });
    if (options_.readmit_interval > Duration::zero() || lazy_) {
      readmitter_ = std::thread([this] { readmitLoop(); });
    }
  } catch (...) {
    if (tcp_link_ != nullptr) tcp_link_->setPieceSink(nullptr);
    teardown();
    control_->setFailureListener(nullptr);
    throw;
  }
}

// A send completes once its writes are acknowledged, before its kWritten ends have left (they
// wait for room on the lanes that carried the writes). A rank that closes right after its last
// collective would drop them, and its peer would wait for them until its deadline (seen under
// ASan after a failover put every piece on one lane). So closing first gives the queued ends
// and notices a bounded time to go out and complete. The progress thread posts them as
// completions free room (this thread only looks: posting here could fail and report to a
// communicator that is being destroyed).
void IbverbsTransport::drainEnds() {
  constexpr auto kMostDrain = std::chrono::seconds(2);
  const Clock::time_point until = Clock::now() + kMostDrain;
  while (Clock::now() < until && !poisoned_.load()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      bool drained = true;
      for (const auto& peer : peers_) {
        if (peer == nullptr) continue;
        drained = drained && peer->ends.empty() && peer->lanes_down.empty();
        for (const Lane* lane : peer->lanes) {
          drained = drained && (lane->failed || lane->send_outstanding == 0);
        }
      }
      if (drained) return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

IbverbsTransport::~IbverbsTransport() {
  if (progress_.joinable()) drainEnds();
  stopping_.store(true);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  { std::lock_guard<std::mutex> lock(readmit_mutex_); }
  readmit_wake_.notify_all();
  if (readmitter_.joinable()) readmitter_.join();
  if (progress_.joinable()) progress_.join();
  // Returns once the TCP reader is out of pieceArriving/pieceLanded for good.
  if (tcp_link_ != nullptr) tcp_link_->setPieceSink(nullptr);
  control_->setFailureListener(nullptr);
  teardown();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void IbverbsTransport::openRails(const std::vector<HcaPort>& ports) {
  // The rails are this rank's usable ports, in discovery order; lane r to a peer joins our
  // port r to its port r (rail-optimised fabrics pair HCAs by index).
  int device_count = 0;
  ibv_device** list = api_.get_device_list(&device_count);
  if (list == nullptr) throw Error("ibverbs: ibv_get_device_list failed: " + errnoText(errno));
  bool software = false;  // a rail is a software device (rxe, siw)
  try {
    for (const auto& port : ports) {
      auto rail = std::make_unique<Rail>();
      rail->port = port;
      for (int i = 0; i < device_count; ++i) {
        if (port.device == api_.get_device_name(list[i])) {
          rail->context = api_.open_device(list[i]);
          break;
        }
      }
      const std::string where = port.device + ":" + std::to_string(port.port);
      if (rail->context == nullptr) throw Error("ibverbs: cannot open " + where);
      rails_.push_back(std::move(rail));
      Rail& r = *rails_.back();
      r.pd = api_.alloc_pd(r.context);
      if (r.pd == nullptr) throw Error("ibverbs: ibv_alloc_pd on " + where + " failed");
      ibv_device_attr attr{};
      if (options_.rendezvous_bytes > 0 && api_.query_device(r.context, &attr) == 0) {
        r.rd_atomic = static_cast<uint8_t>(
            std::min({kMaxReadDepth, attr.max_qp_rd_atom, attr.max_qp_init_rd_atom}));
        if (isSoftwareDevice(attr.vendor_id)) software = true;
      }
      r.channel = api_.create_comp_channel(r.context);
      if (r.channel == nullptr) {
        throw Error("ibverbs: ibv_create_comp_channel on " + where + " failed");
      }
      // The progress thread waits on these in poll(): never block in a read.
      ::fcntl(r.channel->fd, F_SETFL, ::fcntl(r.channel->fd, F_GETFL) | O_NONBLOCK);
      ::fcntl(r.context->async_fd, F_SETFL, ::fcntl(r.context->async_fd, F_GETFL) | O_NONBLOCK);
    }
  } catch (...) {
    api_.free_device_list(list);
    throw;
  }
  api_.free_device_list(list);
  // Measured in the Soft-RoCE guest (docs/rdma.md): rxe's RDMA READ is its slow verb, so a
  // rendezvous there writes; on an HCA a read saves the grant's trip.
  const RendezvousVerb verb = options_.rendezvous_verb;
  write_rendezvous_ = verb == RendezvousVerb::kWrite || (verb == RendezvousVerb::kAuto && software);
  rendezvous_bytes_ = options_.rendezvous_bytes;
  if (options_.rendezvous_auto && software) {
    rendezvous_bytes_ = 0;
    RS_LOG_DEBUG(
        "rank {}: ibverbs: a rail is a software device: large messages staged "
        "(RAILSHARD_IB_RENDEZVOUS=<size> moves them in place anyway)",
        options_.rank);
  }
}

void IbverbsTransport::connectLanes(Store& store) {
  const Duration timeout = options_.connect_timeout;
  // How many rails each RDMA peer has, and of which link layer: lane r exists when both have
  // a port r of the same link layer.
  std::string mine;
  for (const auto& rail : rails_) mine += rail->port.infiniband ? 'I' : 'E';
  store.setString(options_.key_prefix + "/ib/rails/" + std::to_string(options_.rank), mine,
                  timeout);
  const size_t slot_bytes = options_.slot_bytes;
  const auto slots = static_cast<uint32_t>(options_.slots);
  std::mt19937 random(std::random_device{}());
  for (auto& peer_ptr : peers_) {
    if (!peer_ptr) continue;
    Peer& peer = *peer_ptr;
    const std::string theirs =
        store.getString(options_.key_prefix + "/ib/rails/" + std::to_string(peer.rank), timeout);
    std::vector<std::string> names;
    std::vector<double> speeds;
    for (size_t r = 0; r < rails_.size() && r < theirs.size(); ++r) {
      const char layer = rails_[r]->port.infiniband ? 'I' : 'E';
      if (theirs[r] != layer) break;  // keep lanes index-aligned on both sides
      auto lane = std::make_unique<Lane>();
      if (lanes_.size() > 0xffffu) {
        throw ConfigError("ibverbs: more than 65536 RDMA lanes (peers x rails) on rank " +
                          std::to_string(options_.rank) + "; set RAILSHARD_IB_HCA to fewer rails");
      }
      lane->index = static_cast<uint32_t>(lanes_.size());
      lane->peer = peer.rank;
      lane->rail = static_cast<int>(r);
      Rail& rail = *rails_[r];
      lane->local.rank = static_cast<uint32_t>(options_.rank);
      lane->local.rail = static_cast<uint16_t>(r);
      lane->local.port = static_cast<uint8_t>(rail.port.port);
      lane->local.mtu = static_cast<uint8_t>(rail.port.active_mtu);
      lane->local.link_layer =
          rail.port.infiniband ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
      lane->local.gid_index = static_cast<uint8_t>(rail.port.gid_index);
      lane->local.lid = rail.port.lid;
      lane->local.rd_atomic = rail.rd_atomic;
      lane->local.gid = rail.port.gid;
      lane->local.psn = random() & 0xffffffu;
      if (lazy_) {
        lane->failed = true;  // out of rotation until first use connects it (its rings too)
      } else {
        allocateReceiveRing(*lane);
      }
      names.push_back(rail.port.device + ":" + std::to_string(rail.port.port));
      speeds.push_back(rail.port.gbps);
      peer.lanes.push_back(lane.get());
      lanes_.push_back(std::move(lane));
    }
    if (peer.lanes.empty()) {
      throw ConfigError("ibverbs: rank " + std::to_string(options_.rank) + " and rank " +
                        std::to_string(peer.rank) +
                        " have no RDMA rail in common (their first ports differ in link layer: " +
                        "InfiniBand vs Ethernet); set RAILSHARD_IB_HCA or RAILSHARD_TRANSPORT=tcp");
    }
    if (tcp_link_ != nullptr) {
      // One more rail: the TCP connections to the peer, at their nominal rate (0, unknown,
      // starts at the lanes' mean), then measured.
      peer.tcp_rail = static_cast<int>(names.size());
      names.push_back("tcp");
      speeds.push_back(tcp_link_->pieceGbps(peer.rank));
    }
    rails::SchedulerOptions scheduler_options;
    peer.scheduler.emplace(names,
                           options_.rail_weights == RailWeights::kEqual
                               ? std::vector<double>(speeds.size(), 1.0)
                               : speeds,
                           scheduler_options);
    if (lazy_) {
      peer.connected = false;
      for (const Lane* lane : peer.lanes) {
        peer.scheduler->markDown(lane->rail, "not connected yet (RAILSHARD_IB_CONNECT=lazy)");
      }
    }
  }
  if (lazy_) {
    RS_LOG_DEBUG("rank {}: ibverbs: {} lanes on {} rails, each connected on first use",
                 options_.rank, lanes_.size(), rails_.size());
    return;
  }
  // Queue pairs to INIT with receives posted before anyone can learn their numbers: a write
  // with immediate that finds no receive posted is an RNR error.
  for (auto& lane : lanes_) {
    createQueuePair(*lane);
    store.setString(laneKey("lane", options_.rank, lane->peer, lane->rail),
                    toHex(lane->local.encode()), timeout);
  }
  for (auto& lane : lanes_) {
    const auto bytes =
        fromHex(store.getString(laneKey("lane", lane->peer, options_.rank, lane->rail), timeout));
    lane->remote = LaneInfo::decode(bytes);
    if (lane->remote.rank != static_cast<uint32_t>(lane->peer) ||
        lane->remote.rail != static_cast<uint16_t>(lane->rail)) {
      throw ProtocolError("ibverbs: the connection record for rank " + std::to_string(lane->peer) +
                          " rail " + std::to_string(lane->rail) + " names rank " +
                          std::to_string(lane->remote.rank) + " rail " +
                          std::to_string(lane->remote.rail));
    }
    prepareSendSide(*lane);
    moveToRts(*lane);
    lane->ever_up = true;
  }
  // Nobody writes before every queue pair it writes to is ready to receive.
  store.setString(options_.key_prefix + "/ib/ready/" + std::to_string(options_.rank), "1", timeout);
  std::vector<std::string> ready;
  for (const auto& peer : peers_) {
    if (peer) ready.push_back(options_.key_prefix + "/ib/ready/" + std::to_string(peer->rank));
  }
  if (!ready.empty()) store.wait(ready, timeout);
  RS_LOG_DEBUG("rank {}: ibverbs: {} lanes on {} rails, {} slots of {} bytes each way",
               options_.rank, lanes_.size(), rails_.size(), slots, slot_bytes);
}

void IbverbsTransport::allocateReceiveRing(Lane& lane) {
  const auto slots = static_cast<uint32_t>(options_.slots);
  Rail& rail = *rails_[static_cast<size_t>(lane.rail)];
  lane.recv_ring =
      allocateRegistered(api_, rail.pd, slots * options_.slot_bytes,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "a receive ring");
  lane.recv.emplace(slots);
  lane.local.ring_addr = reinterpret_cast<uint64_t>(lane.recv_ring.data);
  lane.local.ring_rkey = lane.recv_ring.mr->rkey;
  lane.local.slots = slots;
  lane.local.slot_bytes = static_cast<uint32_t>(options_.slot_bytes);
}

void IbverbsTransport::prepareSendSide(Lane& lane) {
  if (lane.send_ring.data == nullptr) {
    Rail& rail = *rails_[static_cast<size_t>(lane.rail)];
    lane.send_ring =
        allocateRegistered(api_, rail.pd, size_t{lane.remote.slots} * lane.remote.slot_bytes,
                           IBV_ACCESS_LOCAL_WRITE, "a send staging ring");
    lane.in_flight.assign(lane.remote.slots, {});
  }
  lane.send.emplace(lane.remote.slots);
  lane.reads.assign(static_cast<size_t>(readDepth(lane.local, lane.remote)), {});
  lane.writes.assign(kMaxWriteDepth, {});
}

void IbverbsTransport::createQueuePair(Lane& lane) {
  Rail& rail = *rails_[static_cast<size_t>(lane.rail)];
  // Every lane of a rail shares its completion queue; it is sized for all of them (created
  // lazily here, when the number of lanes is known).
  if (rail.cq == nullptr) {
    int entries = 16;
    for (const auto& other : lanes_) {
      if (other->rail == lane.rail) entries += 2 * (options_.slots + 8);
    }
    rail.cq = api_.create_cq(rail.context, entries, &rail, rail.channel, 0);
    if (rail.cq == nullptr) {
      throw Error("ibverbs: ibv_create_cq(" + std::to_string(entries) + ") on " + rail.port.device +
                  " failed: " + errnoText(errno));
    }
  }
  ibv_qp_init_attr init{};
  init.send_cq = rail.cq;
  init.recv_cq = rail.cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 1;  // every completion frees a staging slot or a send-queue entry
  // Data writes are bounded by the peer's ring, credit writes by two in flight (each returns at
  // least half the ring); receives by our ring plus the peer's credit writes.
  lane.send_depth = options_.slots + 8;
  init.cap.max_send_wr = static_cast<uint32_t>(lane.send_depth);
  init.cap.max_recv_wr = static_cast<uint32_t>(options_.slots + 8);
  init.cap.max_send_sge = 2;  // header from the staging slot + payload from GPU memory
  init.cap.max_recv_sge = 1;
  lane.qp = api_.create_qp(rail.pd, &init);
  if (lane.qp == nullptr) {
    throw Error("ibverbs: ibv_create_qp on " + laneName(lane) + " failed: " + errnoText(errno));
  }
  lane.local.qpn = lane.qp->qp_num;
  QpTransition t = initTransition(static_cast<uint8_t>(rail.port.port));
  if (const int rc = api_.modify_qp(lane.qp, &t.attr, t.mask); rc != 0) {
    throw Error("ibverbs: " + laneName(lane) + ": RESET->INIT failed: " + errnoText(rc));
  }
  postReceives(lane, options_.slots + 8);
}

void IbverbsTransport::moveToRts(Lane& lane) {
  QpTransition rtr = rtrTransition(lane.local, lane.remote, timing_);
  if (const int rc = api_.modify_qp(lane.qp, &rtr.attr, rtr.mask); rc != 0) {
    throw Error("ibverbs: " + laneName(lane) + ": INIT->RTR failed: " + errnoText(rc) +
                " (remote qpn " + std::to_string(lane.remote.qpn) + ", lid " +
                std::to_string(lane.remote.lid) + ", mtu " +
                std::to_string(static_cast<int>(rtr.attr.path_mtu)) + ")");
  }
  QpTransition rts = rtsTransition(lane.local, lane.remote, timing_);
  if (const int rc = api_.modify_qp(lane.qp, &rts.attr, rts.mask); rc != 0) {
    throw Error("ibverbs: " + laneName(lane) + ": RTR->RTS failed: " + errnoText(rc));
  }
}

void IbverbsTransport::postReceives(Lane& lane, int count) {
  // A write with immediate consumes one receive and scatters nothing: no buffers needed.
  for (int i = 0; i < count; ++i) {
    ibv_recv_wr wr{};
    wr.wr_id = makeWorkId(lane.id(), WorkKind::kRecv, 0);
    wr.num_sge = 0;
    if (const int rc = postRecv(lane, wr); rc != 0) {
      throw Error("ibverbs: ibv_post_recv on " + laneName(lane) + " failed: " + errnoText(rc));
    }
  }
}

void IbverbsTransport::teardown() {
  for (auto& lane : lanes_) {
    if (lane->qp != nullptr) api_.destroy_qp(lane->qp);
    lane->qp = nullptr;
  }
  // User memory registered for rendezvous messages still pending (a failure, or a transport
  // closed with requests outstanding): before the protection domains go.
  dropRendezvousLocked();
  for (auto& lane : lanes_) {
    freeRegistered(api_, lane->recv_ring);
    freeRegistered(api_, lane->send_ring);
  }
  for (auto& rail : rails_) {
    rail->device_cache.reset();  // deregisters GPU memory before its protection domain goes
    if (rail->cq != nullptr) {
      api_.destroy_cq(rail->cq);
    }
    if (rail->channel != nullptr) api_.destroy_comp_channel(rail->channel);
    if (rail->pd != nullptr) api_.dealloc_pd(rail->pd);
    if (rail->context != nullptr) api_.close_device(rail->context);
    rail->cq = nullptr;
    rail->channel = nullptr;
    rail->pd = nullptr;
    rail->context = nullptr;
  }
}

std::string IbverbsTransport::laneKey(const std::string& what, int from, int to, int rail) const {
  return options_.key_prefix + "/ib/" + what + "/" + std::to_string(from) + "/" +
         std::to_string(to) + "/" + std::to_string(rail);
}

std::string IbverbsTransport::laneName(const Lane& lane) const {
  const Rail& rail = *rails_[static_cast<size_t>(lane.rail)];
  return "RDMA rail " + rail.port.device + ":" + std::to_string(rail.port.port) + " to rank " +
         std::to_string(lane.peer);
}

}  // namespace railshard::transport::ibverbs
