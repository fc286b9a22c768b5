// The RDMA transport's progress thread (completions, async events) and how failures and
// waits work (ibverbs_transport.h).

#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"
#include "transport/ibverbs/ibverbs_transport_internal.h"

namespace railshard::transport::ibverbs {

namespace {

// The progress thread polls this long after its last completion before it sleeps on the
// completion channels: a wake-up through the kernel costs microseconds on hardware, more on a
// VM, and oversubscribed ranks must not spin forever.
constexpr auto kProgressSpin = std::chrono::microseconds(100);
// Bounds one sleep, so that stopping never depends on an event arriving.
constexpr int kSleepMs = 100;

}  // namespace

void IbverbsTransport::progressLoop() {
  Clock::time_point last_work = Clock::now();
  while (!stopping_.load()) {
    if (pollCompletions()) {
      last_work = Clock::now();
      raisePendingFailure();
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

bool IbverbsTransport::pollCompletions() {
  bool any = false;
  ibv_wc completions[32];
  for (auto& rail : rails_) {
    if (rail->cq == nullptr) continue;
    const int n = ibv_poll_cq(rail->cq, 32, completions);
    if (n < 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) +
                                           ": ibv_poll_cq on " + rail->port.device + " failed");
      return true;
    }
    if (n == 0) continue;
    any = true;
    std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < n; ++i) handleCompletionLocked(completions[i]);
  }
  return any;
}

void IbverbsTransport::handleCompletionLocked(const ibv_wc& wc) {
  const uint32_t index = workLane(wc.wr_id) & 0xffffu;
  if (index >= lanes_.size()) {
    failLocked(ErrorKind::kProtocol,
               "ibverbs: a completion for unknown lane " + std::to_string(index));
    return;
  }
  Lane& lane = *lanes_[index];
  // A queue pair made again (re-admission) only once the old one's work had all completed: a
  // completion of another generation cannot occur; dropped should a provider produce one.
  if ((workLane(wc.wr_id) >> 16) != lane.generation) return;
  --lane.posted;
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  const WorkKind kind = workKind(wc.wr_id);
  if (kind == WorkKind::kProbe) {
    onProbedLocked(lane, wc.status == IBV_WC_SUCCESS);
    return;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    if (lane.failed || poisoned_.load()) return;  // the flushes after the first error
    lane.failed = true;
    const char* what = kind == WorkKind::kRecv    ? "a receive"
                       : kind == WorkKind::kData  ? "an RDMA write"
                       : kind == WorkKind::kRead  ? "an RDMA read"
                       : kind == WorkKind::kWrite ? "a rendezvous write"
                       : kind == WorkKind::kFin   ? "a rendezvous end"
                                                  : "a credit write";
    std::string hint;
    if (wc.status == IBV_WC_RETRY_EXC_ERR) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%.1f", retryExhaustedSeconds(timing_));
      hint = " (no acknowledgement within the retry budget, about " + std::string(seconds) +
             " s from RAILSHARD_IB_TIMEOUT and RAILSHARD_IB_RETRY_CNT: the peer died or the "
             "link is down)";
    } else if (wc.status == IBV_WC_RNR_RETRY_EXC_ERR) {
      hint = " (the peer had no receive posted)";
    } else if (wc.status == IBV_WC_WR_FLUSH_ERR) {
      hint = " (the queue pair went into the error state)";
    }
    std::ostringstream vendor;
    vendor << std::hex << wc.vendor_err;
    laneFailedLocked(lane, laneName(lane) + ": " + what + " completed with " +
                               api_.statusText(wc.status) + ", vendor error 0x" + vendor.str() +
                               hint);
    return;
  }
  try {
    switch (kind) {
      case WorkKind::kData: {
        const uint32_t slot = workValue(wc.wr_id);
        lane.send->completed(slot);
        --lane.send_outstanding;
        Lane::InFlight done = std::move(lane.in_flight[slot]);
        lane.in_flight[slot] = Lane::InFlight{};
        const Clock::time_point now = Clock::now();
        // Service time: pieces queue behind each other, so a piece's time starts when the one
        // before it on this lane finished, if that was after it was posted.
        const Clock::time_point start = std::max(done.posted, lane.last_completion);
        lane.last_completion = now;
        // A rendezvous offer or a grant carries no payload: not a piece of a message, nor a
        // sample.
        const bool payload = done.op && !done.op->rendezvous && !done.op->grant;
        if (payload && done.trace_ns != 0 && trace::enabled())
          traceRailLocked(lane, done.bytes, done.trace_ns);
        if (payload && done.bytes > 0 && now > start &&
            options_.rail_weights == RailWeights::kAdaptive) {
          peer.scheduler->record(lane.rail, done.bytes,
                                 std::chrono::duration<double>(now - start).count());
        }
        if (done.op) {
          --done.op->outstanding;
          maybeSendDoneLocked(done.op);
        }
        postWhatFitsLocked(peer, lane);
        break;
      }
      case WorkKind::kCredit:
      case WorkKind::kNotice:
        --lane.send_outstanding;
        postWhatFitsLocked(peer, lane);
        break;
      case WorkKind::kRead:
      case WorkKind::kWrite:
        // A read or rendezvous write that finished on a lane already failed was handed to
        // another lane (and done again there). Pieces that landed are still taken (kRecv):
        // their writer saw them acknowledged and will not send them again.
        if (lane.failed) break;
        onOneSidedDoneLocked(lane, workValue(wc.wr_id), kind == WorkKind::kWrite);
        postWhatFitsLocked(peer, lane);
        break;
      case WorkKind::kFin:
        --lane.send_outstanding;
        if (!lane.ends.empty()) lane.ends.pop_front();  // completions come in posting order
        postWhatFitsLocked(peer, lane);
        break;
      case WorkKind::kRecv: {
        postReceives(lane, 1);
        if (lane.failed && (lane.readmit == Lane::Readmit::kConnected ||
                            lane.readmit == Lane::Readmit::kProbing)) {
          laneUpLocked(lane);
        }
        if ((wc.wc_flags & IBV_WC_WITH_IMM) == 0) {
          throw ProtocolError("a write without immediate data");
        }
        const Immediate imm = decodeImmediate(ntohl(wc.imm_data));
        if (imm.kind == ImmKind::kCredit) {
          lane.send->grant(imm.value);
          pumpLocked(peer);
        } else if (imm.kind == ImmKind::kFin) {
          onFinLocked(peer, imm.value);
        } else if (imm.kind == ImmKind::kWritten) {
          onWrittenLocked(peer, imm.value);
        } else if (imm.kind == ImmKind::kLaneDown) {
          // The peer's side of another lane failed: its queue pair no longer answers, and
          // this side may have nothing in flight there to find out (waiting for credits).
          const uint32_t rail = laneDownRail(imm.value);
          if (rail >= peer.lanes.size()) throw ProtocolError("a lane-down notice for no lane");
          Lane& down = *peer.lanes[rail];
          // Of the queue pair now there: a notice that arrives after both sides had made the
          // lane again (re-admission) is about the one before, and ignored.
          if (!down.failed && laneDownGeneration(imm.value) == down.generation) {
            down.failed = true;
            laneFailedLocked(down, laneName(down) + ": rank " + std::to_string(peer.rank) +
                                       "'s side failed (it said so on " + laneName(lane) + ")");
          }
        } else {
          onPieceLocked(lane, imm.value, wc.byte_len);
        }
        break;
      }
      default:
        throw ProtocolError("a completion of unknown kind");
    }
  } catch (const ProtocolError& e) {
    failLocked(ErrorKind::kProtocol,
               "rank " + std::to_string(options_.rank) + ": " + laneName(lane) + ": " + e.what());
  } catch (const Error& e) {
    failLocked(ErrorKind::kPeerLost, "rank " + std::to_string(options_.rank) + ": " + e.what());
  }
}

void IbverbsTransport::postWhatFitsLocked(Peer& peer, Lane& lane) {
  pumpLocked(peer);
  returnCreditsLocked(lane, false);
  pumpOneSidedLocked(peer, false);
  pumpOneSidedLocked(peer, true);
  pumpEndsLocked(peer);
}

void IbverbsTransport::waitForEvents() {
  // Arm first, then look once more: a completion that arrived between the last poll and the
  // arming would otherwise raise no event.
  for (auto& rail : rails_) {
    if (rail->cq != nullptr) ibv_req_notify_cq(rail->cq, 0);
  }
  if (pollCompletions()) {
    raisePendingFailure();
    return;
  }
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

void IbverbsTransport::handleAsyncEvent(Rail& rail) {
  ibv_async_event event{};
  if (api_.get_async_event(rail.context, &event) == 0) {
    const std::string name = api_.event_type_str != nullptr
                                 ? api_.event_type_str(event.event_type)
                                 : std::to_string(static_cast<int>(event.event_type));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      switch (event.event_type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_PATH_MIG_ERR:
          for (auto& lane : lanes_) {
            if (lane->qp != event.element.qp || lane->failed || poisoned_.load()) continue;
            laneFailedLocked(*lane, laneName(*lane) + ": asynchronous event " + name +
                                        " (the queue pair is in error)");
          }
          break;
        case IBV_EVENT_PORT_ERR:
        case IBV_EVENT_DEVICE_FATAL:
        case IBV_EVENT_CQ_ERR:
          for (auto& lane : lanes_) {
            if (rails_[static_cast<size_t>(lane->rail)].get() != &rail || lane->failed ||
                poisoned_.load()) {
              continue;
            }
            laneFailedLocked(*lane, laneName(*lane) + ": asynchronous event " + name + " on " +
                                        rail.port.device);
          }
          break;
        default:
          RS_LOG_DEBUG("rank {}: ibverbs: {}: asynchronous event {}", options_.rank,
                       rail.port.device, name);
          break;
      }
    }
    api_.ack_async_event(&event);
  }
  raisePendingFailure();
}

void IbverbsTransport::failLocked(ErrorKind kind, const std::string& message) {
  // From here on no user buffer is touched, by this CPU or (registrations dropped) by an HCA;
  // the control transport is poisoned (and the peers told) outside the lock, by
  // raisePendingFailure().
  poisoned_.store(true);
  dropRendezvousLocked();
  pending_failures_.emplace_back(kind, message);
}

void IbverbsTransport::laneFailedLocked(Lane& lane, const std::string& what) {
  lane.failed = true;
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  // Stopped before its work moves: a read still running on it could otherwise land in a
  // buffer after the same bytes were read again and the caller reused it.
  ibv_qp_attr error{};
  error.qp_state = IBV_QPS_ERR;
  (void)api_.modify_qp(lane.qp, &error, IBV_QP_STATE);
  if (failOverLocked(lane, what)) {
    // The peer's side may still be up and waiting (for credits, say) with nothing in flight
    // that would time out: it is told on a lane that works.
    peer.lanes_down.push_back(laneDownValue(static_cast<uint32_t>(lane.rail), lane.generation));
    pumpEndsLocked(peer);
    return;
  }
  const std::string message = "rank " + std::to_string(options_.rank) + ": lost rank " +
                              std::to_string(lane.peer) + ": " + what;
  const bool known = std::any_of(rdma_lost_.begin(), rdma_lost_.end(),
                                 [&](const LostPeer& lost) { return lost.rank == lane.peer; });
  if (!known) rdma_lost_.push_back(LostPeer{lane.peer, what});
  if (peer.busy()) {
    failLocked(ErrorKind::kPeerLost, message);
  } else if (peer.idle_failure.empty()) {
    RS_LOG_DEBUG("{} (nothing pending with that rank: an error only if it is needed again)",
                 message);
    peer.idle_failure = message;
  }
}

std::vector<LostPeer> IbverbsTransport::lostPeers() const {
  std::vector<LostPeer> lost = control_->lostPeers();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const LostPeer& peer : rdma_lost_) {
    const bool known = std::any_of(lost.begin(), lost.end(),
                                   [&](const LostPeer& other) { return other.rank == peer.rank; });
    if (!known) lost.push_back(peer);
  }
  return lost;
}

bool IbverbsTransport::failOverLocked(Lane& lane, const std::string& why) {
  Peer& peer = *peers_[static_cast<size_t>(lane.peer)];
  std::vector<int> up;  // rails that take over: the lanes still up, else the TCP rail
  for (Lane* other : peer.lanes) {
    if (!other->failed) up.push_back(other->rail);
  }
  if (up.empty() && peer.tcp_rail >= 0 && peer.scheduler->up(peer.tcp_rail)) {
    up.push_back(peer.tcp_rail);
  }
  if (up.empty()) return false;
  RS_LOG_WARN("rank {}: {}; its traffic moves to the other {} rail(s) to rank {}", options_.rank,
              why, up.size(), lane.peer);
  peer.scheduler->markDown(lane.rail, why);
  size_t next = 0;
  std::vector<std::shared_ptr<SendOp>> touched;
  auto reassign = [&](const std::shared_ptr<SendOp>& op, SendOp::Chunk chunk) {
    const int target = up[next++ % up.size()];
    op->per_rail[static_cast<size_t>(target)].push_back(chunk);
    ++op->unposted;
    touched.push_back(op);
  };
  // Written but not acknowledged: they may or may not have landed; sent again, marked so.
  for (auto& flight : lane.in_flight) {
    if (!flight.op) continue;
    --flight.op->outstanding;
    reassign(flight.op, SendOp::Chunk{flight.offset, flight.bytes, true});
    flight = Lane::InFlight{};
  }
  failOverOneSidedLocked(lane);
  // Not written yet; messages that had been fully posted are pending again.
  takeUnposted(peer.sending, static_cast<size_t>(lane.rail), reassign);
  requeue(peer.sending, touched);
  pumpLocked(peer);
  return true;
}

void IbverbsTransport::raisePendingFailure() {
  std::pair<ErrorKind, std::string> first;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_failures_.empty()) return;
    first = pending_failures_.front();
    pending_failures_.clear();
  }
  RS_LOG_DEBUG("rank {}: ibverbs: {}", options_.rank, first.second);
  control_->abort(makeError(first.first, first.second), true);
  { std::lock_guard<std::mutex> lock(state_mutex_); }
  state_changed_.notify_all();
}

void IbverbsTransport::onControlFailure(ErrorKind kind, const std::string& message) {
  poisoned_.store(true);
  { std::lock_guard<std::mutex> lock(state_mutex_); }
  state_changed_.notify_all();
  std::lock_guard<std::mutex> lock(listener_mutex_);
  if (failure_listener_) failure_listener_(kind, message);
}

void IbverbsTransport::rethrowPoisoned() const {
  const_cast<IbverbsTransport*>(this)->raisePendingFailure();
  {
    // Copies into and out of user buffers run under this lock and stop once poisoned_ is
    // set: after taking it once, none is running or will run. An abort from elsewhere (the
    // control transport, the user) poisons without failLocked(): its registrations go here.
    std::lock_guard<std::mutex> lock(mutex_);
    const_cast<IbverbsTransport*>(this)->dropRendezvousLocked();
  }
  const Deadline until = deadlineAfter(std::chrono::seconds(5));
  while (Clock::now() < until) {
    control_->checkHealthy();  // throws the poisoning error
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  throw Error("rank " + std::to_string(options_.rank) +
              ": the RDMA transport failed but its error was not recorded");
}

void IbverbsTransport::checkHealthy() const {
  control_->checkHealthy();
  if (poisoned_.load()) rethrowPoisoned();
}

void IbverbsTransport::abort(std::exception_ptr error, bool tell_peers) {
  poisoned_.store(true);
  control_->abort(error, tell_peers);
}

void IbverbsTransport::wait(const RequestPtr& request, Deadline deadline) {
  if (peers_[static_cast<size_t>(request->peer())] == nullptr) {
    control_->wait(request, deadline);
    return;
  }
  if (request->done()) return;
  // A send striped over TCP too: its RDMA part may finish first; wait() does the rest.
  auto* send =
      request->kind() == Request::Kind::kSend ? static_cast<SendOp*>(request.get()) : nullptr;
  auto rdmaDone = [&] { return send != nullptr && send->rdma_finished.load(); };
  const Clock::time_point spin_start = Clock::now();
  for (uint32_t i = 1; !poisoned_.load() && !rdmaDone(); ++i) {
    if (request->done()) return;
    if ((i & 63u) == 0) {
      const auto spent = Clock::now() - spin_start;
      if (spent >= options_.spin) break;
      if (spent >= std::chrono::microseconds(20)) sched_yield();
    }
  }
  {
    std::unique_lock<std::mutex> lock(state_mutex_);
    state_changed_.wait_until(lock, deadline,
                              [&] { return request->done() || poisoned_.load() || rdmaDone(); });
  }
  // Complete means every byte arrived before any failure: a piece is never counted after
  // poisoned_ is set.
  if (request->done()) return;
  if (poisoned_.load()) rethrowPoisoned();
  if (rdmaDone()) {
    finishTcpParts(request, *send, deadline);
    return;
  }
  std::ostringstream message;
  const bool is_send = request->kind() == Request::Kind::kSend;
  message << "rank " << options_.rank << ": " << describe(request->tag()) << " timed out waiting "
          << (is_send ? "to send to " : "to receive from ") << "rank " << request->peer()
          << " over RDMA (RAILSHARD_TIMEOUT)";
  if (timeout_explainer_) message << ": " << timeout_explainer_(request->tag());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!peers_[static_cast<size_t>(request->peer())]->connected) {
      message << "; no RDMA lane to rank " << request->peer()
              << " ever connected (RAILSHARD_IB_CONNECT=lazy connects on first use: did that "
                 "rank reach the store and this collective?)";
    }
    failLocked(ErrorKind::kTimeout, message.str());
  }
  rethrowPoisoned();
}

std::vector<RailStatus> IbverbsTransport::rails() const {
  std::vector<RailStatus> result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& peer : peers_) {
      if (!peer) continue;
      for (const Lane* lane : peer->lanes) {
        RailStatus status;
        status.peer = peer->rank;
        status.name = peer->scheduler->name(lane->rail);
        status.local = status.name;
        status.remote = "qpn " + std::to_string(lane->remote.qpn);
        status.up = !lane->failed && peer->scheduler->up(lane->rail);
        status.gbps = peer->scheduler->gbps(lane->rail);
        status.fraction = status.up ? peer->scheduler->fraction(lane->rail) : 0;
        status.bytes_sent = lane->bytes_sent;
        status.bytes_in_place = lane->bytes_in_place;
        if (!status.up) {
          status.down_reason = peer->scheduler->downReason(lane->rail);
          if (status.down_reason.empty()) status.down_reason = "queue pair in error";
        }
        result.push_back(status);
      }
      if (peer->tcp_rail >= 0) {
        RailStatus status;
        status.peer = peer->rank;
        status.name = "tcp";
        status.local = "tcp";
        status.remote = "rank " + std::to_string(peer->rank);
        status.up = peer->scheduler->up(peer->tcp_rail);
        status.gbps = peer->scheduler->gbps(peer->tcp_rail);
        status.fraction = status.up ? peer->scheduler->fraction(peer->tcp_rail) : 0;
        status.bytes_sent = tcp_link_->pieceBytesSent(peer->rank);
        status.down_reason = peer->scheduler->downReason(peer->tcp_rail);
        result.push_back(status);
      }
    }
  }
  for (auto& status : control_->rails()) {
    if (status.peer >= 0 && status.peer < options_.size &&
        !peers_[static_cast<size_t>(status.peer)]) {
      result.push_back(status);
    }
  }
  return result;
}

void IbverbsTransport::setTimeoutExplainer(std::function<std::string(const MessageTag&)> explain) {
  timeout_explainer_ = explain;
  control_->setTimeoutExplainer(std::move(explain));
}

void IbverbsTransport::setFailureListener(
    std::function<void(ErrorKind, const std::string&)> listener) {
  std::lock_guard<std::mutex> lock(listener_mutex_);
  failure_listener_ = std::move(listener);
}

std::string IbverbsTransport::describe(const MessageTag& tag) const {
  return options_.formatter.describe ? options_.formatter.describe(tag) : "a message";
}

}  // namespace railshard::transport::ibverbs
