#include "transport/links/ibverbs/rdma_driver.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/logging.h"
#include "transport/links/ibverbs/rdma_lane.h"
#include "transport/links/ibverbs/rdma_work.h"

namespace railshard::transport::links::ibverbs {

namespace {

// The progress thread polls this long after its last completion before it sleeps on the
// completion channels: a wake-up through the kernel costs microseconds on hardware, more on a
// VM, and oversubscribed ranks must not spin forever.
constexpr auto kProgressSpin = std::chrono::microseconds(100);
// Bounds one sleep, so that stopping never depends on an event arriving.
constexpr int kSleepMs = 100;

}  // namespace

RdmaDriver::RdmaDriver(const VerbsApi& api, Options options, const std::vector<HcaPort>& ports)
    : api_(api), options_(std::move(options)), cuda_(CudaDriver::get()) {
  try {
    openRails(ports);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw Error("ibverbs: eventfd failed: " + std::string(std::strerror(errno)));
  } catch (...) {
    teardown();
    throw;
  }
}

RdmaDriver::~RdmaDriver() {
  stop();
}

void RdmaDriver::openRails(const std::vector<HcaPort>& ports) {
  int device_count = 0;
  ibv_device** list = api_.get_device_list(&device_count);
  if (list == nullptr) {
    throw Error("ibverbs: ibv_get_device_list failed: " + std::string(std::strerror(errno)));
  }
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
      if (api_.query_device(r.context, &attr) == 0) {
        r.rd_atomic =
            static_cast<uint8_t>(std::min({8, attr.max_qp_rd_atom, attr.max_qp_init_rd_atom}));
        r.software = isSoftwareDevice(attr.vendor_id);
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
}

std::string RdmaDriver::layers() const {
  std::string text;
  for (const auto& rail : rails_) text += rail->port.infiniband ? 'I' : 'E';
  return text;
}

bool RdmaDriver::software() const {
  return std::any_of(rails_.begin(), rails_.end(), [](const auto& r) { return r->software; });
}

std::vector<std::unique_ptr<RdmaLane>> RdmaDriver::makeLanes(int peer,
                                                             const std::string& their_layers) {
  std::vector<std::unique_ptr<RdmaLane>> lanes;
  for (size_t r = 0; r < rails_.size() && r < their_layers.size(); ++r) {
    Rail& rail = *rails_[r];
    if (their_layers[r] != (rail.port.infiniband ? 'I' : 'E')) break;  // index-aligned lanes
    if (lanes_.size() > 0xffffu) {
      throw ConfigError("ibverbs: more than 65536 RDMA lanes (peers x rails) on rank " +
                        std::to_string(options_.rank) + "; set RAILSHARD_IB_HCA to fewer rails");
    }
    LinkAttributes a;
    a.kind = LinkKind::kRdma;
    a.name = rail.port.device + ":" + std::to_string(rail.port.port);
    a.local = a.name;
    a.gbps = rail.port.gbps;
    a.latency_us = rail.software ? 50 : 3;
    a.max_payload = options_.rdma.slot_bytes - sizeof(messaging::FrameHeader);
    a.delivery = Delivery::kCompletion;
    a.one_sided = true;
    a.reads = options_.want_reads && rail.rd_atomic > 0;
    a.device_memory = cuda_ != nullptr;
    a.rejoin_interval = options_.rdma.readmit;
    a.trace_name = "rdma_write";
    auto lane = std::make_unique<RdmaLane>(*this, static_cast<uint32_t>(lanes_.size()), peer,
                                           static_cast<int>(r), std::move(a));
    lanes_.push_back(lane.get());
    ++rail.lanes;
    lanes.push_back(std::move(lane));
  }
  if (lanes.empty()) {
    throw ConfigError("ibverbs: rank " + std::to_string(options_.rank) + " and rank " +
                      std::to_string(peer) +
                      " have no RDMA rail in common (their first ports differ in link layer: "
                      "InfiniBand vs Ethernet); set RAILSHARD_IB_HCA or RAILSHARD_TRANSPORT=tcp");
  }
  return lanes;
}

void RdmaDriver::start() {
  // Every lane of a rail shares its completion queue, sized for all of them.
  for (auto& rail : rails_) {
    if (rail->cq != nullptr) continue;
    const int entries = 16 + rail->lanes * 2 * (options_.rdma.slots + 8 + 16);
    rail->cq = api_.create_cq(rail->context, entries, rail.get(), rail->channel, 0);
    if (rail->cq == nullptr) {
      throw Error("ibverbs: ibv_create_cq(" + std::to_string(entries) + ") on " +
                  rail->port.device + " failed: " + std::strerror(errno));
    }
  }
  progress_ = std::thread([this] { progressLoop(); });
}

size_t RdmaDriver::forgetDeviceMemory(const void* addr, size_t bytes) {
  size_t touched = 0;
  for (auto& rail : rails_) {
    if (rail->device_cache) touched += rail->device_cache->invalidate(addr, bytes);
  }
  return touched;
}

void RdmaDriver::wake() {
  quiet_check_.store(true);
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void RdmaDriver::linger(Deadline until) {
  // A send completes once its writes are acknowledged, before the frames behind it (a
  // rendezvous's ends, credits) have left: a rank that closes right after its last collective
  // would drop them, and its peer would wait for them until its deadline.
  while (Clock::now() < until && progress_.joinable()) {
    bool idle = true;
    for (RdmaLane* lane : lanes_) {
      auto guard = lane->messenger().guard();
      idle = idle && lane->idleLocked();
    }
    if (idle) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void RdmaDriver::stop() {
  if (stopping_.exchange(true)) return;
  wake();
  if (progress_.joinable()) progress_.join();
  for (RdmaLane* lane : lanes_) {
    auto guard = lane->messenger().guard();
    lane->teardownLocked();
  }
  teardown();
}

void RdmaDriver::teardown() {
  for (auto& rail : rails_) {
    rail->device_cache.reset();  // deregisters GPU memory before its protection domain goes
    if (rail->cq != nullptr) api_.destroy_cq(rail->cq);
    if (rail->channel != nullptr) api_.destroy_comp_channel(rail->channel);
    if (rail->pd != nullptr) api_.dealloc_pd(rail->pd);
    if (rail->context != nullptr) api_.close_device(rail->context);
    rail->cq = nullptr;
    rail->channel = nullptr;
    rail->pd = nullptr;
    rail->context = nullptr;
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
}

void RdmaDriver::progressLoop() {
  Clock::time_point last_work = Clock::now();
  while (!stopping_.load()) {
    if (quiet_check_.exchange(false)) reportQuiet();
    if (pollCompletions()) {
      last_work = Clock::now();
      continue;
    }
    if (Clock::now() - last_work < std::min<Duration>(options_.spin, kProgressSpin)) {
      sched_yield();
      continue;
    }
    waitForEvents();
    last_work = Clock::now();
  }
}

void RdmaDriver::reportQuiet() {
  for (RdmaLane* lane : lanes_) {
    auto guard = lane->messenger().guard();
    lane->reportLocked();
  }
}

bool RdmaDriver::pollCompletions() {
  bool any = false;
  ibv_wc completions[32];
  for (auto& rail : rails_) {
    if (rail->cq == nullptr) continue;
    const int n = ibv_poll_cq(rail->cq, 32, completions);
    if (n < 0) {
      options_.failure->fail(
          makeError(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) +
                                              ": ibv_poll_cq on " + rail->port.device + " failed"),
          true);
      return true;
    }
    for (int i = 0; i < n; ++i) {
      any = true;
      const uint32_t index = workLane(completions[i].wr_id) & 0xffffu;
      if (index >= lanes_.size()) {
        options_.failure->fail(
            makeError(ErrorKind::kProtocol,
                      "ibverbs: a completion for unknown lane " + std::to_string(index)),
            true);
        continue;
      }
      RdmaLane& lane = *lanes_[index];
      auto guard = lane.messenger().guard();
      lane.completionLocked(completions[i]);
    }
  }
  return any;
}

void RdmaDriver::waitForEvents() {
  // Arm first, then look once more: a completion that arrived between the last poll and the
  // arming would otherwise raise no event.
  for (auto& rail : rails_) {
    if (rail->cq != nullptr) ibv_req_notify_cq(rail->cq, 0);
  }
  if (pollCompletions()) return;
  std::vector<pollfd> fds;
  fds.push_back(pollfd{wake_fd_, POLLIN, 0});
  for (auto& rail : rails_) {
    fds.push_back(pollfd{rail->channel->fd, POLLIN, 0});
    fds.push_back(pollfd{rail->context->async_fd, POLLIN, 0});
  }
  if (::poll(fds.data(), fds.size(), kSleepMs) <= 0) return;
  if (fds[0].revents != 0) {
    uint64_t value = 0;
    (void)!::read(wake_fd_, &value, sizeof(value));
  }
  for (size_t i = 0; i < rails_.size(); ++i) {
    Rail& rail = *rails_[i];
    if (fds[1 + 2 * i].revents != 0) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      // One event per wake-up: the descriptor stays readable while more are queued.
      if (api_.get_cq_event(rail.channel, &cq, &context) == 0) api_.ack_cq_events(cq, 1);
    }
    if (fds[2 + 2 * i].revents != 0) handleAsyncEvent(rail);
  }
}

void RdmaDriver::handleAsyncEvent(Rail& rail) {
  ibv_async_event event{};
  if (api_.get_async_event(rail.context, &event) != 0) return;
  const ibv_event_type type = event.event_type;
  const std::string name = api_.event_type_str != nullptr ? api_.event_type_str(type)
                                                          : std::to_string(static_cast<int>(type));
  const bool of_qp = type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR ||
                     type == IBV_EVENT_QP_ACCESS_ERR || type == IBV_EVENT_PATH_MIG_ERR;
  const bool of_port =
      type == IBV_EVENT_PORT_ERR || type == IBV_EVENT_DEVICE_FATAL || type == IBV_EVENT_CQ_ERR;
  const uint32_t qp_num = of_qp && event.element.qp != nullptr ? event.element.qp->qp_num : 0;
  // Acknowledged before a lane's lock is taken: ibv_destroy_qp waits until its queue pair's
  // events are acknowledged, and a lane destroys its queue pair (made again after a failure,
  // or closed) under that lock; waiting for the lock with the event held would wait forever.
  // (The emulation fails the destroy instead, and the queue pair was left behind.)
  api_.ack_async_event(&event);
  if (!of_qp && !of_port) {
    RS_LOG_DEBUG("rank {}: ibverbs: {}: asynchronous event {}", options_.rank, rail.port.device,
                 name);
    return;
  }
  for (RdmaLane* lane : lanes_) {
    if (of_port && &this->rail(lane->rail()) != &rail) continue;
    auto guard = lane->messenger().guard();
    lane->asyncFailureLocked(of_qp, qp_num,
                             of_qp ? "asynchronous event " + name + " (the queue pair is in error)"
                                   : "asynchronous event " + name + " on " + rail.port.device);
  }
}

}  // namespace railshard::transport::links::ibverbs
